"""`nmt adopt`: record a finished Snakemake run in dvc.lock, so that `dvc repro` re-runs nothing
Snakemake made (issue 69 item 2: either orchestrator, alternately, in one checkout).

DVC knows a stage's outputs as current only through dvc.lock, which Snakemake does not write:
after a Snakemake run, `dvc repro` would delete and train every run again (its config stage
refuses first: nmt.pipeline.preflight.check_known_to_dvc). Adopting is safe only for what
Snakemake holds up to date, so it refuses unless `snakemake -n` has nothing to do; then it
writes the two files only DVC's stages write (params/names.yaml, params/<recipe>.yaml, as
`nmt names` and `nmt config` do) and runs `dvc commit --force`, which hashes every stage's
dependencies and outputs into dvc.lock without running anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.pipeline import orchestrators
from nmt.pipeline.preflight import OUTPUT_FOLDERS
from nmt.stages import config, names

HELP = ("Record a finished Snakemake run in dvc.lock (dvc commit --force), so that dvc repro "
        "trains nothing again; refused unless snakemake -n has nothing to do.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cores", type=int, default=1, help="for the snakemake -n check")


def command(args, params: dict) -> None:
    orchestrators.refuse_others(doing="nmt adopt")
    tools = {tool: shutil.which(tool) for tool in ("snakemake", "dvc")}
    if missing := [tool for tool, path in tools.items() if path is None]:
        raise NmtError(f"{' and '.join(missing)} not found (fix: make setup, and run nmt "
                       "adopt with the project's environment active)")
    plan = subprocess.run([tools["snakemake"], "-n", "--cores", str(args.cores)],
                          capture_output=True, text=True)
    said = plan.stdout + plan.stderr
    if plan.returncode != 0 or "Nothing to be done" not in said:
        jobs = [line for line in said.splitlines() if line.startswith(("rule ", "localrule "))]
        raise NmtError(f"snakemake -n has {len(jobs)} job(s) to do: only a finished run can be "
                       "recorded for DVC (fix: run snakemake until it has nothing to do, then "
                       "nmt adopt again)")
    names.names(params, names.OUT)
    for recipe in params["pipeline"]["recipes"]:
        config.config(params, recipe, config.Paths(out=Path("params") / f"{recipe}.yaml"))
    times = output_times()
    done = subprocess.run([tools["dvc"], "commit", "--force", "--quiet"],
                          capture_output=True, text=True)
    for path, (atime, mtime) in times.items():  # DVC links each output back from its cache
        os.utime(path, ns=(atime, mtime), follow_symlinks=False)
    if done.returncode != 0:
        raise NmtError(f"dvc commit failed: {(done.stderr or done.stdout).strip()[-300:]}")
    print("nmt adopt: dvc.lock records the Snakemake run; dvc repro re-runs only what changes")


def output_times() -> dict[Path, tuple[int, int]]:
    """Every file in the folders stages write, with its access and modification times: `dvc
    commit` gives each output a new time as it links it back from the cache, in its own order,
    and a Snakemake without its records of them (only times to compare) would run again the
    jobs whose inputs it saw made later than their outputs."""
    return {path: (path.lstat().st_atime_ns, path.lstat().st_mtime_ns)
            for folder in OUTPUT_FOLDERS if Path(folder).is_dir()
            for path in Path(folder).rglob("*") if path.is_file() or path.is_symlink()}
