"""`nmt bench --data` and `nmt bench --decoding`: the benchmarks beside the bench stage, run by
its subcommand when one of their options asks (nmt.cli's BESIDE): the data stages at scale
(data_bench), and one trained run's decoding, ours against CTranslate2's (decoding_bench).
Importing this module imports neither, nor torch: `nmt bench` builds these options every time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.pipeline.commandline import EXPORTS, RAW, RESULTS, VOCAB, usable_cores
from nmt.pipeline.recipes import resolve


def arguments(sub: argparse.ArgumentParser) -> None:
    """Their options, after the bench stage's own."""
    sub.add_argument("--data", action="store_true",
                     help="instead: time the data stages (download, tokenize, vocab, loading "
                          "an epoch of batches) and their peak memory on a synthetic corpus of "
                          "--pairs pairs built from the Multi30k files in --raw; --threads: "
                          "tokenize's processes (default: every core)")
    sub.add_argument("--pairs", type=int, default=1_000_000, help="with --data: training pairs")
    sub.add_argument("--raw", type=Path, default=RAW,
                     help="with --data: the Multi30k raw files (default: data/raw)")
    sub.add_argument("--decoding", action="store_true",
                     help="instead: decode the first test set with --run's best.pt (our greedy "
                          "and beam search) and with its CTranslate2 export in fp32 and int8, "
                          "on the same threads; speed, BLEU and agreement, written to --json "
                          "(default: results/<run>/decoding.json)")
    sub.add_argument("--run", default="published-scratch-s0", help="with --decoding: the run")
    sub.add_argument("--results", type=Path, default=RESULTS,
                     help="with --decoding: holds <run>/")
    sub.add_argument("--exports", type=Path, default=EXPORTS,
                     help="with --decoding: holds <run>/, written by nmt export")


def asked(args) -> bool:
    """Whether the command line asks for one of them instead of the stage."""
    return args.data or args.decoding


def command(args, params: dict) -> None:
    if args.data:  # the data stages at scale, on a corpus of its own
        from nmt.commands import data_bench

        threads = args.threads or usable_cores()
        data_bench.bench_data(data_bench.Paths(raw=args.raw, json=args.json),
                              data_bench.DataPlan(pairs=args.pairs, threads=threads))
        return
    import torch

    from nmt.commands import decoding_bench
    from nmt.core.runs import Run

    run = Run.parse(args.run)
    files = run.files(args.results)
    decoding_bench.bench_decoding(resolve(params, run.recipe), decoding_bench.Paths(
        run=files, export=args.exports / run.name, vocab=args.vocab or VOCAB / run.recipe,
        tokenized=args.tokenized, json=args.json or files.decoding),
        decoding_bench.DecodingPlan(repeats=args.repeats or params["bench"]["repeats"],
                                    sentences=args.sentences or 0,
                                    threads=torch.get_num_threads()))
