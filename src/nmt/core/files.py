"""Atomic writes: an interrupted stage never leaves a half file that looks finished.

Every output goes to a temporary sibling, `.<name>.<8 random characters>.tmp`, renamed onto its
name only when complete. A killed write leaves that temporary behind; the next write of the same
output removes it, so a stage that runs again clears what its killed run left (a folder such as
results/, an input of the report, then holds nothing but outputs). One process writes a given
output at a time: DVC and Snakemake run one job per output, and only rank 0 of a training writes.
A folder that replaces an older one never leaves a moment with neither (replace_dir).

A write that fails because the disk is full raises one DiskFull line naming the folder, its free
space and the fix, with the temporary removed: the stages, all of which write through here, need
no handling of their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nmt.core.errors import FULL, DiskFull, NmtError

log = logging.getLogger("nmt.files")


def _umask() -> int:
    """The process's umask, read where Linux shows it: setting and restoring it (the portable
    way) would, for a moment, give files another thread creates mode 0666 (resume states are
    written by a thread while training goes on)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
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


def make_folder(folder: Path) -> None:
    """`mkdir -p folder`; one line if a file stands where one of its folders must be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        file = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()),
                    folder)
        raise NmtError(not_a_folder(file)) from None


def not_a_folder(file: Path) -> str:
    """The one line for a file where the pipeline writes into a folder (preflight's too)."""
    return (f"{file} is a file where the pipeline needs a folder (fix: move the file away, "
            f"e.g. mv {file} {file}.moved)")


def temporaries(path: Path, suffix: str = ".tmp") -> list[Path]:
    """The temporaries (files or folders) that killed writes of `path` left beside it:
    `.<name>.<8 characters><suffix>` (.old: a folder replace_dir set aside)."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}{re.escape(suffix)}")
    if not path.parent.is_dir():
        return []
    return [p for p in path.parent.iterdir() if pattern.fullmatch(p.name)]


def remove_temporaries(path: str | Path) -> None:
    """Delete what killed writes of `path` left (see the module's docstring for why it is safe)."""
    for tmp in temporaries(Path(path)):
        discard(tmp)


def discard(path: Path) -> None:
    """Delete a folder tree, a file, or a link: the link alone, never what it points at. What
    cannot go now, the next write of the same output removes (remove_temporaries)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            path.unlink()


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    with named_if_full(path):  # outside the cleanup below: free space is read after it
        make_folder(path.parent)
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
    """Yield a temporary sibling folder; it replaces `path` as a whole only on success, so
    that a kill at any instant leaves the old folder or the new one (replace_dir)."""
    path = Path(path)
    with named_if_full(path):
        make_folder(path.parent)
        restore_aside(path)
        remove_temporaries(path)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            yield tmp
            tmp.chmod(0o777 & ~_umask())
            if path.is_symlink():  # written here, never where the link points (maybe outside)
                log.warning("%s was a link to %s: it is now a folder in the checkout, and what "
                            "the link pointed at is untouched", path, os.readlink(path))
            replace_dir(tmp, path)
        finally:
            discard(tmp)  # the new folder, or the old one (or link) it swapped with


def replace_dir(new: Path, path: Path) -> None:
    """Put the folder `new` where `path` is. Where Linux can, the two swap in one step
    (renameat2 RENAME_EXCHANGE), and `new` then holds the old folder for the caller to delete.
    Elsewhere the old folder goes aside first (`.<name>.<8 characters>.old`), the new one
    takes its place, and the old one is deleted; a kill between those two renames leaves the
    old folder aside, and the next write of `path` puts it back first (restore_aside)."""
    if not os.path.lexists(path):
        os.replace(new, path)
    elif not exchange(new, path):
        aside = new.with_name(new.name.removesuffix(".tmp") + ".old")
        os.replace(path, aside)
        os.replace(new, path)
        discard(aside)  # what cannot go now, restore_aside removes


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where this
    system or filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd, rename_exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE (linux/fcntl.h, fs.h)
    if renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def restore_aside(path: Path) -> None:
    """A folder that replace_dir set aside, back in its place if a kill left `path` without
    one; deleted if the new folder got there."""
    for aside in temporaries(path, ".old"):
        if os.path.lexists(path):
            discard(aside)
        else:
            os.replace(aside, path)


def utf8_lines(binary: Iterable[bytes], where: str, fix: str) -> Iterator[str]:
    """The lines of a file opened in binary mode, decoded one by one, so that a byte that is
    not UTF-8 is named by its line: `<where>: line N is not UTF-8 (byte B of the line)`. A
    byte-order mark opening the file (Windows tools write one) marks the encoding and is no
    text: it goes, where it would have stuck to the first token."""
    for number, raw in enumerate(binary, 1):
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise NmtError(f"{where}: line {number} is not UTF-8 (byte {e.start + 1} of the "
                           f"line) (fix: {fix})") from None


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


def failed_crc(path: Path) -> str | None:
    """The first member of a zip archive (a torch.save file) whose bytes differ from the CRC-32
    recorded when it was written; None if all match. torch.load never checks them: a changed
    byte in a weight (a damaged DVC cache object, a bad disk) loads as another model."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return archive.testzip()
