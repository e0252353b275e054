"""Corpus kind multi30k (the default): the public Multi30k task-1 files, each pinned in
workflow/multi30k.sha256. Download fetches them from MULTI30K_MIRROR (a folder or URL with
the same file names) first, then data.base_url, retrying network errors, and keeps a file
only if its sha256 is the pinned one.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from nmt.core.errors import FULL, NmtError
from nmt.core.files import sha256
from nmt.core.records import read_sums
from nmt.pipeline.corpora.raw import PINS, Origin
from nmt.pipeline.corpus import raw_names

log = logging.getLogger("nmt.download")

# Its settings, the keys of data only this kind reads: where to fetch the files (their bytes
# are pinned, workflow/multi30k.sha256).
SETTINGS = ("data.base_url",)


def check(data: dict, at: str) -> None:
    """Nothing to check in params: base_url and the test sets' pins are the preflight's."""


def preflight(data: dict, at: str, root: Path) -> None:
    """Every file has its pin (a test set without one is refused before any job starts)."""
    pinned = read_sums(root / PINS)
    for name in raw_names(data):
        if name not in pinned:
            raise NmtError(f"params.yaml: {at}.testsets: {name} has no pinned sha256 in "
                           f"{PINS} (fix: add its `sha256sum` line there, or remove the "
                           "test set)")


def describe(data: dict, root: Path) -> list[str]:
    """The pinned sha256 of each file (download checks what it fetches against them)."""
    pinned = read_sums(Path(root) / PINS)
    return [f"{pinned.get(name, 'unpinned')}  {name}" for name in raw_names(data)]


def title(data: dict) -> str:
    return "Multi30k"


def vet(data: dict, root: Path) -> None:
    """Nothing to read before download: each file is known by its pin, which preflight checks
    and download verifies."""


def download(data: dict, origin: Origin, out: Path) -> None:
    """Fetch train, val and data.testsets in both languages; each must match its pin."""
    tried = mirrors() + [data["base_url"]]
    sums = origin.pins
    if not Path(sums).is_file():
        raise NmtError(f"{sums} is missing (fix: restore it from the repository)")
    pinned = read_sums(sums)
    names = raw_names(data)
    for name in names:
        if name not in pinned:
            raise NmtError(f"{name} has no pinned sha256 in {sums} (fix: add its "
                           f"`sha256sum` line there, or remove it from data.testsets)")
    for name in names:
        source = fetch_any(tried, name, out / name, origin.retries, origin.backoff)
        actual = sha256(out / name)
        if actual != pinned[name]:
            raise NmtError(f"{name} from {source} is corrupt: sha256 {actual}, expected "
                           f"{pinned[name]} (fix: replace that file with the Multi30k "
                           "original)")
        log.info("%s ok (%d bytes, from %s)", name, (out / name).stat().st_size, source)


def mirrors() -> list[str]:
    """Where to look before data.base_url: MULTI30K_MIRROR (folder or URL), if set. A mirror
    folder that is not there is an error at once, before any time is spent on the network:
    the user meant that folder."""
    mirror = os.environ.get("MULTI30K_MIRROR", "").strip()
    if mirror and "://" not in mirror and not Path(mirror).is_dir():
        raise NmtError(f"MULTI30K_MIRROR is {mirror}, which is not a folder (fix: point it at "
                       "the folder holding the Multi30k raw files, or unset it to download "
                       "them from the public repository)")
    return [mirror] if mirror else []


def fetch(source: str, name: str, dest: Path, retries: int, backoff: float) -> None:
    """Copy one file from a folder or URL; network errors are retried with exponential backoff."""
    if "://" not in source:
        src = Path(source) / name
        if not src.is_file():
            raise FileNotFoundError(f"{src} does not exist")
        shutil.copyfile(src, dest)
        return
    url = f"{source.rstrip('/')}/{name}"
    for attempt in range(retries):
        try:
            with urllib.request.urlopen(url, timeout=30) as r, open(dest, "wb") as f:
                shutil.copyfileobj(r, f)
            return
        except urllib.error.HTTPError as e:
            if e.code < 500:  # 404 and friends will not get better by waiting
                raise
            err = e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            err = e
        if attempt + 1 < retries:
            wait = backoff * 2**attempt
            log.warning("%s: %s; retrying in %.0f s", url, err, wait)
            time.sleep(wait)
    raise ConnectionError(f"{url}: {err}")


def fetch_any(tried: list[str], name: str, dest: Path, retries: int, backoff: float) -> str:
    """Fetch name from the first source that has it; returns that source."""
    failures = []
    for source in tried:
        try:
            fetch(source, name, dest, retries, backoff)
            return source
        except (OSError, urllib.error.URLError) as e:
            if e.errno in FULL:  # the destination's disk is full: no other source helps
                raise
            failures.append(f"{source}: {e}")
    raise NmtError(f"could not fetch {name} ({'; '.join(failures)}) "
                   "(fix: set MULTI30K_MIRROR to a folder holding the Multi30k raw files)")
