"""`nmt <stage>`: one subcommand per pipeline stage; DVC and Snakemake call exactly these.

Every stage function has one shape, `stage(settings, paths)`: settings are params.yaml, or
one recipe resolved from it (nmt.pipeline.recipes); paths a small dataclass, in the stage's
module (nmt.stages), of the files it reads and writes. Each stage module also says its own
command line (HELP, `arguments`, `command`), so the subcommands are built here from the stage
modules there, and a new stage needs no line in this file. workflow/stages.yaml spells every
path out in the stage's command, so what a stage declares is what its command line says.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import os
import pkgutil
import signal
import sys
import threading
from pathlib import Path

import nmt.stages
from nmt.core.errors import EX_IOERR, FULL, Completion, DiskFull, NmtError, out_of_memory
from nmt.core.runs import Run
from nmt.pipeline import commandline
from nmt.pipeline.commandline import EXPORTS, RAW, RESULTS, VOCAB, set_threads, usable_cores
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve

# The pipeline's stages: every module (or package) of nmt.stages, found without importing them
# (workflow/stages.yaml declares the same names; tests/test_declaration.py checks). Each writes
# into the folder, so each refuses to run while the other orchestrator holds it
# (nmt.pipeline.orchestrators).
STAGES = tuple(sorted(m.name for m in pkgutil.iter_modules(nmt.stages.__path__)))
# What to make smaller when a command that is no stage runs out of memory; a stage says its
# own (MEMORY_FIX in its module); decoding names its batch and beam (core.errors.memory_fix).
MEMORY_FIX = {"translate": "a smaller evaluate.batch_size, or fewer sentences at once"}


def stage_module(name: str):
    """nmt.stages.<name>: its stage function and its command line (HELP, arguments, command)."""
    return importlib.import_module(f"nmt.stages.{name}")


def cmd_bench_tools(args, params):
    """`nmt bench --data` and `--decoding`: commands beside the bench stage (nmt.commands)."""
    if args.data:  # the data stages at scale, on a corpus of its own
        from nmt.commands import data_bench

        threads = args.threads or usable_cores()
        data_bench.bench_data(data_bench.Paths(raw=args.raw, json=args.json),
                             data_bench.DataPlan(pairs=args.pairs, threads=threads))
        return
    # one trained run's decoding: ours against CTranslate2's
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


def add_bench_tools(sub: argparse.ArgumentParser) -> None:
    """The options of `nmt bench --data` / `--decoding`, after the bench stage's own."""
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


# A stage's subcommand may carry commands beside it (nmt.commands): its extra options, and
# the command that runs instead of the stage when one of them asks for it.
BESIDE = {"bench": (add_bench_tools, lambda args: args.data or args.decoding, cmd_bench_tools)}


def cmd_stage(args, params):
    """Run the stage args.stage names: its module's `command` (or a command beside it)."""
    if args.stage in BESIDE and BESIDE[args.stage][1](args):
        return BESIDE[args.stage][2](args, params)
    return stage_module(args.stage).command(args, params)


def cmd_translate(args, params):
    from nmt.commands.translate import translate_cli

    translate_cli(args, params)


def cmd_estimate(args, params):
    from nmt.commands import estimate

    estimate.command(args, params)


