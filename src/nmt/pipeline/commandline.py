"""What the `nmt` subcommands share: the folders their options default to, the option groups
several stages take, and the thread count a torch stage runs with.

Each stage module says its own command line next to its stage function (HELP, `arguments`,
`command`; see nmt.stages), and nmt.cli builds one subcommand a stage from them. The defaults
serve a person typing `nmt train --model scratch` at the repository root; workflow/stages.yaml
spells every path out in the stage's command.

Imports no torch (the `nmt train` that only launches torchrun's processes runs with it).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.models.registry import names

RAW, TOKENIZED, VOCAB, RESULTS, REPORTS, EXPORTS = (
    Path("data/raw"), Path("data/tokenized"), Path("data/vocab"), Path("results"), Path("reports"),
    Path("exports"))


# ---- option groups several stages take, declared once ---------------------------------------

def recipe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", default="published", help="a recipe of params.yaml")


def data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenized", type=Path, default=TOKENIZED)
    parser.add_argument("--vocab", type=Path, default=None,
                        help="the recipe's vocabulary (default: data/vocab/<recipe>)")


def results(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=RESULTS, help="holds the run folders")


def run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, choices=names())
    parser.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")


def threads(parser: argparse.ArgumentParser) -> None:
    """--threads: torch's threads (nmt.cli sets them before the stage runs, thread_count)."""
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads, at most the machine's cores (default: "
                             "OMP_NUM_THREADS, else torch's own)")


def gpu(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-mem-mb", type=int, default=0, metavar="MB",
                        help="bound this process's CUDA memory at MB megabytes, so that jobs "
                             "sharing one GPU cannot starve one another (default 0: "
                             "NMT_GPU_MEM_MB if set, else no bound)")


def run_options(parser: argparse.ArgumentParser, gpu_bound: bool = True) -> None:
    """What a stage of one run (recipe, model, seed) takes: train, evaluate, export."""
    for group in (recipe, data, results, run, threads) + ((gpu,) if gpu_bound else ()):
        group(parser)


def recipe_vocab(args) -> Path:
    """--vocab, else data/vocab/<recipe>: the recipe's own vocabulary folder."""
    return args.vocab or VOCAB / args.recipe


# ---- threads ----------------------------------------------------------------------------------

def set_threads(threads: int | None) -> None:
    """torch's thread count, set explicitly (so MKL, which Snakemake's MKL_NUM_THREADS would
    otherwise steer, follows it too) where thread_count gives one; else torch's default."""
    count = thread_count(threads)
    if count is not None:
        import torch

        torch.set_num_threads(count)


def thread_count(threads: int | None) -> int | None:
    """--threads N, at most the cores the process may use, else OMP_NUM_THREADS when set (the
    processes torchrun starts get theirs that way); None: neither is given. The declaration's
    `threads:` reaches every torch stage as --threads, under DVC and Snakemake alike, so both
    give the same numbers."""
    wanted = omp_threads() if checked_threads(threads) is None else threads
    return None if wanted is None else min(wanted, usable_cores())


def checked_threads(threads: int | None) -> int | None:
    """--threads as given (None: not given), refused unless it is 1 or more: torch's threads,
    or tokenize's processes, which would otherwise quietly become one."""
    if threads is not None and threads < 1:
        raise NmtError(f"--threads {threads}: a count of threads is 1 or more (fix: --threads 1 "
                       f"to {usable_cores()}, the cores this process may use)")
    return threads


def omp_threads() -> int | None:
    """OMP_NUM_THREADS's count of threads, None when unset. OpenMP reads a list, a count for
    each level of nesting ("4,2"), and torch runs on the first. A value OpenMP cannot read
    (libgomp prints a warning at torch's import and runs on its own count) is refused:
    nmt.cli checks it before any stage imports torch."""
    value = os.environ.get("OMP_NUM_THREADS")
    if value is None:
        return None
    counts = value.split(",")
    if not all(re.fullmatch(r"\s*\+?[0-9]+\s*", c) and int(c) > 0 for c in counts):
        raise NmtError(f"OMP_NUM_THREADS={value!r} is not a count of threads (fix: a whole "
                       "number of 1 or more, e.g. OMP_NUM_THREADS=4, or unset it)")
    return int(counts[0])


def torch_threads() -> int:
    """torch's own thread count: what a process that set none trains with."""
    import torch

    return torch.get_num_threads()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system keeps one (taskset,
    a Slurm job's binding, a container's cpuset), else the machine's count. More threads than
    that only take turns on the same cores."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
