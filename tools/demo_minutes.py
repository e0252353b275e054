"""The demo's training minutes on this machine, from each model's first updates, extrapolated.

Produced the row of the README's first-screen table of the demo's minutes by CPU kind that says
"the first 100 updates, extrapolated" (AVX512 turned off), and its check against whole
trainings in docs/cpu-and-precision.md ("What it takes on your CPU"). For each model,
`nmt train` trains the recipe (default: demo) for its first --updates updates (train.max_updates
set to that in a params copy; everything else as the recipe has it: the precision `auto` chooses,
threads, batches) into a folder of its own, then extrapolates train.json's budget
(train_minutes: the updates plus the validation passes) to the whole run:

    minutes = seconds an update x the recipe's max_updates + a validation pass x its epochs

checked against whole trainings (docs/cpu-and-precision.md, "What it takes on your CPU":
within a few percent). The environment passes on, so

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python tools/demo_minutes.py

measures an AVX2-only CPU (a laptop) on an AVX512 machine; it prints torch's vector capability
(train.json's cpu_capability), so that a cap that did not take is seen (ONEDNN_VERBOSE=1 shows
oneDNN's: "isa:Intel AVX2"). Needs data/tokenized and the
recipe's vocabulary (`make demo`, or `dvc repro vocab@demo` in its experiment). Run it alone.

    python tools/demo_minutes.py [--recipe demo] [--updates 100] [--models baseline,scratch]
        [--params params.yaml] [--tokenized data/tokenized] [--vocab data/vocab/<recipe>]

tests/test_tools.py runs it on a tiny params file and data, as a smoke test.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from nmt.core.codecs import load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.models import MODELS
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--updates", type=int, default=100, help="updates timed a model")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--tokenized", type=Path, default=REPO / "data/tokenized")
    parser.add_argument("--vocab", type=Path, default=None, help="default: data/vocab/<recipe>")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    vocab = args.vocab or REPO / "data/vocab" / args.recipe
    params = load_params(args.params)
    settings = resolve(params, args.recipe)
    whole = settings["train"]["max_updates"]
    if not whole:
        sys.exit(f"recipe {args.recipe} trains whole epochs; this extrapolates max_updates")
    epochs = math.ceil(whole / updates_per_epoch(settings, args.tokenized, vocab))
    caps = " ".join(f"{name}={os.environ[name]}" for name in CAPS if name in os.environ)
    print(f"recipe {args.recipe}: {whole} updates, {epochs} epochs; timing the first "
          f"{args.updates} of each model ({caps or 'no instruction caps'})")
    params["recipes"][args.recipe].setdefault("train", {})["max_updates"] = args.updates
    with tempfile.TemporaryDirectory(prefix="demo-minutes-") as work:
        path = Path(work) / "params.yaml"
        (Path(work) / "workflow").symlink_to(REPO / "workflow")  # the schema, beside it
        path.write_text(yaml.safe_dump(params, sort_keys=False))
        for model in args.models.split(","):
            subprocess.run([sys.executable, "-m", "nmt", "-q", "--params", str(path), "train",
                            "--recipe", args.recipe, "--model", model, "--tokenized",
                            str(args.tokenized), "--vocab", str(vocab), "--results", work,
                            "--threads", str(args.threads)], check=True, cwd=REPO)
            folder = Path(work) / f"{args.recipe}-{model}-s0"
            summary = json.loads((folder / "train.json").read_text())
            with open(folder / "history.csv") as f:
                rows = list(csv.DictReader(f))
            update = sum(float(r["seconds"]) for r in rows) / summary["updates"]
            validation = (summary["train_minutes"] * 60 - sum(float(r["seconds"]) for r in rows)
                          ) / len(rows)
            minutes = (update * whole + validation * epochs) / 60
            print(f"{model}: {1e3 * update:,.0f} ms an update, {validation:.1f} s a validation "
                  f"pass, {summary['precision']} ({summary['cpu_capability']}): about "
                  f"{minutes:.2f} minutes for the whole run")


CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def updates_per_epoch(settings: dict, tokenized: Path, vocab: Path) -> int:
    """Epoch 1's batches, as nmt train counts them (accumulate 1)."""
    codecs = load_codecs(vocab)
    pairs = load_pairs(tokenized, "train", *codecs, settings["model"]["max_len"])
    return len(Batches.for_training(pairs, settings["train"], seed=0,
                                    max_len=settings["model"]["max_len"]).indices(1))


if __name__ == "__main__":
    main()
