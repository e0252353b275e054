"""Before a full GPU run: do CUDA graph updates (nmt.training.graphs) train as eager updates do, do
their dropout masks change on every replay, and how much faster are they? About a minute on a
GPU, from the carried data/:

    python3 tools/gpu/check_graphs.py [--recipe published] [--model scratch] [--updates 200]
                                      [--params params.yaml] [--data data]

Equivalence, dropout off: two runs of one recipe and model from the same seed, one with eager
updates (train.cuda_graphs false), one replayed as CUDA graphs, over the same first updates of
epoch 1, padded alike (the graphed run's train.pad_multiple). Reports each one's loss on its
first and last updates, the largest relative difference of any weight tensor (and which), and
the milliseconds an update over a second pass through the same batches (the first pass holds
the warm-up and every capture).

Dropout, on (the recipe's p): a graphed run whose lr is set to 0 (each group's device tensor
filled in place, so Adam moves no weight) updates on one batch REPLAYS times:
- fresh masks: the replays' losses all differ (a mask baked into the graph repeats them),
  while the dropout-off run's replays of that batch are identical;
- mean: the replays' mean loss agrees with that of eager updates on the batch from REPLAYS
  other seeds, within MEAN_ERRORS standard errors (wrong random offsets shift or narrow it);
- kept share: a forward hook on the dropout after the embeddings and positions (its input is
  never exactly 0) copies its input and output into buffers with .copy_(), which a capture
  records, so every replay refreshes them; after one more replay (buffers cleared first) the
  share of elements kept is 1 - p within KEPT_ERRORS binomial standard errors, and each kept
  element is its input / (1 - p).
Every check has its own `ok`; the JSON is printed and written to $OUT/check_graphs.json when
OUT is set. Exit 1 when any check fails or no graph was captured. On a CPU every update is
eager (a dry run): the same checks run, but they check eager dropout, not a graph's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.codecs import PAD_ID  # noqa: E402
from nmt.core.loss import token_loss  # noqa: E402
from nmt.core.runs import Run  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.stages.bench import sync  # noqa: E402
from nmt.training.loop import setup  # noqa: E402
from nmt.training.state import Paths  # noqa: E402
from nmt.training.step import graph_body  # noqa: E402

WEIGHT_TOLERANCE = 2e-2  # relative L2 difference of any weight tensor
LOSS_TOLERANCE = 2e-2  # relative difference of the last updates' summed loss
REPLAYS = 8  # updates of one batch at lr 0, replayed and eager
MEAN_ERRORS = 4  # replayed vs eager mean loss: within this many standard errors
KEPT_ERRORS = 5  # kept share vs 1 - p: within this many binomial standard errors
SCALE_TOLERANCE = 1e-2  # kept element vs input / (1 - p), relative (bf16 input: 2^-8)


def trainer(settings: dict, args, graphs: bool, results: Path, **train):
    """A run of the recipe and model with updates graphed where they can be (`graphs`) or
    eager, and `train` overriding its train: settings."""
    settings = {**settings, "train": {**settings["train"], **train,
                                      "cuda_graphs": "auto" if graphs else False}}
    paths = Paths(tokenized=args.data / "tokenized", vocab=args.data / "vocab" / args.recipe,
                  run=Run(args.recipe, args.model, 0).files(results))
    return setup(settings, paths)


def train_updates(run, updates: int) -> dict:
    """Two passes of updates over epoch 1's first `updates` batches (the first captures every
    shape's graph): every update's loss a token, and the second pass's ms an update."""
    batches = [run.train_batches.batch(idx) for idx, _ in run.plan(1)[:updates]]
    losses = []
    for _ in range(2):  # the second pass is the one timed
        sync(run.device)
        started = time.perf_counter()
        for src, tgt in batches:
            updated = run.update([(src, tgt, True)])
            losses.append(updated.loss_sum / updated.tokens)
        sync(run.device)
    ms = 1000 * (time.perf_counter() - started) / len(batches)
    return {"losses": [float(loss) for loss in losses], "ms_per_update": round(ms, 2),
            "cuda_graphs": len(run.update.graphs.graphs) if run.update.graphs else 0}


