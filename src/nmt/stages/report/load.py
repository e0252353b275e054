"""Loading the report's inputs from results/ and data/: every run's metrics.json, train.json,
evaluation.json and history.csv, the seed aggregates, and each model's comparisons with the
baseline (paired bootstraps of each seed's outputs, a Welch test over the seeds) with the
verdict on the test loss."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from nmt.core import stats
from nmt.core.errors import NmtError
from nmt.core.files import read_json
from nmt.core.runs import Run, runs
from nmt.core.text import read_lines
from nmt.pipeline.corpus import corpus_settings
from nmt.stages.report.inputs import BASELINE, LABELS, Inputs, challengers, need

METRICS = ["loss", "ppl", "bleu", "bleu_greedy", "chrf", "chrf_greedy"]
COLUMNS = ["recipe", "model", "testset", "seed", *METRICS, "params", "seconds_per_epoch",
           "train_minutes"]


def read_losses(path: Path) -> tuple[list[float], list[int]]:
    """translations/<testset>.loss.tsv: per sentence summed loss (nats) and target tokens."""
    rows = [line.split("\t") for line in read_lines(need(path))]
    try:
        return [float(r[0]) for r in rows], [int(r[1]) for r in rows]
    except (IndexError, ValueError):
        raise NmtError(f"{path}: expected '<loss>\\t<tokens>' lines "
                       "(fix: re-run `nmt evaluate`)") from None



def collect(params: dict, results: Path) -> tuple[pd.DataFrame, dict]:
    """The per-seed results table and each run's train.json, evaluation.json and history."""
    rows, found = [], {}
    for run in runs(params):  # pipeline.recipes x models x seeds
        files = run.files(results)
        metrics = read_json(need(files.metrics))
        found[run] = {"train": read_json(need(files.summary)),
                      "evaluation": read_json(need(files.evaluation)),
                      "history": pd.read_csv(need(files.history))}
        for testset in corpus_settings(params)["evaluate"]["testsets"]:
            if testset not in metrics:
                raise NmtError(f"{files.metrics} has no {testset} "
                               "(fix: re-run `nmt evaluate` with the current params.yaml)")
            rows.append({"recipe": run.recipe, "model": run.model, "testset": testset,
                         "seed": run.seed, **{m: metrics[testset][m] for m in METRICS},
                         "params": found[run]["evaluation"]["params"],
                         "seconds_per_epoch": found[run]["train"]["seconds_per_epoch"],
                         "train_minutes": found[run]["train"]["train_minutes"]})
    return pd.DataFrame(rows, columns=COLUMNS), found


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Seed aggregates: n, mean and sample std of each metric per (recipe, model, testset)."""
    rows = stats.aggregate(table.to_dict("records"), ["recipe", "model", "testset"],
                           [*METRICS, "params", "seconds_per_epoch", "train_minutes"])
    df = pd.DataFrame(rows).rename(columns={"n": "seeds"})
    return df.drop(columns=["params_std", "seconds_per_epoch_std", "train_minutes_std"])


def seed_bootstraps(inp: Inputs, recipe: str, names: tuple[str, str], testset: str,
                    seed: int) -> list[stats.Comparison]:
    """The paired bootstraps (BLEU, chrF, test loss) of one seed's pair of runs."""
    refs = read_lines(need(inp.tokenized / f"{testset}.{inp.langs[1]}.txt"))
    out = [read_lines(need(inp.run_files(recipe, m, seed).translations / f"{testset}.beam.txt"))
           for m in names]
    found = list(stats.paired_bootstrap(out[0], out[1], refs, names).values())
    losses = [read_losses(inp.run_files(recipe, m, seed).translations / f"{testset}.loss.tsv")
              for m in names]
    found.append(stats.loss_bootstrap(losses[0], losses[1], names))
    return [replace(c, seed=seed) for c in found]


def compare(inp: Inputs, recipe: str, system: str, testset: str) -> list[stats.Comparison]:
    """system vs baseline on one test set: the bootstraps of each seed's pair, and a Welch
    test over the seeds where each side has two or more."""
    names = (system, BASELINE)
    found = [c for seed in inp.seeds for c in seed_bootstraps(inp, recipe, names, testset, seed)]
    t = inp.table[(inp.table.recipe == recipe) & (inp.table.testset == testset)]
    for metric, higher in (("bleu", True), ("chrf", True), ("loss", False)):
        c = stats.welch(t[t.model == system][metric].tolist(),
                        t[t.model == BASELINE][metric].tolist(), LABELS[metric], names, higher)
        found += [c] if c else []
    return found


def load(params: dict, tokenized: Path, vocab_root: Path, results: Path) -> Inputs:
    table, runs = collect(params, Path(results))
    inp = Inputs(params, Path(tokenized), Path(vocab_root), Path(results), table,
                 summarize(table), runs, {}, {})
    for recipe in inp.recipes:
        for system in challengers(inp.models):
            for testset in inp.testsets:
                inp.comparisons[recipe, system, testset] = compare(inp, recipe, system, testset)
            inp.verdicts[recipe, system] = verdict_of(inp, recipe, system)
    return inp


def verdict_of(inp: Inputs, recipe: str, system: str) -> dict:
    """stats.loss_verdict of system - baseline on the first test set: from the Welch test
    over seeds where it ran, else from the first seed's loss bootstrap."""
    testset = inp.testsets[0]
    t = inp.table[(inp.table.recipe == recipe) & (inp.table.testset == testset)]
    verdict = {"recipe": recipe, "testset": testset} | stats.loss_verdict(
        *inp.tests_of(recipe, system, LABELS["loss"]),
        stats.summarize(t[t.model == system].loss.tolist()),
        stats.summarize(t[t.model == BASELINE].loss.tolist()))
    return verdict | mixed_precisions(inp, recipe, (system, BASELINE), verdict["sentence"])


def mixed_precisions(inp: Inputs, recipe: str, models: tuple[str, str], sentence: str) -> dict:
    """Each side's training precisions (train.json); where the runs compared trained in more
    than one, the verdict sentence says so: its difference then holds the precision's effect
    as well as the architectures' (a busy machine once trained the baseline in fp32 and scratch
    in bf16, and the report's first sentence called the baseline better)."""
    used = {m: sorted({inp.runs[Run(recipe, m, seed)]["train"].get("precision", "not recorded")
                       for seed in inp.seeds}) for m in models}
    if len({p for found in used.values() for p in found}) == 1:
        return {"precisions": used}
    said = ", ".join(f"{m} {' and '.join(found)}" for m, found in used.items())
    return {"precisions": used,
            "sentence": f"{sentence} Caution: the runs compared trained in different precisions "
                        f"({said}), so the difference holds the precision's effect as well as "
                        "the architectures'."}
