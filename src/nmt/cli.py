"""`nmt <stage>`: one subcommand per pipeline stage; DVC and Snakemake call exactly these."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from nmt.config import NmtError, Run, load_params, resolve

RAW, TOKENIZED, VOCAB, RESULTS, REPORTS = (
    Path("data/raw"), Path("data/tokenized"), Path("data/vocab"), Path("results"), Path("reports"))


def cmd_download(args, params):
    from nmt.download import download

    download(args.out, params["data"]["base_url"])


def cmd_tokenize(args, params):
    from nmt.tokenize import tokenize

    d = params["data"]
    tokenize(args.raw, args.out, params["tokenize"]["batch_size"],
             d["max_train_pairs"], d["max_test_pairs"])


def cmd_vocab(args, params):
    from nmt.vocab import build

    r = resolve(params, args.recipe)
    build(args.tokenized, args.out or VOCAB / args.recipe, r["vocab"],
          r["data"]["source_lang"], r["data"]["target_lang"])


def cmd_verify(args, params):
    from nmt.verify import verify

    passed = verify(resolve(params, args.recipe), args.tokenized, args.vocab / args.recipe,
                    args.out or RESULTS / "verify" / f"{args.recipe}.json")
    return 0 if passed else 1  # a failed check stops the pipeline before training


def cmd_train(args, params):
    from nmt.distributed import launch, under_torchrun
    from nmt.resume import Stopped
    from nmt.train import train

    run, recipe = Run(args.recipe, args.model, args.seed), resolve(params, args.recipe)
    if recipe["train"]["devices"] > 1 and not under_torchrun():
        return launch(recipe["train"]["devices"], train_argv(args))
    try:
        train(recipe, run, args.tokenized, args.vocab / args.recipe, run.dir(args.results),
              restart=args.restart)
    except Stopped as e:
        if str(e):
            print(f"nmt train: {e}", file=sys.stderr)
        return e.code


def train_argv(args) -> list[str]:
    """This `nmt train` command line, for the processes torchrun starts."""
    return (["--params", str(args.params)] + (["-q"] if args.quiet else []) +
            ["train", "--recipe", args.recipe, "--model", args.model, "--seed", str(args.seed),
             "--tokenized", str(args.tokenized), "--vocab", str(args.vocab),
             "--results", str(args.results)] + (["--restart"] if args.restart else []))


def cmd_evaluate(args, params):
    from nmt.evaluate import evaluate

    run = Run(args.recipe, args.model, args.seed)
    evaluate(resolve(params, args.recipe), args.tokenized, args.vocab / args.recipe,
             run.dir(args.results))


def cmd_translate(args, params):
    from nmt.translate import translate_cli

    translate_cli(args)


def cmd_report(args, params):
    from nmt.report import report

    report(params, args.tokenized, args.vocab, args.results, args.out)


def cmd_bench(args, params):
    from nmt.bench import bench

    args.recipe = args.recipe or params["bench"]["recipe"]
    bench(args, params)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nmt", description=__doc__)
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="the configuration (default: params.yaml)")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    sub = p.add_subparsers(dest="stage", required=True, metavar="<stage>")

    def stage(name, func, help_):
        s = sub.add_parser(name, help=help_, description=help_)
        s.set_defaults(func=func)
        return s

    s = stage("download", cmd_download,
              "Fetch the Multi30k task-1 raw files (MULTI30K_MIRROR first, then data.base_url), "
              "verify their sha256 and write data/raw/<split>.<lang>.gz.")
    s.add_argument("--out", type=Path, default=RAW)

    s = stage("tokenize", cmd_tokenize,
              "Read data/raw, tokenize with spaCy's rule-based de/en tokenizers and write "
              "data/tokenized/<split>.<lang>.{txt,tok} and stats.json.")
    s.add_argument("--raw", type=Path, default=RAW)
    s.add_argument("--out", type=Path, default=TOKENIZED)

    s = stage("vocab", cmd_vocab,
              "Read data/tokenized (train split only) and write one recipe's vocabulary to "
              "data/vocab/<recipe>/ (word: src.json, tgt.json; bpe: spm.model) with meta.json.")
    s.add_argument("--recipe", default="published")
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--out", type=Path, default=None, help="default: data/vocab/<recipe>")

    s = stage("verify", cmd_verify,
              "Read data/tokenized and data/vocab/<recipe>, prove the scratch model computes what "
              "torch.nn.Transformer computes at the recipe's size, write "
              "results/verify/<recipe>.json; exit 1 if a check fails.")
    s.add_argument("--recipe", default="published")
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--vocab", type=Path, default=VOCAB)
    s.add_argument("--out", type=Path, default=None, help="default: results/verify/<recipe>.json")

    for name, func, help_ in (
        ("train", cmd_train,
         "Read data/tokenized and data/vocab/<recipe>, train one model and write "
         "results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv, train.json (when "
         "training completes). An interrupted run (Ctrl-C, SIGTERM, a crash) keeps resume.pt "
         "there; the same command continues it with the numbers an uninterrupted run gives."),
        ("evaluate", cmd_evaluate,
         "Read results/<recipe>-<model>-s<seed>/best.pt and the test sets, write metrics.json "
         "(loss, perplexity, BLEU greedy and beam, chrF), translations/ and attention.json (one "
         "sentence's attention weights) to the same folder."),
    ):
        s = stage(name, func, help_)
        s.add_argument("--recipe", default="published")
        s.add_argument("--model", required=True, choices=["baseline", "scratch"])
        s.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
        s.add_argument("--tokenized", type=Path, default=TOKENIZED)
        s.add_argument("--vocab", type=Path, default=VOCAB)
        s.add_argument("--results", type=Path, default=RESULTS)
        if name == "train":
            s.add_argument("--restart", action="store_true",
                           help="set aside a resume state (resume.pt) and train from scratch")

    s = stage("translate", cmd_translate,
              "Translate German sentences given as arguments, in --file, or on standard input, "
              "with a trained run's checkpoint; prints one English line per input line.")
    s.add_argument("sentences", nargs="*")
    s.add_argument("--run", default="published-scratch-s0",
                   help="results/<run> to load (default: published-scratch-s0)")
    s.add_argument("--checkpoint", type=Path, default=None, help="a .pt file instead of --run")
    s.add_argument("--file", type=Path, default=None)
    s.add_argument("--results", type=Path, default=RESULTS)
    s.add_argument("--vocab", type=Path, default=VOCAB)
    s.add_argument("--beam", type=int, default=None, help="beam size (default: from params)")
    s.add_argument("--device", default="auto")

    s = stage("report", cmd_report,
              "Read results/ and data/, write reports/report.md, reports/results.csv and "
              "figures.")
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--vocab", type=Path, default=VOCAB)
    s.add_argument("--results", type=Path, default=RESULTS)
    s.add_argument("--out", type=Path, default=REPORTS)

    s = stage("bench", cmd_bench,
              "Train both models for a fixed number of steps on the same real batches, then "
              "decode the same sentences greedily and with beam search; print a speed table.")
    s.add_argument("--recipe", default=None, help="default: bench.recipe from params")
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--vocab", type=Path, default=VOCAB)
    s.add_argument("--device", default="auto")
    # Defaults come from params.yaml's bench: section.
    s.add_argument("--steps", type=int, default=None, help="timed training steps a repeat")
    s.add_argument("--repeats", type=int, default=None, help="the median of this many is shown")
    s.add_argument("--sentences", type=int, default=None, help="test sentences to decode")
    s.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(name)s: %(message)s", stream=sys.stderr)
    try:
        params = load_params(args.params)
        return args.func(args, params) or 0
    except NmtError as e:
        print(f"nmt {args.stage}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = "no half-written output was kept"
        if args.stage == "train":  # the training loop itself answers Ctrl-C with its own line
            state = Run(args.recipe, args.model, args.seed).dir(args.results) / "resume.pt"
            kept = (f"outputs appear only when training completes; {state}, if there, is kept "
                    "and the same nmt train command resumes from it")
        print(f"nmt {args.stage}: interrupted; {kept}", file=sys.stderr)
        return 130
