"""The one error type of the pipeline (a problem the user can fix), and what a stop signal
may still change once a stage's outputs are written (Completion)."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# sysexits.h's EX_IOERR: an input/output error, here a full disk. A scheduler (SLURM, Snakemake,
# a shell loop) can tell it from a bad input (2) and retry once space is freed.
EX_IOERR = 74
FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the device; disk quota exceeded
# Permission denied (a file or folder of another user's, or chmod a-w); a read-only mount.
DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


class NmtError(ValueError):
    """A problem the user can fix; the CLI prints it as one line and exits with `exit_code`."""

    exit_code = 2


class DiskFull(NmtError):
    """A write found its disk (or the user's quota) full; nothing was half-written."""

    exit_code = EX_IOERR

    @classmethod
    def at(cls, folder: Path, writing: str | None = None) -> DiskFull:
        """The one line for `folder`: its free space (read once the unfinished write is gone,
        so it matches what `df` shows afterwards) and what to do."""
        try:
            free = f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free"
        except OSError:
            free = "free space unknown"
        what = f" while writing {writing}" if writing else ""
        return cls(f"{folder}: no space left on its disk{what} ({free}); nothing was "
                   "half-written (fix: free space on that disk, or point the output at a larger "
                   "one, then run the same command again)")


def access_denied(error: OSError, doing: str) -> str:
    """The one line for an OSError of DENIED that `doing` (nmt evaluate) met: the read-only
    file system, the file it may not read, or the file or folder it may not write."""
    path = Path(error.filename) if error.filename else Path.cwd()
    if error.errno == errno.EROFS:
        return (f"{path}: on a read-only file system, and {doing} writes there (fix: run it in a "
                "copy on a writable disk)")
    try:
        if path.exists() and not os.access(path, os.R_OK):
            return f"{path}: not readable, and {doing} reads it (fix: chmod u+r {path})"
        if not path.exists() or os.access(path, os.W_OK):  # a file to make in its folder
            path = path.parent
            while not path.exists():
                path = path.parent
    except PermissionError:  # a folder on its way this user may not enter
        return (f"{path}: permission denied, and {doing} needs it (fix: give this user access "
                "to the folders on its way, or run in a copy you may write)")
    shown = Path.cwd() if path == Path(".") else path  # not a bare "."
    return (f"{shown}: not writable, and {doing} writes there (fix: chmod u+w {shown}, or run "
            "in a copy you may write)")


def out_of_memory(error: BaseException) -> str | None:
    """What ran out, if `error` is an allocation failure: Python's MemoryError, torch's CPU
    allocator ("can't allocate memory") or a GPU's out of memory; else None."""
    if isinstance(error, MemoryError):
        return "memory: an allocation of Python's failed"
    text = str(error)
    if not isinstance(error, RuntimeError) or not ("can't allocate memory" in text or
                                                     "out of memory" in text.lower()):
        return None
    where = "GPU memory" if "CUDA" in text or "GPU" in text else "memory"
    # torch's CPU allocator: "you tried to allocate 2147483648 bytes"; CUDA's: "Tried to ..."
    asked = re.search(r"(?i:tried) to allocate (\d+ bytes|[\d.]+ ?[KMGT]?i?B)", text)
    return f"{where}: an allocation of {asked.group(1)} failed" if asked else where


@contextmanager
def memory_fix(fix: str | None) -> Iterator[None]:
    """Inside, an out-of-memory error carries what to make smaller there (`fix`), which the
    CLI's line names instead of its command's MEMORY_FIX: decoding's batch and beam rather
    than a stage's every setting. The innermost one wins; None adds nothing."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if fix and out_of_memory(e) is not None and not hasattr(e, "memory_fix"):
            e.memory_fix = fix
        raise


class Completion:
    """Whether this process's stage has written its last outputs (last_outputs), for nmt.cli's
    SIGTERM handler: a stop that comes once they are all in place must not make the job look
    failed (Snakemake deletes a failed job's outputs, complete or not)."""

    writing = False  # inside the last writes: a SIGTERM waits for them
    complete = False  # every output is in place
    late_sigterm = False  # a SIGTERM came during or after the last writes

    @classmethod
    def reset(cls) -> None:
        cls.writing = cls.complete = cls.late_sigterm = False


@contextmanager
def last_outputs() -> Iterator[None]:
    """Around a stage's last writes: a SIGTERM that comes during them waits until they are
    done (nmt.core.process.on_sigterm), and once they are done the outputs count as complete,
    so a SIGTERM from then on ends the command with status 0 and a line that says so, not
    with 143."""
    Completion.writing = True
    try:
        yield
        Completion.complete = True
    finally:
        Completion.writing = False
