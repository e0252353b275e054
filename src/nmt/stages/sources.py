"""Stage sources: what the corpus is made of, one line a source file, in params/sources.sha256,
so that an edit of a local corpus file re-runs download and what follows, and nothing else.

The files of data.corpus: files (or a local Hugging Face dataset folder) lie outside the
project, where neither orchestrator looks. So DVC runs this stage every time
(`always_changed`) and Snakemake runs `refresh` when it reads the workflow; the file is
rewritten only when its text changes, and download depends on it: an unchanged corpus
re-runs nothing.

- multi30k: the pinned sha256 of each file (download checks what it fetches against them);
- files: the sha256 of each file of data.files;
- huggingface: the sha256 of each file of a local dataset folder; a Hub dataset is known by
  data.huggingface itself (a params dependency of download).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from nmt.core.files import sha256, write_text
from nmt.core.records import read_sums
from nmt.pipeline.corpus import PINS, corpus_settings, local_files, raw_names

log = logging.getLogger("nmt.sources")

OUT = Path("params/sources.sha256")


def describe(data: dict, root: Path = Path(".")) -> str:
    """The text of params/sources.sha256 for the corpus settings `data`."""
    kind = data["corpus"]
    lines = [f"# data.corpus: {kind}"]
    if kind == "multi30k":
        pinned = read_sums(Path(root) / PINS)
        lines += [f"{pinned.get(name, 'unpinned')}  {name}" for name in raw_names(data)]
    elif kind == "files":
        for name, path in local_files(data, root).items():  # train.de.gz <- its file
            lines.append(f"{sha256(path) if path.is_file() else 'missing'}  {name}  {path}")
    else:
        folder = Path(root) / data["huggingface"]["path"]
        if folder.is_dir():  # a local dataset folder: its files; else a Hub id (params say it)
            files = [f.relative_to(folder) for f in sorted(folder.rglob("*")) if f.is_file()]
            lines += [f"{sha256(folder / f)}  {f}" for f in files
                      if not any(part.startswith(".") for part in f.parts)]
    return "\n".join(lines) + "\n"


def refresh(settings: dict, out: Path = OUT, root: Path = Path(".")) -> bool:
    """Stage sources: write `out` if its text would change; True if it did. settings: the
    pipeline's corpus settings (nmt.pipeline.corpus.corpus_settings)."""
    text = describe(settings["data"], root)
    if Path(out).is_file() and Path(out).read_text() == text:
        log.info("%s: unchanged", out)
        return False
    write_text(out, text)
    log.info("%s: written", out)
    return True


# ---- `nmt sources`: nmt.cli builds the subcommand from HELP, arguments and command ---------------

HELP = ("Write params/sources.sha256, the sha256 of every file the corpus is made of "
        "(data.corpus), if it changed: download depends on it.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=OUT)


def command(args, params: dict) -> None:
    refresh(corpus_settings(params), args.out)
