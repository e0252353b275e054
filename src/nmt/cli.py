"""`nmt <stage>`: one subcommand per pipeline stage; DVC and Snakemake call exactly these."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import yaml

from nmt.errors import NmtError
from nmt.params import load_params
from nmt.recipes import resolve
from nmt.runs import MODEL_NAMES, Run

RAW, TOKENIZED, VOCAB, RESULTS, REPORTS = (
    Path("data/raw"), Path("data/tokenized"), Path("data/vocab"), Path("results"), Path("reports"))
TORCH_STAGES = {"verify", "train", "evaluate", "bench", "translate"}
DEFAULT_THREADS = 8  # the `threads:` that workflow/stages.yaml declares for the torch stages


def cmd_download(args, params):
    from nmt.download import download

    download(args.out, params["data"])


def cmd_tokenize(args, params):
    from nmt.tokenize import tokenize

    tokenize(args.raw, args.out, params["data"], params["tokenize"]["batch_size"])


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

    evaluate(resolve(params, args.recipe), Run(args.recipe, args.model, args.seed),
             args.tokenized, args.vocab / args.recipe, args.results)


def cmd_translate(args, params):
    from nmt.translate import translate_cli

    translate_cli(args, params)


def cmd_report(args, params):
    from nmt.report import report

    report(params, args.tokenized, args.vocab, args.results, args.out)


def cmd_bench(args, params):
    from nmt.bench import bench

    args.recipe = args.recipe or params["bench"]["recipe"]
    bench(args, params)


def cmd_config(args, params):
    from nmt.files import write_text

    # Written only when its content changes: an unchanged recipe keeps its bytes and mtime.
    text = yaml.safe_dump(resolve(params, args.recipe), sort_keys=True)
    out = args.out or Path("params") / f"{args.recipe}.yaml"
    if not out.is_file() or out.read_text() != text:
        write_text(out, text)


def cmd_stages(args, params):
    from nmt.stages import rendered

    files = rendered(args.declaration)  # dvc.yaml, workflow/rules/stages.smk
    if args.check:
        stale = [str(p) for p, text in files.items()
                 if not p.is_file() or p.read_text() != text]
        if stale:
            raise NmtError(f"{' and '.join(stale)} differ{'s' if len(stale) == 1 else ''} "
                           f"from {args.declaration} (fix: nmt stages --write)")
    elif args.write:
        for path, text in files.items():
            path.write_text(text)
    else:
        for path, text in files.items():
            print(f"# ==> {path} <==\n{text}", end="")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nmt", description=__doc__)
    p.add_argument("--params", type=Path, default=Path("params.yaml"),
                   help="the configuration (default: params.yaml)")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    sub = p.add_subparsers(dest="stage", required=True, metavar="<stage>")

    # Options several stages share, declared once.
    recipe = argparse.ArgumentParser(add_help=False)
    recipe.add_argument("--recipe", default="published", help="a recipe of params.yaml")
    data = argparse.ArgumentParser(add_help=False)
    data.add_argument("--tokenized", type=Path, default=TOKENIZED)
    data.add_argument("--vocab", type=Path, default=VOCAB, help="holds <recipe>/")
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument("--results", type=Path, default=RESULTS)
    run = argparse.ArgumentParser(add_help=False, parents=[recipe, data, results])
    run.add_argument("--model", required=True, choices=MODEL_NAMES)
    run.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")

    def stage(name, func, help_, parents=()):
        s = sub.add_parser(name, help=help_, description=help_, parents=list(parents))
        s.set_defaults(func=func)
        return s

    s = stage("download", cmd_download,
              "Fetch the Multi30k task-1 raw files of train, val and data.testsets "
              "(MULTI30K_MIRROR first, then data.base_url), verify their sha256 against "
              "workflow/multi30k.sha256 and write data/raw/<split>.<lang>.gz.")
    s.add_argument("--out", type=Path, default=RAW)

    s = stage("tokenize", cmd_tokenize,
              "Read data/raw, tokenize with spaCy's rule-based tokenizers and write "
              "data/tokenized/<split>.<lang>.{txt,tok} and stats.json.")
    s.add_argument("--raw", type=Path, default=RAW)
    s.add_argument("--out", type=Path, default=TOKENIZED)

    s = stage("config", cmd_config,
              "Resolve one recipe (the top-level sections with its overrides merged over "
              "them) and write params/<recipe>.yaml, whose keys the later stages "
              "declare as parameters.", [recipe])
    s.add_argument("--out", type=Path, default=None, help="default: params/<recipe>.yaml")

    s = stage("vocab", cmd_vocab,
              "Read data/tokenized (train split only) and write one recipe's vocabulary to "
              "data/vocab/<recipe>/ (word: src.json, tgt.json; bpe: spm.model) with meta.json.",
              [recipe])
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--out", type=Path, default=None, help="default: data/vocab/<recipe>")

    s = stage("verify", cmd_verify,
              "Read data/tokenized and data/vocab/<recipe>, prove the scratch model computes what "
              "torch.nn.Transformer computes at the recipe's size, write "
              "results/verify/<recipe>.json; exit 1 if a check fails.", [recipe, data])
    s.add_argument("--out", type=Path, default=None, help="default: results/verify/<recipe>.json")

    s = stage("train", cmd_train,
              "Read data/tokenized and data/vocab/<recipe>, train one model and write "
              "results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv, train.json "
              "(when training completes). An interrupted run (Ctrl-C, SIGTERM, a crash) keeps "
              "resume.pt there; the same command continues it with the numbers an "
              "uninterrupted run gives.", [run])
    s.add_argument("--restart", action="store_true",
                   help="set aside a resume state (resume.pt) and train from scratch")
    stage("evaluate", cmd_evaluate,
          "Read results/<recipe>-<model>-s<seed>/best.pt and the test sets, write metrics.json "
          "(loss, perplexity, BLEU greedy and beam, chrF), evaluation.json, translations/ and "
          "attention.json (one sentence's attention weights) to the same folder.", [run])

    s = stage("translate", cmd_translate,
              "Translate German sentences given as arguments, in --file, or on standard input, "
              "with a trained run's checkpoint; prints one English line per input line.",
              [results])
    s.add_argument("sentences", nargs="*")
    s.add_argument("--run", default="published-scratch-s0",
                   help="results/<run> to load (default: published-scratch-s0)")
    s.add_argument("--checkpoint", type=Path, default=None, help="a .pt file instead of --run")
    s.add_argument("--file", type=Path, default=None)
    s.add_argument("--vocab", type=Path, default=VOCAB)
    s.add_argument("--beam", type=int, default=None, help="beam size (default: from params)")
    s.add_argument("--device", default="auto")

    s = stage("report", cmd_report,
              "Read results/ and data/, write reports/report.md, reports/results.csv and "
              "figures.", [data, results])
    s.add_argument("--out", type=Path, default=REPORTS)

    s = stage("bench", cmd_bench,
              "Train both models for a fixed number of steps on the same real batches, then "
              "decode the same sentences greedily and with beam search; print a speed table.",
              [data])
    s.add_argument("--recipe", default=None, help="default: bench.recipe from params")
    s.add_argument("--device", default="auto")
    # Defaults come from params.yaml's bench: section.
    s.add_argument("--steps", type=int, default=None, help="timed training steps a repeat")
    s.add_argument("--repeats", type=int, default=None, help="the median of this many is shown")
    s.add_argument("--sentences", type=int, default=None, help="test sentences to decode")
    s.add_argument("--json", type=Path, default=None, help="also write the figures here")

    s = stage("stages", cmd_stages,
              "Render dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) from "
              "workflow/stages.yaml, the one declaration of every stage: print them, --write "
              "them, or --check that they are current.")
    s.add_argument("--declaration", type=Path, default=Path("workflow/stages.yaml"))
    s.add_argument("--write", action="store_true")
    s.add_argument("--check", action="store_true")
    return p


def set_threads() -> None:
    """The same torch thread count under DVC and Snakemake: OMP_NUM_THREADS when set (Snakemake
    sets it to a rule's threads), else the declared default, so both give the same numbers."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or default_threads()))


def default_threads() -> int:
    return min(DEFAULT_THREADS, os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(name)s: %(message)s", stream=sys.stderr)
    reads = set()
    try:
        params = load_params(args.params)
        if os.environ.get("NMT_TRACK_READS"):  # tests: which keys and modules a stage uses
            from nmt.tracking import start_tracking

            params = start_tracking(params, reads)
        if args.stage in TORCH_STAGES:
            set_threads()
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
    finally:
        if os.environ.get("NMT_TRACK_READS"):
            record_reads(Path(os.environ["NMT_TRACK_READS"]), args.stage, reads)


def record_reads(path: Path, stage: str, reads: set) -> None:
    """Append {stage, params, recipe_params, modules} as one JSON line (tests only)."""
    import json

    modules = sorted(m for m in sys.modules if (m == "nmt" or m.startswith("nmt."))
                     and m != "nmt.tracking")  # the recording itself is no stage's code
    line = {"stage": stage, "modules": modules,
            "params": sorted(k for ns, k in reads if ns == "params"),
            "recipe_params": sorted(k for ns, k in reads if ns == "recipe")}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
