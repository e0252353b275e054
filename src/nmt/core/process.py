"""What an `nmt` process sets up before its command runs, and how it answers a stop: glibc
malloc's settings (keep_freed_memory), the CUDA memory bound its stage and torchrun's
processes read (set_gpu_memory_bound), the SIGTERM policy outside the training loop
(sigterm_stops), how long ago it started (process_seconds), and its log lines, each on a
row of its own above any progress bar (log_to_stderr, say). Imports no torch: `nmt train`
over several devices only launches torchrun.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from nmt.core.errors import Completion, NmtError

# Megabytes (10^6 bytes, as Snakemake's mem_mb) of CUDA memory this process may take; `nmt
# train|evaluate|bench --gpu-mem-mb` sets it, and torchrun's processes inherit it.
GPU_MEMORY_ENV = "NMT_GPU_MEM_MB"

# glibc malloc's settings (mallopt): above M_MMAP_THRESHOLD a block is mapped for itself and
# unmapped when freed; free memory above M_TRIM_THRESHOLD at the heap's top goes back too.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BELOW = 2**31 - 1  # bytes (mallopt takes an int): blocks up to 2 GiB stay in the heap
IMPORTED = time.monotonic()  # where /proc is not there to say when the process started


def process_seconds() -> float:
    """Seconds since this process started, the interpreter's start and its imports included:
    Linux's /proc/self/stat gives the start (field 22, clock ticks since boot); elsewhere,
    since this module was imported."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # fields 3.. follow the name
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - IMPORTED


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
    if megabytes < 0:
        raise NmtError(f"--gpu-mem-mb {megabytes} is negative (fix: a number of megabytes, "
                       "or 0 for no bound)")
    os.environ[GPU_MEMORY_ENV] = str(megabytes)


class Terminated(BaseException):
    """SIGTERM outside the training loop (which answers it with its own line and state); a
    BaseException, as KeyboardInterrupt, so no `except Exception` on the way swallows it."""


def on_sigterm(signum, frame):
    """Stop the command, unless its last outputs are being written (errors.last_outputs: the
    stop waits for them) or are all in place (then it changes nothing, and says so at exit)."""
    if Completion.writing or Completion.complete:
        Completion.late_sigterm = True
        return
    raise Terminated


@contextlib.contextmanager
def sigterm_stops(exiting: bool) -> Iterator[dict]:
    """Around a command: SIGTERM raises Terminated (a scheduler's stop gets its one line too),
    where this thread can set handlers. After it, the handler before it comes back, unless the
    command succeeded and the process is `exiting` (then a stop while it exits changes nothing
    and must not make it look failed: ignored), or the command set one of its own since (SIG_IGN
    by a training whose peer died). Yields a dict whose "status" the command fills in."""
    Completion.reset()
    outcome, before = {"status": None}, signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield outcome
    finally:
        if outcome["status"] == 0 and exiting:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, before)


def say(line: str) -> None:
    """line on stderr, on a row of its own: a progress bar being drawn (tqdm, the loop's
    epoch bar) is cleared first and drawn again below it, where a plain print would add the
    line to the bar's row."""
    tqdm.write(line, file=sys.stderr)


class _AboveTheBars(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(self.format(record))
        except Exception:  # as logging.StreamHandler.emit
            self.handleError(record)


def log_to_stderr(level: int) -> None:
    """The nmt loggers' lines (`nmt.train: ...`) on stderr, each through say; as
    logging.basicConfig, nothing changes where the root logger has a handler already (a
    test's)."""
    logging.basicConfig(level=level, format="%(name)s: %(message)s",
                        handlers=[_AboveTheBars()])
