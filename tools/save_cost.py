"""What writing a resume state costs the training loop: the seconds resume.save keeps the loop
(the snapshot: CPU copies of the weights, Adam's moments and the rest) against the seconds the
whole write takes (serializing and writing to the run's disk, fsync included), which the loop
waited for before resume states were written by a thread (nmt.training.state_writer.StateWriter).

A run of the recipe is set up as nmt train sets it up (nmt.training.loop.setup: its data,
vocabulary and model, on the CPU), makes one update so that Adam's moments exist, and saves
its state --repeats times into a temporary folder beside --results, each time timing
resume.save's return and then the write's end. At the published size the state is about 1 GB.

    python tools/save_cost.py [--recipe published] [--model scratch] [--repeats 3]

Needs the recipe's vocabulary (`dvc repro vocab@published`). Produced docs/interrupted-runs.md's
"What a save costs"; tests/test_tools.py runs it at tiny size.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.runs import Run  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.training import resume  # noqa: E402
from nmt.training.loop import setup  # noqa: E402
from nmt.training.state import Paths, Progress  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--model", default="scratch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--tokenized", type=Path, default=REPO / "data" / "tokenized")
    parser.add_argument("--vocab", type=Path, default=None)
    parser.add_argument("--results", type=Path, default=REPO / "results",
                        help="the disk to write on (a temporary folder inside it)")
    args = parser.parse_args()
    settings = resolve(load_params(args.params), args.recipe)
    settings["train"].update(device="cpu", precision="fp32")  # no precision measurement first
    args.results.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="save_cost.", dir=args.results))
    try:
        run = Run(args.recipe, args.model, 0)
        trainer = setup(settings, Paths(args.tokenized, args.vocab or REPO / "data" / "vocab" /
                                        args.recipe, run.files(scratch)))
        src, tgt = trainer.train_batches.batch(trainer.plan(1)[0][0])
        trainer.update([(src, tgt, True)])  # Adam's moments, as after any update
        progress = Progress(best_state=trainer.model.state_dict())  # a best copy, as after epoch 1
        returned, written = [], []
        for _ in range(args.repeats):
            began = time.perf_counter()
            resume.save(trainer, progress)
            returned.append(time.perf_counter() - began)
            trainer.writer.wait()
            written.append(time.perf_counter() - began)
        size = trainer.paths.run.resume.stat().st_size
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"recipe {args.recipe}, {args.model}: {trainer.n_params:,} parameters, a resume state "
          f"of {size / 1e6:,.0f} MB, {args.repeats} saves")
    print(f"  the loop waits   {statistics.median(returned):7.2f} s (median; "
          f"{min(returned):.2f}-{max(returned):.2f})")
    print(f"  the whole write  {statistics.median(written):7.2f} s (median; "
          f"{min(written):.2f}-{max(written):.2f}): what the loop waited for before")
    return 0


if __name__ == "__main__":
    sys.exit(main())
