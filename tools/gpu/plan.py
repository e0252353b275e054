"""Plan a GPU machine's minutes: which runs of the pipeline fit in what is left, in what order.

    python3 tools/gpu/plan.py --minutes 6.5 [--check $OUT/check_graphs.json] [--extra RUN ...]
        [--targets FILE] [--params params.yaml] [--data data]

The runs' optimizer updates come from the data (each recipe's batches of epoch 1 times its
epochs, or train.max_updates); a run's seconds are its updates times the milliseconds an update
that tools/gpu/check_graphs.py measured on this machine (graphed when a graph was captured and
the graph check passed, else eager), plus a share for validation. Trainings that share one GPU
take turns on it, so their seconds add up. Runs are taken in priority order: the published
recipe's baseline and scratch first (the comparison this project exists for), then the rest of
that recipe's runs, then the --extra runs (a second seed, say), then the other recipes' runs of
params.yaml's pipeline; a run that does not fit is left out and the next is tried. Prints the
plan as a table and one line saying whether the whole pipeline fits; --targets writes the
Snakemake targets, one a line (each planned run's evaluation, the bench, and the report when
every run of the pipeline is in). When only some recipes' runs are all in, --narrowed writes
params.yaml with pipeline.recipes cut to those recipes (the report of what was trained: `nmt
--params FILE report`), and --stages the DVC stages of the planned runs (what `dvc commit` can
record). tools/gpu/run.sh runs it (step 3; docs/gpu.md): its plan chose the runs that
reports/h200-published/ holds and narrowed that report to the published recipe.
tests/test_tools.py checks its choices, and runs it on a tiny params file and data.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.codecs import load_codecs  # noqa: E402
from nmt.core.data import Batches, load_pairs  # noqa: E402
from nmt.core.runs import Run, runs  # noqa: E402
from nmt.pipeline.params import load_params, read_yaml  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402

FIRST = (Run("published", "baseline"), Run("published", "scratch"))  # the comparison itself
VALIDATION_SHARE = 0.15  # validation and the end-of-run greedy BLEU, on top of the updates
AFTER_TRAINING = 90  # seconds for the evaluations, the bench and the report after the last run
UNMEASURED_MS = 60.0  # an eager published update on an H100 (46-68 ms): without a measurement


@dataclass(frozen=True)
class Planned:
    run: Run
    updates: int
    seconds: float


def updates_of(params: dict, recipe: str, data: Path) -> int:
    """The optimizer updates a run of `recipe` makes (train.max_updates, else epochs x epoch 1's
    batches; with patience, at most that)."""
    settings = resolve(params, recipe)
    train, max_len = settings["train"], settings["model"]["max_len"]
    if train["max_updates"]:
        return train["max_updates"]
    codecs = load_codecs(data / "vocab" / recipe)
    pairs = load_pairs(data / "tokenized", "train", *codecs, max_len)
    if settings["data"]["max_train_pairs"]:
        pairs = pairs[: settings["data"]["max_train_pairs"]]
    batches = Batches.for_training(pairs, train, seed=0)
    return train["epochs"] * math.ceil(len(batches.indices(0)) / train["accumulate"])


def ms_per_update(check: Path | None, given: float = 0.0) -> tuple[float, str]:
    """The milliseconds an update, and where the figure comes from."""
    if given:
        return given, "given (--ms)"
    if check is None or not check.exists():
        return UNMEASURED_MS, "not measured (an eager H100 update)"
    report = json.loads(check.read_text())
    timed = report["equivalence"]  # eager and graphed updates over the same batches
    if timed["graphs_cuda_graphs"] > 0 and report["ok"]:
        return timed["graphs_ms_per_update"], "measured, CUDA graphs"
    return timed["eager_ms_per_update"], "measured, eager (no graph passed the check)"


def in_priority(pipeline_runs: list[Run], extra: list[Run]) -> list[Run]:
    """FIRST, the rest of its recipe's runs, extra (asked for by name: a second seed of the
    comparison, say), then the other recipes' runs as params.yaml lists them."""
    ordered = [run for run in FIRST if run in pipeline_runs]
    ordered += [run for run in pipeline_runs if run.recipe == FIRST[0].recipe]
    ordered += extra + pipeline_runs
    return list(dict.fromkeys(ordered))  # each once, in that order


