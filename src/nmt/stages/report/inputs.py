"""What the report reads, loaded once (`Inputs`), and the names every part of it shares: the
baseline every other model is compared with, the metrics' labels, `need` for a file that must
be there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nmt.core.errors import NmtError
from nmt.core.runs import Run, RunFiles
from nmt.pipeline.corpus import corpus_settings

LABELS = {"loss": "test loss", "ppl": "ppl", "bleu": "BLEU", "bleu_greedy": "BLEU greedy",
          "chrf": "chrF"}
BASELINE = "baseline"


@dataclass
class Inputs:
    """What the report reads, loaded once: metrics, summaries, histories, comparisons."""

    params: dict
    tokenized: Path
    vocab_root: Path
    results: Path
    table: pd.DataFrame    # one row per (recipe, model, testset, seed)
    summary: pd.DataFrame  # one row per (recipe, model, testset): seed means, stds and n
    runs: dict             # Run -> {"train", "evaluation", "history"}
    comparisons: dict      # (recipe, system, testset) -> [stats.Comparison] vs the baseline
    verdicts: dict         # (recipe, system) -> stats.loss_verdict on the first test set

    @property
    def recipes(self) -> list[str]:
        return self.params["pipeline"]["recipes"]

    @property
    def models(self) -> list[str]:
        return self.params["pipeline"]["models"]

    @property
    def seeds(self) -> list[int]:
        return self.params["pipeline"]["seeds"]

    @property
    def testsets(self) -> list[str]:
        return corpus_settings(self.params)["evaluate"]["testsets"]

    @property
    def langs(self) -> tuple[str, str]:
        data = corpus_settings(self.params)["data"]
        return data["source_lang"], data["target_lang"]

    def run_files(self, recipe: str, model: str, seed: int | None = None) -> RunFiles:
        """A run's files; seed None is the first seed (the one samples and tests use)."""
        return Run(recipe, model, self.seeds[0] if seed is None else seed).files(self.results)

    def cell(self, recipe: str, model: str, testset: str) -> pd.Series:
        s = self.summary
        return s[(s.recipe == recipe) & (s.model == model) & (s.testset == testset)].iloc[0]

    def tests_of(self, recipe: str, system: str, metric: str):
        """system - baseline on the first test set's `metric` (a LABELS value): (the Welch test
        over seeds, None with one seed a side; the first seed's paired bootstrap)."""
        found = {(c.kind, c.seed): c for c in self.comparisons[recipe, system, self.testsets[0]]
                 if c.metric == metric}
        return found.get(("seeds", None)), found["bootstrap", self.seeds[0]]

    def headline_test(self, recipe: str, system: str, metric: str):
        """The test that speaks for the architectures: over seeds where it ran (training noise
        included), else the first seed's bootstrap."""
        seeds, bootstrap = self.tests_of(recipe, system, metric)
        return seeds or bootstrap


def seeds_of(n) -> str:
    """'1 seed', '3 seeds'."""
    return f"{int(n)} seed{'s' if n > 1 else ''}"


def need(path: Path) -> Path:
    if not path.exists():
        raise NmtError(f"{path} is missing (fix: run the stage that writes it, or `dvc repro`)")
    return path


def challengers(models: list[str]) -> list[str]:
    """The models compared with the baseline: every other one, when the baseline ran."""
    return [m for m in models if m != BASELINE] if BASELINE in models else []