def add_estimate(s: argparse.ArgumentParser) -> None:
    """nmt estimate's options (here: every `nmt` command builds them, and the module, which
    imports torch and the models, only loads for `nmt estimate` itself)."""
    commandline.recipe(s)
    s.add_argument("--models", default="baseline,scratch,decoder_only",
                   help="the models to estimate, comma separated")
    s.add_argument("--vocab", type=Path, default=None,
                   help="the recipe's vocabulary, if built (default: data/vocab/<recipe>)")
    commandline.threads(s)


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


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """`nmt [--params FILE] [-q] <stage> ...`: a subcommand a stage (from its module) and the
    commands that are no stage. Only the subcommand argv names is built where it names one
    (importing one stage's module, not all of them); else all are (`nmt --help`)."""
    parser = argparse.ArgumentParser(prog="nmt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="the configuration (default: params.yaml)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    subcommands = parser.add_subparsers(dest="stage", required=True, metavar="<stage>")
    chosen = named_command(sys.argv[1:] if argv is None else argv)
    for name in STAGES:
        if chosen in (None, name) or chosen not in STAGES + tuple(COMMANDS):
            module = stage_module(name)
            sub = subcommands.add_parser(name, help=module.HELP, description=module.HELP)
            module.arguments(sub)
            if name in BESIDE:
                BESIDE[name][0](sub)
            sub.set_defaults(func=cmd_stage)
    for name, (add, func, help_) in COMMANDS.items():
        sub = subcommands.add_parser(name, help=help_, description=help_)
        add(sub)
        sub.set_defaults(func=func)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The subcommand argv names: its first word that is no option (or --params's value)."""
    words = iter(argv)
    for word in words:
        if word == "--params":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def add_translate(s: argparse.ArgumentParser) -> None:
    commandline.results(s)
    commandline.threads(s)
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


def add_stages(s: argparse.ArgumentParser) -> None:
    s.add_argument("--declaration", type=Path, default=Path("workflow/stages.yaml"))
    s.add_argument("--write", action="store_true")
    s.add_argument("--check", action="store_true")


# The commands that are no stage: name -> (its options, its function, its help).
COMMANDS = {
    "translate": (add_translate, cmd_translate,
                  "Translate German sentences given as arguments, in --file, or on standard "
                  "input, with a trained run's checkpoint; prints one English line per input "
                  "line."),
    "estimate": (add_estimate, cmd_estimate,
                 "Print what a recipe's trainings will take on this CPU, from the precision "
                 "calibration (measured once a machine, cached): the precision "
                 "train.precision auto chooses, and each model's minutes."),
    "stages": (add_stages, cmd_stages,
               "Render dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) from "
               "workflow/stages.yaml, the one declaration of every stage: print them, --write "
               "them, or --check that they are current."),
}


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


def set_gpu_memory_bound(megabytes: int) -> None:
    """--gpu-mem-mb N becomes NMT_GPU_MEM_MB, which the stage applies to its device
    (nmt.core.runtime.bound_gpu_memory) and the processes torchrun starts inherit. A bound, like
    the thread count, changes no result: a command-line value, not a param, so changing it
    re-runs nothing (Snakemake passes its gpu_mem_mb resource; DVC users set the variable)."""
    from nmt.core.runtime import GPU_MEMORY_ENV

    if megabytes < 0:
        raise NmtError(f"--gpu-mem-mb {megabytes} is negative (fix: a number of megabytes, "
                       "or 0 for no bound)")
    os.environ[GPU_MEMORY_ENV] = str(megabytes)


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
    try:  # before the parser imports the stages, and so torch, whose libgomp would only warn
        commandline.omp_threads()
    except NmtError as e:
        print(f"nmt: error: {e}", file=sys.stderr)
        return e.exit_code
    args = build_parser(argv).parse_args(argv)
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
        if hasattr(args, "threads") and not said(args.stage, "SETS_OWN_THREADS", False):
            set_threads(args.threads)  # the torch stages; train sets its own (nmt.stages.train)
        if getattr(args, "gpu_mem_mb", 0):  # train, evaluate, bench
            set_gpu_memory_bound(args.gpu_mem_mb)
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
        fix = getattr(e, "memory_fix", None) or MEMORY_FIX.get(args.stage) or said(
            args.stage, "MEMORY_FIX", "free memory, or run it where there is more")
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


def said(stage: str, name: str, default):
    """What a stage's module says about it (MEMORY_FIX, SETS_OWN_THREADS, interrupted_note);
    default for a command that is no stage, or a stage that says nothing."""
    return getattr(stage_module(stage), name, default) if stage in STAGES else default


def interrupted_note(args) -> str:
    """What a Ctrl-C or SIGTERM outside the training loop (which answers with its own line)
    leaves: a stage's own note (nmt.stages.train: its resume state), else that nothing
    half-written was kept."""
    note = said(args.stage, "interrupted_note", None)
    return note(args) if note else "no half-written output was kept"


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
