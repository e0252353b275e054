"""Plan a GPU machine's minutes: which runs of the pipeline fit in what is left, in what order.

    python3 tools/gpu/plan.py --minutes 6.5 [--check $OUT/check_graphs.json] [--extra RUN ...]
        [--concurrency concurrency.json] [--profile workflow/profiles/gpu/config.yaml]
        [--targets FILE] [--params params.yaml] [--data data] [--results results]

The runs' optimizer updates come from the data (each recipe's batches of epoch 1 times its
epochs, or train.max_updates); a run's seconds are its updates times the milliseconds an update
that tools/gpu/check_graphs.py measured on this machine (graphed when a graph was captured and
the graph check passed, else eager), plus a share for validation: its seconds alone on the GPU.

The concurrency model: the planned runs train at once, at most the GPU profile's `gpu` units of
them (--profile). S(N), the aggregate updates a second of N trainings at once over one alone's,
comes from tools/gpu/concurrency.py's JSON (--concurrency; linear between the measured N, the
largest's beyond it). Runs of s_1 .. s_k seconds alone then take about
max(sum(s_i) / S(min(k, units)), max(s_i)): the GPU's work done at the aggregate speed, and no
run faster than alone. It is rough: when runs differ in length, fewer than N run near the end.
Without a measurement S(N) = 1 for every N: the trainings take turns on the GPU and their
seconds add up (the H100 and H200 runs so far: four at once ~20 s an epoch each, one alone ~5 s).

A run whose metrics.json results/ holds is done (an earlier call on this machine finished it):
it costs no seconds and stays among the targets (Snakemake finds it up to date). On the first
H200 study session the plan counted the finished published pair again, and a second call of
4.1 minutes had room for one new run.

Runs are taken in priority order: the published recipe's baseline and scratch first (the
comparison this project exists for), then the --extra runs in the order given (a second seed,
say, or a study's own order), then the rest of that recipe's runs, then the other recipes' runs
of params.yaml's pipeline, each recipe's seed by seed; a run that does not fit is left out and
the next is tried. Prints the plan as a table and one line saying whether the whole pipeline
fits; --targets writes the Snakemake targets, one a line (each planned run's evaluation, the
bench, and the report when every run of the pipeline is in). When only some runs are in,
--narrowed writes params.yaml with pipeline.recipes and pipeline.seeds cut to the recipes and
seeds trained whole (the report of what was trained: `nmt --params FILE report`), and --stages
the DVC stages of the planned runs (what `dvc commit` can record). tools/gpu/run.sh runs it
(step 4, with step 3's concurrency JSON where it ran; docs/gpu.md): its plan chose the runs that
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
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.params_file import read_yaml  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402

FIRST = (Run("published", "baseline"), Run("published", "scratch"))  # the comparison itself
VALIDATION_SHARE = 0.15  # validation and the end-of-run greedy BLEU, on top of the updates
AFTER_TRAINING = 90  # seconds for the evaluations, the bench and the report after the last run
UNMEASURED_MS = 60.0  # an eager published update on an H100 (46-68 ms): without a measurement


@dataclass(frozen=True)
class Planned:
    run: Run
    updates: int
    seconds: float  # alone on the GPU


@dataclass(frozen=True)
class Concurrency:
    """The concurrency model: S(N), the aggregate throughput of N trainings at once relative to
    one alone, measured at some N; `jobs`, the most that run at once (the profile's units)."""

    factors: dict[int, float]  # N -> S(N); {1: 1.0} alone: seconds add up
    jobs: int
    source: str  # where the factors come from, for the printed plan

    def factor(self, count: int) -> float:
        """S(count): linear between the measured counts, the largest's beyond it."""
        measured = sorted(self.factors.items())
        below = [(n, f) for n, f in measured if n <= count]
        above = [(n, f) for n, f in measured if n >= count]
        if not above:
            return measured[-1][1]
        (n0, f0), (n1, f1) = below[-1], above[0]
        return f0 if n1 == n0 else f0 + (f1 - f0) * (count - n0) / (n1 - n0)

    def wall(self, seconds: list[float]) -> float:
        """About how long runs of these seconds (each alone) take together: their sum at the
        aggregate speed of min(runs, jobs) at once, and no less than the longest alone."""
        if not seconds:
            return 0.0
        at_once = min(len(seconds), self.jobs)
        return max(sum(seconds) / self.factor(at_once), max(seconds))


def no_gain(jobs: int = 1) -> Concurrency:
    """S(N) = 1: trainings take turns on the GPU, their seconds add up (no measurement)."""
    return Concurrency({1: 1.0}, jobs, "none measured: S(N) = 1, the runs' seconds add up")


def read_concurrency(path: Path, jobs: int) -> Concurrency:
    """tools/gpu/concurrency.py's JSON: its factors {"N": S(N)}, "1" among them; ValueError
    saying what is wrong with the file otherwise."""
    try:
        report = json.loads(path.read_text())
        factors = {int(n): float(f) for n, f in report["factors"].items()}
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError,
            ValueError) as error:
        raise ValueError(f"{path}: not concurrency.py's JSON ({type(error).__name__}: "
                         f"{error}); want {{\"factors\": {{\"1\": 1.0, \"3\": ...}}}}") from None
    if factors.get(1) != 1.0 or min(factors) < 1 or not all(f > 0 for f in factors.values()):
        raise ValueError(f"{path}: factors {report['factors']} are not S(N) > 0 for N >= 1 "
                         "with S(1) = 1.0")
    mps = "on" if report.get("mps") else "off"
    measured = ", ".join(f"S({n}) = {f:.2f}" for n, f in sorted(factors.items()))
    return Concurrency(factors, jobs, f"measured ({path.name}, MPS {mps}): {measured}")


