"""`nmt check`: is the data what its stages wrote? Every SHA256SUMS against its folder's files,
and every DVC output's cache object against its name; one line for each damaged file, with
its fix, and exit status 1 when there is one.

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

from nmt.core.dvc_cache import CachedFile, intact, md5, stage_files
from nmt.core.errors import NmtError
from nmt.core.records import RECORD, check_entry, covered_files, read_sums, recorded_stage

log = logging.getLogger("nmt.check")

# The folders whose stages write a record (download, tokenize, vocab, evaluate, export).
RECORDED = ("data", "results", "exports")

HELP = ("Check that the data is what its stages wrote: every folder's SHA256SUMS against its "
        "files, and DVC's cached copy of every output against its md5; one line for each "
        "damaged file with its fix, exit status 1 if there is one.")


def arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--root", type=Path, default=Path("."), help="the checkout (default: here)")


def command(args, params: dict) -> int:
    records = sorted(p for top in RECORDED for p in (args.root / top).rglob(RECORD))
    damaged = [line for record in records for line in record_lines(record)]
    cached = stage_files(args.root)
    rerun_repairs = {recorded_stage(record) for record in records}
    damaged += [cache_line(c, args.root, c.stage in rerun_repairs)
                for c in cached if not intact(c)]
    for line in damaged:
        print(line)
    log.info(f"{len(damaged)} damaged: checked {len(records)} SHA256SUMS and the DVC cache "
             f"objects of {len(cached)} files")
    return 1 if damaged else 0


def record_lines(record: Path) -> list[str]:
    """One line for each file the record lists that is missing or differs, and each file in
    the folder it does not list."""
    folder, listed = record.parent, read_sums(record)
    lines = []
    for name in sorted(set(covered_files(folder)) | set(listed)):
        try:
            check_entry(folder / name, listed.get(name), record)
        except NmtError as e:
            lines.append(str(e))
    return lines


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

