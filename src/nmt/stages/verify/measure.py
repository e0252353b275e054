"""What every checklist measures with: the check batches, max_abs_diff, the loss, fused
against math attention, the tolerances by dtype, and the size and steps of the training
trajectory (the twin check set trains it; every verify record gives them)."""

import dataclasses
import math

import torch
import torch.nn.functional as F

from nmt.models.config import ModelConfig

# bfloat16: float32 weights under bf16 autocast (what a GPU trains in). bf16 keeps 8 bits of
# mantissa (rounding 2^-9 = 0.2% relative), so two correct models that round at other places
# differ by ~1e-2 on values of order 1; a real bug (a missing 1/sqrt(d_k), a mask off by
# one) moves them by 1e-1 and more.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 1e-1}
FUSED_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-1}
CHECK_ROWS = 4  # sentences in the forward/attention/gradient check batches
TRAJECTORY_STEPS = 30
TRAJECTORY_ADAM = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9}  # the published optimizer
TRAJECTORY_SIZE = {"num_encoder_layers": 2, "num_decoder_layers": 2, "d_model": 64, "nhead": 4,
                   "dim_feedforward": 128}  # the largest: float64 training is slow on a CPU


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute elementwise difference; inf when the shapes differ."""
    if a.shape != b.shape:
        return math.inf
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def check_batches(train_batches, pad_id: int, rows: int = CHECK_ROWS):
    """(unpadded, padded) (src, tgt) batches: the first batch whose first `rows` sentences have
    padding in source and target input, and the same sentences cut to their shortest length."""
    def trim(x):  # drop the columns that are padding in every row
        return x[:, : int((x != pad_id).sum(1).max())]

    for src, tgt in train_batches:
        src, tgt = trim(src[:rows]), trim(tgt[:rows])
        if (src == pad_id).any() and (tgt[:, :-1] == pad_id).any():
            break
    else:
        raise ValueError("no batch has padding in both source and target input; "
                         "pass real padded batches (bos/eos added, right-padded)")
    s, t = int((src != pad_id).sum(1).min()), int((tgt != pad_id).sum(1).min())
    return (src[:, :s], tgt[:, :t]), (src, tgt)


def loss_of(model, src: torch.Tensor, tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token-level cross entropy of teacher-forced next-token prediction, padding ignored."""
    logits = model(src, tgt[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=pad_id)


def fused_math_diff(model, src, tgt) -> float:
    """Logits of the fused scaled_dot_product_attention path against the explicit math path."""
    with torch.no_grad():
        fused = model(src, tgt[:, :-1])
        model.set_fused_attention(False)
        try:
            math_path = model(src, tgt[:, :-1])
        finally:
            model.set_fused_attention(True)
    return max_abs_diff(fused, math_path)


def trajectory_model(cfg: ModelConfig) -> ModelConfig:
    """The recipe's model, no larger than TRAJECTORY_SIZE in any dimension, without dropout:
    a full-size recipe trains its trajectory at TRAJECTORY_SIZE, a smaller one at its own size
    (d_model and nhead change together, so that nhead still divides d_model)."""
    cap = TRAJECTORY_SIZE
    width = ({"d_model": cfg.d_model, "nhead": cfg.nhead} if cfg.d_model <= cap["d_model"]
             else {"d_model": cap["d_model"], "nhead": cap["nhead"]})
    return dataclasses.replace(
        cfg, **width, dropout=0.0, **{k: min(getattr(cfg, k), cap[k]) for k in
                                      ("num_encoder_layers", "num_decoder_layers",
                                       "dim_feedforward")})
