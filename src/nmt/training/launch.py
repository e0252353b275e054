"""`nmt train` with train.devices N > 1: the process that starts torchrun's N training
processes and waits for them.

It imports no torch (about 2 s of CPU a launch, for a process that only waits): torchrun and
the training processes import their own, and nmt.training.distributed is what those run.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys

log = logging.getLogger("nmt.train")


def under_torchrun() -> bool:
    """This process is one of torchrun's."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when `nmt train` dies
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def launch(nproc: int, argv: list[str], threads: int) -> int:
    """Run `nmt <argv>` as nproc processes under torchrun, sharing out `threads` (this
    process's torch thread count, nmt.pipeline.commandline.thread_count); returns torchrun's exit
    status.

    Ctrl-C reaches torchrun and its processes from the terminal; SIGTERM sent to this process
    is passed on to torchrun, which passes it to the training processes.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "nmt", *argv]
    log.info("train.devices is %d: %s", nproc, " ".join(cmd))
    # The threads shared out, set explicitly: torchrun would set 1 when OMP_NUM_THREADS is
    # unset (DVC) and keep it when set (Snakemake), and the thread count changes the low
    # digits of CPU results.
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent,
                            env={**os.environ, "OMP_NUM_THREADS": str(max(1, threads // nproc))})
    got = []

    def forward(signum, frame):
        got.append(signum)
        if signum == signal.SIGTERM:
            proc.send_signal(signum)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:
        return 128 + got[0]
    if code:
        print(f"nmt train: training under torchrun failed (exit {code}; torchrun names the "
              "first failure above); a resume state, if one was written, is kept and the same "
              "nmt train command again resumes from it", file=sys.stderr)
    return code
