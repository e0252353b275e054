"""An epoch's running numbers while it trains, its clock and its progress bar, and what the
run will take (said once, on the CPU, from its first updates)."""

from __future__ import annotations

import logging
import time

import torch
from tqdm import tqdm

from nmt.training.state import Progress, Trainer
from nmt.training.step import Updated

log = logging.getLogger("nmt.train")

SHOW_EVERY = 20  # updates between progress-bar refreshes (reading the loss waits for the GPU)


class EpochMeter:
    """An epoch's running training loss and sums of the updates' means (on the device: reading
    them waits for the GPU), its target tokens (counted on the host, where an update counts
    them: adding them on the device was a kernel an update), its clock (resumed from
    progress.seconds) and its progress bar."""

    def __init__(self, trainer: Trainer, progress: Progress):
        self.trainer, self.first_step = trainer, progress.step
        self.began = time.perf_counter() - progress.seconds  # the epoch's start, as if unbroken
        self.session = time.perf_counter()  # when this process took the epoch up
        self.loss_sum = torch.tensor(progress.loss_sum, dtype=torch.float64, device=trainer.device)
        self.tokens = progress.tokens
        self.sums = {name: torch.tensor(value, dtype=torch.float64, device=trainer.device)
                     for name, value in progress.sums.items()}
        self.bar = tqdm(total=len(trainer.plan(progress.epoch)), initial=progress.batch,
                        desc=f"epoch {progress.epoch}/{trainer.epochs}", unit="batch",
                        leave=False, disable=not trainer.world.main)

    def add(self, updated: Updated, batches: int) -> None:
        self.loss_sum += updated.loss_sum
        self.tokens += updated.tokens
        for name, value in updated.means.items():
            self.sums[name] = self.sums.get(name, 0.0) + value.double()
        self.bar.update(batches)

    def read(self, progress: Progress) -> Progress:
        """progress with the running sums and the epoch's time so far."""
        progress.loss_sum, progress.tokens = self.loss_sum.item(), self.tokens
        progress.sums = {name: value.item() for name, value in self.sums.items()}
        progress.seconds = time.perf_counter() - self.began
        return progress

    def show(self, progress: Progress) -> None:
        """Every SHOW_EVERY updates: the running loss and the run's time left on the bar; on
        the CPU, the first time, a warning when the run takes more than an hour."""
        updates, trainer = progress.step - self.first_step, self.trainer
        if updates % SHOW_EVERY:
            return
        per_update = (time.perf_counter() - self.session) / updates
        self.bar.set_postfix(loss=f"{(self.loss_sum / self.tokens).item():.3f}",
                             run_eta=duration(per_update * (trainer.total_updates - progress.step)))
        if updates == SHOW_EVERY and trainer.device.type == "cpu" and trainer.world.main:
            log.info(expected_minutes(per_update, trainer, progress))

    def __enter__(self) -> EpochMeter:
        return self

    def __exit__(self, *exc) -> None:
        """The bar is cleared however the epoch ends (a second Ctrl-C, a full disk), so that
        the line that says why starts a row of its own."""
        self.bar.close()


def expected_minutes(seconds_per_update: float, trainer: Trainer, progress: Progress) -> str:
    """What the run's training will take, measured on its first updates (validation passes
    not counted); over an hour, how to shrink it."""
    left = seconds_per_update * (trainer.total_updates - progress.step)
    line = (f"training takes about {duration(seconds_per_update * trainer.updates_per_epoch)} "
            f"an epoch here, {duration(left)} for the {trainer.total_updates - progress.step} "
            f"updates left ({trainer.total_updates} in all, {trainer.epochs} epochs)")
    if left > 3600:
        line += ("; for a quick run use a smaller recipe (e.g. the demo recipe: make demo), "
                 "fewer updates (train.max_updates) or fewer pairs (data.max_train_pairs)")
    return line


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
