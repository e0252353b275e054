"""Input embeddings and sinusoidal positional encoding (paper sections 3.4 and 3.5)."""

import math

import torch
import torch.nn as nn

from nmt.models.config import ModelConfig
from nmt.models.scratch.dropout import Dropout


def sinusoids(max_len: int, d_model: int) -> torch.Tensor:
    """(max_len, d_model) table: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same)."""
    # Built in float64 so the float32 table is correctly rounded whichever formula is used.
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                         * (-math.log(10000.0) / d_model))  # (D/2,)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)
    return table.float()


class Embeddings(nn.Module):
    """Token embedding scaled by sqrt(d_model)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.token(tokens) * self.scale  # (B, T, D)


class PositionalEncoding(nn.Module):
    """Adds the sinusoid of each position (with cfg.positions "rotary", none: the positions act
    in attention instead), then dropout."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.max_len = cfg.max_len
        # Not persistent: a constant, so checkpoints hold only learned parameters.
        sinusoidal = cfg.positions == "sinusoidal"
        table = sinusoids(cfg.max_len, cfg.d_model) if sinusoidal else None
        self.register_buffer("table", table, persistent=False)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x: (B, T, D) embeddings of positions offset .. offset + T - 1."""
        end = offset + x.size(1)
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds max_len={self.max_len}; "
                             "raise model.max_len")
        return self.dropout(x if self.table is None else x + self.table[offset:end])
