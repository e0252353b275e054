"""The code stays lint-clean: ruff on the package and tests, snakemake --lint on the rules."""

import subprocess
import sys
from pathlib import Path

from conftest import REPO

BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    proc = subprocess.run([BIN / "ruff", "check", "src", "tests"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_is_clean():
    proc = subprocess.run([BIN / "snakemake", "--lint"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr
