"""Interrupted training: the resume state <run_dir>/resume.pt (nmt.core.runs.RunFiles.resume), and
stopping on a signal.

Not a declared output of any stage (git and DVC ignore it); written atomically at the end of
every epoch and, with train.save_every_minutes, within one; removed when the stage completes.
Plain types and tensors only, so `torch.load(..., weights_only=True)` reads it.

Written off the training's critical path (`StateWriter`): the loop hands over a snapshot (CPU
copies of everything a later update changes in place, `snapshot`) and goes on training while a
thread serializes it and writes it (a published-size state is about 1 GB: 6-8 s to write on
a CI machine's disk, every epoch). One write is in flight at a time; a stop (a signal) writes
its state and waits for it, and so does the end of the run before it removes the state.

Format (a dict):
    format          FORMAT (an int; another value is set aside like a changed configuration)
    config          what must match to continue (`config_key`), and config_hash its sha256
    precisions      the run's precision choices at its start ({"train", "decode"}: a
                    precision.Choice as a dict), which a resumed run keeps
    attention_kernels  the kernels the run trained with (the route in force)
    model, optimizer, scheduler    their state_dicts
    ranks           one dict a process (rank order): rng {torch (CPU), cuda (or None),
                    python (`random`)}, loss_sum, tokens and sums (of the updates' numbers:
                    grad_norm, ...) of the epoch so far on that rank (loop.RANK_OWN)
    progress        nmt.training.loop.Progress as a dict (rank 0's): epoch, batch (position in
                    the epoch's micro-batch plan of each rank), step (optimizer updates),
                    loss_sum, tokens, sums, seconds, history, best_loss, best_epoch, best_averaged,
                    best_state, stale, recent (the averaging buffer)
The batch order itself is not stored: it follows from (seed, epoch) (nmt.core.data.Batches).

SIGINT/SIGTERM (`StopSignals`) let the current step finish; the loop then writes the state,
waits for it, and raises `Stopped` (exit 130/143).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

import torch

from nmt.core import files
from nmt.core.files import atomic_path
from nmt.training import faults

log = logging.getLogger("nmt.train")

FORMAT = 3  # 2: best_epoch always an int, best_averaged beside it; 3: each rank's sums
# Settings that change when and how state is kept, not the numbers a run computes.
NEUTRAL = ("save_every_minutes",)


def config_key(params: dict, run_name: str, seed: int, vocab_dir: Path, world_size: int) -> dict:
    """What a resume state must share with this run: model, train and data settings, the
    vocabulary files' content, the seed and the number of processes."""
    vocab = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(Path(vocab_dir).iterdir()) if p.is_file()}
    train = {k: v for k, v in params["train"].items() if k not in NEUTRAL}
    data = {k: params["data"][k] for k in ("source_lang", "target_lang", "max_train_pairs")}
    return {"run": run_name, "seed": seed, "world_size": world_size, "model": params["model"],
            "train": train, "data": data, "vocab": vocab}


def config_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted names of the settings that differ between two config keys."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out


def rng_state(device: torch.device) -> dict:
    """Every generator training draws from: torch CPU (dropout on CPU), CUDA, Python's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": random.getstate()}


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class Stopped(Exception):
    """Training stopped by a signal with its resume state kept; `code` is the exit status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class StopSignals:
    """SIGINT and SIGTERM ask the loop to stop after the current step; a second Ctrl-C stops
    at once (KeyboardInterrupt). Under torchrun a Ctrl-C arrives twice within a moment (from
    the terminal, then passed on by torchrun): `echo` seconds after the first are ignored."""

    def __init__(self, echo: float = 0.0, announce: bool = True):
        self.signum, self.echo, self.announce, self._old = 0, echo, announce, {}
        self._first = 0.0

    def __enter__(self) -> StopSignals:
        if threading_main():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum:
            if signum == signal.SIGINT and time.monotonic() - self._first >= self.echo:
                raise KeyboardInterrupt
            return
        self.signum, self._first = signum, time.monotonic()
        if self.announce:
            print(f"nmt train: {signal.Signals(signum).name}: finishing this step, then saving "
                  "the resume state (Ctrl-C again: stop at once)", file=sys.stderr, flush=True)


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()


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


def read(path: Path) -> tuple[dict | None, str]:
    """(state, "") or (None, why it cannot be used)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: any unpickling error means unusable
        return None, f"it is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
    bad = files.failed_crc(path)
    if bad is not None:
        return None, f"its member {bad} fails the CRC-32 check its archive recorded"
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None, f"it is not a format-{FORMAT} resume state"
    return state, ""


def set_aside(path: Path, why: str) -> Path:
    """Rename a state that cannot be continued to resume.pt.stale; training starts fresh."""
    stale = path.with_name(path.name + ".stale")
    os.replace(path, stale)
    log.warning("set aside %s as %s: %s; training starts fresh", path, stale.name, why)
    return stale


def remove_temporaries(paths: Iterable[Path]) -> None:
    """Delete the temporary files killed writes of `paths` left (atomic_path's .<name>.*.tmp)."""
    for path in paths:
        files.remove_temporaries(path)
