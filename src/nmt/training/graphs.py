"""Training updates replayed as CUDA graphs (train.cuda_graphs).

Eagerly, a published-size update (65 M parameters, 32 sentences) launches a few thousand
small kernels one by one from Python, and the GPU waits for them: 46-68 ms an update on an
H100 at 0.3 % of its bf16 peak (reports/gpu-first-run/README.md). A CUDA graph records one
update's kernels once (forward, backward, gradient clipping and the fused Adam step) and
replays them with one launch. Each batch shape (sentences x source length, target length)
gets its own graph, captured the first time it comes; the graphs share one memory pool, so
they cost about the memory of one update. torch.compile was the other way to fewer launches;
it cost more than it saved here (nmt.core.runtime.resolve_compile).

What a graph needs, and how the update gives it:
- inputs at fixed addresses: each graph owns device buffers for src, tgt and the update's
  token count; a batch is copied in (from pinned memory, without waiting) before a replay;
- no host synchronization inside (no .item(), no data-dependent Python branch): the models
  have none (tests/test_graphs.py checks every op an update dispatches);
- an optimizer that keeps its step count and learning rate on the device: Adam with
  capturable=True and a tensor lr, which the lr schedule fills in place between replays;
- warm-up: the first WARMUP updates run eagerly on a side stream, as PyTorch's whole-network
  capture example does, so that lazily created state (Adam's moments, cuBLAS workspaces)
  exists before the first capture.
Dropout draws new masks on every replay (the CUDA generator is graph-aware).

A capture that fails (out of memory included: the new shape's graph did not fit beside the
others) raises CaptureFailed; training then releases the graphs and their pool and updates
eagerly (nmt.training.step.Updater). With graphs, batch lengths are padded to a
multiple of GRAPH_PAD_MULTIPLE under train.pad_multiple `auto` (resolve_pad_multiple): the
published recipe's batches come in 223 shapes over 3 epochs, 16 padded so, one graph each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

WARMUP = 3  # eager updates on a side stream before the first capture
GRAPH_PAD_MULTIPLE = 8  # train.pad_multiple `auto` where updates replay as graphs


class CaptureFailed(RuntimeError):
    """Recording a batch shape's graph failed; the failure (e.g. torch.OutOfMemoryError) is
    its __cause__. Nothing ran: the update it was for has not been made."""


def resolve_cuda_graphs(setting: bool | str, device: torch.device, *, compiled: bool,
                        processes: int, accumulate: int) -> bool:
    """train.cuda_graphs: `auto` replays updates as CUDA graphs wherever they can run: on a
    CUDA device, an eager step (not compiled), one process (DDP's all-reduce is not captured)
    and one micro-batch an update; false never."""
    return (setting == "auto" and torch.device(device).type == "cuda" and not compiled
            and processes == 1 and accumulate == 1)


def resolve_pad_multiple(setting: int | str, graphs: bool) -> int:
    """train.pad_multiple: `auto` pads batch lengths to a multiple of GRAPH_PAD_MULTIPLE where
    updates replay as CUDA graphs (`graphs`: resolve_cuda_graphs), so that fewer shapes are
    captured, and not at all (1) elsewhere; an integer is that multiple."""
    if setting == "auto":
        return GRAPH_PAD_MULTIPLE if graphs else 1
    return int(setting)


def capturable_adam(params, lr: float, betas: tuple[float, float], eps: float,
                    device: torch.device) -> torch.optim.Adam:
    """Adam whose step a graph can replay: fused, capturable (its step count on the device),
    its lr a device tensor that an lr schedule fills in place between replays."""
    return torch.optim.Adam(params, lr=torch.tensor(lr, device=device), betas=betas, eps=eps,
                            fused=True, capturable=True)


@dataclass
class Captured:
    """One batch shape's graph and the fixed buffers it reads and writes."""

    graph: torch.cuda.CUDAGraph
    src: torch.Tensor  # (B, S) on the device
    tgt: torch.Tensor  # (B, T) on the device
    total: torch.Tensor  # the update's target tokens, the loss's divisor
    out: tuple  # what the body returns (its summed token loss, ...), written by each replay


class GraphedUpdates:
    """Optimizer updates of one model, each batch shape's captured once and then replayed.

    `body(src, tgt, total)` is one whole update on device tensors (forward, backward, clip,
    optimizer step; gradients set to None before it: nmt.training.step.graph_body) and
    returns device tensors (the batch's summed token loss, the update's numbers); the lr
    schedule steps outside it.
    """

    def __init__(self, body: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple],
                 optimizer: torch.optim.Optimizer, device: torch.device):
        self.body, self.optimizer, self.device = body, optimizer, torch.device(device)
        self.graphs: dict[tuple, Captured] = {}
        self.pool = None  # the memory pool every graph shares (set by the first capture)
        self.warmup_left = WARMUP

    def __call__(self, src: torch.Tensor, tgt: torch.Tensor, total: float) -> tuple:
        """One update on a CPU batch; returns what the body returns (device tensors, valid
        until the next update)."""
        src, tgt = src.pin_memory(), tgt.pin_memory()
        if self.warmup_left:
            self.warmup_left -= 1
            return self.warm_up(src, tgt, total)
        key = (tuple(src.shape), tuple(tgt.shape))
        captured = self.graphs.get(key) or self.capture(key)
        captured.src.copy_(src, non_blocking=True)
        captured.tgt.copy_(tgt, non_blocking=True)
        captured.total.fill_(total)
        captured.graph.replay()
        return captured.out

    def warm_up(self, src: torch.Tensor, tgt: torch.Tensor, total: float) -> tuple:
        """An eager update on a side stream (PyTorch's recipe before a first capture)."""
        side, main = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self.optimizer.zero_grad(set_to_none=True)
            out = self.body(src.to(self.device, non_blocking=True),
                            tgt.to(self.device, non_blocking=True),
                            torch.tensor(total, dtype=torch.float64, device=self.device))
        main.wait_stream(side)
        return out

    def capture(self, key: tuple) -> Captured:
        """Record the update for batches of shape `key` (nothing runs yet: replay runs it);
        CaptureFailed if recording fails."""
        try:
            return self.record(key)
        except Exception as error:
            raise CaptureFailed(f"capturing the update for batch shape {key} failed: "
                                f"{type(error).__name__}") from error

    def record(self, key: tuple) -> Captured:
        """capture's work, its failures as they come."""
        src_shape, tgt_shape = key
        graph = torch.cuda.CUDAGraph()
        src = torch.zeros(src_shape, dtype=torch.long, device=self.device)
        tgt = torch.zeros(tgt_shape, dtype=torch.long, device=self.device)
        total = torch.ones((), dtype=torch.float64, device=self.device)
        self.optimizer.zero_grad(set_to_none=True)  # backward writes, never adds, in a graph
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.body(src, tgt, total)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[key] = Captured(graph, src, tgt, total, out)
        return self.graphs[key]

    def release(self) -> None:
        """Drop every graph and the memory pool they share (with the gradients a failed
        capture left in it), and give the pool's memory back to the device (CUDA) for the
        eager updates that follow."""
        self.graphs, self.pool = {}, None
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
