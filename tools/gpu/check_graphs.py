"""Before a full GPU run: do CUDA graph updates (nmt.core.graphs) train as eager updates do, and
how much faster are they? About a minute on a GPU, from the carried data/:

    python3 tools/gpu/check_graphs.py [--recipe published] [--model scratch] [--updates 200]

Two runs of one recipe and model, from the same seed, dropout off: one with eager updates
(train.cuda_graphs false), one replayed as CUDA graphs, over the same first updates of
epoch 1. Prints (and writes to $OUT/check_graphs.json when OUT is set) each one's loss on
its first and last updates, the largest relative difference of any weight tensor, and the
milliseconds an update over a second pass through the same batches (the first pass holds the
warm-up and every capture). Exit 1 when the two
differ by more than bf16 rounding can explain (a graph reading stale inputs, a missed lr
update) or when no graph was captured. On a CPU both runs are eager (a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.runs import Run  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.stages.bench import sync  # noqa: E402
from nmt.stages.train import Paths, setup, update  # noqa: E402

WEIGHT_TOLERANCE = 2e-2  # relative L2 difference of any weight tensor
LOSS_TOLERANCE = 2e-2  # relative difference of the last updates' summed loss


def trainer(settings: dict, recipe: str, model: str, graphs: bool, results: Path):
    settings = {**settings, "train": {**settings["train"], "cuda_graphs": "auto" if graphs
                                      else False}}
    paths = Paths(tokenized=REPO / "data/tokenized", vocab=REPO / "data/vocab" / recipe,
                  run=Run(recipe, model, 0).files(results / ("graphs" if graphs else "eager")))
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
            loss, tokens = update(run, [(src, tgt, True)])
            losses.append(loss / tokens)
        sync(run.device)
    ms = 1000 * (time.perf_counter() - started) / len(batches)
    return {"losses": [float(loss) for loss in losses], "ms_per_update": round(ms, 2),
            "cuda_graphs": len(run.graphs.graphs) if run.graphs else 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--model", default="scratch")
    parser.add_argument("--updates", type=int, default=200, help="batches, each passed twice")
    args = parser.parse_args()
    if args.updates < 10:
        parser.error("--updates: at least 10")
    settings = resolve(load_params(REPO / "params.yaml"), args.recipe)
    settings["model"] = {**settings["model"], "dropout": 0.0}  # the same updates, mask for mask
    with tempfile.TemporaryDirectory() as results:
        runs = {name: trainer(settings, args.recipe, args.model, name == "graphs", Path(results))
                for name in ("eager", "graphs")}
        out = {name: train_updates(run, args.updates) for name, run in runs.items()}
        eager, graphed = (runs[n].model.state_dict() for n in ("eager", "graphs"))
        weight_diff = max(float((graphed[k].float() - v.float()).norm() / v.float().norm().clamp(
            min=1e-12)) for k, v in eager.items() if v.is_floating_point())
    last = [sum(out[n]["losses"][-10:]) for n in ("eager", "graphs")]
    loss_diff = abs(last[1] - last[0]) / abs(last[0])
    cuda = runs["graphs"].device.type == "cuda"
    ok = weight_diff <= WEIGHT_TOLERANCE and loss_diff <= LOSS_TOLERANCE and (
        out["graphs"]["cuda_graphs"] > 0 or not cuda)
    report = {"recipe": args.recipe, "model": args.model, "updates": args.updates,
              "device": str(runs["graphs"].device), "torch": torch.__version__,
              "largest_weight_difference": round(weight_diff, 6),
              "last_10_loss_difference": round(loss_diff, 6), "ok": ok,
              **{f"{n}_{k}": v for n, r in out.items() for k, v in r.items() if k != "losses"},
              **{f"{n}_loss_first_last": [round(r["losses"][0], 4), round(r["losses"][-1], 4)]
                 for n, r in out.items()}}
    print(json.dumps(report, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "check_graphs.json").write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
