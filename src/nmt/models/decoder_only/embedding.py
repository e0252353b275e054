"""One token table for source, target and <sep>, and sinusoidal positions given per token.

Table rows: tied (one joint vocabulary) [shared tokens (V) | <sep>]; untied (two vocabularies)
[source tokens (Vs) | target tokens (Vt) | <sep>]. The target's <bos>, the first token search
feeds, is read as <sep>: the row that ends the source and predicts the first target token.
"""

import math

import torch
import torch.nn as nn

from nmt.models.config import ModelConfig
from nmt.models.scratch.dropout import Dropout
from nmt.models.scratch.embedding import sinusoids


class JointEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) over one table; the LM head reads it back."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, bos_id: int):
        super().__init__()
        self.bos_id = bos_id
        self.tgt_offset = 0 if cfg.tie_embeddings else src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.sep_id = self.tgt_offset + tgt_vocab_size  # the last row
        self.token = nn.Embedding(self.sep_id + 1, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model)

    def source_rows(self, src: torch.Tensor) -> torch.Tensor:
        return src  # source ids are table rows as they are

    def target_rows(self, tgt: torch.Tensor) -> torch.Tensor:
        """Target ids -> table rows: offset past the source rows, <bos> read as <sep>."""
        return torch.where(tgt == self.bos_id, self.sep_id, tgt + self.tgt_offset)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.token(rows) * self.scale  # (B, T, D)

    def head_weight(self) -> torch.Tensor:
        """The target rows, (Vt, D): the LM head tied to the embedding."""
        return self.token.weight[self.tgt_offset : self.tgt_offset + self.tgt_vocab_size]


class Positions(nn.Module):
    """Adds the sinusoid of each token's own position (B, T), then dropout."""

    def __init__(self, d_model: int, dropout: float, size: int):
        super().__init__()
        self.register_buffer("table", sinusoids(size, d_model), persistent=False)  # (L, D)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (B, T, D), pos (B, T) position ids."""
        return self.dropout(x + self.table[pos])
