"""Atomic writes: an interrupted stage never leaves a half file that looks finished.

Every output goes to a temporary sibling, `.<name>.<8 random characters>.tmp`, renamed onto its
name only when complete. A killed write leaves that temporary behind; the next write of the same
output removes it, so a stage that runs again clears what its killed run left (a folder such as
results/, an input of the report, then holds nothing but outputs). One process writes a given
output at a time: DVC and Snakemake run one job per output, and only rank 0 of a training writes.

A write that fails because the disk is full raises one DiskFull line naming the folder, its free
space and the fix, with the temporary removed: the stages, all of which write through here, need
no handling of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nmt.errors import FULL, DiskFull


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def named_if_full(path: Path) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT inside the block (or a nested write's DiskFull) into the one line
    about `path`: a file written into a temporary folder is reported as that folder's output."""
    try:
        yield
    except DiskFull:
        raise DiskFull.at(path.parent, path.name) from None
    except OSError as e:
        if e.errno not in FULL:
            raise
        raise DiskFull.at(path.parent, path.name) from None


def temporaries(path: Path) -> list[Path]:
    """The temporaries (files or folders) that killed writes of `path` left beside it."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    if not path.parent.is_dir():
        return []
    return [p for p in path.parent.iterdir() if pattern.fullmatch(p.name)]


def remove_temporaries(path: str | Path) -> None:
    """Delete what killed writes of `path` left (see the module's docstring for why it is safe)."""
    for tmp in temporaries(Path(path)):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    with named_if_full(path):  # outside the cleanup below: free space is read after it
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(tmp)
        try:
            yield tmp
            tmp.chmod(0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; it replaces `path` as a whole only on success."""
    path = Path(path)
    with named_if_full(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_temporaries(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            yield tmp
            tmp.chmod(0o777 & ~_umask())
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (download and preflight check pins)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
