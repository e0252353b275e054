"""Stage download: the pipeline's corpus (data.corpus, nmt.pipeline.corpus) into data/raw, one
<split>.<lang>.gz a split and language, written to a temporary folder and renamed when whole.

- multi30k: fetch the public files (MULTI30K_MIRROR first) and verify their pinned sha256;
- files: read the local files (plain or .gz), check that the sides pair up, write them gzipped;
- huggingface: datasets.load_dataset each split, take the two languages' columns, write them.
Whatever the kind, data/raw/SHA256SUMS records what was written (nmt.core.records): tokenize
checks each file against it before reading, Snakemake's preflight when it starts.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.core.errors import FULL, NmtError
from nmt.core.files import atomic_dir, sha256, utf8_lines
from nmt.core.records import read_sums, write_record
from nmt.pipeline import commandline
from nmt.pipeline.corpus import PINS, corpus_settings, local_files, raw_names, splits

log = logging.getLogger("nmt.download")

SUMS = PINS  # the pinned sha256 of every Multi30k file

# The pairs with text on both sides a train split needs (files, huggingface; Multi30k is
# pinned): verify trains 30 batches of 32 real pairs (nmt.stages.verify; a test ties the two),
# so a smaller split would pass download, tokenize and vocab only to stop there.
MIN_TRAIN_PAIRS = 960


def sources() -> list[str]:
    """Where to look, in order: MULTI30K_MIRROR (folder or URL) first, then the public repo.
    A mirror folder that is not there is an error at once, before any time is spent on the
    network: the user meant that folder."""
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


@dataclass(frozen=True)
class Paths:
    out: Path  # data/raw: <split>.<lang>.gz
    sums: Path = SUMS  # multi30k: the pinned sha256 of every file
    root: Path = Path(".")  # files: relative paths in data.files are relative to this


def download(settings: dict, paths: Paths, *, retries: int = 4, backoff: float = 2.0) -> None:
    """Stage download: write every raw file of the corpus (nmt.pipeline.corpus.raw_names) into a
    temporary folder, then rename it to paths.out. settings: the pipeline's corpus settings
    (nmt.pipeline.corpus.corpus_settings; its data section)."""
    data = settings["data"]
    with atomic_dir(paths.out) as tmp:
        if data["corpus"] == "multi30k":
            fetch_multi30k(data, paths.sums, tmp, retries, backoff)
        else:
            write = copy_files if data["corpus"] == "files" else load_huggingface
            write(data, paths, tmp)
        write_record(tmp, "download")
    log.info("wrote %d files to %s", len(raw_names(data)), paths.out)


def fetch_multi30k(data: dict, sums: Path, out: Path, retries: int, backoff: float) -> None:
    """Fetch train, val and data.testsets in both languages; each must match its pin."""
    tried = sources() + [data["base_url"]]
    if not Path(sums).is_file():
        raise NmtError(f"{sums} is missing (fix: restore it from the repository)")
    pinned = read_sums(sums)
    names = raw_names(data)
    for name in names:
        if name not in pinned:
            raise NmtError(f"{name} has no pinned sha256 in {sums} (fix: add its "
                           f"`sha256sum` line there, or remove it from data.testsets)")
    for name in names:
        source = fetch_any(tried, name, out / name, retries, backoff)
        actual = sha256(out / name)
        if actual != pinned[name]:
            raise NmtError(f"{name} from {source} is corrupt: sha256 {actual}, expected "
                           f"{pinned[name]} (fix: replace that file with the Multi30k "
                           "original)")
        log.info("%s ok (%d bytes, from %s)", name, (out / name).stat().st_size, source)


def write_split(out: Path, split: str, sides: dict[str, Iterable[str]], where: str) -> int:
    """Write one split's sides as <split>.<lang>.gz, a sentence a line, streaming; refuse
    sides of different lengths, an empty split and one without enough text (check_text).
    Returns the number of pairs."""
    texts = {lang: write_side(out / f"{split}.{lang}.gz", sentences)
             for lang, sentences in sides.items()}
    (src, src_text), (tgt, tgt_text) = texts.items()
    if len(src_text) != len(tgt_text):
        raise NmtError(f"{where}: {split} has {len(src_text)} {src} but {len(tgt_text)} {tgt} "
                       f"sentences: the sides do not pair up (fix: give both sides one "
                       f"sentence a line, in the same order)")
    if not src_text:
        raise NmtError(f"{where}: {split} is empty (fix: point it at a corpus with sentences)")
    check_text(split, texts, where)
    return len(src_text)


def write_side(path: Path, sentences: Iterable[str]) -> bytearray:
    """One side's sentences into path, gzipped, a line each; returns a byte a line, 1 where
    it holds text. Newlines inside a sentence become spaces (a line is a sentence
    downstream). The gzip header holds no name or time, so the same sentences give the
    same bytes."""
    text = bytearray()
    with open(path, "wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
        for sentence in sentences:
            line = " ".join(sentence.split("\n")).strip()
            f.write((line + "\n").encode("utf-8"))
            text.append(bool(line))
    return text


def check_text(split: str, texts: dict[str, bytearray], where: str) -> None:
    """Refuse a split that would train or score on nothing: a side whose lines are all empty,
    a test set or val without one pair with text on both sides, a train split with fewer
    than MIN_TRAIN_PAIRS. Tokenize, vocab and train would take any of them, and train learn
    to say nothing."""
    for lang, text in texts.items():
        if not any(text):
            raise NmtError(f"{where}: {split} has no {lang} text: its {len(text)} {lang} lines "
                           f"are all empty (fix: point it at the {lang} sentences, one a line)")
    (src, src_text), (tgt, tgt_text) = texts.items()
    both = sum(map(min, src_text, tgt_text))  # pairs with text on both sides
    if split == "train" and both < MIN_TRAIN_PAIRS:
        raise NmtError(f"{where}: train has {both} pairs with text on both sides, fewer than "
                       f"the {MIN_TRAIN_PAIRS} verify trains on (30 batches of 32) (fix: point "
                       f"it at a corpus of at least {MIN_TRAIN_PAIRS} such pairs)")
    if not both:
        raise NmtError(f"{where}: {split} has no pair with text on both sides (fix: give each "
                       f"{src} line its {tgt} translation on the same line)")
    if both < len(src_text):
        log.warning("%s: %d of %d pairs have an empty side", split, len(src_text) - both,
                    len(src_text))
    log.info("%s: %d pairs", split, len(src_text))


def read_text(path: Path, key: str) -> Iterator[str]:
    """The lines of a plain or gzipped UTF-8 file; a missing or unreadable file is one line
    naming its params key."""
    if not path.is_file():
        raise NmtError(f"params.yaml: {key}: {path} does not exist (fix: correct the path; "
                       "relative paths start at the project folder)")
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            for line in utf8_lines(f, f"params.yaml: {key}: {path}",
                                   "give a UTF-8 text file, plain or gzipped"):
                yield line.rstrip("\r\n")
    except (OSError, EOFError) as e:
        raise NmtError(f"params.yaml: {key}: {path} is unreadable ({e}) (fix: give a UTF-8 "
                       "text file, plain or gzipped)") from None


def copy_files(data: dict, paths: Paths, out: Path) -> None:
    """files: data.files.<split>.<lang> into data/raw, both sides of a split checked."""
    files = local_files(data, paths.root)
    for split in splits(data):
        sides = {lang: read_text(files[f"{split}.{lang}.gz"], f"data.files.{split}.{lang}")
                 for lang in (data["source_lang"], data["target_lang"])}
        write_split(out, split, sides, f"data.files.{split}")


def load_huggingface(data: dict, paths: Paths, out: Path) -> None:
    """huggingface: each split from datasets.load_dataset(path, name, split=...), its two
    languages from a `translation` column ({de: ..., en: ...}, as WMT-style datasets hold
    them) or from one column a language. A local folder (parquet, json, arrow) or the local
    Hugging Face cache works offline (HF_HUB_OFFLINE=1)."""
    hf, langs = data["huggingface"], (data["source_lang"], data["target_lang"])
    for split in splits(data):
        dataset = load_split(hf, split)
        columns = set(dataset.column_names)
        if "translation" in columns:
            def side(lang, dataset=dataset):
                for batch in dataset.select_columns("translation").iter(batch_size=10_000):
                    for pair in batch["translation"]:
                        yield pair[lang]
            first = dataset[0]["translation"] if len(dataset) else {}
            missing = [lang for lang in langs if len(dataset) and lang not in first]
        elif set(langs) <= columns:
            def side(lang, dataset=dataset):
                for batch in dataset.select_columns(lang).iter(batch_size=10_000):
                    yield from batch[lang]
            missing = []
        else:
            missing = [lang for lang in langs if lang not in columns]
        if missing:
            raise NmtError(f"params.yaml: data.huggingface.splits.{split}: {hf['path']} has "
                           f"no {'/'.join(missing)} text (columns: {', '.join(sorted(columns))})"
                           " (fix: a dataset with a translation column {"
                           f"{langs[0]}: ..., {langs[1]}: ...}} or columns {langs[0]}, "
                           f"{langs[1]}; or set data.source_lang/target_lang)")
        write_split(out, split, {lang: side(lang) for lang in langs},
                    f"data.huggingface.splits.{split}")


def load_split(hf: dict, split: str):
    """One split of the dataset; a wrong path or split is one line."""
    try:
        import datasets
    except ImportError:
        raise NmtError("data.corpus huggingface needs the datasets package (fix: pip install "
                       "datasets, as requirements.txt pins it)") from None
    spec = hf["splits"][split]
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(hf["path"], hf.get("name"), split=spec)
    except ValueError as e:  # an unknown split or a bad slice
        raise NmtError(f"params.yaml: data.huggingface.splits.{split}: {spec!r}: {e} (fix: "
                       "name a split the dataset has)") from None
    except (FileNotFoundError, ConnectionError, OSError,
            datasets.exceptions.DatasetNotFoundError) as e:
        raise NmtError(f"params.yaml: data.huggingface.path: cannot load {hf['path']!r}"
                       f"{' (' + hf['name'] + ')' if hf.get('name') else ''}: "
                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__} (fix: a Hub "
                       "id reachable or in the local cache, or a local dataset folder)") from None


# ---- `nmt download`: nmt.cli builds the subcommand from HELP, arguments and command --------------

HELP = ("Write train, val and data.testsets of the pipeline's corpus (data.corpus of "
        "pipeline.recipes[0]) to data/raw/<split>.<lang>.gz: multi30k fetched "
        "(MULTI30K_MIRROR first, then data.base_url) and verified against "
        "workflow/multi30k.sha256; files and huggingface read and checked.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=commandline.RAW)


def command(args, params: dict) -> None:
    download(corpus_settings(params), Paths(out=args.out))
