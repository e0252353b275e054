"""Text files and tokens: spaCy's rule-based tokenizers, line files, and the detokenizer
that turns word-level output back into a sentence written the way the references are."""

from __future__ import annotations

import re
from pathlib import Path

from tqdm import tqdm

from nmt.errors import NmtError


def tokenizer(lang: str):
    """spaCy's rule-based tokenizer alone: no model download, same tokens everywhere."""
    import spacy  # imported here: the GPU machine runs train/evaluate without spaCy

    return spacy.blank(lang)


def tokenize_lines(lines: list[str], lang: str, batch_size: int = 1000, desc: str = "",
                   progress: bool = True) -> list:
    """spaCy tokens of each line; a progress bar on stderr unless progress=False."""
    nlp = tokenizer(lang)
    docs = nlp.pipe(lines, batch_size=batch_size)
    # Whitespace-only tokens (from doubled spaces) carry nothing to translate.
    return [
        [t.text for t in doc if not t.is_space]
        for doc in tqdm(docs, total=len(lines), desc=desc, unit="sent", leave=False,
                        disable=not progress)
    ]


def read_lines(path: Path) -> list[str]:
    if not Path(path).is_file():
        raise NmtError(f"{path} is missing (fix: run `nmt tokenize` first)")
    return Path(path).read_text("utf-8").split("\n")[:-1]


def read_tokens(path: Path) -> list[list[str]]:
    return [line.split(" ") if line else [] for line in read_lines(path)]


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
