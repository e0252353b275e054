"""Interrupted training: the resume state <run_dir>/resume.pt (nmt.core.runs.RunFiles.resume),
every decision about it, and stopping on a signal.

Not a declared output of any stage (git and DVC ignore it); written atomically at the end of
every epoch and, with train.save_every_minutes, within one; removed when the stage completes.
Plain types and tensors only, so `torch.load(..., weights_only=True)` reads it.

Reading order: what a state must match to be continued (`config_key`), whether a run
continues the one it finds (`usable_state`: readable, this FORMAT, the same settings; else it
is set aside as resume.pt.stale), what a continued run keeps of its start (`precisions`) and
reads back (`restore`), and how the loop's state becomes one (`save`; a thread writes it while
training goes on: nmt.training.state_writer).

Format (a dict):
    format          FORMAT (an int; another value is set aside like a changed configuration)
    config          what must match to continue (`config_key`), and config_hash its sha256
    precisions      the run's precision choices at its start ({"train", "decode"}: a
                    precision.Choice as a dict), which a resumed run keeps
    attention_kernels  the kernels the run trained with (the route in force)
    threads         torch's intra-op threads it trained with (on a CPU they change the bits)
    model, optimizer, scheduler    their state_dicts
    ranks           one dict a process (rank order): rng {torch (CPU), cuda (or None),
                    python (`random`)}, loss_sum, tokens and sums (of the updates' numbers:
                    grad_norm, ...) of the epoch so far on that rank (state.RANK_OWN)
    progress        nmt.training.state.Progress as a dict (rank 0's): epoch, batch (position in
                    the epoch's micro-batch plan of each rank), step (optimizer updates),
                    loss_sum, tokens, sums, seconds, history, best_loss, best_epoch, best_averaged,
                    best_state, stale, recent (the averaging buffer), earlier (seconds by phase)
The batch order itself is not stored: it follows from (seed, epoch) (nmt.core.data.Batches).

SIGINT/SIGTERM (`StopSignals`) let the current step finish; the loop then writes the state,
waits for it, and raises `Stopped` (exit 130/143).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path

import torch

from nmt.core import files
from nmt.core.process import say
from nmt.training.precision import Choice
from nmt.training.state import RANK_OWN, Progress, Trainer, spent
from nmt.training.state_writer import snapshot

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


def usable_state(path: Path, resume_key: dict, restart: bool) -> tuple[dict | None, str]:
    """(the resume state at `path` to continue, "") or (None, why it is set aside; "" if there
    is none)."""
    if not path.exists():
        return None, ""
    if restart:
        return None, "--restart asks for a fresh start"
    state, why = read(path)
    if state and state["config_hash"] != config_hash(resume_key):
        changed = differences(state["config"], resume_key)
        return None, f"it was written with other settings (changed: {', '.join(changed[:4])})"
    return state, why


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


def precisions(state: dict | None) -> dict[str, Choice] | None:
    """The precision choices a resume state recorded at its run's start, which the resumed run
    keeps, so that it trains and decodes as it began whatever the machine's measurement says
    now; None where there is no state to continue (or it recorded none)."""
    if state is None or "precisions" not in state:
        return None
    kept = {kind: Choice(**choice) for kind, choice in state["precisions"].items()}
    log.info("precision kept from the run's start: training %s, decoding %s",
             kept["train"].precision, kept["decode"].precision)
    return kept


def restore(trainer: Trainer, state: dict) -> Progress:
    """The Progress a resume state holds, read back with the weights, the optimizer, the lr
    schedule and this rank's random generators as they were when it was written."""
    files, world = trainer.paths.run, trainer.world
    update = trainer.update
    update.model.load_state_dict(state["model"])
    update.optimizer.load_state_dict(state["optimizer"])
    if update.graphs is not None:  # the loaded lr (a number, or a tensor read to the CPU)
        for group in update.optimizer.param_groups:  # back on the device, for the graphs
            group["lr"] = torch.tensor(float(group["lr"]), device=trainer.device)
    update.scheduler.load_state_dict(state["scheduler"])
    mine = state["ranks"][world.rank]
    set_rng_state(mine["rng"], trainer.device)
    progress = Progress(**{**state["progress"], **{k: mine[k] for k in RANK_OWN}})
    # Kept as they are now, and both recorded: a route excludes a wrong kernel; a process
    # takes as many threads as it may use.
    trainer.attention_kernels = went_on("attention kernels", state.get("attention_kernels"),
                                        trainer.attention_kernels, progress.step)
    trainer.threads = went_on(
        "torch threads", state.get("threads"), trainer.threads, progress.step,
        ", so its numbers differ from an uninterrupted run's in the last digits",
        f"; `--threads {state.get('threads')}` on a machine with that many cores resumes it "
        "exactly")
    trainer.saved = progress.where(trainer)
    log.info("resuming from %s (batch %d of %d of the epoch), from %s", trainer.saved,
             progress.batch, len(trainer.plan(progress.epoch)), files.resume)
    return progress


def went_on(what: str, began, now, step: int, consequence: str = "", fix: str = ""):
    """What train.json records of a setting the run took from the machine: `now`, or, where
    the resumed run began with another (a state written before it was recorded: None), both
    ("7, then 1 from step 14"), with one warning."""
    if began is None or began == now:
        return now
    log.warning("%s: the run began with %s and goes on with %s%s (train.json records both%s)",
                what, began, now, consequence, fix)
    return f"{began}, then {now} from step {step}"


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


def save(trainer: Trainer, progress: Progress) -> None:
    """Start writing the resume state (rank 0): all it takes to continue exactly where the run
    stands, as CPU copies taken now (state_writer.snapshot), written by a thread while training
    goes on (state_writer.StateWriter; the loop waits for it before it says a stopped run kept
    it)."""
    began, update = time.perf_counter(), trainer.update
    ranks = trainer.world.gather({"rng": rng_state(trainer.device),
                                  **{k: getattr(progress, k) for k in RANK_OWN}})
    if trainer.world.main:
        # Progress's lists and dicts are copied; the weights they hold (best_state, recent)
        # are CPU copies that are replaced, never changed in place, so they are shared
        now = {f.name: copy.copy(getattr(progress, f.name)) for f in fields(Progress)}
        now["earlier"] = spent(trainer, progress)  # what a resumed run adds its own time to
        trainer.writer.submit(trainer.paths.run.resume, {
            "format": FORMAT, "config": trainer.resume_key,
            "config_hash": config_hash(trainer.resume_key),
            # what the run took from the machine at its start, which a resumed run keeps
            "precisions": {kind: asdict(choice) for kind, choice in trainer.precisions.items()},
            "attention_kernels": trainer.attention_kernels, "threads": trainer.threads,
            **snapshot({
                "model": update.model.state_dict(), "optimizer": update.optimizer.state_dict(),
                "scheduler": update.scheduler.state_dict(), "ranks": ranks}),
            "progress": now})
    trainer.saved, trainer.last_save = progress.where(trainer), time.monotonic()
    trainer.clock["saving"] = trainer.clock.get("saving", 0.0) + time.perf_counter() - began


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
            say(f"nmt train: {signal.Signals(signum).name}: finishing this step, then saving "
                "the resume state (Ctrl-C again: stop at once)")


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()
