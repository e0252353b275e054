"""`nmt <stage>`: one subcommand per pipeline stage; DVC and Snakemake call exactly these.

Every stage function has one shape, `stage(settings, paths)`: settings are params.yaml, or
one recipe resolved from it (nmt.pipeline.recipes); paths a small dataclass, in the stage's
module (nmt.stages), of the files it reads and writes. workflow/stages.yaml spells every one
of those paths out in the stage's command, so what a stage declares is what its command line
says. The defaults below serve a person typing `nmt train --model scratch` at the repository root.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from nmt.core.errors import EX_IOERR, FULL, Completion, DiskFull, NmtError, out_of_memory
from nmt.core.runs import MODEL_NAMES, Run
from nmt.pipeline.corpus import corpus_settings
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve

RAW, TOKENIZED, VOCAB, RESULTS, REPORTS, EXPORTS = (
    Path("data/raw"), Path("data/tokenized"), Path("data/vocab"), Path("results"), Path("reports"),
    Path("exports"))
# The pipeline's stages: each writes into the folder, so each refuses to run while the other
# orchestrator holds it (nmt.pipeline.orchestrators).
STAGES = ("sources", "download", "tokenize", "config", "vocab", "verify", "train", "evaluate",
          "export", "bench", "report")


def recipe_vocab(args) -> Path:
    """--vocab, else data/vocab/<recipe>: the recipe's own vocabulary folder."""
    return args.vocab or VOCAB / args.recipe


def cmd_sources(args, params):
    from nmt.stages import sources

    sources.refresh(corpus_settings(params), args.out)


def cmd_download(args, params):
    from nmt.stages import download

    download.download(corpus_settings(params), download.Paths(out=args.out))


def cmd_tokenize(args, params):
    from nmt.stages import tokenize

    tokenize.tokenize(corpus_settings(params), tokenize.Paths(raw=args.raw, out=args.out),
                      args.processes)


def cmd_vocab(args, params):
    from nmt.stages import vocab

    vocab.build(resolve(params, args.recipe),
                vocab.Paths(tokenized=args.tokenized, out=args.out or VOCAB / args.recipe))


def cmd_verify(args, params):
    from nmt.stages.verify import Paths, verify

    paths = Paths(tokenized=args.tokenized, vocab=recipe_vocab(args),
                  out=args.out or RESULTS / "verify" / f"{args.recipe}.json")
    passed = verify(resolve(params, args.recipe), paths)
    return 0 if passed else 1  # a failed check stops the pipeline before training


def cmd_train(args, params):
    from nmt.core.launch import launch, under_torchrun

    run, recipe = Run(args.recipe, args.model, args.seed), resolve(params, args.recipe)
    if recipe["train"]["devices"] > 1 and not under_torchrun():  # a launcher: no torch here
        return launch(recipe["train"]["devices"], train_argv(args), thread_count(args.threads)
                      or torch_threads())
    set_threads(args.threads)
    from nmt.core.resume import Stopped
    from nmt.stages.train import Paths, train

    paths = Paths(tokenized=args.tokenized, vocab=recipe_vocab(args),
                  run=run.files(args.results))
    try:
        train(recipe, paths, restart=args.restart)
    except Stopped as e:
        if str(e):
            print(f"nmt train: {e}", file=sys.stderr)
        return e.code


def train_argv(args) -> list[str]:
    """This `nmt train` command line, for the processes torchrun starts (their threads come
    from OMP_NUM_THREADS: nmt.core.launch shares this process's out)."""
    return (["--params", str(args.params)] + (["-q"] if args.quiet else []) +
            ["train", "--recipe", args.recipe, "--model", args.model, "--seed", str(args.seed),
             "--tokenized", str(args.tokenized), "--vocab", str(recipe_vocab(args)),
             "--results", str(args.results)] + (["--restart"] if args.restart else []))


def cmd_evaluate(args, params):
    from nmt.stages import evaluate

    run = Run(args.recipe, args.model, args.seed)
    evaluate.evaluate(resolve(params, args.recipe), evaluate.Paths(
        tokenized=args.tokenized, vocab=recipe_vocab(args), run=run.files(args.results)))


