"""Attention masks as the additive bias attention reads, built once a forward.

The models derive boolean masks from the tokens: True where a query may attend a key. Handed
to F.scaled_dot_product_attention as they are, every call (each attention of each layer)
turns one into an additive bias again (0 where attended, -inf elsewhere, in the queries'
dtype: a few kernels), and the memory-efficient kernel copies a bias whose rows do not start
on aligned addresses. `bias` does both once, where a forward builds the mask; each attention
then adds it to its scores (the explicit math path) or hands it to the fused kernel as it is.
"""

import torch

ALIGN = 16  # elements: where each row of a bias starts (the fused kernels' alignment)


def attention_dtype(like: torch.Tensor) -> torch.dtype:
    """The dtype attention's queries have when they are computed from `like` (the hidden
    states): autocast's where it is on and would cast them, else like's own."""
    device = like.device.type
    if like.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return like.dtype


def bias(keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """keep (..., keys) bool -> the additive bias of the same shape: 0.0 where True, -inf where
    False, in attention_dtype(like), each row of keys starting on an ALIGN-element boundary."""
    *lead, keys = keep.shape
    # Rows a whole ALIGN longer than the keys when these are a multiple of it: the bias is then
    # never a contiguous tensor, so torch.compile (dynamic shapes) has no case to tell apart
    # (rounding up, lengths of 16, 32, ... recompiled the forward)
    room = (keys // ALIGN + 1) * ALIGN
    out = torch.zeros(*lead, room, dtype=attention_dtype(like), device=keep.device)[..., :keys]
    return out.masked_fill_(~keep, float("-inf"))
