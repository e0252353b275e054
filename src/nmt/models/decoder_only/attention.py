"""Multi-head self-attention over the packed sequence, with a key/value cache.

Masks are boolean, broadcast to (B, H, T_query, T_key): True where a query may attend a key,
the convention of F.scaled_dot_product_attention. The model builds them (prefix or causal).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention_weights(q, k, mask, scale: float) -> torch.Tensor:
    """softmax(Q K^T * scale) over the keys a query may see: (B, H, T, S)."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, H, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))
    # A query that sees no key would be all -inf, softmax NaN; make its row 0.
    return scores.softmax(dim=-1).masked_fill(~mask, 0.0)


class SelfAttention(nn.Module):
    """H heads over one packed Q/K/V projection; a fused path and an explicit math path."""

    def __init__(self, d_model: int, nhead: int, dropout: float):
        super().__init__()
        self.nhead, self.d_head = nhead, d_model // nhead
        self.scale = 1.0 / math.sqrt(self.d_head)
        self.qkv = nn.Linear(d_model, 3 * d_model)  # rows [W_q; W_k; W_v]
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)  # on the attention weights
        self.fused = True  # F.scaled_dot_product_attention unless weights are requested
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.out.bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.nhead, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def forward(self, x, mask, past_kv=None, need_weights: bool = False):
        """x (B, T, D) new positions; past_kv: keys, values (B, H, t, Dh) of earlier ones.
        Returns (B, T, D), the keys and values of past and new positions, the weights."""
        q, k, v = [self.split_heads(t) for t in self.qkv(x).chunk(3, dim=-1)]
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        if need_weights or not self.fused:
            weights = attention_weights(q, k, mask, self.scale)
            y = self.dropout(weights) @ v  # (B, H, T, Dh)
        else:
            p = self.dropout.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                               scale=self.scale)
            weights = None
        B, H, T, Dh = y.shape
        return self.out(y.transpose(1, 2).reshape(B, T, H * Dh)), (k, v), weights
