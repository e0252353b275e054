"""How many operators one optimizer update dispatches, by phase, for each model: the count a GPU
launches as kernels (one a launch, eagerly; each of them a slice of a CUDA graph's replay).

A published-size update is about 1,300 small kernels on an H100 (2.4 % MFU, issue 55): their
number, not their arithmetic, bounds a step there. This counts the aten operators that reach
the dispatcher (torch's TorchDispatchMode, below autograd: the forward's and the backward's
alike), views left out since they launch nothing, in three phases: forward and loss, backward,
and the gradient norm with clipping and fused Adam (as on CUDA). The recipe's layers, heads and
dropout; its widths shrunk (--d-model), since the count does not depend on them; a synthetic
batch with padding on both sides. `--path fused` sets dropout to 0, so that every attention
takes F.scaled_dot_product_attention as it does on a GPU (on a CPU, dropout on the attention
weights takes the explicit math path); `--path cpu` counts the CPU's own training path.

    python tools/update_ops.py [--recipe published] [--path fused|cpu] [--models ...]

Produced the counts in docs/gpu.md ("Kernels an update") and the masks commit (models/masks.py:
built once a forward); tests/test_tools.py runs it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.codecs import BOS_ID, PAD_ID  # noqa: E402
from nmt.core.loss import token_loss  # noqa: E402
from nmt.models import MODELS, ModelConfig, build_model  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.training.step import clip_and_step  # noqa: E402

# Operators that launch nothing: they make another view of the same memory (or read a scalar).
VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "permute", "unsqueeze", "squeeze",
         "slice", "select", "as_strided", "alias", "detach", "reshape", "split", "chunk",
         "unbind", "split_with_sizes", "_reshape_alias", "lift_fresh", "unflatten", "flatten",
         "_local_scalar_dense"}


class Counted(TorchDispatchMode):
    """The operators dispatched inside the block that are not views, by name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def phases(model, settings: dict, src, tgt) -> dict[str, collections.Counter]:
    """The operators of one update's three phases (the second of two: the first creates Adam's
    state and settles lazily built buffers)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    device, train = torch.device("cpu"), settings["train"]
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        with Counted() as forward:
            loss, _ = token_loss(model, src, tgt, device, train["label_smoothing"])
        with Counted() as backward:
            (loss / 100).backward()
        with Counted() as step:
            clip_and_step(model, optimizer, train["clip_grad_norm"])
    return {"forward+loss": forward.ops, "backward": backward.ops, "norm+clip+adam": step.ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--path", choices=("fused", "cpu"), default="fused",
                        help="fused: dropout 0, the GPU's attention; cpu: the CPU's training path")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--d-model", type=int, default=64, help="width (the count ignores it)")
    parser.add_argument("--top", type=int, default=0, help="also the N most frequent operators")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    args = parser.parse_args()
    settings = resolve(load_params(args.params), args.recipe)
    cfg = dataclasses.replace(ModelConfig.from_dict(settings["model"]), d_model=args.d_model,
                              dim_feedforward=2 * args.d_model)
    if args.path == "fused":
        cfg = dataclasses.replace(cfg, dropout=0.0)
    vocab = 500 if cfg.tie_embeddings else None
    torch.manual_seed(0)
    src, tgt = torch.randint(4, 500, (8, 12)), torch.randint(4, 500, (8, 14))
    src[0, -3:], tgt[1, -4:], tgt[:, 0] = PAD_ID, PAD_ID, BOS_ID
    print(f"recipe {args.recipe} ({cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, "
          f"{cfg.nhead} heads), {args.path} path: operators an update, views left out")
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(name, cfg, vocab or 500, vocab or 500).train()
        counted = phases(model, settings, src, tgt)
        total = sum(sum(ops.values()) for ops in counted.values())
        print(f"  {name:13} {total:5}: " + ", ".join(
            f"{phase} {sum(ops.values())}" for phase, ops in counted.items()))
        if args.top:
            every = sum(counted.values(), collections.Counter())
            print("      " + ", ".join(f"{op} {n}" for op, n in every.most_common(args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
