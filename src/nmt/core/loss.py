"""The training objective: token-level cross-entropy under teacher forcing (pads ignored), for
one batch (`token_loss`, which training, its CUDA graphs and the benchmark step on) and over a
whole corpus (`corpus_loss`: validation and test loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nmt.core.codecs import PAD_ID
from nmt.core.runtime import autocast


def token_loss(model, src, tgt, device, label_smoothing: float = 0.0, reduction: str = "sum",
               precision: str = "fp32", cache_casts: bool = True):
    """(loss, target tokens) of one batch under teacher forcing; pads ignored.

    reduction "sum": one summed loss; "none": a (B,) loss per sentence (summed over its tokens).
    The forward pass runs under `precision` (resolve_precision, autocast); the loss is
    float32 or wider.
    """
    src, tgt = src.to(device, non_blocking=True), tgt.to(device, non_blocking=True)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    with autocast(device, precision, cache_casts):
        logits = model(src, tgt_in)  # (B, T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, fp64 kept
    loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID,
                           reduction="sum" if reduction == "sum" else "none",
                           label_smoothing=label_smoothing)
    if reduction != "sum":
        loss = loss.view(tgt_out.shape).sum(dim=1)  # (B,)
    return loss, (tgt_out != PAD_ID).sum()


def corpus_loss(model, batches, device, reduce=None, precision: str = "fp32") -> float:
    """Per-token cross-entropy over (src, tgt) batches: no label smoothing, no dropout (the
    model's mode is restored after). The loss sums in float64; `reduce` (training's
    World.sum: every rank's share) combines [summed loss, tokens] before the division."""
    with torch.inference_mode():
        was_training = model.training
        model.eval()
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros((), dtype=torch.long, device=device)
        for src, tgt in batches:
            loss, n = token_loss(model, src, tgt, device, precision=precision)
            total += loss
            count += n
        model.train(was_training)
        sums = torch.stack([total, count.double()])
        total, count = (sums if reduce is None else reduce(sums)).tolist()
        return total / count
