"""Stage tokenize: spaCy rule-based tokenizers over every split, streamed.

Each split is read line by line from its raw .gz and written as it goes: first the raw lines
(<split>.<lang>.txt, what BPE vocabularies and the references read), then their spaCy tokens
(<split>.<lang>.tok, space-joined, what word vocabularies read), in worker processes when
--threads allows; last stats.json and SHA256SUMS (every reader checks a file against it,
nmt.core.records). Nothing holds a whole split, so a million pairs take what a thousand do in
memory. With tokenize.words: false only the .txt files are written (a pipeline of BPE
recipes needs no word tokens) and spaCy never runs.
"""

from __future__ import annotations

import argparse
import gzip
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from nmt.core.errors import NmtError
from nmt.core.files import atomic_dir, utf8_lines, write_json
from nmt.core.records import verified, write_record
from nmt.core.text import iter_lines, token_lines
from nmt.pipeline import commandline
from nmt.pipeline.corpus import corpus_settings

log = logging.getLogger("nmt.tokenize")


def raw_lines(raw_dir: Path, split: str, lang: str) -> Iterator[str]:
    """The stripped lines of <split>.<lang>.gz, one by one."""
    path = Path(raw_dir) / f"{split}.{lang}.gz"
    if not path.is_file():
        raise NmtError(f"{path} is missing (fix: run `nmt download` first)")
    verified(path)  # against data/raw/SHA256SUMS: a damaged copy is never tokenized
    try:
        with gzip.open(path, "rb") as f:
            for line in utf8_lines(f, str(path), "re-run `nmt download`"):
                yield line.strip()
    except (OSError, EOFError) as e:
        raise NmtError(f"{path} is unreadable ({e}) (fix: re-run `nmt download`)") from None


def write_text_lines(lines: Iterator[str], out: Path, limit: int) -> tuple[int, int]:
    """The first `limit` lines (0: all) into out, one a line; (lines read, lines written).
    Every line is read, so that the sides of a split can be compared whole."""
    read = 0
    with open(out, "w", encoding="utf-8") as f:
        for line in lines:
            read += 1
            if not limit or read <= limit:
                f.write(line + "\n")
    return read, min(read, limit) if limit else read


# Splits of fewer lines are tokenized in this process whatever --threads says: a worker takes
# a second or two to start (spaCy's tokenizer included), what one process needs for ~20,000
# lines; Multi30k's splits (29,000 lines at most) gain nothing from workers.
PARALLEL_FROM = 50_000


@dataclass(frozen=True)
class Tokenizer:
    """How the .tok files are made: spaCy's tokenizer of each language, nlp.pipe batches of
    batch_size lines, in `processes` processes (1: this one). The bytes written are the
    same whatever the number of processes."""

    batch_size: int
    processes: int = 1

    def write(self, txt: Path, tok: Path, lang: str, sentences: int) -> dict:
        """The tokens of txt's lines into tok; their stats (sentences, tokens, longest)."""
        tokens = longest = 0
        # Starting workers costs seconds: worth it only for splits of many lines.
        processes = self.processes if sentences >= PARALLEL_FROM else 1
        lines = token_lines(iter_lines(txt), lang, self.batch_size, processes)
        with open(tok, "w", encoding="utf-8") as f:
            for line in tqdm(lines, total=sentences, desc=txt.stem, unit="sent", leave=False):
                f.write(line + "\n")
                count = line.count(" ") + 1 if line else 0  # tokens hold no spaces
                tokens, longest = tokens + count, max(longest, count)
        return {"sentences": sentences, "tokens": tokens, "max_len": longest}


@dataclass(frozen=True)
class Paths:
    raw: Path  # data/raw
    out: Path  # data/tokenized


def tokenize(settings: dict, paths: Paths, processes: int = 1) -> dict:
    """Stage tokenize: write <split>.<lang>.txt (raw lines) and, with tokenize.words,
    <split>.<lang>.tok (space-joined tokens) of train, val and data.testsets, and stats.json;
    data.max_train_pairs / max_test_pairs cut them (0 = all). settings: params.yaml (data,
    tokenize). processes: spaCy worker processes (nmt tokenize --threads), no param, as it
    changes no byte."""
    data, words = settings["data"], settings["tokenize"]["words"]
    tokenizer = Tokenizer(settings["tokenize"]["batch_size"], processes) if words else None
    stats, langs = {}, (data["source_lang"], data["target_lang"])
    limits = {"train": data["max_train_pairs"], "val": 0} | {
        t: data["max_test_pairs"] for t in data["testsets"]}
    with atomic_dir(paths.out) as tmp:
        for split, limit in limits.items():
            read, kept = {}, {}
            for lang in langs:
                read[lang], kept[lang] = write_text_lines(
                    raw_lines(paths.raw, split, lang), tmp / f"{split}.{lang}.txt", limit)
            if read[langs[0]] != read[langs[1]]:  # before the long work: tokenizing
                raise NmtError(f"{split}: {read[langs[0]]} {langs[0]} vs {read[langs[1]]} "
                               f"{langs[1]} lines (fix: re-run `nmt download`)")
            for lang in langs:
                key, sentences = f"{split}.{lang}", kept[lang]
                if tokenizer:
                    stats[key] = tokenizer.write(tmp / f"{key}.txt", tmp / f"{key}.tok", lang,
                                                 sentences)
                    log.info("%s: %d sentences, %d tokens, longest %d", key, sentences,
                             stats[key]["tokens"], stats[key]["max_len"])
                else:
                    stats[key] = {"sentences": sentences}
                    log.info("%s: %d sentences (raw text only: tokenize.words is false)", key,
                             sentences)
        write_json(tmp / "stats.json", stats)
        write_record(tmp, "tokenize")
    log.info("wrote %s", paths.out)
    return stats


# ---- `nmt tokenize`: nmt.cli builds the subcommand from HELP, arguments and command --------------

HELP = ("Read data/raw, tokenize with spaCy's rule-based tokenizers and write "
        "data/tokenized/<split>.<lang>.{txt,tok} and stats.json (tokenize.words: false: "
        "the .txt files only, no spaCy), streaming, a split at a time.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw", type=Path, default=commandline.RAW)
    parser.add_argument("--out", type=Path, default=commandline.TOKENIZED)
    # Not `threads` (which sets torch's threads and imports torch): spaCy processes.
    parser.add_argument("--threads", dest="processes", type=int, default=1, metavar="N",
                        help="tokenize in N processes, at most the machine's cores (default 1: "
                             "this one); the files are the same whatever N")


def command(args, params: dict) -> None:
    tokenize(corpus_settings(params), Paths(raw=args.raw, out=args.out),
             commandline.checked_threads(args.processes))