def cmd_export(args, params):
    from nmt.stages import export

    run = Run(args.recipe, args.model, args.seed)
    export.export(resolve(params, args.recipe), export.Paths(
        run=run.files(args.results), vocab=recipe_vocab(args), tokenized=args.tokenized,
        out=args.out or EXPORTS / run.name))


def cmd_bench(args, params):
    if args.data:  # the data stages at scale, on a corpus of its own
        from nmt.commands import data_bench

        threads = args.threads or usable_cores()
        data_bench.bench_data(data_bench.Paths(raw=args.raw, json=args.json),
                             data_bench.DataPlan(pairs=args.pairs, threads=threads))
        return
    if args.decoding:  # one trained run's decoding: ours against CTranslate2's
        import torch

        from nmt.commands import decoding_bench

        run = Run.parse(args.run)
        files = run.files(args.results)
        decoding_bench.bench_decoding(resolve(params, run.recipe), decoding_bench.Paths(
            run=files, export=args.exports / run.name, vocab=args.vocab or VOCAB / run.recipe,
            tokenized=args.tokenized, json=args.json or files.decoding),
            decoding_bench.DecodingPlan(repeats=args.repeats or params["bench"]["repeats"],
                               sentences=args.sentences or 0,
                               threads=torch.get_num_threads()))
        return
    from nmt.stages import bench

    recipe = args.recipe or params["bench"]["recipe"]
    plan = bench.SpeedPlan(recipe=recipe, device=args.device, **{
        k: params["bench"][k] if getattr(args, k) is None else getattr(args, k)
        for k in ("steps", "repeats", "sentences")})
    bench.bench(resolve(params, recipe), bench.Paths(
        tokenized=args.tokenized, vocab=args.vocab or VOCAB / recipe, json=args.json), plan)


def cmd_report(args, params):
    from nmt.stages import report

    report.report(params, report.Paths(tokenized=args.tokenized, vocab=args.vocab or VOCAB,
                                       results=args.results, out=args.out))


def cmd_translate(args, params):
    from nmt.commands.translate import translate_cli

    translate_cli(args, params)


def cmd_config(args, params):
    from nmt.stages import config

    config.config(params, args.recipe,
                  config.Paths(out=args.out or Path("params") / f"{args.recipe}.yaml"))


