"""Rotary position embedding (RoFormer, Su et al. 2021), an alternative to the sinusoids.

Instead of adding a position vector to the embeddings, each query and key is rotated: feature
pair i (features i and i + Dh/2) of position p turns by the angle p * 10000^(-2i/Dh). A query
at p and a key at p' then score q R(p)^T R(p') k = q R(p' - p) k: attention sees only how far
apart they are. MultiHeadAttention.at_positions applies it (its position hook), so the math,
fused and cached beam paths all read rotated queries and keys.
"""

import torch
import torch.nn as nn


class Rotary(nn.Module):
    """Rotates queries or keys (..., T, Dh) by the angles of their positions."""

    def __init__(self, d_head: int, max_len: int, base: float = 10000.0):
        super().__init__()
        # float64 angles, as sinusoids(): the float32 tables are correctly rounded.
        inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (L, Dh/2)
        # Not persistent: constants, so checkpoints hold only learned parameters.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x (..., T, Dh) at positions start .. start + T - 1; the embeddings' length check
        (max_len) has already run."""
        end = start + x.size(-2)
        # (T, Dh/2), the same for every row and head; in x's dtype, so bf16 stays bf16
        cos, sin = self.cos[start:end].to(x.dtype), self.sin[start:end].to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)  # the two halves: pair i is (x1[i], x2[i])
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
