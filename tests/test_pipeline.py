"""Smoke: the whole pipeline on tiny settings, in a scratch copy, with DVC and with Snakemake.

Each orchestrator runs everything (download ... report), then a second run must do nothing,
and a changed vocab.min_freq must re-run only vocab and what depends on it.
"""

from __future__ import annotations

import copy
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, edit_params

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent  # nmt, dvc and snakemake live beside this python

TINY = {
    "data": {"max_train_pairs": 1000, "max_test_pairs": 50},
    "model": {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
              "dim_feedforward": 64, "dropout": 0.1},
    "train": {"epochs": 1, "batch_size": 32},
    "evaluate": {"beam_size": 2, "batch_size": 50},
    "bench": {"steps": 2, "repeats": 1, "sentences": 10},
    "report": {"samples": 3},
}


def scratch_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked, plus new files not ignored), with tiny params."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        src = REPO / rel
        if src.is_file() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    for leftover in ("dvc.lock", "reports"):  # the real run's outputs are not the smoke's
        target = dest / leftover
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    recipes = {name: tiny_recipe(r) for name, r in params["recipes"].items()}
    edit_params(dest / "params.yaml", **TINY, recipes=recipes)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def tiny_recipe(recipe: dict) -> dict:
    """Keep what a recipe changes in kind (vocabulary, tying, batching); shrink what costs."""
    recipe = copy.deepcopy(recipe)
    if "model" in recipe:
        recipe["model"].update(TINY["model"])
    if "bpe_size" in recipe.get("vocab", {}):
        recipe["vocab"]["bpe_size"] = 500
    train = recipe.setdefault("train", {})
    train.update(epochs=1, average_last=min(train.get("average_last", 0), 1))
    recipe.setdefault("evaluate", {}).update(beam_size=2)
    return recipe


def run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{output[-4000:]}"
    return output


def check_report(root: Path) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    with open(root / "reports" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    expected = {(r, m, t) for r in params["pipeline"]["recipes"]
                for m in ("baseline", "scratch") for t in ("test_2016_flickr", "test_2017_flickr")}
    assert {(r["recipe"], r["model"], r["testset"]) for r in rows} == expected
    assert all(float(r["loss"]) > 0 and 0 <= float(r["bleu"]) <= 100 for r in rows)
    report = (root / "reports" / "report.md").read_text()
    for heading in ("## Results", "## Verification", "## Sample translations", "## Setup"):
        assert heading in report
    assert (root / "reports" / "figures" / "loss.png").stat().st_size > 1000
    assert (root / "reports" / "figures" / "attention.png").stat().st_size > 1000


def test_dvc_repro(mirror, tmp_path):
    root = scratch_copy(tmp_path)
    run(["dvc", "repro"], root)
    check_report(root)
    second = run(["dvc", "repro"], root)
    assert "Data and pipelines are up to date" in second, second
    run(["dvc", "metrics", "show"], root)

    edit_params(root / "params.yaml", vocab={"min_freq": 2})
    status = run(["dvc", "status"], root)
    assert "vocab@published" in status and "tokenize" not in status
    ran = stages_run(run(["dvc", "repro"], root))
    assert {"vocab@published", "train@published-baseline-0", "train@published-scratch-0",
            "report"} <= ran
    # The BPE recipe ignores min_freq: its vocabulary re-runs but comes out identical.
    assert not ran & {"download", "tokenize", "train@tuned-scratch-0", "train@tuned-baseline-0"}


def stages_run(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines()
            if line.startswith("Running stage '")}


def test_snakemake(mirror, tmp_path):
    root = scratch_copy(tmp_path)
    run(["snakemake", "--cores", "2"], root)
    check_report(root)
    second = run(["snakemake", "--cores", "2"], root)
    assert "Nothing to be done" in second, second

    edit_params(root / "params.yaml", vocab={"min_freq": 2})
    dry = run(["snakemake", "-n", "--cores", "2"], root)
    jobs = [line.split() for line in dry[dry.index("Job stats"):].splitlines()[3:]]
    counts = {job[0]: int(job[1]) for job in jobs if len(job) == 2 and job[1].isdigit()}
    # Only the word-vocabulary recipe (published) reads min_freq: one vocab, two trainings.
    assert counts.get("vocab") == 1 and counts.get("train") == 2 and counts.get("report") == 1
    assert "download" not in counts and "tokenize" not in counts
