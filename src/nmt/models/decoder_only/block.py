"""The pre-norm decoder block and the stack with its final LayerNorm (GPT-2's layout)."""

import torch.nn as nn

from nmt.models.decoder_only.attention import SelfAttention
from nmt.models.decoder_only.feed_forward import FeedForward
from nmt.models.decoder_only.layer_norm import LayerNorm
from nmt.models.scratch.dropout import Dropout


class Block(nn.Module):
    """x + Attention(LayerNorm(x)), then x + FFN(LayerNorm(x)); dropout on each branch."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)
        self.attn = SelfAttention(d_model, nhead, dropout)
        self.ff = FeedForward(d_model, dim_feedforward, dropout)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)

    def forward(self, x, mask, past_kv=None, need_weights: bool = False):
        """x (B, T, D) -> x, this layer's keys and values (past and new), the weights."""
        a, kv, weights = self.attn(self.norm1(x), mask, past_kv, need_weights)
        x = x + self.dropout1(a)
        x = x + self.dropout2(self.ff(self.norm2(x)))
        return x, kv, weights


class Stack(nn.Module):
    """num_layers blocks and a final LayerNorm."""

    def __init__(self, num_layers: int, d_model: int, nhead: int, dim_feedforward: int,
                 dropout: float):
        super().__init__()
        self.layers = nn.ModuleList(
            Block(d_model, nhead, dim_feedforward, dropout) for _ in range(num_layers))
        self.norm = LayerNorm(d_model)

    def forward(self, x, mask, past_kv=None, need_weights: bool = False):
        """x (B, T, D), mask (B, 1, T, t + T); past_kv: per layer, or None.
        Returns normed states (B, T, D), per-layer keys and values, per-layer weights."""
        kvs, weights = [], []
        for i, layer in enumerate(self.layers):
            x, kv, w = layer(x, mask, None if past_kv is None else past_kv[i], need_weights)
            kvs.append(kv)
            weights.append(w)
        return self.norm(x), kvs, weights

    def set_fused(self, enabled: bool) -> None:
        for layer in self.layers:
            layer.attn.fused = enabled
