"""Stage report: reports/report.md, results.csv, results_summary.csv, metrics.json,
statistics.json and figures/ from the small files the runs left in results/.

`report` loads the inputs once (`load`: the `inputs.Inputs` object), draws the figures
(`figures`), writes the tables for machines (`tables`) and joins the sections, one builder
function a section, each returning markdown lines: the answer (`answer`: head, results,
statistics), what each ingredient bought (`search`: recipe search, ablations), the published
reference (`reference`: reference, attention kernels), speed (`speed`: training, benchmarks,
data stages, decoding engines) and the evidence (`evidence`: verification, samples, attention,
setup). Nothing here reads a checkpoint, so results produced on another machine can be
reported here.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from nmt.core.files import atomic_dir, write_text
from nmt.pipeline import commandline
from nmt.stages.report.answer import head_section, results_section, statistics_section
from nmt.stages.report.evidence import (
    attention_section,
    samples_section,
    setup_section,
    verification_section,
)
from nmt.stages.report.figures import draw_figures
from nmt.stages.report.load import load
from nmt.stages.report.reference import kernels_section, reference_section
from nmt.stages.report.search import ablation_section, search_section, search_steps
from nmt.stages.report.size import size_section
from nmt.stages.report.speed import data_bench_section, decoding_section, training_section
from nmt.stages.report.tables import write_tables

# What tests and other modules import from nmt.stages.report, beside the stage's own names.
__all__ = ["Paths", "report", "HELP", "arguments", "command", "search_steps",
           "data_bench_section", "decoding_section"]

log = logging.getLogger("nmt.report")


@dataclass(frozen=True)
class Paths:
    tokenized: Path  # data/tokenized: sources and references of the samples
    vocab: Path  # data/vocab: holds <recipe>/meta.json of every recipe
    results: Path  # results/: every run's folder, verify/ and bench.json
    out: Path  # reports/
    full_size: Path | None = None  # a published full-size run's report folder (size.py)


def report(settings: dict, paths: Paths) -> None:
    """Stage report: read results/ and data/, write reports/: report.md, tables and figures.
    settings: params.yaml (every recipe, the pipeline lists, report.samples)."""
    out = Path(paths.out)
    inp = load(settings, paths.tokenized, paths.vocab, paths.results)
    with atomic_dir(out / "figures") as folder:
        figures = draw_figures(inp, folder)
    lines = (head_section(inp) + results_section(inp) + size_section(inp, paths.full_size)
             + statistics_section(inp)
             + search_section(inp) + ablation_section(inp) + reference_section(inp)
             + kernels_section(inp) + training_section(inp, figures)
             + verification_section(inp) + samples_section(inp)
             + attention_section(inp, figures) + setup_section(inp) + data_bench_section(inp)
             + decoding_section(inp))
    write_tables(inp, out)
    write_text(out / "report.md", "\n".join(lines))
    log.info("wrote %s, results.csv (%d rows), results_summary.csv, metrics.json, "
             "statistics.json, figures/ (%s)", out / "report.md", len(inp.table),
             ", ".join(figures.values()))


# ---- `nmt report`: nmt.cli builds the subcommand from HELP, arguments and command ----------------

HELP = ("Read results/ and data/, write reports/report.md, reports/results.csv and "
        "figures.")


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.results(parser)
    parser.add_argument("--tokenized", type=Path, default=commandline.TOKENIZED)
    parser.add_argument("--vocab", type=Path, default=None, help="holds <recipe>/ (default: "
                        "data/vocab)")
    parser.add_argument("--out", type=Path, default=commandline.REPORTS)
    parser.add_argument("--full-size", type=Path, default=None, help="a published full-size "
                        "run's report folder (results_summary.csv, statistics.json), for the "
                        "section 'Against full size' when the pipeline runs no `published`")


def command(args, params: dict) -> None:
    report(params, Paths(tokenized=args.tokenized, vocab=args.vocab or commandline.VOCAB,
                         results=args.results, out=args.out, full_size=args.full_size))
