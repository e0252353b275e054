"""Do scratch and the baseline learn alike from the same start? The published recipe on this
machine's CPU, fp32, both models from the same initial weights (one model's seed-0 weights,
given to the other through the state-dict mapping verify uses) and the same batches (the run
seed's order), dropout on (each model draws its own masks), for a few epochs; the validation
loss per epoch side by side.

    python tools/twin_training.py --model scratch [--start baseline] [--epochs 2]
        [--threads 1] --json results/twin/scratch-from-baseline.json

One model a process (run the two side by side, a thread each); --start names whose seed-0
initial weights it starts from (the swap: both models from scratch's). A lag of scratch here,
on the CPU, would be in our code, not in a GPU kernel. At published size an epoch took about
25 minutes a model on one thread of this repository's 2-core Xeon beside other work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.runs import Run  # noqa: E402
from nmt.models.mapping import baseline_to_scratch, scratch_to_baseline  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.stages.train import Paths, setup  # noqa: E402
from nmt.stages.train.loop import Progress, fit  # noqa: E402

MAPPING = {("baseline", "scratch"): baseline_to_scratch,
           ("scratch", "baseline"): scratch_to_baseline}


def trainer_for(model: str, settings: dict, results: Path):
    paths = Paths(tokenized=REPO / "data/tokenized", vocab=REPO / "data/vocab/published",
                  run=Run("published", model, 0).files(results))
    return setup(settings, paths)


def initial_weights(model: str, start: str, settings: dict, results: Path) -> dict:
    """`start`'s seed-0 initial weights in `model`'s layout."""
    state = trainer_for(start, settings, results).model.state_dict()
    return state if model == start else MAPPING[(start, model)](state)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("baseline", "scratch"), required=True)
    parser.add_argument("--start", choices=("baseline", "scratch"), default="baseline",
                        help="whose seed-0 initial weights the model starts from")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = resolve(load_params(REPO / "params.yaml"), "published")
    settings["train"] = {**settings["train"], "epochs": args.epochs, "precision": "fp32",
                         "device": "cpu", "cuda_graphs": False}
    with tempfile.TemporaryDirectory() as results:
        initial = initial_weights(args.model, args.start, settings, Path(results))
        trainer = trainer_for(args.model, settings, Path(results))  # seeds as a run does
        trainer.model.load_state_dict(initial)
        started, progress = time.perf_counter(), Progress()
        fit(trainer, progress)
    report = {"recipe": "published", "precision": "fp32", "device": "cpu",
              "threads": args.threads, "model": args.model, "initial_weights_of": args.start,
              "valid_loss": [row["valid_loss"] for row in progress.history],
              "train_loss": [row["train_loss"] for row in progress.history],
              "minutes": round((time.perf_counter() - started) / 60, 1)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
