"""Stage download: fetch the Multi30k task-1 raw files and verify their pinned sha256 sums."""

from __future__ import annotations

import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import FULL, NmtError
from nmt.files import atomic_dir, sha256

log = logging.getLogger("nmt.download")

SUMS = Path("workflow/multi30k.sha256")  # `sha256  <split>.<lang>.gz` lines, the pinned files


def read_sums(path: Path) -> dict[str, str]:
    """file name -> pinned sha256, from a `sha256sum` style file."""
    if not Path(path).is_file():
        raise NmtError(f"{path} is missing (fix: restore it from the repository)")
    return {name: digest for digest, name in
            (line.split() for line in Path(path).read_text().splitlines() if line.strip())}


def sources() -> list[str]:
    """Where to look, in order: MULTI30K_MIRROR (folder or URL) first, then the public repo."""
    mirror = os.environ.get("MULTI30K_MIRROR", "").strip()
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


@dataclass(frozen=True)
class Paths:
    out: Path  # data/raw: <split>.<lang>.gz
    sums: Path = SUMS  # the pinned sha256 of every file


def download(settings: dict, paths: Paths, *, retries: int = 4, backoff: float = 2.0) -> None:
    """Stage download: fetch and verify train, val and data.testsets in both languages into a
    temporary folder, then rename it to paths.out. settings: params.yaml (its data section)."""
    data, sums, out_dir = settings["data"], paths.sums, paths.out
    tried = sources() + [data["base_url"]]
    pinned = read_sums(sums)
    names = [f"{split}.{lang}.gz" for split in ("train", "val", *data["testsets"])
             for lang in (data["source_lang"], data["target_lang"])]
    for name in names:
        if name not in pinned:
            raise NmtError(f"{name} has no pinned sha256 in {sums} (fix: add its "
                           f"`sha256sum` line there, or remove it from data.testsets)")
    with atomic_dir(out_dir) as tmp:
        for name in names:
            source = fetch_any(tried, name, tmp / name, retries, backoff)
            actual = sha256(tmp / name)
            if actual != pinned[name]:
                raise NmtError(f"{name} from {source} is corrupt: sha256 {actual}, expected "
                               f"{pinned[name]} (fix: replace that file with the Multi30k "
                               "original)")
            log.info("%s ok (%d bytes, from %s)", name, (tmp / name).stat().st_size, source)
    log.info("wrote %d verified files to %s", len(names), out_dir)