def cmd_stages(args, params):
    from nmt.pipeline.declaration import rendered

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
    """`nmt [--params FILE] [-q] <stage> ...`: the options below, grouped by stage."""
    parser = argparse.ArgumentParser(prog="nmt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="the configuration (default: params.yaml)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    stages = parser.add_subparsers(dest="stage", required=True, metavar="<stage>")

    def stage(name, func, help_, *options):
        """A subcommand taking the shared option groups in `options`."""
        sub = stages.add_parser(name, help=help_, description=help_, parents=list(options))
        sub.set_defaults(func=func)
        return sub

    options = shared_options()
    add_data_stages(stage, options)
    add_model_stages(stage, options)
    add_other_commands(stage, options)
    return parser


def shared_options() -> dict[str, argparse.ArgumentParser]:
    """Option groups several stages take, declared once."""
    def group():
        return argparse.ArgumentParser(add_help=False)

    recipe, data, results, run, threads, gpu = (group() for _ in range(6))
    recipe.add_argument("--recipe", default="published", help="a recipe of params.yaml")
    data.add_argument("--tokenized", type=Path, default=TOKENIZED)
    data.add_argument("--vocab", type=Path, default=None,
                      help="the recipe's vocabulary (default: data/vocab/<recipe>)")
    results.add_argument("--results", type=Path, default=RESULTS, help="holds the run folders")
    run.add_argument("--model", required=True, choices=MODEL_NAMES)
    run.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    threads.add_argument("--threads", type=int, default=None,
                         help="torch threads, at most the machine's cores (default: "
                              "OMP_NUM_THREADS, else torch's own)")
    gpu.add_argument("--gpu-mem-mb", type=int, default=0, metavar="MB",
                     help="bound this process's CUDA memory at MB megabytes, so that jobs "
                          "sharing one GPU cannot starve one another (default 0: "
                          "NMT_GPU_MEM_MB if set, else no bound)")
    return {"recipe": recipe, "data": data, "results": results, "run": run, "threads": threads,
            "gpu": gpu}


def add_data_stages(stage, opt: dict) -> None:
    s = stage("sources", cmd_sources,
              "Write params/sources.sha256, the sha256 of every file the corpus is made of "
              "(data.corpus), if it changed: download depends on it.")
    s.add_argument("--out", type=Path, default=Path("params/sources.sha256"))
    s = stage("download", cmd_download,
              "Write train, val and data.testsets of the pipeline's corpus (data.corpus of "
              "pipeline.recipes[0]) to data/raw/<split>.<lang>.gz: multi30k fetched "
              "(MULTI30K_MIRROR first, then data.base_url) and verified against "
              "workflow/multi30k.sha256; files and huggingface read and checked.")
    s.add_argument("--out", type=Path, default=RAW)
    s = stage("tokenize", cmd_tokenize,
              "Read data/raw, tokenize with spaCy's rule-based tokenizers and write "
              "data/tokenized/<split>.<lang>.{txt,tok} and stats.json (tokenize.words: false: "
              "the .txt files only, no spaCy), streaming, a split at a time.")
    s.add_argument("--raw", type=Path, default=RAW)
    s.add_argument("--out", type=Path, default=TOKENIZED)
    # Not `threads` (which sets torch's threads and imports torch): spaCy processes.
    s.add_argument("--threads", dest="processes", type=int, default=1, metavar="N",
                   help="tokenize in N processes, at most the machine's cores (default 1: "
                        "this one); the files are the same whatever N")
    s = stage("config", cmd_config,
              "Resolve one recipe (the top-level sections with its overrides merged over "
              "them) and write params/<recipe>.yaml, whose keys the later stages "
              "declare as parameters.", opt["recipe"])
    s.add_argument("--out", type=Path, default=None, help="default: params/<recipe>.yaml")
    s = stage("vocab", cmd_vocab,
              "Read data/tokenized (train split only) and write one recipe's vocabulary to "
              "data/vocab/<recipe>/ (word: src.json, tgt.json; bpe: spm.model) with meta.json.",
              opt["recipe"])
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--out", type=Path, default=None, help="default: data/vocab/<recipe>")


def add_model_stages(stage, opt: dict) -> None:
    s = stage("verify", cmd_verify,
              "Read data/tokenized and data/vocab/<recipe>, prove the scratch model computes what "
              "torch.nn.Transformer computes at the recipe's size, write "
              "results/verify/<recipe>.json; exit 1 if a check fails.",
              opt["recipe"], opt["data"], opt["threads"])
    s.add_argument("--out", type=Path, default=None, help="default: results/verify/<recipe>.json")
    run = (opt["recipe"], opt["data"], opt["results"], opt["run"], opt["threads"], opt["gpu"])
    s = stage("train", cmd_train,
              "Read data/tokenized and data/vocab/<recipe>, train one model and write "
              "results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv, train.json "
              "(when training completes). An interrupted run (Ctrl-C, SIGTERM, a crash) keeps "
              "resume.pt there; the same command continues it with the numbers an "
              "uninterrupted run gives.", *run)
    s.add_argument("--restart", action="store_true",
                   help="set aside a resume state (resume.pt) and train from scratch")
    stage("evaluate", cmd_evaluate,
          "Read results/<recipe>-<model>-s<seed>/best.pt and the test sets, write metrics.json "
          "(loss, perplexity, BLEU greedy and beam, chrF), evaluation.json, translations/ and "
          "attention.json (one sentence's attention weights) to the same folder.", *run)
    s = stage("export", cmd_export,
              "Read results/<recipe>-<model>-s<seed>/best.pt and write it as a CTranslate2 "
              "model folder, exports/<recipe>-<model>-s<seed>/ (with vocab/ and nmt.json), "
              "after checking on validation pairs that the engine's per-token "
              "log-probabilities are within 1e-4 of ours; baseline and scratch runs.",
              *run[:-1])
    s.add_argument("--out", type=Path, default=None,
                   help="default: exports/<recipe>-<model>-s<seed>")
    s = stage("bench", cmd_bench,
              "Train both models for a fixed number of steps on the same real batches, then "
              "decode the same sentences greedily and with beam search; print a speed table.",
              opt["data"], opt["threads"], opt["gpu"])
    s.add_argument("--recipe", default=None, help="default: bench.recipe from params")
    s.add_argument("--device", default="auto")
    # Defaults come from params.yaml's bench: section.
    s.add_argument("--steps", type=int, default=None, help="timed training steps a repeat")
    s.add_argument("--repeats", type=int, default=None, help="the median of this many is shown")
    s.add_argument("--sentences", type=int, default=None, help="test sentences to decode")
    s.add_argument("--json", type=Path, default=None, help="also write the figures here")
    s.add_argument("--data", action="store_true",
                   help="instead: time the data stages (download, tokenize, vocab, loading "
                        "an epoch of batches) and their peak memory on a synthetic corpus of "
                        "--pairs pairs built from the Multi30k files in --raw; --threads: "
                        "tokenize's processes (default: every core)")
    s.add_argument("--pairs", type=int, default=1_000_000, help="with --data: training pairs")
    s.add_argument("--raw", type=Path, default=RAW,
                   help="with --data: the Multi30k raw files (default: data/raw)")
    s.add_argument("--decoding", action="store_true",
                   help="instead: decode the first test set with --run's best.pt (our greedy "
                        "and beam search) and with its CTranslate2 export in fp32 and int8, "
                        "on the same threads; speed, BLEU and agreement, written to --json "
                        "(default: results/<run>/decoding.json)")
    s.add_argument("--run", default="published-scratch-s0", help="with --decoding: the run")
    s.add_argument("--results", type=Path, default=RESULTS, help="with --decoding: holds <run>/")
    s.add_argument("--exports", type=Path, default=EXPORTS,
                   help="with --decoding: holds <run>/, written by nmt export")


def add_other_commands(stage, opt: dict) -> None:
    s = stage("report", cmd_report,
              "Read results/ and data/, write reports/report.md, reports/results.csv and "
              "figures.", opt["results"])
    s.add_argument("--tokenized", type=Path, default=TOKENIZED)
    s.add_argument("--vocab", type=Path, default=None, help="holds <recipe>/ (default: "
                   "data/vocab)")
    s.add_argument("--out", type=Path, default=REPORTS)
    s = stage("translate", cmd_translate,
              "Translate German sentences given as arguments, in --file, or on standard input, "
              "with a trained run's checkpoint; prints one English line per input line.",
              opt["results"], opt["threads"])
    s.add_argument("sentences", nargs="*")
    s.add_argument("--run", default="published-scratch-s0",
                   help="results/<run> to load (default: published-scratch-s0)")
    s.add_argument("--checkpoint", type=Path, default=None, help="a .pt file instead of --run")
    s.add_argument("--file", type=Path, default=None)
    s.add_argument("--vocab", type=Path, default=VOCAB, help="holds <recipe>/")
    s.add_argument("--beam", type=int, default=None, help="beam size (default: from params)")
    s.add_argument("--device", default="auto")
    s.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch",
                   help="torch: the checkpoint in results/<run>; ctranslate2: its export in "
                        "--exports/<run> (nmt export writes it)")
    s.add_argument("--exports", type=Path, default=EXPORTS,
                   help="with --engine ctranslate2: holds <run>/ (default: exports)")
    s.add_argument("--compute-type", default="float32", choices=("float32", "int8"),
                   help="with --engine ctranslate2: the weights' type (int8: quantized as "
                        "the engine loads them)")
    s = stage("stages", cmd_stages,
              "Render dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) from "
              "workflow/stages.yaml, the one declaration of every stage: print them, --write "
              "them, or --check that they are current.")
    s.add_argument("--declaration", type=Path, default=Path("workflow/stages.yaml"))
    s.add_argument("--write", action="store_true")
    s.add_argument("--check", action="store_true")


