"""data/raw's files as the corpus kinds write them: one split's two sides, a sentence a line,
gzipped, checked to pair up and to hold text; and where a kind's download reads from (Origin).
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.core.files import utf8_lines

log = logging.getLogger("nmt.download")

# The pairs with text on both sides a train split needs (every kind but the pinned Multi30k):
# verify trains 30 batches of 32 real pairs (nmt.stages.verify; a test ties the two), so a
# smaller split would pass download, tokenize and vocab only to stop there.
MIN_TRAIN_PAIRS = 960
PINS = Path("workflow/multi30k.sha256")  # `sha256  <split>.<lang>.gz`: the Multi30k files


@dataclass(frozen=True)
class Origin:
    """What a kind's download reads besides params."""

    root: Path = Path(".")  # relative paths in params (data.files, a local dataset) start here
    pins: Path = PINS  # multi30k: the pinned sha256 of every file
    retries: int = 4  # a network read: tries of each file
    backoff: float = 2.0  # seconds before the second try, doubled for each one after


def write_split(out: Path, split: str, sides: dict[str, Iterable[str]], where: str) -> int:
    """Write one split's sides as <split>.<lang>.gz, a sentence a line, streaming; refuse
    sides of different lengths, an empty split and one without enough text (check_split).
    Returns the number of pairs."""
    return check_split(split, {lang: write_side(out / f"{split}.{lang}.gz", sentences)
                               for lang, sentences in sides.items()}, where)


def vet_split(split: str, sides: dict[str, Iterable[str]], where: str) -> int:
    """What write_split refuses, read without writing anything (a kind's vet)."""
    return check_split(split, {lang: bytearray(bool(one_line(s)) for s in sentences)
                               for lang, sentences in sides.items()}, where)


def check_split(split: str, texts: dict[str, bytearray], where: str) -> int:
    """Refuse sides of different lengths, an empty split and one without enough text
    (check_text); texts: a byte a line of each side, 1 where it holds text. Returns the
    number of pairs."""
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
            line = one_line(sentence)
            f.write((line + "\n").encode("utf-8"))
            text.append(bool(line))
    return text


def one_line(sentence: str) -> str:
    """A sentence as data/raw holds it: one line, its newlines spaces, no space around it."""
    return " ".join(sentence.split("\n")).strip()


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