def plan(candidates: list[Planned], seconds: float) -> list[Planned]:
    """The candidates, in order, whose summed seconds fit; one that does not fit is skipped.
    The published pair starts even when it does not fit: it resumes on the next call."""
    chosen = [c for c in candidates if c.run in FIRST]
    used = sum(c.seconds for c in chosen)
    for candidate in candidates[len(chosen):]:
        if used + candidate.seconds <= seconds:
            chosen.append(candidate)
            used += candidate.seconds
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="minutes left to train in")
    parser.add_argument("--check", type=Path, help="check_graphs.json of this machine")
    parser.add_argument("--extra", nargs="*", default=[],
                        help="more runs, e.g. published-scratch-s1")
    parser.add_argument("--ms", type=float, default=0.0,
                        help="ms an update, measured earlier on this kind of GPU (no --check)")
    parser.add_argument("--targets", type=Path, help="write the Snakemake targets here")
    parser.add_argument("--stages", type=Path, help="write the planned runs' DVC stages here")
    parser.add_argument("--narrowed", type=Path,
                        help="write params.yaml cut to the recipes whose runs are all planned")
    parser.add_argument("--data", type=Path, default=REPO / "data")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    args = parser.parse_args()
    params = load_params(args.params)
    pipeline_runs = runs(params)
    order = in_priority(pipeline_runs, [Run.parse(name) for name in args.extra])
    ms, source = ms_per_update(args.check, args.ms)
    recipes = {run.recipe for run in order}
    updates = {recipe: updates_of(params, recipe, args.data) for recipe in recipes}
    candidates = [Planned(run, updates[run.recipe],
                          updates[run.recipe] * ms / 1000 * (1 + VALIDATION_SHARE))
                  for run in order]
    budget = 60 * args.minutes - AFTER_TRAINING
    chosen = plan(candidates, budget)
    print(f"plan: {ms:.1f} ms an update ({source}); {args.minutes:.1f} min left, "
          f"{budget:.0f} s to train in after {AFTER_TRAINING} s for evaluation and the report")
    for candidate in candidates:
        mark = "yes" if candidate in chosen else "no "
        print(f"  {mark} {candidate.run.name:32} {candidate.updates:7,} updates "
              f"~{candidate.seconds:6.0f} s")
    whole = all(run in [c.run for c in chosen] for run in pipeline_runs)
    used = sum(c.seconds for c in chosen)
    if used > budget:
        print("plan: even the published pair does not fit: it trains what it can and keeps its "
              "resume state (the same command again, on this machine, goes on)")
    print(f"plan: {len(chosen)} of {len(candidates)} runs, ~{used / 60:.1f} min of training; "
          + ("the whole pipeline fits" if whole else
             "the whole pipeline does NOT fit: training what fits, in the order above"))
    if args.targets:
        targets = [str(c.run.files().metrics) for c in chosen] + ["results/bench.json"]
        targets += ["reports/report.md"] if whole else []
        args.targets.write_text("".join(f"{t}\n" for t in targets))
    if args.stages:
        args.stages.write_text("".join(f"{stage}@{c.run.recipe}-{c.run.model}-{c.run.seed}\n"
                                       for c in chosen for stage in ("train", "evaluate")))
    complete = [recipe for recipe in params["pipeline"]["recipes"]
                if all(run in [c.run for c in chosen] for run in pipeline_runs
                       if run.recipe == recipe)]
    if args.narrowed and complete and not whole:
        narrowed = read_yaml(args.params.read_text())
        narrowed["pipeline"]["recipes"] = complete
        args.narrowed.write_text(yaml.safe_dump(narrowed, sort_keys=False))
        print(f"plan: the report covers recipe(s) {', '.join(complete)} ({args.narrowed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