def equivalence(runs: dict, updates: int) -> dict:
    """Eager and graphed runs, dropout off, over the same updates: weights and losses."""
    out = {name: train_updates(run, updates) for name, run in runs.items()}
    eager, graphed = (runs[n].model.state_dict() for n in ("eager", "graphs"))
    weight_diff, weight_name = max((float((graphed[k].float() - v.float()).norm() / v.float(
        ).norm().clamp(min=1e-12)), k) for k, v in eager.items() if v.is_floating_point())
    last = [sum(out[n]["losses"][-10:]) for n in ("eager", "graphs")]
    loss_diff = abs(last[1] - last[0]) / abs(last[0])
    captured = out["graphs"]["cuda_graphs"] > 0 or runs["graphs"].device.type != "cuda"
    return {"largest_weight_difference": round(weight_diff, 6),
            "largest_weight_difference_in": weight_name,
            "last_10_loss_difference": round(loss_diff, 6),
            **{f"{n}_{k}": v for n, r in out.items() for k, v in r.items() if k != "losses"},
            **{f"{n}_loss_first_last": [round(r["losses"][0], 4), round(r["losses"][-1], 4)]
               for n, r in out.items()},
            "ok": weight_diff <= WEIGHT_TOLERANCE and loss_diff <= LOSS_TOLERANCE and captured}


def first_batch(run) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Epoch 1's first batch (src, tgt) and its target tokens."""
    src, tgt = run.train_batches.batch(run.plan(1)[0][0])
    return src, tgt, float((tgt[:, 1:] != PAD_ID).sum())


def still_updater(run):
    """A function making one update of the run on its first batch at lr 0, returning its loss a
    token: with graphs a replay (the warm-up's eager updates made first), else an eager update
    (the body a graph records)."""
    update = run.update
    for group in update.optimizer.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(0.0)  # in place: the captured Adam step reads this tensor
        else:
            group["lr"] = 0.0
    src, tgt, total = first_batch(run)
    if update.graphs is None:
        device = run.device
        body = graph_body(run.model, update.optimizer, device, update.config)
        total_on_device = torch.tensor(total, dtype=torch.float64, device=device)

        def eager():
            update.optimizer.zero_grad(set_to_none=True)
            loss, _ = body(src.to(device), tgt.to(device), total_on_device)
            return float(loss) / total

        return eager
    while update.graphs.warmup_left:
        update.graphs(src, tgt, total)
    return lambda: float(update.graphs(src, tgt, total)[0]) / total


@torch.no_grad()
def eager_losses(run, seeds: int) -> list[float]:
    """The run's loss a token on its first batch in training mode (dropout on), from each of
    `seeds` seeds: what eager updates at lr 0 give."""
    src, tgt, total = first_batch(run)
    losses = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        loss, _ = token_loss(run.model.train(), src, tgt, run.device,
                             run.config.label_smoothing, precision=run.precision)
        losses.append(float(loss) / total)
    return losses


def position_dropout(model: torch.nn.Module) -> torch.nn.Dropout:
    """The dropout after the embeddings and positions (scratch and decoder_only: pos, baseline:
    positional_encoding): its input, embedding + sinusoid, is never exactly 0."""
    return (getattr(model, "pos", None) or model.positional_encoding).dropout


class DropoutProbe:
    """Copies a dropout module's input and output into float32 buffers, one pair a shape
    (allocated on its first call, an eager warm-up update, before any capture), with .copy_()
    so that a captured graph refreshes them on every replay."""

    def __init__(self, module: torch.nn.Dropout):
        self.p, self.buffers = module.p, {}
        self.hook = module.register_forward_hook(self.record)

    def record(self, module, inputs, output) -> None:
        seen = inputs[0].detach()
        if seen.shape not in self.buffers:
            self.buffers[seen.shape] = tuple(torch.zeros_like(seen, dtype=torch.float32)
                                             for _ in range(2))
        into, out = self.buffers[seen.shape]
        into.copy_(seen)
        out.copy_(output.detach())

    def clear(self) -> None:
        for buffer in (b for pair in self.buffers.values() for b in pair):
            buffer.zero_()

    def check(self) -> dict:
        """The share of nonzero inputs kept, against 1 - p, and whether each kept element is
        its input / (1 - p), over the last call of every shape (none since clear(): fails)."""
        inputs = torch.cat([into.flatten() for into, _ in self.buffers.values()])
        outputs = torch.cat([out.flatten() for _, out in self.buffers.values()])
        live = inputs != 0
        kept = live & (outputs != 0)
        elements = int(live.sum())
        share = float(kept.sum()) / max(elements, 1)
        tolerance = KEPT_ERRORS * math.sqrt(self.p * (1 - self.p) / max(elements, 1))
        scaled = bool(torch.allclose(outputs[kept], inputs[kept] / (1 - self.p),
                                     rtol=SCALE_TOLERANCE, atol=0))
        return {"elements": elements, "kept_share": round(share, 5), "expected": 1 - self.p,
                "tolerance": round(tolerance, 5), "kept_are_input_over_1_minus_p": scaled,
                "ok": elements > 0 and abs(share - (1 - self.p)) <= tolerance and scaled}


