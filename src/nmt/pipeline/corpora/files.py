"""Corpus kind files: data.files.<split>.<lang>, local text files (plain or .gz), one sentence
a line, for train, val and every name in data.testsets; relative paths start at the project
folder. Download reads them, checks that the sides pair up, and writes them gzipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.core.files import sha256
from nmt.pipeline.corpora.raw import Origin, read_text, vet_split, write_split
from nmt.pipeline.corpus import splits

# Its settings: the keys of data it reads, download and sources alike (workflow/stages.yaml
# declares them for both as "data.{kind}").
SETTINGS = ("data.files",)


def local_files(data: dict, root: Path = Path(".")) -> dict[str, Path]:
    """Raw name (train.de.gz) -> the local file it is made from (relative paths are relative
    to the project, root)."""
    return {f"{split}.{lang}.gz": Path(root) / data["files"][split][lang]
            for split in splits(data) for lang in (data["source_lang"], data["target_lang"])}


def check(data: dict, at: str) -> None:
    """Every split (train, val, each test set) has a file for both languages."""
    files = data.get("files") or {}
    for split in splits(data):
        what = "test set" if split in data["testsets"] else "split"
        for lang in (data["source_lang"], data["target_lang"]):
            if lang not in files.get(split, {}):
                raise NmtError(
                    f"params.yaml: {at}.files: the {what} {split} has no {lang} file "
                    f"(fix: add {at}.files.{split}.{lang}: <path>"
                    + (f", or remove {split} from data.testsets)" if what == "test set"
                       else ")"))


def preflight(data: dict, at: str, root: Path) -> None:
    """Each file exists."""
    for name, path in local_files(data, root).items():
        if not path.is_file():
            split, lang, _ = name.split(".")
            raise NmtError(f"params.yaml: {at}.files.{split}.{lang}: {path} does not exist "
                           "(fix: correct the path; relative paths start at the project "
                           "folder)")


def describe(data: dict, root: Path) -> list[str]:
    """The sha256 of each file of data.files, beside the raw name it becomes."""
    return [f"{sha256(path) if path.is_file() else 'missing'}  {name}  {path}"
            for name, path in local_files(data, root).items()]


def title(data: dict) -> str:
    return "local files (data.files)"


def vet(data: dict, root: Path) -> None:
    """What download would refuse, read without writing (sources runs it when a file changed,
    before either orchestrator deletes data/raw for a download bound to fail)."""
    for split in splits(data):
        vet_split(split, read_split(data, root, split), f"data.files.{split}")


def download(data: dict, origin: Origin, out: Path) -> None:
    """data.files.<split>.<lang> into out, both sides of a split checked."""
    for split in splits(data):
        write_split(out, split, read_split(data, origin.root, split), f"data.files.{split}")


def read_split(data: dict, root: Path, split: str) -> dict[str, Iterator[str]]:
    """Language -> the lines of its file of `split` (read as they are taken)."""
    files = local_files(data, root)
    return {lang: read_text(files[f"{split}.{lang}.gz"], f"data.files.{split}.{lang}")
            for lang in (data["source_lang"], data["target_lang"])}
