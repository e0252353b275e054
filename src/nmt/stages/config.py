"""Stage config: validate params.yaml and write one recipe's resolved settings.

DVC runs it first after any params edit, so a job bound to fail stops here, before `dvc repro`
deletes its outputs (Snakemake runs the same checks itself, when it reads the workflow). The
file it writes, params/<recipe>.yaml, is what the recipe stages declare their keys of, so a
params edit re-runs exactly the recipes whose values changed.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from nmt.core.files import write_text
from nmt.pipeline import commandline, orchestrators, preflight
from nmt.pipeline.recipes import resolve


@dataclass(frozen=True)
class Paths:
    out: Path  # params/<recipe>.yaml


def config(params: dict, recipe: str, paths: Paths) -> None:
    """Write the recipe's resolved settings (the command checks params.yaml first)."""
    # Written only when its content changes: an unchanged recipe keeps its bytes and mtime.
    text = yaml.safe_dump(resolve(params, recipe), sort_keys=True)
    if not paths.out.is_file() or paths.out.read_text() != text:
        write_text(paths.out, text)


# ---- `nmt config`: nmt.cli builds the subcommand from HELP, arguments and command ----------------

HELP = ("Resolve one recipe (the top-level sections with its overrides merged over "
        "them) and write params/<recipe>.yaml, whose keys the later stages "
        "declare as parameters.")


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.recipe(parser)
    parser.add_argument("--out", type=Path, default=None, help="default: params/<recipe>.yaml")


def command(args, params: dict) -> None:
    # Every section and what would make a later job fail: the command line's checks, which
    # refuse and change nothing written (so no edit of them re-runs this stage).
    preflight.check_settings(params)
    preflight.check_devices(params)
    if orchestrators.run_by_dvc():  # runs Snakemake trained, unknown to DVC: not again
        preflight.check_known_to_dvc(params)
    config(params, args.recipe, Paths(out=args.out or Path("params") / f"{args.recipe}.yaml"))
