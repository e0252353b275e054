"""Stage download: fetch the Multi30k task-1 raw files and verify their pinned sha256 sums."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

from nmt.config import NmtError
from nmt.files import atomic_dir

log = logging.getLogger("nmt.download")

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr")
LANGS = ("de", "en")

# sha256 of data/task1/raw/<split>.<lang>.gz in github.com/multi30k/dataset.
SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def download(out_dir: Path, base_url: str, retries: int = 4, backoff: float = 2.0) -> None:
    """Fetch and verify every file into a temporary folder, then rename it to out_dir."""
    tried = sources() + [base_url]
    with atomic_dir(out_dir) as tmp:
        for split in SPLITS:
            for lang in LANGS:
                name = f"{split}.{lang}.gz"
                dest = tmp / name
                failures = []
                for source in tried:
                    try:
                        fetch(source, name, dest, retries, backoff)
                        break
                    except (OSError, urllib.error.URLError) as e:
                        failures.append(f"{source}: {e}")
                else:
                    raise NmtError(
                        f"could not fetch {name} ({'; '.join(failures)}) "
                        "(fix: set MULTI30K_MIRROR to a folder holding the Multi30k raw files)"
                    )
                actual = sha256(dest)
                if actual != SHA256[name]:
                    raise NmtError(
                        f"{name} from {source} is corrupt: sha256 {actual}, expected "
                        f"{SHA256[name]} (fix: replace that file with the Multi30k original)"
                    )
                log.info("%s ok (%d bytes, from %s)", name, dest.stat().st_size, source)
    log.info("wrote %d verified files to %s", len(SHA256), out_dir)
