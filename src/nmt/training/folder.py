"""A run's folder while it trains: room on its disk, one trainer at a time, and a finished
run's outputs set aside (not deleted) until the new run has written its own."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

from nmt.core.errors import FULL, DiskFull, NmtError
from nmt.core.files import make_folder
from nmt.core.runs import RunFiles

log = logging.getLogger("nmt.train")


def check_room(files: RunFiles, n_params: int, average_last: int) -> None:
    """The run folder must take files, and its disk the resume state and checkpoints."""
    try:
        make_folder(files.folder)  # a file in its place: make_folder's own line
        with tempfile.TemporaryFile(dir=files.folder) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno in FULL:
            raise DiskFull.at(files.folder) from None
        raise NmtError(f"cannot write to {files.folder}: {e.strerror} (fix: make it writable, "
                       "or pass --results a writable folder)") from None
    # float32 copies: weights, Adam's two moments, the best weights, the averaging window.
    state = 4 * n_params * (4 + average_last)
    need = 2 * state + 2 * 4 * n_params  # the old and the new resume state, best.pt, last.pt
    need -= files.resume.stat().st_size if files.resume.exists() else 0
    free = shutil.disk_usage(files.folder).free
    if free < need:
        raise DiskFull(f"{files.folder}: {free / 1e6:.1f} MB free on its disk, training needs "
                       f"about {need / 1e6:.1f} MB for its resume state and checkpoints (fix: "
                       "free disk space, or pass --results a folder on a larger disk)")


def sole_trainer(files: RunFiles) -> int:
    """A lock on the run folder, held while this process trains it (the descriptor, closed at
    the end); one line if another process holds it. flock: the kernel releases it when its
    process ends, killed or not, so no stale lock is ever left to remove."""
    folder = os.open(files.folder, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(folder)
        raise NmtError(f"another nmt train is training {files.folder} now (fix: wait until it "
                       "ends, or stop it first)") from None
    return folder


def set_aside_outputs(files: RunFiles) -> None:
    """A finished run's outputs (train.json, written last, marks one) renamed <name>.previous
    until this run has written its own (finish deletes them then), so that a kill or a failure
    of the new run leaves the finished model. Outputs of an unfinished write are deleted."""
    present = [path for path in files.trained if path.exists()]
    if not files.summary.exists():
        for path in present:
            path.unlink()
        return
    for path in present:
        os.replace(path, previous(path))
    log.warning("set aside the finished run's %s in %s as *%s until this run has written its "
                "own (then they are deleted; `rm %s/*%s` deletes them sooner)",
                ", ".join(p.name for p in present), files.folder, PREVIOUS, files.folder,
                PREVIOUS)


PREVIOUS = ".previous"


def previous(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS)
