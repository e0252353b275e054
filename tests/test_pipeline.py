"""Smoke: the whole pipeline on tiny settings, in a scratch copy, with DVC and with Snakemake.

Each orchestrator runs everything (download ... report) once (the session fixtures in
conftest.py); a second run must do nothing, and both must give the same numbers.
"""

from __future__ import annotations

import json

import pytest

from tiny import check_report, run

pytestmark = pytest.mark.slow


def test_dvc_repro(dvc_run):
    check_report(dvc_run)
    second = run(["dvc", "repro"], dvc_run)
    assert "Data and pipelines are up to date" in second, second
    shown = run(["dvc", "metrics", "show"], dvc_run)
    assert "bleu" in shown and "…" not in shown  # numbers only: the table fits


def test_snakemake(snakemake_run):
    check_report(snakemake_run)
    second = run(["snakemake", "--cores", "2"], snakemake_run)
    assert "Nothing to be done" in second, second


def test_both_orchestrators_give_the_same_numbers(dvc_run, snakemake_run):
    """Same commands, same thread count: the same losses, BLEU and translations, exactly."""
    runs = sorted(p.parent.name for p in (dvc_run / "results").glob("*/metrics.json"))
    assert runs
    for name in runs:
        a, b = (json.loads((root / "results" / name / "metrics.json").read_text())
                for root in (dvc_run, snakemake_run))
        assert a == b, name
        for path in (dvc_run / "results" / name / "translations").iterdir():
            twin = snakemake_run / "results" / name / "translations" / path.name
            assert path.read_text() == twin.read_text(), path
