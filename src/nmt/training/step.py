"""The one optimizer update, which nmt train makes, nmt bench times and the precision
calibration measures.

nanoGPT's update on one screen, with what a run here adds: micro-batches (gradient
accumulation), several processes (DDP), a precision, label smoothing, clipping, an lr schedule,
and two ways to run: eagerly, or replayed as a CUDA graph (nmt.training.graphs).

    zero the gradients
    each micro-batch: forward, loss, backward (scaled)          forward_backward
    the gradient norm, clipping, the optimizer's step          clip_and_step
    the lr schedule's step                                      Updater.update

`updater()` builds an Updater from the train: settings as nmt train does; nmt bench builds
its own through it too, so that it times the update training makes (tests/test_step.py).

Besides its loss an update reports `Updated.means`: numbers history.csv averages over an
epoch, a column each, which the report draws as curves. Logging one more is one more entry
where clip_and_step (or forward_backward) computes it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from nmt.core.codecs import PAD_ID
from nmt.core.loss import token_loss
from nmt.training import distributed
from nmt.training.config import TrainConfig
from nmt.training.distributed import World
from nmt.training.graphs import CaptureFailed, GraphedUpdates, capturable_adam

log = logging.getLogger("nmt.train")

Micro = tuple[torch.Tensor, torch.Tensor, bool]  # (src, tgt, real); padding ones are not real
ONE_PROCESS = World()


@dataclass(frozen=True)
class UpdateConfig:
    """What an update does besides the model's forward and the optimizer's step."""

    precision: str = "fp32"  # bf16 (autocast) or fp32, resolved (nmt.training.precision)
    label_smoothing: float = 0.0
    clip: float = 0.0  # train.clip_grad_norm: the gradient norm is clipped to this (0: not)


@dataclass
class Updated:
    """What one update reports (device tensors: reading them waits for the GPU)."""

    loss_sum: torch.Tensor  # the summed token loss of this rank's real micro-batches
    tokens: int  # ... and their target tokens
    means: dict[str, torch.Tensor]  # numbers history.csv averages over the epoch's updates


def forward_backward(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor,
                     device: torch.device, config: UpdateConfig, total: torch.Tensor, *,
                     real: bool = True, ranks: int = 1, cache_casts: bool = True) -> torch.Tensor:
    """One micro-batch's forward and backward: its summed token loss, divided by the update's
    target tokens (`total`, over every micro-batch and rank), backpropagated. DDP averages
    gradients over ranks; x `ranks` makes that their sum. A padding micro-batch (not `real`)
    weighs nothing: it only keeps the ranks in step. `cache_casts`: keep autocast's bf16
    copies of the weights (a CUDA graph capture cannot). Returns the detached loss."""
    loss, _ = token_loss(model, src, tgt, device, config.label_smoothing,
                         precision=config.precision, cache_casts=cache_casts)
    ((loss if real else loss * 0.0) / total * ranks).backward()
    return loss.detach()


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  clip: float) -> dict[str, torch.Tensor]:
    """The gradient norm (before clipping), clipping to `clip` (0: none), the optimizer's step;
    returns the update's numbers for history.csv."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(grads)
    if clip > 0:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), clip, grad_norm)
    optimizer.step()
    return {"grad_norm": grad_norm}


def graph_body(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
               config: UpdateConfig):
    """The update for one process and one micro-batch on device tensors, as a CUDA graph
    records it (nmt.training.graphs): the same two steps as an eager update."""

    def body(src: torch.Tensor, tgt: torch.Tensor, total: torch.Tensor):
        loss = forward_backward(model, src, tgt, device, config, total, cache_casts=False)
        return loss, clip_and_step(model, optimizer, config.clip)

    return body


