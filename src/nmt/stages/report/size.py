"""Against full size: for each challenger whose standing against the baseline in a smaller
recipe of the pipeline (behind, level, ahead on BLEU) differs from its standing at full size,
a short paragraph with both sides' figures and parameter counts.

Full size is the `published` recipe: the pipeline's own runs of it when it runs them, else the
full-size run the project published (`--full-size`, reports/h200-published: its
results_summary.csv and statistics.json, both declared inputs of the stage)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from nmt.core import stats
from nmt.core.files import read_json
from nmt.core.runs import Run
from nmt.stages.report.inputs import BASELINE, LABELS, Inputs, challengers, seeds_of

FULL_SIZE_RECIPE = "published"
PHRASE = {"behind": "behind", "level": "level with", "ahead": "ahead of"}


@dataclass(frozen=True)
class Standing:
    """A challenger against the baseline on the first test set's BLEU, in one recipe."""

    where: str           # in words: which recipe, from which files
    seeds: int
    bleu: float
    baseline_bleu: float
    p: float
    method: str          # how p was obtained (stats.Comparison.method)
    params: int
    baseline_params: int
    updates: int | None = None  # each run's optimizer updates, where train.json says

    @property
    def verdict(self) -> str:
        if self.p >= stats.ALPHA:
            return "level"
        return "ahead" if self.bleu > self.baseline_bleu else "behind"

    def sentence(self, model: str) -> str:
        p = stats.format_p(self.p)
        return (f"{model} is {PHRASE[self.verdict]} the baseline: {self.bleu:.2f} against "
                f"{self.baseline_bleu:.2f} BLEU ({self.bleu - self.baseline_bleu:+.2f}; "
                f"{self.method}, p {p if '<' in p else f'= {p}'}), with {self.params:,} "
                f"parameters against {self.baseline_params:,} "
                f"({self.params / self.baseline_params:.2f}x)"
                + (f", {self.updates:,} updates each" if self.updates else ""))


def own_standing(inp: Inputs, recipe: str, model: str) -> Standing:
    """From the pipeline's runs: the Welch test over seeds where it ran, else the first
    seed's paired bootstrap."""
    testset = inp.testsets[0]
    c = inp.headline_test(recipe, model, LABELS["bleu"])
    s, b = inp.cell(recipe, model, testset), inp.cell(recipe, BASELINE, testset)
    updates = {inp.runs[Run(recipe, m, seed)]["train"].get("updates")
               for m in (model, BASELINE) for seed in inp.seeds}
    return Standing(f"the `{recipe}` recipe ({seeds_of(s.seeds)})", int(s.seeds),
                    float(s.bleu), float(b.bleu), c.p, c.method, int(s.params), int(b.params),
                    updates.pop() if len(updates) == 1 else None)


def published_standing(folder: Path, testset: str, model: str) -> Standing | None:
    """From a published full-size run's report folder; None where it lacks the model."""
    summary = pd.read_csv(folder / "results_summary.csv")
    rows = summary[(summary.recipe == FULL_SIZE_RECIPE) & (summary.testset == testset)]
    recorded = read_json(folder / "statistics.json")  # reports before the verdicts: a list
    comparisons = recorded["comparisons"] if isinstance(recorded, dict) else recorded
    found = [c for c in comparisons
             if (c["system"], c["metric"], c["testset"]) == (model, "BLEU", testset)]
    if model not in set(rows.model) or BASELINE not in set(rows.model) or not found:
        return None
    c = next((c for c in found if c["method"].startswith("Welch")), found[0])
    s, b = (rows[rows.model == m].iloc[0] for m in (model, BASELINE))
    return Standing(f"{folder}, the `{FULL_SIZE_RECIPE}` recipe ({seeds_of(s.seeds)})",
                    int(s.seeds), float(s.bleu), float(b.bleu),
                    c["p"], c["method"], int(s.params), int(b.params))


def size_section(inp: Inputs, full_size: Path | None) -> list[str]:
    """A paragraph for each (recipe, challenger) whose standing differs from full size, of the
    recipes at most half its size (the baseline's parameters): another full-size recipe
    (tuned) differs by its recipe, not its size."""
    paragraphs = []
    for model in challengers(inp.models):
        if FULL_SIZE_RECIPE in inp.recipes:
            full = own_standing(inp, FULL_SIZE_RECIPE, model)
        elif full_size is not None and (full_size / "results_summary.csv").exists():
            full = published_standing(full_size, inp.testsets[0], model)
        else:
            full = None
        for recipe in (r for r in inp.recipes if r != FULL_SIZE_RECIPE):
            own = own_standing(inp, recipe, model)
            smaller = full is not None and own.baseline_params * 2 <= full.baseline_params
            if smaller and own.verdict != full.verdict:
                paragraphs += [
                    f"**{model}, `{recipe}` against full size.** On {inp.testsets[0]}, in "
                    f"{own.where}, {own.sentence(model)}. At full size, in {full.where}, "
                    f"{full.sentence(model)}. So the `{recipe}` recipe's verdict on {model} "
                    "holds at its size, not at full size.", ""]
    if not paragraphs:
        return []
    return ["## Against full size", "",
            "Where a model's standing against the baseline (behind, level or ahead on BLEU, "
            f"at significance {stats.ALPHA:g}) differs between a recipe and full size:", "",
            *paragraphs]