def dropout_checks(settings: dict, args, still_off, results: Path) -> dict:
    """The three dropout checks (module docstring) on a new graphed run with dropout on and
    `still_off`, the graphed dropout-off run of the equivalence check."""
    run = trainer(settings, args, True, results / "dropout")
    eager = eager_losses(run, REPLAYS)  # first: no capture has touched the generator yet
    probe = DropoutProbe(position_dropout(run.model))
    step, steady = still_updater(run), still_updater(still_off)
    replayed = [step() for _ in range(REPLAYS)]
    probe.clear()
    step()  # one more replay: the buffers hold only what it copied
    kept = probe.check()
    probe.hook.remove()
    without = [steady() for _ in range(REPLAYS)]
    error = math.sqrt(statistics.variance(replayed) / REPLAYS
                      + statistics.variance(eager) / REPLAYS)
    gap = abs(statistics.mean(replayed) - statistics.mean(eager))
    return {
        "dropout": settings["model"]["dropout"], "graphed": run.update.graphs is not None,
        "dropout_fresh_masks": {
            "losses_on": [round(x, 6) for x in replayed],
            "losses_off": [round(x, 6) for x in without],
            "ok": len(set(replayed)) == REPLAYS and len(set(without)) == 1},
        "dropout_mean": {
            "replayed": round(statistics.mean(replayed), 6),
            "eager": round(statistics.mean(eager), 6), "standard_error": round(error, 6),
            "ok": gap <= MEAN_ERRORS * error},
        "dropout_kept": kept}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--model", default="scratch")
    parser.add_argument("--updates", type=int, default=200, help="batches, each passed twice")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--data", type=Path, default=REPO / "data",
                        help="holds tokenized/ and vocab/<recipe>/")
    args = parser.parse_args()
    if args.updates < 10:
        parser.error("--updates: at least 10")
    settings = resolve(load_params(args.params), args.recipe)
    if not settings["model"]["dropout"]:
        parser.error(f"recipe {args.recipe} has model.dropout 0: the dropout checks need it on")
    off = {**settings, "model": {**settings["model"], "dropout": 0.0}}  # mask for mask
    with tempfile.TemporaryDirectory() as results:
        graphed = trainer(off, args, True, Path(results) / "graphs")
        # The eager run pads as the graphed one (train.pad_multiple auto differs): same batches.
        runs = {"eager": trainer(off, args, False, Path(results) / "eager",
                                 pad_multiple=graphed.train_batches.pad_multiple),
                "graphs": graphed}
        checks = {"equivalence": equivalence(runs, args.updates)}
        dropout = dropout_checks(settings, args, runs["graphs"], Path(results))
    cuda = runs["graphs"].device.type == "cuda"
    if not cuda:
        print("no CUDA: a dry run, every update eager; the dropout checks ran on eager "
              "updates and say nothing of a graph's masks (they need CUDA)")
    checks |= {k: v for k, v in dropout.items() if k.startswith("dropout_")}
    report = {"recipe": args.recipe, "model": args.model, "updates": args.updates,
              "device": str(runs["graphs"].device), "torch": torch.__version__,
              "dry_run": not cuda, "dropout": dropout["dropout"],
              "dropout_graphed": dropout["graphed"], **checks,
              "ok": all(check["ok"] for check in checks.values())}
    print(json.dumps(report, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "check_graphs.json").write_text(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