def profile_jobs(profile: Path) -> int:
    """The most trainings the GPU profile runs at once: its `gpu` units."""
    resources = yaml.safe_load(profile.read_text())["resources"]
    return int(next(item for item in resources if item.startswith("gpu=")).split("=")[1])


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
    """FIRST, extra in the order given (asked for by name: the study's own order, say, the
    comparison's seeds before the decoder-only model's), the rest of FIRST's recipe's runs, then
    the other recipes' runs; within a recipe seed by seed (each seed's models together), so
    that what fits is whole seeds of the comparison, not one model's three seeds and its
    twin's one."""
    seeds = list(dict.fromkeys(run.seed for run in pipeline_runs))
    by_seed = sorted(pipeline_runs, key=lambda run: seeds.index(run.seed))  # stable: models
    ordered = [run for run in FIRST if run in pipeline_runs]
    ordered += extra
    ordered += [run for run in by_seed if run.recipe == FIRST[0].recipe]
    ordered += [run for recipe in dict.fromkeys(run.recipe for run in pipeline_runs)
                for run in by_seed if run.recipe == recipe]
    return list(dict.fromkeys(ordered))  # each once, in that order


def covered(params: dict, planned: list[Run]) -> tuple[list[str], list[int]]:
    """The recipes and seeds of the pipeline whose every run is planned, chosen to cover the
    most runs (more seeds first among equals: they are what the verdict rests on); ([], [])
    when none is whole."""
    pipeline, best = params["pipeline"], ([], [])
    for kept in range(len(pipeline["seeds"]), 0, -1):
        seeds = pipeline["seeds"][:kept]
        recipes = [recipe for recipe in pipeline["recipes"]
                   if all(Run(recipe, model, seed) in planned
                          for model in pipeline["models"] for seed in seeds)]
        if len(recipes) * kept > len(best[0]) * len(best[1]):
            best = (recipes, seeds)
    return best


