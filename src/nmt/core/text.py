"""Text files and tokens: spaCy's rule-based tokenizers, line files, and the detokenizer
that turns word-level output back into a sentence written the way the references are.

Line files are read as streams (`iter_lines`), so that a million-line split never sits in
memory as one list; `read_lines` remains for the small files (test sets, translations). Each
reader checks the file against its folder's SHA256SUMS first (nmt.core.records): a stage
never reads a damaged copy of another stage's output."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from tqdm import tqdm

from nmt.core.errors import NmtError
from nmt.core.records import verified


def tokenizer(lang: str):
    """spaCy's rule-based tokenizer alone: no model download, same tokens everywhere.

    Without a length limit: spaCy's nlp.max_length (1,000,000 characters) guards its parser's
    and NER's memory, about 1 GB per 100,000 characters, and a tokenizer alone needs no such
    guard. Its memory grows with the line, about 45 bytes a character (231 MB for a 5 MB
    line), so a line of megabytes in a corpus is tokenized like any other and the .tok files
    stay line for line with the .txt. nmt translate passes only the words its model can read
    (first_words)."""
    import spacy  # imported here: the GPU machine runs train/evaluate without spaCy

    nlp = spacy.blank(lang)
    nlp.max_length = sys.maxsize
    return nlp


_WORD = re.compile(r"\S+")  # what spaCy and SentencePiece split a text into before tokenizing


def first_words(text: str, n: int) -> str:
    """The text up to the end of its n-th word (a run of non-whitespace), or all of it.

    spaCy splits a text at whitespace and tokenizes each word on its own into one token or
    more, and SentencePiece's pieces never cross whitespace, so the tokens of these words are
    the first tokens of the whole text, at least n of them: a model that reads n tokens of a
    line costs what n words do, however long the line. (SentencePiece gives no piece for a
    word of characters its normalizer drops, control or zero-width ones alone: a line of
    many such words keeps fewer.)"""
    words = list(islice(_WORD.finditer(text), n + 1))
    return text if len(words) <= n else text[: words[n - 1].end()]


def words(nlp, lines: Iterable[str], batch_size: int = 1000) -> Iterator[list[str]]:
    """The tokens of each line through the spaCy pipeline nlp, in order, as they come."""
    for doc in nlp.pipe(lines, batch_size=batch_size):
        # Whitespace-only tokens (from doubled spaces) carry nothing to translate.
        yield [t.text for t in doc if not t.is_space]


def tokenize_lines(lines: list[str], lang: str, batch_size: int = 1000, desc: str = "",
                   progress: bool = True) -> list:
    """spaCy tokens of each line; a progress bar on stderr unless progress=False."""
    return list(tqdm(words(tokenizer(lang), lines, batch_size), total=len(lines), desc=desc,
                     unit="sent", leave=False, disable=not progress))


def token_lines(lines: Iterable[str], lang: str, batch_size: int = 1000,
                processes: int = 1) -> Iterator[str]:
    """The lines of a .tok file (spaCy tokens, space-joined) of each line, in order, as they
    come: in this process, or in `processes` worker processes (at most the machine's cores)
    that tokenize batch_size lines at a time. The lines are the same whatever the number.

    Workers of our own rather than nlp.pipe(n_process=...): that ships every Doc back
    serialized, and for a tokenizer alone was 9 times slower than one process (2 cores);
    ours ship the joined text. At most two batches a worker are in flight, so a split of
    any size streams through in bounded memory."""
    processes = max(1, min(processes, os.cpu_count() or 1))
    if processes == 1:
        yield from map(" ".join, words(tokenizer(lang), lines, batch_size))
        return
    lines = iter(lines)
    batches = iter(lambda: list(islice(lines, batch_size)), [])
    pool = multiprocessing.Pool(processes, _start_worker, (lang,))
    try:
        pending = deque()
        for batch in batches:
            pending.append(pool.apply_async(_tokenize_batch, (batch,)))
            if len(pending) > 2 * processes:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()
    except BaseException:  # an error, Ctrl-C, or a reader that stopped early
        pool.terminate()
        raise
    pool.close()  # the workers leave when their queue ends
    pool.join()


_worker_nlp = None  # a worker process's tokenizer (token_lines)


def _start_worker(lang: str) -> None:
    global _worker_nlp
    # The parent answers Ctrl-C and SIGTERM (nmt.cli) and ends its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _worker_nlp = tokenizer(lang)


def _tokenize_batch(lines: list[str]) -> list[str]:
    return [" ".join(tokens) for tokens in words(_worker_nlp, lines, len(lines))]


def readable(path: Path) -> Path:
    """path, once it exists and matches its folder's SHA256SUMS (verified): what every reader
    of a line file opens."""
    if not Path(path).is_file():
        raise NmtError(f"{path} is missing (fix: run `nmt tokenize` first)")
    return verified(Path(path))


def iter_lines(path: Path) -> Iterator[str]:
    """The lines of a text file one by one, without their newline: what read_lines lists."""
    with open(readable(path), encoding="utf-8") as f:
        for line in f:
            yield line[:-1] if line.endswith("\n") else line


def count_lines(path: Path) -> int:
    """Lines of a text file, counted in its bytes (fast, little memory)."""
    with open(readable(path), "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def no_text(path: Path, split: str, lines: int) -> NmtError:
    """The one line for a side of a split whose lines are all empty (vocab and every stage
    that loads pairs refuse it): SentencePiece would blame its vocabulary size, and train
    would learn to say nothing and exit 0."""
    return NmtError(f"{path} holds no text (its {lines} lines are empty): the {split} split "
                    f"has nothing on that side (fix: check the corpus's {split} files, then "
                    "re-run nmt download and nmt tokenize)")


def read_lines(path: Path) -> list[str]:
    return readable(path).read_text("utf-8").split("\n")[:-1]


def split_tokens(line: str) -> list[str]:
    """The tokens of one line of a .tok file (space-joined; an empty line has none)."""
    return line.split(" ") if line else []


def read_tokens(path: Path) -> list[list[str]]:
    return [split_tokens(line) for line in read_lines(path)]


def token_file(folder: Path, split: str, lang: str) -> Path:
    """<split>.<lang>.tok of a tokenized folder, which word vocabularies read. A folder
    tokenized with tokenize.words: false holds only the raw .txt files (for BPE), so a
    word-vocabulary recipe over it is refused by name rather than as a missing file."""
    path = Path(folder) / f"{split}.{lang}.tok"
    if not path.is_file() and path.with_suffix(".txt").is_file():
        raise NmtError(f"{path} is missing: {folder} was tokenized with tokenize.words: false, "
                       "which writes no word tokens (fix: set tokenize.words: true and re-run "
                       "nmt tokenize, or give the recipe vocab.kind: bpe)")
    return path


# spaCy splits "T-shirt" into T - shirt and "man's" into man 's; undo that for English output.
_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:%)\]}]|'s|'re|'ve|'ll|'m|'d|n't|'|’s)(?= |$)")
_NO_SPACE_AFTER = re.compile(r"([(\[{$]) ")
_HYPHEN = re.compile(r"(?<=\w) - (?=\w)")


def detokenize(tokens: list[str]) -> str:
    """Join tokens into a sentence the way the references are written (cased, spaced)."""
    text = " ".join(tokens)
    text = _HYPHEN.sub("-", text)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    text = _NO_SPACE_AFTER.sub(r"\1", text)
    # Straight double quotes alternate: open binds right, close binds left.
    parts = text.split('"')
    if len(parts) > 1:
        out = parts[0]
        for i, part in enumerate(parts[1:]):
            opening = i % 2 == 0
            out = out.rstrip() + (' "' + part.lstrip() if opening else '"' + part)
        text = out.strip()
    return text
