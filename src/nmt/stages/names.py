"""Stage names: the names params.yaml gives the pipeline's files, checked before DVC deletes
a file whose path holds one.

dvc.yaml's stages loop over pipeline.recipes, models, seeds and export, and name bench.recipe;
DVC reads those values from params.yaml when it loads dvc.yaml, makes paths of them
(params/<recipe>.yaml, results/<recipe>-<model>-s<seed>/...) and deletes a stage's outputs
before it runs the stage's command. So a value such as `../../x` in pipeline.recipes once
had `dvc repro` delete params/../../x.yaml, outside the checkout, before `nmt config` refused
it. This stage's paths hold no name, and every stage is downstream of its file (config
depends on it, the rest on config's files): DVC runs it first, and its `nmt` command, which
validates params.yaml before anything else (nmt.cli), stops the run with one line when a
name does not match `^[a-z][a-z0-9_]*$`. It re-runs whenever one of the values changes, and
DVC records them in dvc.lock only once they passed. Snakemake checks the same values when it
reads the workflow (workflow/Snakefile), so under it nothing needs this stage's file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from nmt.core.files import write_text

OUT = Path("params/names.yaml")


def names(params: dict, out: Path = OUT) -> None:
    """Write the pipeline's names (validated by now) to `out`, only when they changed: an
    unchanged list keeps its bytes, and config, which depends on it, does not re-run."""
    pipeline = params["pipeline"]
    text = yaml.safe_dump({"recipes": list(pipeline["recipes"]), "models": list(pipeline["models"]),
                           "seeds": list(pipeline["seeds"]), "export": list(pipeline["export"]),
                           "bench": params["bench"]["recipe"]}, sort_keys=False)
    if not out.is_file() or out.read_text() != text:
        write_text(out, text)


# ---- `nmt names`: nmt.cli builds the subcommand from HELP, arguments and command -----------------

HELP = ("Check the names params.yaml gives the pipeline's files (pipeline.recipes, models, "
        "seeds, export, bench.recipe) and write them to params/names.yaml; DVC runs it before "
        "any stage whose paths hold them.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=OUT)


def command(args, params: dict) -> None:
    names(params, args.out)
