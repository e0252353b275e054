"""`nmt check`: is the data what its stages wrote? Every SHA256SUMS against its folder's files,
and every DVC output's cache object against its name; one line for each damaged file, for a
record that cannot be read as one, and for DVC's cached copies that are gone (the whole
cache, or a stage's), with its fix, and exit status 1 when there is one.

The readers check a file against its record only when they read it (nmt.core.records), and
neither DVC (which trusts its cache and the time stamps of its state) nor Snakemake (time
stamps) hashes anything when it says a pipeline is up to date: a byte changed in a cached
object, or in a tracked file whose mtime was kept (`cp -p`), is seen by neither. This reads
every byte once: seconds at the published size (docs/faults.md).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import yaml

from nmt.core.dvc_cache import CachedFile, cache_folder, intact, md5, stage_files
from nmt.core.errors import NmtError
from nmt.core.records import RECORD, check_entry, covered_files, read_sums, recorded_stage

log = logging.getLogger("nmt.check")

# The folders whose stages write a record (download, tokenize, vocab, evaluate, export).
RECORDED = ("data", "results", "exports")

HELP = ("Check that the data is what its stages wrote: every folder's SHA256SUMS against its "
        "files, and DVC's cached copy of every output against its md5 (or gone); one line for "
        "each damaged or missing file with its fix, exit status 1 if there is one.")


def arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--root", type=Path, default=Path("."), help="the checkout (default: here)")


def command(args, params: dict) -> int:
    records = sorted(p for top in RECORDED for p in (args.root / top).rglob(RECORD))
    damaged = [line for record in records for line in record_lines(record)]
    cached = stage_files(args.root)
    rerun_repairs = {recorded_stage(record) for record in records}
    damaged += [cache_line(c, args.root, c.stage in rerun_repairs)
                for c in cached if not intact(c)]
    uncached = uncached_outputs(args.root)
    damaged += missing_lines([c for c in cached if not c.object.is_file()
                              and c.path.as_posix() not in uncached], args.root)
    for line in damaged:
        print(line)
    log.info(f"{len(damaged)} damaged: checked {len(records)} SHA256SUMS and the DVC cache "
             f"objects of {len(cached)} files")
    return 1 if damaged else 0


def record_lines(record: Path) -> list[str]:
    """One line for each file the record lists that is missing or differs, and each file in
    the folder it does not list."""
    try:
        folder, listed = record.parent, read_sums(record)
    except NmtError as e:  # the record itself: one line, not a line for each file it lists
        return [str(e)]
    lines = []
    for name in sorted(set(covered_files(folder)) | set(listed)):
        try:
            check_entry(folder / name, listed.get(name), record)
        except NmtError as e:
            lines.append(str(e))
    return lines


def missing_lines(missing: list[CachedFile], root: Path) -> list[str]:
    """DVC's cached copies that are gone, which `dvc checkout` cannot restore: one line for
    the whole cache when its folder is gone, else one a stage."""
    if not missing:
        return []
    cache = cache_folder(root)
    if cache is not None and not cache.is_dir():
        return [f"{cache}: DVC's cache is gone, so `dvc checkout` can restore none of the "
                f"{len(missing)} outputs dvc.lock lists (fix: `dvc commit -f`, which copies the "
                "outputs in the workspace into it again, once the lines above, if any, are "
                "mended)"]
    by_stage: dict[str, list[CachedFile]] = {}
    for cached in missing:
        by_stage.setdefault(cached.stage, []).append(cached)
    return [f"{files[0].path}{f' and {len(files) - 1} more' if len(files) > 1 else ''}: "
            f"DVC's cached copy is missing, so `dvc checkout` cannot restore it (fix: "
            f"`dvc commit -f {stage}`, from the workspace's copy, or `dvc repro -f -s {stage}`)"
            for stage, files in by_stage.items()]


def uncached_outputs(root: Path) -> set[str]:
    """The outputs dvc.yaml keeps out of DVC's cache (`cache: false`: params/sources.sha256),
    by the path dvc.lock gives them: they have no cached copy to miss."""
    try:
        stages = (yaml.safe_load((root / "dvc.yaml").read_text()) or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return set()
    return {path for stage in stages.values()
            for out in [*(stage.get("outs") or []), *(stage.get("metrics") or []),
                        *(stage.get("plots") or [])]
            if isinstance(out, dict) for path, opts in out.items()
            if (opts or {}).get("cache") is False and "${" not in path}


def cache_line(cached: CachedFile, root: Path, rerun_repairs: bool) -> str:
    """A damaged cache object and its fix: the stage re-run where that repairs it (a stage
    that writes a record removes its damaged objects, nmt.core.dvc_cache), else the object
    removed and the intact workspace copy committed again, or the stage re-run when that copy
    is damaged too."""
    rerun = f"`dvc repro -f -s {cached.stage}`"
    workspace = root / cached.path
    if rerun_repairs:
        fix = rerun
    elif workspace.is_file() and md5(workspace) == cached.md5:
        fix = f"`rm -f {cached.object}`, then `dvc commit -f {cached.stage}`"
    else:
        fix = f"`rm -f {cached.object}`, then {rerun}"
    return (f"{cached.path}: DVC's cached copy {cached.object} is damaged: its md5 is not its "
            f"name, and `dvc checkout` would restore it as it is (fix: {fix})")

