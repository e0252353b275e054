"""Where a training step's time goes: torch.profiler over the steps `nmt bench` times.

Produced docs/cpu-and-precision.md's table "Where a demo-size step's time goes" (ms a step by
kind of operator, fp32 and bf16) and its per-model profiles (the baseline's `bernoulli_`
dropout masks, the decoder-only model's LayerNorm, matrix products with AVX512 off).
A model of a recipe (default: scratch, of recipe demo) takes Adam steps on the recipe's first
training batches, in fp32 and in bf16 autocast, the update `nmt bench` times (bench.make_update).
The profiler's self CPU time of every operator is summed into kinds: matrix products, fused
attention, softmax and loss, layer norm, dropout, other element-wise work, the casts bf16 adds,
the optimizer, and the rest; each kind is printed with its milliseconds a step and its share.
The allocator shows as page faults (getrusage) a step, since its time is the kernel's; glibc
is told to keep freed memory first, as every `nmt` command does.

    python tools/step_profile.py [--recipe demo] [--model scratch] [--steps 8]
        [--precisions fp32 bf16]
        [--vocab data/vocab/demo] [--tokenized data/tokenized] [--params params.yaml]

Needs the recipe's vocabulary (`dvc repro vocab@demo`). Run it alone on the machine.
tests/test_tools.py runs it on a tiny params file and data, as a smoke test.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from nmt.core.codecs import load_codecs
from nmt.core.process import keep_freed_memory
from nmt.core.runtime import seed_everything
from nmt.models import MODELS, ModelConfig, build_model
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from nmt.stages.bench import SpeedPlan, bench_inputs, make_update, train_flops

REPO = Path(__file__).resolve().parents[1]

# Operator name fragments by kind, tried in this order (the first that matches wins).
KINDS = [
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                         "aten::linear", "aten::matmul", "mkldnn", "onednn")),
    ("fused attention", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("softmax and loss", ("softmax", "nll_loss", "cross_entropy")),
    ("layer norm", ("layer_norm",)),
    # nn.Dropout draws with bernoulli_; the models' cheaper mask with random_, then lt
    ("dropout", ("dropout", "bernoulli", "native_dropout", "aten::random_", "aten::lt")),
    ("optimizer (Adam)", ("_foreach", "adam", "Optimizer.step", "lerp", "addcdiv", "addcmul")),
    ("casts and copies", ("aten::to", "_to_copy", "aten::copy_", "aten::clone",
                          "aten::contiguous")),
    ("element-wise", ("aten::add", "aten::mul", "aten::div", "aten::relu", "aten::gelu",
                      "threshold_backward", "aten::sum", "aten::masked_fill", "aten::where",
                      "aten::sqrt", "aten::fill_", "aten::zero_", "aten::embedding")),
]


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, fragments in KINDS:
        if any(f.lower() in lowered for f in fragments):
            return kind
    return "other"


def profile_steps(step, batches: list, repeats: int) -> tuple[dict, dict, float, float]:
    """(self CPU ms a step by kind, by operator, wall ms a step, minor page faults a step)
    over `repeats` passes over the batches, after one untimed pass."""
    for src, tgt in batches:
        step(src, tgt)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            for src, tgt in batches:
                step(src, tgt)
    wall = time.perf_counter() - start
    steps = repeats * len(batches)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    by_kind: dict[str, float] = defaultdict(float)
    by_op = {}
    for event in prof.key_averages():
        by_kind[kind_of(event.key)] += event.self_cpu_time_total / 1000 / steps
        by_op[event.key] = event.self_cpu_time_total / 1000 / steps
    return dict(by_kind), by_op, 1000 * wall / steps, faults


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="demo")
    ap.add_argument("--steps", type=int, default=8, help="batches a pass")
    ap.add_argument("--repeats", type=int, default=2, help="profiled passes over them")
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--model", default="scratch", choices=list(MODELS))
    ap.add_argument("--vocab", type=Path, default=None)
    ap.add_argument("--tokenized", type=Path, default=REPO / "data" / "tokenized")
    ap.add_argument("--params", type=Path, default=REPO / "params.yaml")
    args = ap.parse_args()
    keep_freed_memory()  # as every nmt command does
    settings = resolve(load_params(args.params), args.recipe)
    codecs = load_codecs(args.vocab or REPO / "data" / "vocab" / args.recipe)
    device = torch.device("cpu")
    batches, _, _ = bench_inputs(settings, args.tokenized,
                               SpeedPlan(args.recipe, args.steps, 1, 1), codecs, device,
                               pad_multiple=1)
    cfg = ModelConfig.from_dict(settings["model"])
    flops = train_flops(cfg, len(codecs[1]), batches) / len(batches)
    print(f"recipe {args.recipe}: {args.model}, {len(batches)} batches x {args.repeats} passes, "
          f"{torch.get_num_threads()} threads, {flops / 1e9:.1f} GFLOP a step")
    for precision in args.precisions:
        seed_everything(0)
        model = build_model(args.model, cfg, len(codecs[0]), len(codecs[1])).train()
        update = make_update(model, settings, device, precision, graphs=False,
                             updates=len(batches) * (args.repeats + 1))
        by_kind, by_op, wall, faults = profile_steps(
            lambda src, tgt, update=update: update([(src, tgt, True)]), batches, args.repeats)
        total = sum(by_kind.values())
        print(f"\n{precision}: {wall:.0f} ms a step (profiled; {flops / wall / 1e6:.1f} "
              f"GFLOP/s), operators' self time {total:.0f} ms, {faults:,.0f} page faults")
        for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            top = sorted(((t, op) for op, t in by_op.items() if kind_of(op) == kind),
                         reverse=True)[:3]
            print(f"  {kind:20} {ms:8.1f} ms  {ms / total:6.1%}   " + ", ".join(
                f"{op} {t:.0f}" for t, op in top))


if __name__ == "__main__":
    main()
