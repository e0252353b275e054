"""`nmt <command>`: one subcommand per pipeline stage, which DVC and Snakemake call, and the
commands that are no stage (translate, estimate, stages).

Every stage function has one shape, `stage(settings, paths)`: settings are params.yaml, or
one recipe resolved from it (nmt.pipeline.recipes); paths a small dataclass, in the stage's
module (nmt.stages), of the files it reads and writes. Each stage module, and each command
module of nmt.commands, also says its own command line (HELP, `arguments`, `command`), so the
subcommands are built here from the modules there, and a new stage needs no line in this
file. workflow/stages.yaml spells every path out in the stage's command, so what a stage
declares is what its command line says. What a process sets up before a command runs is
nmt.core.process's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import pkgutil
import signal
import sys
from pathlib import Path

import nmt.stages
from nmt.core.errors import (
    DENIED,
    EX_IOERR,
    FULL,
    Completion,
    DiskFull,
    NmtError,
    access_denied,
    out_of_memory,
)
from nmt.core.process import (
    Terminated,
    keep_freed_memory,
    log_to_stderr,
    set_gpu_memory_bound,
    sigterm_stops,
)
from nmt.pipeline import commandline
from nmt.pipeline.commandline import set_threads
from nmt.pipeline.params import load_params

# The pipeline's stages: every module (or package) of nmt.stages, found without importing them
# (workflow/stages.yaml declares the same names; tests/test_declaration.py checks). Each writes
# into the folder, so each refuses to run while the other orchestrator holds it
# (nmt.pipeline.orchestrators).
STAGES = tuple(sorted(m.name for m in pkgutil.iter_modules(nmt.stages.__path__)))
# The modules of nmt.commands that are commands of their own (the others serve one of these,
# or run instead of a stage: INSTEAD).
COMMANDS = ("adopt", "check", "estimate", "stages", "translate")
# A stage's subcommand whose options (in the stage's module) can ask for a command instead of
# the stage: option -> the module of nmt.commands whose `command` runs.
INSTEAD = {"bench": {"data": "data_bench", "decoding": "decoding_bench"}}


def module(name: str):
    """The module of a subcommand (a stage's, or a command's): HELP, arguments, command."""
    return importlib.import_module(f"nmt.{'stages' if name in STAGES else 'commands'}.{name}")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """`nmt [--params FILE] [-q] <command> ...`. Only the subcommand argv names is built where
    it names one (importing its module, not all of them); else all are (`nmt --help`)."""
    parser = argparse.ArgumentParser(prog="nmt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="the configuration (default: params.yaml)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    subcommands = parser.add_subparsers(dest="stage", required=True, metavar="<command>")
    chosen = named_command(sys.argv[1:] if argv is None else argv)
    for name in STAGES + COMMANDS:
        if chosen in (None, name) or chosen not in STAGES + COMMANDS:
            code = module(name)
            sub = subcommands.add_parser(name, help=code.HELP, description=code.HELP)
            code.arguments(sub)
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


def main(argv: list[str] | None = None) -> int:
    """The `nmt` command (argv None: this process is it) or one call of it (argv given)."""
    keep_freed_memory()
    try:  # before the parser imports the stages, and so torch, whose libgomp would only warn
        commandline.omp_threads()
    except NmtError as e:
        print(f"nmt: error: {e}", file=sys.stderr)
        return e.exit_code
    args = build_parser(argv).parse_args(argv)
    log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    with (sigterm_stops(exiting=argv is None) as outcome,
          reads_recorded(args.stage, getattr(args, "model", None)) as track):
        outcome["status"] = run(args, track)
        return outcome["status"]


def run(args, track) -> int:
    """The command args names, its exit status; a problem the user can fix, a full disk, out
    of memory or a stop as one line that says what to do."""
    try:
        if args.stage in STAGES:
            from nmt.pipeline.orchestrators import refuse_others, stop_when_orchestrator_dies

            refuse_others(doing=f"nmt {args.stage}")
            stop_when_orchestrator_dies()  # an orphan stops at its next safe point
            from nmt.pipeline.preflight import check_outputs_writable

            check_outputs_writable(args.stage, args)  # a read-only checkout: before any work
        params = track(load_params(args.params))
        if hasattr(args, "threads") and not said(args.stage, "SETS_OWN_THREADS", False):
            set_threads(args.threads)  # the torch stages; train sets its own (nmt.stages.train)
        if getattr(args, "gpu_mem_mb", 0):  # train, evaluate, bench
            set_gpu_memory_bound(args.gpu_mem_mb)
        asked = [name for option, name in INSTEAD.get(args.stage, {}).items()
                 if getattr(args, option)]
        status = module(asked[0] if asked else args.stage).command(args, params) or 0
        if Completion.late_sigterm and status == 0:
            print(f"nmt {args.stage}: SIGTERM came after the last outputs were written; they are "
                  "complete", file=sys.stderr)
        return status
    except NmtError as e:
        print(f"nmt {args.stage}: error: {e}", file=sys.stderr)
        return e.exit_code  # 2; a full disk 74 (EX_IOERR)
    except OSError as e:  # a full disk met outside nmt.core.files (which names the output itself)
        if e.errno in DENIED:  # a write (or read) refused: a command the checks above missed
            print(f"nmt {args.stage}: error: {access_denied(e, f'nmt {args.stage}')}",
                  file=sys.stderr)
            return 2
        if e.errno not in FULL:
            raise
        folder = Path(e.filename).parent if e.filename else Path.cwd()
        print(f"nmt {args.stage}: error: {DiskFull.at(folder)}", file=sys.stderr)
        return EX_IOERR
    except (MemoryError, RuntimeError) as e:
        what = out_of_memory(e)
        if what is None:
            raise
        fix = getattr(e, "memory_fix", None) or said(
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


def said(name: str, attribute: str, default):
    """What a subcommand's module says about it (MEMORY_FIX, SETS_OWN_THREADS,
    interrupted_note); default where it says nothing."""
    return getattr(module(name), attribute, default)


def interrupted_note(args) -> str:
    """What a Ctrl-C or SIGTERM outside the training loop (which answers with its own line)
    leaves: a stage's own note (nmt.stages.train: its resume state), else that nothing
    half-written was kept."""
    note = said(args.stage, "interrupted_note", None)
    return note(args) if note else "no half-written output was kept"


@contextlib.contextmanager
def reads_recorded(command: str, model: str | None = None):
    """NMT_TRACK_READS=FILE, a debug feature (docs/testing.md) on which the stage-contract
    tests stand: the params keys and `nmt` modules the command read, appended to FILE as one
    JSON line (nmt.pipeline.tracking). Yields what wraps params.yaml; unset, params as they
    are, and nothing of the tracking is imported."""
    path = os.environ.get("NMT_TRACK_READS")
    if not path:
        yield lambda params: params
        return
    from nmt.pipeline import tracking

    with tracking.recorded(Path(path), command, model) as track:
        yield track