def set_threads(threads: int | None) -> None:
    """torch's thread count, set explicitly (so MKL, which Snakemake's MKL_NUM_THREADS would
    otherwise steer, follows it too) where thread_count gives one; else torch's default."""
    count = thread_count(threads)
    if count is not None:
        import torch

        torch.set_num_threads(count)


def thread_count(threads: int | None) -> int | None:
    """--threads N, at most the cores the process may use, else OMP_NUM_THREADS when set (the
    processes torchrun starts get theirs that way); None: neither is given. The declaration's
    `threads:` reaches every torch stage as --threads, under DVC and Snakemake alike, so both
    give the same numbers."""
    if threads is None and not os.environ.get("OMP_NUM_THREADS"):
        return None
    wanted = threads if threads is not None else int(os.environ["OMP_NUM_THREADS"])
    return max(1, min(wanted, usable_cores()))


def torch_threads() -> int:
    """torch's own thread count: what a process that set none trains with."""
    import torch

    return torch.get_num_threads()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity where the system keeps one (taskset,
    a Slurm job's binding, a container's cpuset), else the machine's count. More threads than
    that only take turns on the same cores."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# glibc malloc's settings (mallopt): above M_MMAP_THRESHOLD a block is mapped for itself and
# unmapped when freed; free memory above M_TRIM_THRESHOLD at the heap's top goes back too.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BELOW = 2**31 - 1  # bytes (mallopt takes an int): blocks up to 2 GiB stay in the heap


