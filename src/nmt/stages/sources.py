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

The record holds the kind (data.corpus), its own settings (its SETTINGS: data.files,
data.huggingface, data.base_url) and its code: the sha256 of every module the kind's module
runs (nmt.pipeline.code.kind_code). The kinds are found by name (nmt.pipeline.corpora.kinds),
so no stage's derived code holds one; download and the report, which run the kind, depend on
this record instead, and so re-run when the kind in use, its settings or its code change,
never when another kind is edited or a new one registered. The rest of the lines are the
kind's to say (its `describe`, nmt.pipeline.corpora): the pinned sha256 of each Multi30k
file, the sha256 of each file of data.files, of each file of a local Hugging Face dataset
folder (a Hub dataset is known by data.huggingface itself).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from nmt.core.files import sha256, write_text
from nmt.pipeline import code, preflight
from nmt.pipeline.corpora.kinds import kind_of, settings_of
from nmt.pipeline.corpus import corpus_settings

log = logging.getLogger("nmt.sources")

OUT = Path("params/sources.sha256")


def describe(data: dict, root: Path = Path("."), src: Path | None = None) -> str:
    """The text of params/sources.sha256 for the corpus settings `data`: the kind, its own
    settings, the sha256 of every module it runs (found under src, the folder that holds nmt:
    by default where the kind was loaded from), then the kind's lines."""
    kind = kind_of(data)
    src = code.source_root(kind) if src is None else Path(src)
    modules = code.kind_code(data["corpus"], src)
    lines = [f"# data.corpus: {data['corpus']}",
             *(f"# {key}: {json.dumps(value, sort_keys=True)}"
               for key, value in settings_of(data).items()),
             f"# the code of kind {data['corpus']}:",
             *(f"{sha256(src / 'nmt' / module)}  nmt/{module}" for module in modules),
             *kind.describe(data, Path(root))]
    return "\n".join(lines) + "\n"


def refresh(settings: dict, out: Path = OUT, root: Path = Path("."),
            src: Path | None = None) -> bool:
    """Stage sources: write `out` if its text would change; True if it did. settings: the
    pipeline's corpus settings (nmt.pipeline.corpus.corpus_settings); src: describe's."""
    text = describe(settings["data"], root, src)
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
