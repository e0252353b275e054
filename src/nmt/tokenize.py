"""Stage tokenize: spaCy rule-based tokenizers over every split."""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NmtError
from nmt.files import atomic_dir, write_json
from nmt.text import tokenize_lines

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


@dataclass(frozen=True)
class Paths:
    raw: Path  # data/raw
    out: Path  # data/tokenized


def tokenize(settings: dict, paths: Paths) -> dict:
    """Stage tokenize: write <split>.<lang>.txt (raw lines) and <split>.<lang>.tok
    (space-joined tokens) of train, val and data.testsets, and stats.json; data.max_train_pairs
    / max_test_pairs cut them (0 = all). settings: params.yaml (data, tokenize)."""
    data, batch_size = settings["data"], settings["tokenize"]["batch_size"]
    raw_dir, out_dir = paths.raw, paths.out
    stats, langs = {}, (data["source_lang"], data["target_lang"])
    limits = {"train": data["max_train_pairs"], "val": 0} | {
        t: data["max_test_pairs"] for t in data["testsets"]}
    with atomic_dir(out_dir) as tmp:
        for split, limit in limits.items():
            pairs = {lang: read_raw(raw_dir, split, lang) for lang in langs}
            counts = [len(lines) for lines in pairs.values()]
            if counts[0] != counts[1]:
                raise NmtError(f"{split}: {counts[0]} {langs[0]} vs {counts[1]} {langs[1]} "
                               "lines (fix: re-run `nmt download`)")
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
