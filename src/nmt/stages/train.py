"""Stage train: fit one model of one recipe. The work is nmt.training (the loop:
nmt.training.loop.train, which `fit` calls); the rest of this module is its command line.

`nmt train` with train.devices N > 1 only starts torchrun's N processes and waits
(nmt.training.launch), and that process imports no torch (about 2 s of CPU a launch). nmt.cli
imports this module to build the subcommand, so it imports no torch either: the loop is
imported when a training runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from nmt.core.runs import Run
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.training.launch import launch, under_torchrun

if TYPE_CHECKING:
    from nmt.training.state import Paths


def launches(recipe: dict) -> bool:
    """Whether this process only starts torchrun's train.devices processes (each of which
    runs `fit`) and waits: nmt.training.launch sets up what they share."""
    return recipe["train"]["devices"] > 1 and not under_torchrun()


def fit(recipe: dict, paths: Paths, restart: bool = False) -> int | None:
    """Stage train: nmt.training.loop.train on one run's files; a stop (Ctrl-C, SIGTERM, a
    fault point) becomes its exit status, the resume state kept."""
    from nmt.training.loop import train
    from nmt.training.resume import Stopped

    try:
        train(recipe, paths, restart=restart)
    except Stopped as e:
        if str(e):
            print(f"nmt train: {e}", file=sys.stderr)
        return e.code
    return None


# ---- `nmt train`: nmt.cli builds the subcommand from HELP, arguments and command ------------

HELP = ("Read data/tokenized and data/vocab/<recipe>, train one model and write "
        "results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv, train.json "
        "(when training completes). An interrupted run (Ctrl-C, SIGTERM, a crash) keeps "
        "resume.pt there; the same command continues it with the numbers an "
        "uninterrupted run gives.")
# What to make smaller when it runs out of memory (nmt.core.errors.out_of_memory).
MEMORY_FIX = ("a smaller train.max_tokens (token batches) or train.batch_size, with a larger "
              "train.accumulate for the same updates, or a smaller model; a training resumes "
              "from its last resume state")
# nmt.cli sets no torch threads before `command`: it sets its own once it knows whether it
# only launches torchrun's processes (which must not import torch).
SETS_OWN_THREADS = True


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.run_options(parser)
    parser.add_argument("--restart", action="store_true",
                        help="set aside a resume state (resume.pt) and train from scratch")


def command(args, params: dict) -> int | None:
    run, recipe = Run(args.recipe, args.model, args.seed), resolve(params, args.recipe)
    if launches(recipe):  # a launcher: no torch here
        return launch(recipe["train"]["devices"], train_argv(args),
                      commandline.thread_count(args.threads) or commandline.torch_threads())
    commandline.set_threads(args.threads)
    from nmt.training.state import Paths

    return fit(recipe, Paths(tokenized=args.tokenized, vocab=commandline.recipe_vocab(args),
                             run=run.files(args.results)), restart=args.restart)


def train_argv(args) -> list[str]:
    """This `nmt train` command line, for the processes torchrun starts (their threads come
    from OMP_NUM_THREADS: nmt.training.launch shares this process's out)."""
    return (["--params", str(args.params)] + (["-q"] if args.quiet else []) +
            ["train", "--recipe", args.recipe, "--model", args.model, "--seed", str(args.seed),
             "--tokenized", str(args.tokenized), "--vocab", str(commandline.recipe_vocab(args)),
             "--results", str(args.results)] + (["--restart"] if args.restart else []))


def interrupted_note(args) -> str:
    """What a Ctrl-C outside the training loop (which answers with its own line) leaves."""
    state = Run(args.recipe, args.model, args.seed).files(args.results).resume
    return (f"outputs appear only when training completes; {state}, if there, is kept "
            "and the same nmt train command resumes from it")
