"""DVC's cache, checked: each object is named by the md5 of its bytes, and DVC trusts that name.

An object DVC has made read-only is never hashed again: `dvc checkout` restores a damaged one
as it is, `dvc status` sees nothing, and a stage re-run that writes the intact bytes does not
replace it (an object of that name exists, so DVC keeps it). So each stage that records its
outputs (nmt.core.records.write_record) calls `evict_damaged` for itself: the objects its
outputs have in dvc.lock whose bytes no longer hash to their names are removed, and DVC adds
the intact copy when the stage ends. The fix a damaged-file line names (`dvc repro -f -s
STAGE`) so repairs the workspace and the cache alike. `nmt check` lists every damaged object
(`damaged_objects`).

Only DVC 3's layout is read (`hash: md5` in dvc.lock, objects under files/md5/). A cache
outside the checkout (`dvc cache dir`) is checked but never touched: nothing outside the
checkout is deleted; the warning names the object to remove by hand.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
log = logging.getLogger("nmt.dvc_cache")


@dataclass(frozen=True)
class CachedFile:
    """One file of a stage's DVC output: where it is in the workspace, the md5 dvc.lock gives
    it (a folder's ends in .dir: its object lists the files) and where DVC keeps its bytes."""
    stage: str
    path: Path
    md5: str
    object: Path


def cache_folder(root: Path) -> Path | None:
    """The checkout's DVC cache: cache.dir of .dvc/config.local or .dvc/config (relative to
    .dvc/), else .dvc/cache; None when root is no DVC checkout."""
    dvc = Path(root) / ".dvc"
    if not dvc.is_dir():
        return None
    for name in ("config.local", "config"):
        config = configparser.ConfigParser(strict=False, interpolation=None)
        try:
            config.read(dvc / name, encoding="utf-8")
        except configparser.Error:
            continue  # DVC itself says what is wrong with its config
        if config.has_option("cache", "dir"):
            return (dvc / config.get("cache", "dir")).resolve()
    return dvc / "cache"


def object_path(cache: Path, md5: str) -> Path:
    return cache / "files" / "md5" / md5[:2] / md5[2:]


def intact(cached: CachedFile) -> bool:
    """The object's bytes hash to its name (an object that is not there is not damaged: DVC
    says it is missing)."""
    if not cached.object.is_file():
        return True
    return md5(cached.object) == cached.md5.removesuffix(".dir")


def md5(path: Path) -> str:
    """The md5 of a file's bytes, DVC's name for it."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def locked_stages(root: Path) -> dict:
    """dvc.lock's stages by name ({} without one, or with one DVC itself will say is broken)."""
    lock = Path(root) / "dvc.lock"
    try:
        return (yaml.load(lock.read_text(), Loader=YAML_LOADER) or {}).get("stages") or {}
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return {}


def stage_files(root: Path, stage: str | None = None) -> list[CachedFile]:
    """The files of every DVC output in root's dvc.lock (or `stage`'s only): each file output,
    and each folder output's .dir object with the files it lists (those of an intact .dir)."""
    cache = cache_folder(root)
    if cache is None:
        return []
    stages, files = locked_stages(root), []
    for name, entry in stages.items():
        if stage not in (None, name):
            continue
        for out in (entry or {}).get("outs") or []:
            if out.get("hash") != "md5" or not out.get("md5"):
                continue  # DVC 2's layout: not read here
            top = CachedFile(name, Path(out["path"]), out["md5"], object_path(cache, out["md5"]))
            files.append(top)
            if top.md5.endswith(".dir") and top.object.is_file() and intact(top):
                files += [CachedFile(name, top.path / e["relpath"], e["md5"],
                                     object_path(cache, e["md5"]))
                          for e in json.loads(top.object.read_text())]
    return files


def damaged_objects(root: Path, stage: str | None = None) -> list[CachedFile]:
    """The files whose DVC cache object is there but no longer hashes to its name."""
    return [cached for cached in stage_files(root, stage) if not intact(cached)]


def evict_damaged(stage: str, root: Path | None = None) -> None:
    """Remove the stage's damaged cache objects, so DVC re-adds the intact copies the stage
    just wrote; one warning for each it may not remove (outside the checkout)."""
    root = Path.cwd() if root is None else Path(root)
    for cached in damaged_objects(root, stage):
        if not cached.object.resolve().is_relative_to(root.resolve()):
            log.warning(f"{cached.path}: DVC's cached copy {cached.object} is damaged and "
                        "outside the checkout, so it stays (fix: remove it by hand, then "
                        f"`dvc commit -f {stage}`)")
            continue
        cached.object.unlink()
        log.info(f"{cached.path}: removed DVC's damaged cached copy {cached.object}; DVC "
                 "re-adds the intact one when the stage ends")
