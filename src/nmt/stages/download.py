"""Stage download: the pipeline's corpus (data.corpus, nmt.pipeline.corpus) into data/raw, one
<split>.<lang>.gz a split and language, written to a temporary folder and renamed when whole.

How the files are made is the corpus kind's (its module in nmt.pipeline.corpora):
- multi30k: fetch the public files (MULTI30K_MIRROR first) and verify their pinned sha256;
- files: read the local files (plain or .gz), check that the sides pair up, write them gzipped;
- huggingface: datasets.load_dataset each split, take the two languages' columns, write them.
Whatever the kind, data/raw/SHA256SUMS records what was written (nmt.core.records): tokenize
checks each file against it before reading, Snakemake's preflight when it starts.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from nmt.core.files import atomic_dir
from nmt.core.records import write_record
from nmt.pipeline import commandline
from nmt.pipeline.corpora.kinds import kind_of
from nmt.pipeline.corpora.raw import PINS, Origin
from nmt.pipeline.corpus import corpus_settings, raw_names

log = logging.getLogger("nmt.download")


@dataclass(frozen=True)
class Paths:
    out: Path  # data/raw: <split>.<lang>.gz
    sums: Path = PINS  # multi30k: the pinned sha256 of every file
    root: Path = Path(".")  # files: relative paths in data.files are relative to this


def download(settings: dict, paths: Paths, *, retries: int = 4, backoff: float = 2.0) -> None:
    """Stage download: write every raw file of the corpus (nmt.pipeline.corpus.raw_names) into a
    temporary folder, as its kind does, then rename it to paths.out. settings: the pipeline's
    corpus settings (nmt.pipeline.corpus.corpus_settings; its data section)."""
    data = settings["data"]
    origin = Origin(root=paths.root, pins=paths.sums, retries=retries, backoff=backoff)
    with atomic_dir(paths.out) as tmp:
        kind_of(data).download(data, origin, tmp)
        write_record(tmp, "download")
    log.info("wrote %d files to %s", len(raw_names(data)), paths.out)


# ---- `nmt download`: nmt.cli builds the subcommand from HELP, arguments and command --------------

HELP = ("Write train, val and data.testsets of the pipeline's corpus (data.corpus of "
        "pipeline.recipes[0]) to data/raw/<split>.<lang>.gz: multi30k fetched "
        "(MULTI30K_MIRROR first, then data.base_url) and verified against "
        "workflow/multi30k.sha256; files and huggingface read and checked.")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=commandline.RAW)


def command(args, params: dict) -> None:
    download(corpus_settings(params), Paths(out=args.out))
