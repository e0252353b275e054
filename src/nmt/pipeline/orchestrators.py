"""One orchestrator at a time in a folder: `dvc repro` and `snakemake` both delete a stage's
outputs before they run it, so the second one started would delete files the first one's jobs
are reading.

DVC marks its run itself: `.dvc/tmp/lock`, an flock that DVC commands hold (two refuse each
other through it), and, while a stage's command runs (when `dvc repro` holds no flock),
`.dvc/tmp/rwlock`, which names its pid. Snakemake holds no such lock, so its
`onstart` writes a marker, `.snakemake/nmt-running.<pid>`, removed by `onsuccess`/`onerror`.
Every `nmt` stage command, and Snakemake's `onstart`, refuse when the other tool holds the
folder and is not the process that started them, except that a job of the Snakemake holding
the folder goes on while a `dvc repro` started later holds DVC's lock (that run's own stages
refuse). A marker or lock of a process that is gone (a killed run) blocks nothing.

Killed with SIGKILL, an orchestrator can clean up nothing: its jobs ran on as orphans, and
Snakemake's own lock stayed. So a stage's command stops at its next safe point once the
orchestrator that started it is gone (`stop_when_orchestrator_dies`: SIGTERM to itself; a
training writes its resume state, which the rerun resumes), and the Snakefile removes the lock
a killed Snakemake left when no other Snakemake works in the folder (`clear_stale_lock`).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import psutil

from nmt.core.dvc_cache import locked_stages
from nmt.core.errors import NmtError
from nmt.core.process import say
from nmt.core.runs import Run

DVC_LOCK = Path(".dvc/tmp/lock")
# While a stage's command runs, `dvc repro` (3.x) holds no DVC_LOCK: it records itself (pid,
# command) in this file as the reader and writer of the stage's dependencies and outputs.
DVC_RWLOCK = Path(".dvc/tmp/rwlock")
MARKERS = Path(".snakemake")  # holds nmt-running.<pid>, one a running Snakemake
SNAKEMAKE_LOCKS = Path(".snakemake/locks")  # Snakemake's own: <n>.input.lock, <n>.output.lock
ORCHESTRATORS = ("snakemake", "dvc")


def _is_mine(pid: int) -> bool:
    """pid is this process or one of its ancestors (the orchestrator that started it)."""
    me = psutil.Process()
    return pid == me.pid or pid in {p.pid for p in me.parents()}


def _alive(pid: int, name: str) -> bool:
    """pid is a live process whose command line names `name` (not a reused pid)."""
    try:
        return any(name in part for part in psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def dvc_holder(root: Path = Path("."), stages: bool = False) -> int | None:
    """The pid of the DVC command holding root's repository lock (stages: or running a
    stage's command there, DVC_RWLOCK), else None. Probing takes a
    shared lock for an instant (DVC takes it exclusively; a DVC starting just then retries for
    seconds, as it does anyway). The file is opened to read only, so a checkout this user may
    not write (read-only, another user's) is probed too."""
    path = root / DVC_LOCK
    try:
        lock = open(path)
    except (FileNotFoundError, IsADirectoryError):  # no DVC command ran here yet
        return running_stage(root) if stages else None
    except PermissionError:
        raise NmtError(f"{path}: not readable, so whether dvc is running in this folder cannot "
                       f"be told (fix: chmod a+r {path}, or run in a copy you may write)") from None
    with lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = lock.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return running_stage(root) if stages else None


def running_stage(root: Path = Path(".")) -> int | None:
    """The pid of a live DVC command that DVC_RWLOCK names (one running a stage), else None."""
    try:
        entries = json.loads((root / DVC_RWLOCK).read_text() or "{}")
    except (OSError, ValueError):
        return None
    for holders in (entries.get("write", {}), entries.get("read", {})):
        for held in holders.values():
            for info in held if isinstance(held, list) else [held]:
                pid = info.get("pid") if isinstance(info, dict) else None
                if isinstance(pid, int) and _alive(pid, "dvc"):
                    return pid
    return None


def snakemake_holders(root: Path = Path(".")) -> list[int]:
    """The pids of the Snakemake runs of this host holding root (their markers name them).
    A marker written on another host (a cluster's login node) cannot be checked from here:
    its jobs run on this one."""
    pids = []
    for marker in sorted((root / MARKERS).glob("nmt-running.*")):
        try:
            info = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if info.get("host") == socket.gethostname() and _alive(info["pid"], "snakemake"):
            pids.append(info["pid"])
    return pids


def refuse_others(root: Path = Path("."), doing: str = "this command",
                  stages: bool = False) -> None:
    """Stop with one line when the other orchestrator runs in root and did not start us;
    stages: a `dvc repro` running a stage's command counts too (Snakemake's onstart).

    A job of the Snakemake that holds the folder goes on whatever DVC does meanwhile: the
    marker says Snakemake claimed the folder first (its onstart refused while DVC ran), so a
    `dvc repro` started since is the second one, and its own stages refuse. Refusing the job
    too, when it starts while that `dvc repro` holds its lock, failed both runs, and Snakemake
    deleted the job's outputs."""
    snakemakes = snakemake_holders(root)
    if any(_is_mine(pid) for pid in snakemakes):
        return
    dvc = dvc_holder(root, stages)
    if dvc is not None and not (dvc > 0 and _is_mine(dvc)):
        who = f"dvc (pid {dvc})" if dvc > 0 else "dvc"
        raise NmtError(f"{who} is running in this folder and {doing} would change files "
                       "its stages read (fix: wait for it to finish, or stop it, then run again)")
    if snakemakes:
        raise NmtError(f"snakemake (pid {snakemakes[0]}) is running in this folder and {doing} "
                       "would change files its jobs read (fix: wait for it to finish, or stop "
                       "it, then run again)")


def claim_for_snakemake(root: Path = Path(".")) -> None:
    """Snakemake's onstart: refuse if DVC holds the folder or runs a stage there, else mark
    it as Snakemake's."""
    refuse_others(root, "snakemake", stages=True)
    marker = root / MARKERS / f"nmt-running.{os.getpid()}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")


