"""Several processes for one run: torchrun + DistributedDataParallel (train.devices: N).

`nmt train` with devices > 1 re-launches itself under torchrun (nmt.training.launch). Under
torchrun each process joins the group (`join`: NCCL on CUDA, Gloo on CPU), trains every N-th
micro-batch of the same seeded epoch order (`shard`) and all-reduces what the loss
normalisation and the validation need (`World.sum`). Only rank 0 writes files. One process
outside torchrun is a World of size 1 whose collectives do nothing.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import re
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from nmt.core.errors import NmtError
from nmt.core.runtime import pick_device
from nmt.training.launch import under_torchrun

log = logging.getLogger("nmt.train")

# Seconds a collective waits for the other ranks before the job fails (NMT_DIST_TIMEOUT
# overrides). Long enough for rank 0 to write a resume state while the others wait.
TIMEOUT = {"gloo": 120, "nccl": 1800}


@dataclass(frozen=True)
class World:
    """This process's place in the job: rank `rank` of `size` (one process: 0 of 1)."""

    rank: int = 0
    size: int = 1
    group: bool = False  # in a process group (as torchrun starts it): collectives run, DDP wraps
    device: str = "cpu"  # where collectives' tensors live (NCCL: this rank's GPU)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes files and logs progress."""
        return self.rank == 0

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over all ranks (in place)."""
        if self.group:
            dist.all_reduce(values)
        return values

    def max(self, values: list[int]) -> list[int]:
        """Element-wise maximum over all ranks (flags every rank must agree on)."""
        if not self.group:
            return values
        t = torch.tensor(values, dtype=torch.long, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        if not self.group:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.group:
            dist.barrier()


def join(device_name: str, devices: int) -> tuple[World, torch.device]:
    """This process's World and device; under torchrun, join the process group."""
    if not under_torchrun():
        return World(), pick_device(device_name)
    size, rank, local = (int(os.environ[k]) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    if size != devices:
        raise NmtError(f"torchrun started {size} processes but train.devices is {devices} "
                       f"(fix: set train.devices: {size}, or run plain `nmt train`, which starts "
                       "train.devices processes itself)")
    device = pick_device(device_name)
    if device.type == "cuda":
        if torch.cuda.device_count() <= local:
            raise NmtError(f"train.devices is {devices} but only {torch.cuda.device_count()} "
                           "GPUs are visible (fix: lower train.devices)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        seconds = float(os.environ.get("NMT_DIST_TIMEOUT", TIMEOUT[backend]))
        dist.init_process_group(backend, timeout=timedelta(seconds=seconds))
    return World(rank, size, group=True, device=str(device)), device


def lost_peer(error: Exception) -> str | None:
    """One line of why, when a collective failed because another rank died or stopped
    answering; None for any other error."""
    line = re.sub(r"^\[[^]]*\] *", "", str(error).strip().splitlines()[0] if str(error) else "")
    words = ("connection closed", "connection reset", "timed out", "timeout", "gloo", "nccl")
    if isinstance(error, dist.DistError) or any(w in str(error).lower() for w in words):
        return line[:100]
    return None


def leave() -> None:
    """Destroy the process group now, while the interpreter is whole: a Gloo group whose
    threads are still alive when Python exits can abort the process at exit ("terminate
    called without an active exception"). Call it once nothing holds the group (no DDP)."""
    if dist.is_initialized():
        gc.collect()  # a DDP wrapper caught in a reference cycle lets go of the group here
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, world: World, device: torch.device):
    """The model as a training step calls it: DistributedDataParallel under torchrun."""
    if not world.group:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def no_sync(step_model: torch.nn.Module, skip: bool):
    """Within an update's earlier micro-batches: keep gradients local (DDP's no_sync). The
    step's model may be compiled: its DDP wrapper is then the module torch.compile wraps."""
    ddp = getattr(step_model, "_orig_mod", step_model)
    if skip and isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return ddp.no_sync()
    return contextlib.nullcontext()


def shard(order: list[list[int]], world: World) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches as (indices, real): every size-th of the epoch's order from
    `rank` on, padded with weightless copies (real=False) so all ranks take as many steps."""
    mine = [(idx, True) for idx in order[world.rank :: world.size]]
    return mine + [(order[0], False)] * (math.ceil(len(order) / world.size) - len(mine))
