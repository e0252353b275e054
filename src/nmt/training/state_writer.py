"""Writing a resume state off the training's critical path: the loop hands over a snapshot (CPU
copies of everything a later update changes in place, `snapshot`) and goes on training while a
thread serializes it and writes it (`StateWriter`; a published-size state is about 1 GB: 6-8 s
to write on a CI machine's disk, every epoch). One write is in flight at a time; the write
itself is atomic (`write`). What a state holds, and when one is written: nmt.training.resume.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from pathlib import Path

import torch

from nmt.core.files import atomic_path
from nmt.training import faults

_writes = 0  # resume states this process began to write (a fault point counts them)


def write(path: Path, state: dict) -> None:
    """Serialize `state` straight into a temporary file, then rename it onto `path` (same
    state, same bytes). A kill at any instant leaves the old state or the new one whole."""
    global _writes
    _writes += 1
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        faults.reached("save", _writes)  # a kill here: a whole temporary file, not yet renamed
        os.fsync(f.fileno())  # on disk before the rename: a power cut keeps one whole state


def snapshot(value):
    """`value` with every tensor in it copied to the CPU (dicts, lists and tuples rebuilt; other
    values shared): what a resume state holds at this instant, however the weights, the
    optimizer's moments and its lr go on changing in place while a thread writes it."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(item) for item in value)
    return value


class StateWriter:
    """Writes resume states in a background thread, one at a time, in the order given.

    `submit` waits for the write in flight (so at most one snapshot waits in memory beside the
    one being written), then starts this one and returns. `wait` returns once nothing is in
    flight and raises, in the caller's thread, what a write failed with (a full disk: DiskFull's
    one line). A planted kill (nmt.training.faults) waits for the write in flight first, so the
    state a test expects is on disk; the kill *during* a write is the `save` point's."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.seconds_waited = 0.0  # the training's time spent waiting for a write to end
        _writers.add(self)

    def submit(self, path: Path, state: dict) -> None:
        self.wait()
        self.thread = threading.Thread(target=self._write, args=(path, state),
                                       name="resume-state-writer")
        self.thread.start()

    def _write(self, path: Path, state: dict) -> None:
        try:
            write(path, state)
        except BaseException as error:  # noqa: BLE001 - handed to the training's thread
            self.error = error

    def wait(self) -> None:
        if self.thread is not None and self.thread is not threading.current_thread():
            started = time.perf_counter()
            self.thread.join()
            self.seconds_waited += time.perf_counter() - started
            self.thread = None
        error, self.error = self.error, None
        if error is not None:
            raise error

    def wait_quietly(self) -> None:
        """wait(), a failed write left for `wait` to raise (a planted kill comes next)."""
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()


_writers: weakref.WeakSet[StateWriter] = weakref.WeakSet()  # this process's, for the kill hook


def _settle() -> None:
    for writer in list(_writers):
        writer.wait_quietly()


faults.before_kill(_settle)
