"""Does bf16 autocast cost the CPU demo any quality? The same trainings in fp32 and in bf16.

Produced docs/cpu-and-precision.md's bf16 quality check (Precision: mean valid loss 1.7011
and greedy valid BLEU 35.47 in bf16 against fp32's 1.7018 and 35.34, 382 against 500 ms an
update) and the demo search's step demo_s12 (docs/demo-recipe-search.md).
The demo recipe's scratch model is trained by `nmt train`, once per (precision, seed), with
nothing else changed: the same updates (the recipe's train.max_updates), data and seeds. Each
training runs alone, one after the other, on every core this process may use. Printed per run:
the validation loss and greedy validation BLEU that train.json records (the validation set
only; no test set is decoded), the training minutes and seconds per update; then per precision
the mean over the seeds. The runs stay in --results for a second look.

    python tools/precision_check.py [--recipe demo] [--model scratch] [--seeds 0 1]
        [--precisions fp32 bf16] [--results /tmp/precision-check]
        [--params params.yaml] [--tokenized data/tokenized] [--vocab data/vocab/<recipe>]

The data and vocabulary stages must have run (`dvc repro vocab@demo`, or `nmt download`,
`nmt tokenize`, `nmt vocab --recipe demo`). About 8 minutes a fp32 training on 2 cores.
tests/test_tools.py runs it on a tiny params file and data, as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from nmt.core.runs import Run
from nmt.pipeline.params_file import read_params

REPO = Path(__file__).resolve().parents[1]


def params_with(source: Path, precision: str, recipe: str, folder: Path) -> Path:
    """A copy of params.yaml (`source`) whose recipe trains in `precision` (schema beside it,
    as nmt looks for it next to the params file)."""
    params = read_params(source)
    params["recipes"][recipe].setdefault("train", {})["precision"] = precision
    path = folder / precision / "params.yaml"
    (path.parent / "workflow").mkdir(parents=True, exist_ok=True)
    schemas = path.parent / "workflow" / "schemas"
    if not schemas.exists():
        schemas.symlink_to(REPO / "workflow" / "schemas")
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def train(args, precision: str, seed: int) -> dict:
    """One `nmt train`; its train.json's figures."""
    results = args.results / precision
    params = params_with(args.params, precision, args.recipe, args.results)
    vocab = args.vocab or REPO / "data" / "vocab" / args.recipe
    subprocess.run([sys.executable, "-m", "nmt", "--params", str(params), "-q", "train",
                    "--recipe", args.recipe, "--model", args.model, "--seed", str(seed),
                    "--tokenized", str(args.tokenized), "--vocab", str(vocab),
                    "--results", str(results)], cwd=REPO, check=True)
    summary = json.loads(Run(args.recipe, args.model, seed).files(results).summary.read_text())
    return {"precision": summary.get("precision", precision), "seed": seed,
            "valid_loss": summary["best_valid_loss"], "valid_bleu": summary["valid_bleu_greedy"],
            "updates": summary["updates"], "minutes": summary["train_minutes"],
            "ms_per_update": round(60_000 * summary["train_minutes"] / summary["updates"], 1),
            "cpu": summary.get("device_name", "?")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--model", default="scratch")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--results", type=Path,
                        default=Path(tempfile.gettempdir()) / "precision-check")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--tokenized", type=Path, default=REPO / "data" / "tokenized")
    parser.add_argument("--vocab", type=Path, default=None, help="default: data/vocab/<recipe>")
    args = parser.parse_args()
    rows = [train(args, precision, seed) for seed in args.seeds for precision in args.precisions]
    print(f"\n{args.recipe} {args.model}, on {rows[0]['cpu']}")
    print(f"{'precision':>10}{'seed':>6}{'updates':>9}{'valid loss':>12}{'valid BLEU':>12}"
          f"{'minutes':>9}{'ms/update':>11}")
    for r in rows:
        print(f"{r['precision']:>10}{r['seed']:>6}{r['updates']:>9}{r['valid_loss']:>12.4f}"
              f"{r['valid_bleu']:>12.2f}{r['minutes']:>9.2f}{r['ms_per_update']:>11.1f}")
    for precision in args.precisions:
        mine = [r for r in rows if r["precision"] == precision]
        print(f"{precision:>10}{'mean':>6}{'':>9}"
              f"{statistics.mean(r['valid_loss'] for r in mine):>12.4f}"
              f"{statistics.mean(r['valid_bleu'] for r in mine):>12.2f}"
              f"{statistics.mean(r['minutes'] for r in mine):>9.2f}"
              f"{statistics.mean(r['ms_per_update'] for r in mine):>11.1f}")
    (args.results / "check.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
