"""params.yaml's train: section, as the loop and the update read it."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class TrainConfig:
    """params.yaml's train: section. Its schema (workflow/schemas/params.schema.yaml) checks
    the values before any stage runs; nothing here checks them again."""

    epochs: int
    batch_by: str  # sentences: batch_size sentences a batch; tokens: up to max_tokens a batch
    batch_size: int
    bucket: bool  # sentences: similar lengths share a batch (little padding); tokens always do
    max_tokens: int
    lr: float  # the peak learning rate
    betas: tuple[float, float]  # Adam's
    eps: float  # Adam's
    max_updates: int  # 0: `epochs` epochs; else exactly this many updates (the last epoch cut)
    warmup_steps: int  # linear warmup over these updates (0: none)
    schedule: str  # after warmup: inverse_sqrt (0 warmup: constant), or linear/cosine to zero
    label_smoothing: float
    clip_grad_norm: float  # 0: off
    average_last: int  # 0: off; else also validate the mean of the last N epochs' weights
    patience: int  # 0: every epoch; else stop after N epochs without a better valid loss
    device: str  # auto (CUDA when present), cpu, cuda[:N]
    precision: str  # auto (measured: nmt.training.precision), bf16 (autocast), fp32
    compile: bool | str  # auto (off: it cost more than it saved), true, false: torch.compile
    cuda_graphs: bool | str  # auto (CUDA, eager, 1 process, accumulate 1), false: training.graphs
    # batch lengths padded up to a multiple of this (1: off); auto: 8 where updates replay as
    # CUDA graphs, else 1 (nmt.training.graphs.resolve_pad_multiple)
    pad_multiple: int | str
    accumulate: int  # micro-batches an optimizer update (gradient accumulation)
    devices: int  # processes one run trains on (DDP under torchrun)
    save_every_minutes: float  # 0: a resume state every epoch; else also every M minutes

    @classmethod
    def from_dict(cls, section: dict) -> TrainConfig:
        """From the train: section of a resolved recipe."""
        values = {f.name: section[f.name] for f in fields(cls)}
        return cls(**{**values, "betas": tuple(values["betas"])})
