"""Fault injection: the one place a test makes training die at a chosen moment, so that the
tests can check that a resumed run ends exactly where an uninterrupted one does.

    NMT_TEST_KILL_AT=<point>:<n>[:<SIGNAL>[:session|:others]][@<rank>]

makes the process send itself SIGNAL (default KILL) when `point` is reached for the n-th
time. `session`: every process of its session gets the signal too (an orchestrator killed
together with its job); `others`: every process of its session but this one does, and this
one goes on after ORPHAN_SECONDS (an orchestrator killed alone, its job left an orphan in the
middle of a step: a tiny test run would otherwise end before a watcher looks); @rank limits
it to one process of a distributed run. Unset, which it
always is outside tests/test_resume.py and tests/test_faults.py, `reached` returns at once.

The points, each one line in the code:
    start   nmt train begins, before the loop's signal handling (n = 1)   training/loop.py, train
    step    after optimizer update n of the run                           training/loop.py, fit
    valid   after the first batch of this process's n-th validation       training/loop.py
    save    its n-th resume state written, before the rename              training/state_writer.py

Before a planted kill, `reached` runs the functions `before_kill` registered: the resume state
writer waits for the write in flight (a thread), so that a kill after update n finds the state
that update n's epoch end wrote, as it would without the thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ENV = "NMT_TEST_KILL_AT"
ORPHAN_SECONDS = 3.0
POINTS = ("start", "step", "valid", "save")
_before_kill: list = []  # functions run before a planted kill (before_kill)


def before_kill(function) -> None:
    """Run `function` (no arguments) before any planted kill of this process."""
    _before_kill.append(function)


def reached(point: str, count: int) -> None:
    """`point` happens for the `count`-th time: die here if NMT_TEST_KILL_AT says so."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    spec, _, rank = spec.partition("@")
    if rank and rank != os.environ.get("RANK", "0"):
        return
    where, n, *rest = spec.split(":")
    if where != point or int(n) != count:
        return
    sig = getattr(signal, f"SIG{rest[0] if rest else 'KILL'}")
    for function in _before_kill:
        function()
    if rest[1:] in (["session"], ["others"]):
        for pid in session_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    if rest[1:] == ["others"]:
        time.sleep(ORPHAN_SECONDS)
    else:
        os.kill(os.getpid(), sig)


def session_pids() -> list[int]:
    """The other processes of this process's session (Linux /proc)."""
    mine, out = os.getsid(0), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == mine:
                    out.append(int(entry.name))
    return out
