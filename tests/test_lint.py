"""The code stays lint-clean: ruff on the package, tests and tools; snakemake --lint on rules."""

import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    proc = subprocess.run([BIN / "ruff", "check", "src", "tests", "tools"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([BIN / "snakemake", "--lint"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr


def test_slurm_profile_plans_the_whole_pipeline():
    """The cluster profile loads with the pinned SLURM executor plugin (a dry run submits
    nothing) and plans every stage, whatever this checkout has already made (`--forceall`:
    after `make reproduce` or `make gpu-bundle`, download was done and the plan lacked it)."""
    slurm = ["--workflow-profile", "workflow/profiles/slurm", "-n", "--forceall"]
    proc = subprocess.run([BIN / "snakemake", *slurm], cwd=REPO, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "executor: slurm" in out or "slurm" in out.lower()
    for rule in ("download", "train", "evaluate", "report"):
        assert f"rule {rule}:" in out, out[-2000:]