def plan(candidates: list[Planned], seconds: float,
         concurrency: Concurrency | None = None) -> list[Planned]:
    """The candidates, in order, that fit in `seconds` run at once (concurrency.wall; without
    a model their seconds add up); one that does not fit is skipped. The published pair starts
    even when it does not fit: it resumes on the next call."""
    concurrency = concurrency or no_gain()
    chosen = [c for c in candidates if c.run in FIRST]
    for candidate in candidates[len(chosen):]:
        if concurrency.wall([c.seconds for c in chosen + [candidate]]) <= seconds:
            chosen.append(candidate)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="minutes left to train in")
    parser.add_argument("--check", type=Path, help="check_graphs.json of this machine")
    parser.add_argument("--extra", nargs="*", default=[],
                        help="more runs, e.g. published-scratch-s1")
    parser.add_argument("--ms", type=float, default=0.0,
                        help="ms an update, measured earlier on this kind of GPU (no --check)")
    parser.add_argument("--concurrency", type=Path,
                        help="tools/gpu/concurrency.py's JSON: S(N) of this machine")
    parser.add_argument("--profile", type=Path,
                        default=REPO / "workflow" / "profiles" / "gpu" / "config.yaml",
                        help="the Snakemake profile the trainings run under (its gpu units)")
    parser.add_argument("--targets", type=Path, help="write the Snakemake targets here")
    parser.add_argument("--stages", type=Path, help="write the planned runs' DVC stages here")
    parser.add_argument("--narrowed", type=Path,
                        help="write params.yaml cut to the recipes whose runs are all planned")
    parser.add_argument("--data", type=Path, default=REPO / "data")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--results", type=Path, default=REPO / "results",
                        help="where finished runs are (their metrics.json): they cost nothing")
    args = parser.parse_args()
    jobs = profile_jobs(args.profile)
    try:
        concurrency = read_concurrency(args.concurrency, jobs) if args.concurrency else \
            no_gain(jobs)
    except ValueError as error:
        parser.exit(2, f"plan.py: error: --concurrency {error}\n")
    params = load_params(args.params)
    pipeline_runs = runs(params)
    order = in_priority(pipeline_runs, [Run.parse(name) for name in args.extra])
    ms, source = ms_per_update(args.check, args.ms)
    recipes = {run.recipe for run in order}
    updates = {recipe: updates_of(params, recipe, args.data) for recipe in recipes}
    done = {run for run in order if run.files(args.results).metrics.exists()}
    candidates = [Planned(run, updates[run.recipe], 0.0 if run in done else
                          updates[run.recipe] * ms / 1000 * (1 + VALIDATION_SHARE))
                  for run in order]
    budget = 60 * args.minutes - AFTER_TRAINING
    chosen = plan(candidates, budget, concurrency)
    print(f"plan: {ms:.1f} ms an update ({source}); {args.minutes:.1f} min left, "
          f"{budget:.0f} s to train in after {AFTER_TRAINING} s for evaluation and the report")
    print(f"plan: concurrency {concurrency.source}; up to {jobs} trainings at once "
          f"({args.profile.name} of {args.profile.parent.name})")
    for candidate in candidates:
        mark = "done" if candidate.run in done else "yes" if candidate in chosen else "no "
        print(f"  {mark} {candidate.run.name:32} {candidate.updates:7,} updates "
              f"~{candidate.seconds:6.0f} s alone")
    whole = all(run in [c.run for c in chosen] for run in pipeline_runs)
    used = concurrency.wall([c.seconds for c in chosen])
    if used > budget:
        print("plan: even the published pair does not fit: it trains what it can and keeps its "
              "resume state (the same command again, on this machine, goes on)")
    print(f"plan: {len(chosen)} of {len(candidates)} runs, ~{used / 60:.1f} min of training "
          f"at once (~{sum(c.seconds for c in chosen) / 60:.1f} alone, one after another); "
          + ("the whole pipeline fits" if whole else
             "the whole pipeline does NOT fit: training what fits, in the order above"))
    if args.targets:
        targets = [str(c.run.files().metrics) for c in chosen] + ["results/bench.json"]
        targets += ["reports/report.md"] if whole else []
        args.targets.write_text("".join(f"{t}\n" for t in targets))
    if args.stages:
        args.stages.write_text("".join(f"{stage}@{c.run.recipe}-{c.run.model}-{c.run.seed}\n"
                                       for c in chosen for stage in ("train", "evaluate")))
    recipes, seeds = covered(params, [c.run for c in chosen])
    if args.narrowed and recipes and not whole:
        narrowed = read_yaml(args.params.read_text())
        narrowed["pipeline"].update(recipes=recipes, seeds=seeds)
        args.narrowed.write_text(yaml.safe_dump(narrowed, sort_keys=False))
        print(f"plan: the report covers recipe(s) {', '.join(recipes)}, seed(s) "
              f"{', '.join(map(str, seeds))} ({args.narrowed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
