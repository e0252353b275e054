"""What a training run holds while it trains: `Trainer`, what it trains with (settings, places,
data, model and its updates, the resume state found), `Progress`, where it stands (the loop's
state, which the resume state keeps as a dict), `Paths`, where it reads and writes, and
`spent`, the run's seconds by phase over all its processes.

The loop (nmt.training.loop) builds and advances them; the epoch's meter, the outputs and the
resume state (meter, outputs, resume) read them, and resume rebuilds a Progress from a state
it reads back. This module imports none of those.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from nmt.core.data import Batches
from nmt.core.process import process_seconds
from nmt.core.runs import Run, RunFiles
from nmt.training import distributed
from nmt.training.config import TrainConfig
from nmt.training.distributed import World
from nmt.training.precision import Choice
from nmt.training.state_writer import StateWriter
from nmt.training.step import Updater


@dataclass(frozen=True)
class Paths:
    """Where a run reads and writes."""

    tokenized: Path  # data/tokenized
    vocab: Path  # the recipe's vocabulary folder: data/vocab/<recipe>
    run: RunFiles  # results/<recipe>-<model>-s<seed>/, whose name is the run's


@dataclass(kw_only=True)
class Trainer:
    """What a run trains with, built once by `setup`: settings, places, data, model, optimizer."""

    config: TrainConfig
    paths: Paths
    world: World  # this process's rank of how many (one process: 0 of 1)
    device: torch.device
    # train.precision on the device for "train" (an update) and "decode" (the validation
    # BLEU, as evaluate decodes): which precision each runs in, and why (nmt.training.precision)
    precisions: dict[str, Choice]
    # The optimizer updates (nmt.training.step): the model, its optimizer and lr schedule, how
    # an update runs (DDP, compiled, CUDA graphs) and what it fell back from
    update: Updater | None  # set once the Trainer knows its updates
    train_batches: Batches
    valid_batches: Batches
    valid_references: Path  # the validation split's raw target lines (for its BLEU)
    tgt_codec: object  # ids -> detokenized target text (nmt.core.codecs), for the validation BLEU
    # What best.pt and last.pt record besides the weights (checkpoint.save's keywords): the
    # model's name, config and vocabulary sizes, the model and train settings, the seed, ...
    checkpoint_meta: dict
    resume_key: dict  # what a resume state must match (resume.config_key)
    # The resume state setup found (None: none to continue) and why one was set aside ("")
    # (resume.usable_state); resume_or_start takes it up and lets it go
    found: tuple[dict | None, str] = (None, "")
    saved: str = ""  # where the last resume state written or found stands
    last_save: float = field(default_factory=time.monotonic)
    validations: int = 0  # validation passes of this process (a fault point counts them)
    attention_kernels: str = "any"  # the kernels NMT_ATTENTION_KERNELS allows (runtime)
    # torch's intra-op threads (--threads, at most the usable cores): on a CPU the bits of a
    # training depend on them (a sum split over more threads adds in another order)
    threads: int | str = 1
    writer: StateWriter = field(default_factory=StateWriter)  # rank 0's writes
    # This process's seconds outside the epochs, by phase (`spent`): start (from the process's
    # start until the loop begins), saving (the loop's time in resume.save), end (finish)
    clock: dict[str, float] = field(default_factory=dict)

    @property
    def precision(self) -> str:
        """bf16 or fp32: what an update runs in."""
        return self.precisions["train"].precision

    @property
    def model(self) -> torch.nn.Module:
        """The weights: what is updated, validated and saved."""
        return self.update.model

    @property
    def run(self) -> Run:
        return Run.parse(self.paths.run.folder.name)

    @property
    def n_params(self) -> int:
        return self.checkpoint_meta["n_params"]

    def plan(self, epoch: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of epoch `epoch` (1-based) as (indices, real), in order:
        every world.size-th batch of the epoch's seeded order (distributed.shard)."""
        return distributed.shard(self.train_batches.indices(epoch - 1), self.world)

    @cached_property
    def updates_per_epoch(self) -> int:
        """Optimizer updates an epoch (token batches: epoch 1's count, others differ by a few)."""
        return math.ceil(len(self.plan(1)) / self.config.accumulate)

    @property
    def total_updates(self) -> int:
        """The run's optimizer updates: train.max_updates, else `epochs` full epochs."""
        return self.config.max_updates or self.updates_per_epoch * self.config.epochs

    @property
    def epochs(self) -> int:
        """The epochs the run trains (with max_updates: the last one cut short)."""
        return math.ceil(self.total_updates / self.updates_per_epoch)

    def save_due(self) -> bool:
        minutes = self.config.save_every_minutes
        return minutes > 0 and time.monotonic() - self.last_save >= 60 * minutes


