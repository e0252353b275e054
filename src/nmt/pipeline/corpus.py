"""The corpus a pipeline trains on (data.corpus): which recipe's settings the data stages use,
which raw files they make, and where each comes from.

- multi30k: the public Multi30k files, each pinned in workflow/multi30k.sha256;
- files: data.files.<split>.<lang>, local text or .gz files, one sentence a line;
- huggingface: data.huggingface {path, name, splits}, read with datasets.load_dataset.

Whatever the kind, `nmt download` writes the same folder: data/raw/<split>.<lang>.gz for train,
val and every data.testsets name, so tokenize and everything after it never ask which kind.
A recipe may override data and tokenize, but the data stages run once a pipeline: the
recipes of one pipeline must share one corpus, that of pipeline.recipes[0] (checked by
nmt.pipeline.params).
"""

from __future__ import annotations

from pathlib import Path

from nmt.core.errors import NmtError
from nmt.pipeline.recipes import resolve

PINS = Path("workflow/multi30k.sha256")  # `sha256  <split>.<lang>.gz`: the Multi30k files
CORPUS_SECTIONS = ("data", "tokenize")  # what the data stages read of a recipe


def corpus_recipe(params: dict) -> str:
    """The recipe whose data and tokenize sections the data stages run with."""
    return params["pipeline"]["recipes"][0]


def corpus_settings(params: dict) -> dict:
    """The pipeline's corpus: the data and tokenize sections of corpus_recipe, resolved."""
    return resolve(params, corpus_recipe(params))


def splits(data: dict) -> list[str]:
    """Every split the data stages make: train, val, then data.testsets."""
    return ["train", "val", *data["testsets"]]


def raw_names(data: dict) -> list[str]:
    """The files of data/raw: <split>.<lang>.gz of every split, both languages."""
    return [f"{split}.{lang}.gz" for split in splits(data)
            for lang in (data["source_lang"], data["target_lang"])]


def local_files(data: dict, root: Path = Path(".")) -> dict[str, Path]:
    """files: raw name (train.de.gz) -> the local file it is made from (relative paths are
    relative to the project, root)."""
    return {f"{split}.{lang}.gz": Path(root) / data["files"][split][lang]
            for split in splits(data) for lang in (data["source_lang"], data["target_lang"])}


def check_corpus(data: dict, at: str) -> None:
    """What a corpus kind needs of params (no file is opened): `at` is where to fix it
    (data, or recipes.<name>.data). Files that are missing or unreadable are download's."""
    langs = (data["source_lang"], data["target_lang"])
    kind = data["corpus"]
    if kind == "files":
        files = data.get("files") or {}
        for split in splits(data):
            what = "test set" if split in data["testsets"] else "split"
            for lang in langs:
                if lang not in files.get(split, {}):
                    raise NmtError(
                        f"params.yaml: {at}.files: the {what} {split} has no {lang} file "
                        f"(fix: add {at}.files.{split}.{lang}: <path>"
                        + (f", or remove {split} from data.testsets)" if what == "test set"
                           else ")"))
    if kind == "huggingface":
        hf = data.get("huggingface") or {}
        if not hf.get("path") or "splits" not in hf:
            raise NmtError(f"params.yaml: {at}: corpus huggingface needs {at}.huggingface "
                           "(fix: add {path: <hub id or folder>, name: <config>, splits: "
                           "{train: ..., val: ..., <test set>: ...}})")
        for split in splits(data):
            if split not in (hf["splits"] or {}):
                what = "test set" if split in data["testsets"] else "split"
                raise NmtError(f"params.yaml: {at}.huggingface.splits: the {what} {split} "
                               f"has no datasets split (fix: add {split}: <split, e.g. test>)")
