"""Encoder layer and encoder stack (paper section 3.1, left half of Figure 1)."""

import torch
import torch.nn as nn

from nmt.models.config import ModelConfig
from nmt.models.scratch.attention import MultiHeadAttention
from nmt.models.scratch.dropout import Dropout
from nmt.models.scratch.feed_forward import FeedForward
from nmt.models.scratch.rotary import Rotary


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each as LayerNorm(x + Dropout(sublayer(x))) (post-norm),
    or with norm_first as x + Dropout(sublayer(LayerNorm(x))) (pre-norm)."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None):
        super().__init__()
        d_model, dropout = cfg.d_model, cfg.dropout
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(d_model, cfg.nhead, dropout, rotary)
        self.ff = FeedForward(d_model, cfg.dim_feedforward, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False):
        """x: (B, S, D), mask: its bias (B, 1, 1, S) (nmt.models.masks); returns x and the
        attention weights (or None)."""
        if self.norm_first:
            a, weights = self.self_attn(self.norm1(x), mask, need_weights)
            x = x + self.dropout1(a)
            return x + self.dropout2(self.ff(self.norm2(x))), weights
        a, weights = self.self_attn(x, mask, need_weights)
        x = self.norm1(x + self.dropout1(a))
        x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, weights


class Encoder(nn.Module):
    """A stack of encoder layers and a final LayerNorm, as nn.TransformerEncoder has."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg, rotary)
                                    for _ in range(cfg.num_encoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, need_weights: bool = False):
        """Memory (B, S, D) and each layer's self-attention weights (None unless needed)."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, need_weights)
            weights.append(w)
        return self.norm(x), weights
