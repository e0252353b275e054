"""The report's files for machines, beside report.md: results.csv, results_summary.csv,
metrics.json, curves.csv and statistics.json."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nmt.core.files import atomic_path, write_json
from nmt.stages.report.inputs import Inputs


def write_tables(inp: Inputs, out: Path) -> None:
    """results.csv (per seed), results_summary.csv (seed aggregates), metrics.json (for
    `dvc metrics show`: seed means, numbers only) and statistics.json (the verdicts and the
    comparisons)."""
    with atomic_path(out / "results.csv") as tmp:
        inp.table.to_csv(tmp, index=False, float_format="%.4f")
    with atomic_path(out / "results_summary.csv") as tmp:
        inp.summary.to_csv(tmp, index=False, float_format="%.4f")
    metrics = {}
    for r in inp.summary.itertuples():
        metrics.setdefault(r.recipe, {}).setdefault(r.model, {})[r.testset] = {
            "loss": r.loss, "bleu": r.bleu, "chrf": r.chrf}
    write_json(out / "metrics.json", metrics)
    curves = pd.concat([r["history"][["epoch", "train_loss", "valid_loss"]].assign(run=run.name)
                        for run, r in inp.runs.items()])
    with atomic_path(out / "curves.csv") as tmp:  # `dvc plots show`: one chart, all runs
        curves.to_csv(tmp, index=False)
    write_json(out / "statistics.json", {
        "verdicts": list(inp.verdicts.values()),
        "comparisons": [{"recipe": recipe, "testset": testset, **c.to_dict()}
                        for (recipe, _, testset), found in inp.comparisons.items()
                        for c in found]})