@dataclass(kw_only=True)
class Updater:
    """One model's optimizer updates: `updater(micro)` makes one from this rank's
    micro-batches. Where a compiled update or a CUDA graph capture fails, it says why in one
    line and updates eagerly from then on (compile_failed, graphs_failed)."""

    model: torch.nn.Module  # the weights: clipped, stepped, validated and saved
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    device: torch.device
    config: UpdateConfig
    # What the forward calls: the model, in DistributedDataParallel under torchrun, maybe
    # compiled (distributed.no_sync finds the DDP wrapper inside it)
    step_model: torch.nn.Module | None = None
    world: World = ONE_PROCESS
    graphs: GraphedUpdates | None = None  # updates replayed as CUDA graphs (train.cuda_graphs)
    compile_failed: str = ""  # why compiling failed, when updates fell back to eager
    graphs_failed: str = ""  # why a capture failed, when updates fell back to eager

    def __post_init__(self):
        if self.step_model is None:
            self.step_model = self.model

    @property
    def compiled(self) -> bool:
        """Whether updates run compiled (not after a failed compile fell back)."""
        return isinstance(self.step_model, torch._dynamo.eval_frame.OptimizedModule)

    def __call__(self, micro: list[Micro]) -> Updated:
        """update(), and where a compiled update fails (inductor, Triton, the C++ compiler) or
        a CUDA graph does (a capture out of memory included: the graphs' memory is released),
        this update and the rest go eagerly: that changes the speed, not what is learnt. A
        failure that is the model's own fails eagerly too and is raised from there. Any other
        out of memory is raised as it is; so is any failure under DDP, where the ranks would
        have to fall back together."""
        try:
            return self.update(micro)
        except CaptureFailed as error:  # out of memory included
            self.drop_graphs(error)
        except (torch.OutOfMemoryError, MemoryError):
            raise
        except Exception as error:  # noqa: BLE001 - the eager retry raises any model error again
            if self.graphs is not None:
                self.drop_graphs(error)
            elif self.compiled and self.world.size == 1:
                self.compile_failed, self.step_model = root_cause(error), self.model
                log.warning("torch.compile failed (%s): training eagerly from here",
                            self.compile_failed)
            else:
                raise
        return self.update(micro)

    def update(self, micro: list[Micro]) -> Updated:
        """One optimizer update from this rank's micro-batches. Its loss is the summed token
        loss of all micro-batches of all ranks over their total target tokens: accumulate k
        on batches of B equals one batch of k*B, and N ranks x accumulate k equal one process
        x accumulate N*k."""
        local = sum(int((tgt[:, 1:] != PAD_ID).sum()) for _, tgt, real in micro if real)
        if self.graphs is not None:  # one process, one micro-batch: replayed
            src, tgt, _ = micro[0]
            loss_sum, means = self.graphs(src, tgt, float(local))
        else:
            loss_sum, means = self.eager(micro, local)
        if self.scheduler is not None:
            self.scheduler.step()
        return Updated(loss_sum, local, means)

    def eager(self, micro: list[Micro], local: int):
        """update()'s work, kernel by kernel: (summed loss, means)."""
        device, world = self.device, self.world
        # One process keeps the divisor on the CPU (a CUDA kernel takes it as a number): a
        # device tensor made from it would copy from pageable memory, which waits for the GPU
        # to finish the last update, and the CPU could no longer queue this one ahead of it.
        total = torch.tensor(float(local), dtype=torch.float64, device="cpu")
        if world.group:
            total = world.sum(total.to(device))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        for i, (src, tgt, real) in enumerate(micro):
            if device.type == "cuda":  # pinned, so that copying the batch does not wait either
                src, tgt = src.pin_memory(), tgt.pin_memory()
            last = i == len(micro) - 1
            with distributed.no_sync(self.step_model, skip=not last):  # all-reduce once
                loss = forward_backward(self.step_model, src, tgt, device, self.config, total,
                                        real=real, ranks=world.size)
            if real:
                loss_sum += loss
        return loss_sum, clip_and_step(self.model, self.optimizer, self.config.clip)

    def drop_graphs(self, error: Exception) -> None:
        """Update eagerly from here on: release the graphs and their memory; one line says why."""
        self.graphs_failed = root_cause(error)
        self.graphs.release()
        self.graphs = None
        log.warning("a CUDA graph capture failed (%s): updating eagerly from here",
                    self.graphs_failed)


def updater(model: torch.nn.Module, config: TrainConfig, device: torch.device, *,
            precision: str, total_updates: int, world: World = ONE_PROCESS,
            compile_on: bool = False, graphs_on: bool = False) -> Updater:
    """The Updater a run trains `model` with: Adam (fused on CUDA; capturable for graphs), the
    lr schedule over `total_updates`, DDP under torchrun, torch.compile or CUDA graphs."""
    step_model = distributed.wrap(model, world, device)
    if compile_on:  # batch shapes vary with sentence length: one compile, dynamic shapes
        step_model = compiled(step_model)
    if graphs_on:
        optimizer = capturable_adam(model.parameters(), config.lr, config.betas, config.eps,
                                    device)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, betas=config.betas,
                                     eps=config.eps, fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
        s + 1, config.warmup_steps, config.schedule, total_updates))
    update_config = UpdateConfig(precision, config.label_smoothing, config.clip_grad_norm)
    graphs = (GraphedUpdates(graph_body(model, optimizer, device, update_config), optimizer,
                             device) if graphs_on else None)
    return Updater(model=model, optimizer=optimizer, scheduler=scheduler, device=device,
                   config=update_config, step_model=step_model, world=world, graphs=graphs)


def lr_factor(step: int, warmup: int, schedule: str = "inverse_sqrt", total: int = 0) -> float:
    """The lr of update `step` (1-based) as a fraction of the peak: a linear warmup over
    `warmup` updates, then inverse_sqrt decay (constant when warmup is 0), or a linear or
    cosine decay that reaches zero after update `total`."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(warmup / step) if warmup else 1.0
    left = max(total - step, 0) / max(total - warmup, 1)  # 1 at the peak, 0 at the end
    return left if schedule == "linear" else 0.5 * (1 - math.cos(math.pi * left))


def compiled(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """torch.compile for dynamic shapes (inductor: Triton on CUDA, C++ via gcc on the CPU):
    one graph for every batch shape. Duck shaping is off: it gives two sizes that happen to
    be equal in the first batch (32 sentences of 32 tokens) one symbol, and the first batch
    where they differ recompiles. Dynamo's caches and counters are cleared first, so
    outputs.machine_report counts this run's compiles."""
    import torch.fx.experimental._config as shape_config
    from torch._dynamo.utils import compilation_time_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    compilation_time_metrics.clear()
    shape_config.use_duck_shape = False  # read when the first batch compiles
    return torch.compile(model, dynamic=True, backend=backend)


def root_cause(error: BaseException) -> str:
    """`Type: first line` of the innermost exception (a compiler's own error, not dynamo's
    wrapper around it: BackendCompilerFailed holds it as inner_exception)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
