"""Stage sources: what the corpus is made of, one line a source file, in params/sources.sha256,
so that an edit of a local corpus file re-runs download and what follows, and nothing else.

The files of data.corpus: files (or a local Hugging Face dataset folder) lie outside the
project, where neither orchestrator looks. So DVC runs this stage every time
(`always_changed`) and Snakemake runs `refresh` when it reads the workflow; the file is
rewritten only when its text changes, and download depends on it: an unchanged corpus
re-runs nothing. A changed one is first read as download would read it (the kind's `vet`:
text that is not UTF-8, sides that do not pair up, a Hugging Face path that does not
resolve): this stage then fails, before either orchestrator deletes data/raw to run a
download bound to fail, and records nothing, so the next run reads it again.

What the lines are is the corpus kind's to say (its `describe`, nmt.pipeline.corpora): the
pinned sha256 of each Multi30k file, the sha256 of each file of data.files, of each file of a
local Hugging Face dataset folder (a Hub dataset is known by data.huggingface itself, a params
dependency of download).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from nmt.core.files import write_text
from nmt.pipeline import preflight
from nmt.pipeline.corpora.kinds import kind_of
from nmt.pipeline.corpus import corpus_settings

log = logging.getLogger("nmt.sources")

OUT = Path("params/sources.sha256")


def describe(data: dict, root: Path = Path(".")) -> str:
    """The text of params/sources.sha256 for the corpus settings `data`."""
    lines = [f"# data.corpus: {data['corpus']}", *kind_of(data).describe(data, Path(root))]
    return "\n".join(lines) + "\n"


def refresh(settings: dict, out: Path = OUT, root: Path = Path(".")) -> bool:
    """Stage sources: write `out` if its text would change; True if it did. settings: the
    pipeline's corpus settings (nmt.pipeline.corpus.corpus_settings)."""
    text = describe(settings["data"], root)
    if not stale(text, out):
        log.info("%s: unchanged", out)
        return False
    kind_of(settings["data"]).vet(settings["data"], Path(root))
    write_text(out, text)
    log.info("%s: written", out)
    return True


def stale(text: str, out: Path = OUT) -> bool:
    """Whether `out` does not hold `text` (describe's) yet."""
    return not (Path(out).is_file() and Path(out).read_text() == text)


# ---- `nmt sources`: nmt.cli builds the subcommand from HELP, arguments and command ---------------

HELP = ("Write params/sources.sha256, the sha256 of every file the corpus is made of "
        "(data.corpus), if it changed: download depends on it.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=OUT)


def command(args, params: dict) -> None:
    # DVC runs this stage on every `dvc repro`, before any stage that deletes a folder to
    # write it again: the one place a guard runs first there (Snakemake's: its Snakefile).
    preflight.check_links()
    refresh(corpus_settings(params), args.out)