# Progress's fields that each rank keeps its own of (the rest is rank 0's): the epoch's sums.
RANK_OWN = ("loss_sum", "tokens", "sums")


@dataclass
class Progress:
    """Where a run stands: the loop's state, none of it in the model or optimizer (the resume
    state holds it as a dict)."""

    epoch: int = 1  # the epoch in progress (1-based)
    batch: int = 0  # micro-batches of this epoch's plan already trained on
    step: int = 0  # optimizer updates so far (what the lr schedule counts)
    loss_sum: float = 0.0  # this epoch's summed training token loss so far
    tokens: int = 0  # ... and its target tokens
    sums: dict = field(default_factory=dict)  # ... and its updates' Updated.means, summed
    seconds: float = 0.0  # training time spent on this epoch so far
    valid_seconds: float = 0.0  # time spent validating, every epoch so far
    history: list[dict] = field(default_factory=list)  # one row a finished epoch
    best_loss: float = math.inf
    best_epoch: int = 0  # the epoch of the best weights (0: none yet; an average: its last)
    best_averaged: int = 0  # how many epochs' weights the best are the mean of (0: not a mean)
    best_state: dict | None = None  # the best weights (CPU)
    stale: int = 0  # epochs since the validation loss last improved
    recent: list[dict] = field(default_factory=list)  # the last average_last epochs' weights
    # Seconds by phase (wall, start, saving: `spent`) of the run's earlier processes, up to the
    # resume state each wrote last; the work of a killed process after that state is not in it
    earlier: dict = field(default_factory=dict)

    def done(self, config: TrainConfig) -> bool:
        """Every epoch (or max_updates update) trained, or patience ran out."""
        out_of_patience = bool(config.patience and self.stale >= config.patience)
        if config.max_updates:
            return self.step >= config.max_updates or out_of_patience
        return self.epoch > config.epochs or out_of_patience

    def where(self, trainer: Trainer) -> str:
        return f"epoch {self.epoch}, step {self.step} of {trainer.total_updates}"

    @property
    def best_name(self) -> int | str:
        """The best weights as train.json's best_epoch names them: the epoch, or avg<N>."""
        return f"avg{self.best_averaged}" if self.best_averaged else self.best_epoch

    def next_epoch(self) -> None:
        self.epoch, self.batch, self.loss_sum, self.tokens, self.sums, self.seconds = (
            self.epoch + 1, 0, 0.0, 0, {}, 0.0)


def spent(trainer: Trainer, progress: Progress) -> dict[str, float]:
    """Seconds by phase over the run's processes so far (the earlier ones' and this one's):
    wall (from each process's start), start (until the loop began), saving (the loop's time in
    resume.save: the snapshot, and waiting for the write before it), end (finish, up to the
    summary). The epochs' and the validation passes' own seconds are in Progress."""
    now = {**trainer.clock, "wall": process_seconds()}
    return {phase: progress.earlier.get(phase, 0.0) + now.get(phase, 0.0)
            for phase in sorted(now.keys() | progress.earlier.keys())}