def release_for_snakemake(root: Path = Path(".")) -> None:
    """Snakemake's onsuccess and onerror: remove this run's marker."""
    (root / MARKERS / f"nmt-running.{os.getpid()}").unlink(missing_ok=True)


def run_by_dvc(root: Path = Path(".")) -> bool:
    """Whether DVC runs this process as a stage of root's pipeline: DVC sets DVC_STAGE and
    DVC_ROOT for the commands it runs (it does not hold its lock meanwhile)."""
    dvc_root = os.environ.get("DVC_ROOT")
    return bool(os.environ.get("DVC_STAGE")) and dvc_root is not None and \
        Path(dvc_root).resolve() == root.resolve()


def made_by_snakemake(runs: list[Run], root: Path = Path(".")) -> list[Run]:
    """Of the runs, those whose training is complete in root but that dvc.lock does not know:
    Snakemake made them (or DVC's record of them is gone), and `dvc repro` would delete them
    and train them again."""
    known = locked_stages(root)
    return [run for run in runs if run.dvc_stage("train") not in known
            and run.files(root / "results").summary.is_file()]


def orchestrator_name(process: psutil.Process) -> str | None:
    """"snakemake" or "dvc" when the process is one (its program, or the script or module its
    Python runs), else None."""
    try:
        argv = process.cmdline()
    except psutil.Error:
        return None
    words = argv[:1]
    if argv and Path(argv[0]).name.startswith("python"):
        words = argv[2:3] if argv[1:2] == ["-m"] else argv[1:2]
    name = Path(words[0]).name if words else ""
    return name if name in ORCHESTRATORS else None


def alive_since(pid: int, started: float) -> bool:
    """The process pid, started at `started`, still runs (not a zombie, not a reused pid)."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_when_orchestrator_dies(interval: float = 1.0) -> None:
    """A stage's command started by Snakemake or DVC (its nearest such ancestor): once that
    process is gone, one line, then SIGTERM to this process, which stops it at its next safe
    point (a training finishes its step and writes its resume state). Started by hand: none."""
    orchestrator = next((p for p in psutil.Process().parents() if orchestrator_name(p)), None)
    if orchestrator is None:
        return
    name, pid, started = orchestrator_name(orchestrator), orchestrator.pid, \
        orchestrator.create_time()

    def watch() -> None:
        while alive_since(pid, started):
            time.sleep(interval)
        say(f"nmt: {name} (pid {pid}), which started this command, is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orchestrator watch", daemon=True).start()


def clear_stale_lock(root: Path = Path(".")) -> None:
    """The Snakefile, before Snakemake checks its lock: remove the lock a killed Snakemake left
    (it stopped the rerun until `snakemake --unlock` by hand), with one line, when no other
    Snakemake works in root. A Snakemake started by one (a job's own) leaves it alone."""
    locks = sorted((root / SNAKEMAKE_LOCKS).glob("*.lock"))
    me = psutil.Process()
    if not locks or any(orchestrator_name(p) == "snakemake" for p in me.parents()):
        return
    folder = root.resolve()
    for process in psutil.process_iter():
        try:
            elsewhere = process.pid == me.pid or Path(process.cwd()) != folder
        except psutil.Error:
            continue
        if not elsewhere and orchestrator_name(process) == "snakemake":
            return  # it holds the lock: Snakemake refuses this run itself
    for lock in locks:
        lock.unlink(missing_ok=True)
    print("snakemake: removed the lock a killed snakemake left (no other snakemake runs in this "
          "folder)", file=sys.stderr)