def keep_freed_memory() -> bool:
    """Tell glibc malloc to keep freed memory for the next allocation instead of returning it.

    On its own settings glibc maps every block over 32 MB (a demo batch's logits are about
    100 MB) for itself and unmaps it when freed, and hands smaller ones back once enough is
    free at the heap's top; so every training step faults its activations in again (94,000
    minor page faults a step of the demo's size) and the kernel zeroes each page. Kept, a step
    faults none once the heap has settled, and the same step took 1.03-1.3x less time here
    (tools/allocator_bench.py). The cost is memory: the heap keeps what it once held, and a
    few blocks more while it settles (the demo step's peak resident memory: 1.1-1.4 GB
    instead of 1.0-1.1). False where the C library is not glibc (musl, macOS): their allocators
    have no such settings."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BELOW) and mallopt(M_TRIM_THRESHOLD, KEEP_BELOW))


def bound_gpu_memory(megabytes: int) -> None:
    """--gpu-mem-mb N becomes NMT_GPU_MEM_MB, which the stage applies to its device
    (nmt.core.runtime.bound_gpu_memory) and the processes torchrun starts inherit. A bound, like
    the thread count, changes no result: a command-line value, not a param, so changing it
    re-runs nothing (Snakemake passes its gpu_mem_mb resource; DVC users set the variable)."""
    from nmt.core.runtime import GPU_MEMORY_ENV

    if megabytes < 0:
        raise NmtError(f"--gpu-mem-mb {megabytes} is negative (fix: a number of megabytes, "
                       "or 0 for no bound)")
    os.environ[GPU_MEMORY_ENV] = str(megabytes)


# What to make smaller when a stage runs out of memory (nmt.core.errors.out_of_memory).
MEMORY_FIX = {
    "train": "a smaller train.max_tokens (token batches) or train.batch_size, with a larger "
             "train.accumulate for the same updates, or a smaller model; a training resumes "
             "from its last resume state",
    "evaluate": "a smaller evaluate.batch_size",
    "export": "a smaller evaluate.batch_size",
    "bench": "a smaller bench.sentences, or the recipe's smaller batches",
    "verify": "a smaller model",
    "translate": "a smaller evaluate.batch_size, or fewer sentences at once"}


class Terminated(BaseException):
    """SIGTERM outside the training loop (which answers it with its own line and state); a
    BaseException, as KeyboardInterrupt, so no `except Exception` on the way swallows it."""


def on_sigterm(signum, frame):
    """Stop the stage, unless its last outputs are being written (errors.last_outputs: the
    stop waits for them) or are all in place (then it changes nothing, and says so at exit)."""
    if Completion.writing or Completion.complete:
        Completion.late_sigterm = True
        return
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """The `nmt` command (argv None: this process is it) or one call of it (argv given)."""
    keep_freed_memory()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(name)s: %(message)s", stream=sys.stderr)
    reads, old_sigterm, status = set(), signal.getsignal(signal.SIGTERM), None
    Completion.reset()
    if threading.current_thread() is threading.main_thread():  # where handlers can be set
        signal.signal(signal.SIGTERM, on_sigterm)  # a scheduler's stop gets its line too
    try:
        if args.stage in STAGES:
            from nmt.pipeline.orchestrators import refuse_others

            refuse_others(doing=f"nmt {args.stage}")
        params = load_params(args.params)
        if os.environ.get("NMT_TRACK_READS"):  # tests: which keys and modules a stage uses
            from nmt.pipeline.tracking import start_tracking

            params = start_tracking(params, reads)
        if hasattr(args, "threads") and args.func is not cmd_train:  # the torch stages; train
            set_threads(args.threads)  # sets its own after it knows whether it only launches
        if getattr(args, "gpu_mem_mb", 0):  # train, evaluate, bench
            bound_gpu_memory(args.gpu_mem_mb)
        status = args.func(args, params) or 0
        if Completion.late_sigterm and status == 0:
            print(f"nmt {args.stage}: SIGTERM came after the last outputs were written; they are "
                  "complete", file=sys.stderr)
        return status
    except NmtError as e:
        print(f"nmt {args.stage}: error: {e}", file=sys.stderr)
        return e.exit_code  # 2; a full disk 74 (EX_IOERR)
    except OSError as e:  # a full disk met outside nmt.core.files (which names the output itself)
        if e.errno not in FULL:
            raise
        folder = Path(e.filename).parent if e.filename else Path.cwd()
        print(f"nmt {args.stage}: error: {DiskFull.at(folder)}", file=sys.stderr)
        return EX_IOERR
    except (MemoryError, RuntimeError) as e:
        what = out_of_memory(e)
        if what is None:
            raise
        fix = MEMORY_FIX.get(args.stage, "free memory, or run it where there is more")
        print(f"nmt {args.stage}: error: out of {what} (fix: {fix}; then run the same command "
              "again)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nmt {args.stage}: interrupted; {interrupted_note(args)}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"nmt {args.stage}: stopped by SIGTERM; {interrupted_note(args)}", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if status == 0 and argv is None:  # done: a stop while the process exits changes nothing
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (and must not make it look failed)
        elif signal.getsignal(signal.SIGTERM) is on_sigterm:  # not one set since (SIG_IGN
            signal.signal(signal.SIGTERM, old_sigterm)  # by a training whose peer died)
        if os.environ.get("NMT_TRACK_READS"):
            record_reads(Path(os.environ["NMT_TRACK_READS"]), args.stage, reads)


def interrupted_note(args) -> str:
    """What a Ctrl-C outside the training loop (which answers with its own line) leaves."""
    if args.stage != "train":
        return "no half-written output was kept"
    state = Run(args.recipe, args.model, args.seed).files(args.results).resume
    return (f"outputs appear only when training completes; {state}, if there, is kept "
            "and the same nmt train command resumes from it")


def record_reads(path: Path, stage: str, reads: set) -> None:
    """Append {stage, params, recipe_params, modules} as one JSON line (tests only)."""
    import json

    modules = sorted(m for m in sys.modules if (m == "nmt" or m.startswith("nmt."))
                     and m != "nmt.pipeline.tracking")  # the recording itself is no stage's code
    line = {"stage": stage, "modules": modules,
            "params": sorted(k for ns, k in reads if ns == "params"),
            "recipe_params": sorted(k for ns, k in reads if ns == "recipe")}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
