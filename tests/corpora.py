"""Parallel corpora made from the Multi30k mirror in a temporary folder (tests only), as the
two non-Multi30k kinds of data.corpus read them: text files, and a local Hugging Face dataset.
"""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pandas as pd

# split -> (Multi30k file it is cut from, pairs); the test set has a name of its own.
SPLITS = {"train": ("train", 1000), "val": ("val", 60), "news_test": ("test_2016_flickr", 50)}
LANGS = ("de", "en")


def multi30k_lines(mirror: Path, split: str, lang: str, count: int) -> list[str]:
    with gzip.open(Path(mirror) / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, count)]


def sentences(mirror: Path) -> dict[str, dict[str, list[str]]]:
    """split -> language -> sentences."""
    return {split: {lang: multi30k_lines(mirror, source, lang, count) for lang in LANGS}
            for split, (source, count) in SPLITS.items()}


def write_files(mirror: Path, folder: Path) -> dict:
    """<split>.<lang> files in folder (train plain text, the rest gzipped, as both work);
    returns the data.files entry pointing at them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, sides in sentences(mirror).items():
        for lang, lines in sides.items():
            path = folder / (f"{split}.{lang}" + ("" if split == "train" else ".gz"))
            text = "".join(line + "\n" for line in lines).encode("utf-8")
            path.write_bytes(text if split == "train" else gzip.compress(text))
            files.setdefault(split, {})[lang] = str(path)
    return files


def write_parquet(mirror: Path, folder: Path, layout: str = "translation") -> dict:
    """A local dataset folder (data/<split>-00000.parquet, the Hub's layout) with a
    `translation` column ({de, en}) or one column a language; returns data.huggingface."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    names = {"train": "train", "val": "validation", "news_test": "test"}
    for split, sides in sentences(mirror).items():
        rows = list(zip(*(sides[lang] for lang in LANGS), strict=True))
        frame = (pd.DataFrame({"translation": [dict(zip(LANGS, r, strict=True)) for r in rows]})
                 if layout == "translation" else pd.DataFrame(rows, columns=list(LANGS)))
        frame.to_parquet(folder / "data" / f"{names[split]}-00000.parquet")
    return {"path": str(folder), "name": None, "splits": names}


def corpus_data(kind: str, entry: dict) -> dict:
    """The data-section overrides for a corpus of this kind."""
    return {"corpus": kind, kind: entry, "testsets": ["news_test"]}
