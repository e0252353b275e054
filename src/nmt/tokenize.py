"""Stage tokenize: spaCy rule-based tokenizers over every split; also a detokenizer for output."""

from __future__ import annotations

import gzip
import logging
import re
from pathlib import Path

from tqdm import tqdm

from nmt.config import NmtError
from nmt.download import LANGS, SPLITS
from nmt.files import atomic_dir, write_json

log = logging.getLogger("nmt.tokenize")


def read_raw(raw_dir: Path, split: str, lang: str) -> list[str]:
    path = Path(raw_dir) / f"{split}.{lang}.gz"
    if not path.is_file():
        raise NmtError(f"{path} is missing (fix: run `nmt download` first)")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [line.strip() for line in f]
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise NmtError(f"{path} is unreadable ({e}) (fix: re-run `nmt download`)") from None


def tokenizer(lang: str):
    """spaCy's rule-based tokenizer alone: no model download, same tokens everywhere."""
    import spacy  # imported here: the GPU machine runs train/evaluate without spaCy

    return spacy.blank(lang)


def tokenize_lines(lines: list[str], lang: str, batch_size: int = 1000, desc: str = "") -> list:
    nlp = tokenizer(lang)
    docs = nlp.pipe(lines, batch_size=batch_size)
    # Whitespace-only tokens (from doubled spaces) carry nothing to translate.
    return [
        [t.text for t in doc if not t.is_space]
        for doc in tqdm(docs, total=len(lines), desc=desc, unit="sent", leave=False)
    ]


def tokenize(raw_dir: Path, out_dir: Path, batch_size: int, max_train: int, max_test: int):
    """Write <split>.<lang>.txt (raw lines) and <split>.<lang>.tok (space-joined tokens)."""
    stats = {}
    with atomic_dir(out_dir) as tmp:
        for split in SPLITS:
            limit = max_train if split == "train" else max_test if split.startswith("test") else 0
            pairs = {lang: read_raw(raw_dir, split, lang) for lang in LANGS}
            if len(pairs["de"]) != len(pairs["en"]):
                raise NmtError(
                    f"{split}: {len(pairs['de'])} German vs {len(pairs['en'])} English lines "
                    "(fix: re-run `nmt download`)"
                )
            for lang, lines in pairs.items():
                lines = lines[:limit] if limit else lines
                tokens = tokenize_lines(lines, lang, batch_size, desc=f"{split}.{lang}")
                (tmp / f"{split}.{lang}.txt").write_text("\n".join(lines) + "\n", "utf-8")
                (tmp / f"{split}.{lang}.tok").write_text(
                    "\n".join(" ".join(t) for t in tokens) + "\n", "utf-8"
                )
                lengths = [len(t) for t in tokens]
                stats[f"{split}.{lang}"] = {
                    "sentences": len(tokens),
                    "tokens": sum(lengths),
                    "max_len": max(lengths),
                }
                log.info("%s.%s: %d sentences, %d tokens, longest %d", split, lang,
                         len(tokens), sum(lengths), max(lengths))
        write_json(tmp / "stats.json", stats)
    log.info("wrote %s", out_dir)
    return stats


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
