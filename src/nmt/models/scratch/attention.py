"""Scaled dot-product attention and multi-head attention (paper section 3.2).

A mask reaches attention as an additive bias (nmt.models.masks: 0 where a query may attend a
key, -inf where not), broadcast to (B, H, T, S) and built once a forward, not once a call.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt.models.masks import bias
from nmt.models.scratch.dropout import Dropout
from nmt.models.scratch.rotary import Rotary


def scaled_dot_product_attention(q, k, v, bias, scale: float, dropout: nn.Dropout):
    """softmax(Q K^T * scale + bias) V, eq. (1): output (B, H, T, Dh) and weights (B, H, T, S).
    bias: -inf at the keys a query may not attend (exp(-inf) = 0), 0 elsewhere; or None."""
    scores = (q * scale) @ k.transpose(-2, -1)  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    weights = scores.softmax(dim=-1)
    if bias is not None:
        # A query that sees no key at all is all -inf, its softmax NaN: make its row 0 (other
        # rows hold no NaN, and 0 already at every masked key).
        weights = weights.masked_fill(weights.isnan(), 0.0)
    weights = dropout(weights)
    return weights @ v, weights


def beam_attention(q, k, v, slots, real, scale: float):
    """Attention of each beam's newest position over its own prefix, read from keys and values
    that the K beams of a sentence share, none of them copied.

    q: (B, H, K, Dh), the newest query of each of K beams; k, v: (B, H, T, K, Dh), position t
    of slot j (what the beam in row j computed at step t); slots: (B, K, T), the slot holding
    beam i's position t; real: (B, K, T), True where that token is not padding.
    Returns (B, H, K, Dh). Every beam scores every slot (K times the products it needs, in one
    matrix product that reads each key once) and keeps the scores of its own slots; its weights
    are spread back over the slots for one product with the values.
    """
    B, H, T, K, Dh = k.shape
    own = slots[:, None, :, :, None].expand(B, H, K, T, 1)
    scores = (q * scale) @ k.reshape(B, H, T * K, Dh).transpose(-2, -1)  # (B, H, K, T*K)
    scores = scores.view(B, H, K, T, K).gather(-1, own).squeeze(-1)  # (B, H, K, T)
    weights = scores.masked_fill(~real[:, None], float("-inf")).softmax(dim=-1)
    spread = weights.new_zeros(B, H, K, T, K).scatter_(-1, own, weights[..., None])
    return spread.view(B, H, K, T * K) @ v.reshape(B, H, T * K, Dh)  # (B, H, K, Dh)


class MultiHeadAttention(nn.Module):
    """H attention heads over learned projections, with one packed Q/K/V weight.

    Self-attention's queries and keys pass through one position hook, at_positions, where
    they are made (project_self): the math path, the fused path and beam_attention all read
    what it returns. It is the identity unless `rotary` is given (cross-attention never has
    it: source and target positions are not on one axis).
    """

    def __init__(self, d_model: int, nhead: int, dropout: float, rotary: Rotary | None = None):
        super().__init__()
        self.rotary = rotary  # may be shared by the layers (a constant table)
        self.nhead, self.d_head = nhead, d_model // nhead
        self.scale = 1.0 / math.sqrt(self.d_head)
        # Rows [W_q; W_k; W_v], laid out as nn.MultiheadAttention's in_proj_weight.
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = Dropout(dropout)  # on the attention weights, as nn.MultiheadAttention
        self.fused = True  # F.scaled_dot_product_attention unless weights are requested
        nn.init.zeros_(self.qkv.bias)  # nn.MultiheadAttention starts its biases at 0
        nn.init.zeros_(self.out.bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.nhead, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def project_self(self, x: torch.Tensor, start: int | None = None):
        """Queries, keys and values of x (B, T, D) in one matmul, each (B, H, T, Dh); queries
        and keys placed at positions start .. start + T - 1 by at_positions (None: a whole
        sequence, from 0; the cached step gives its one position)."""
        q, k, v = [self.split_heads(t) for t in self.qkv(x).chunk(3, dim=-1)]
        return self.at_positions(q, start), self.at_positions(k, start), v

    def at_positions(self, x: torch.Tensor, start: int | None) -> torch.Tensor:
        """The position hook: queries or keys x (B, H, T, Dh) at their positions, from start
        on. Identity (x itself) by default, where the positions were added to the embeddings:
        no work at all on that path."""
        if self.rotary is None:
            return x
        return self.rotary(x, start or 0)

    def project_query(self, x: torch.Tensor) -> torch.Tensor:
        """Queries of x (B, T, D) for cross-attention: (B, H, T, Dh)."""
        d = x.size(-1)
        return self.split_heads(F.linear(x, self.qkv.weight[:d], self.qkv.bias[:d]))

    def project_memory(self, memory: torch.Tensor):
        """Keys and values of the encoder memory (B, S, D), each (B, H, S, Dh)."""
        d = memory.size(-1)
        kv = F.linear(memory, self.qkv.weight[d:], self.qkv.bias[d:])  # (B, S, 2D)
        return [self.split_heads(t) for t in kv.chunk(2, dim=-1)]

    def attend(self, q, k, v, mask, need_weights: bool = False):
        """Attention of q over (k, v), heads concatenated and projected: (B, T, D), weights.
        mask: the additive bias the model built once (nmt.models.masks.bias), or a boolean mask
        (True: attend), made the bias here, or None."""
        if mask is not None and mask.dtype == torch.bool:
            mask = bias(mask, q)
        math_path = need_weights or not self.fused
        # Dropping out weights on a CPU, the fused kernel falls back to this same math, but
        # draws nn.Dropout's mask, three times as costly as Dropout's: take the math path.
        cpu_dropout = self.training and self.dropout.p > 0 and q.device.type == "cpu"
        if math_path or cpu_dropout:
            y, weights = scaled_dot_product_attention(q, k, v, mask, self.scale, self.dropout)
            return self.project_out(y), weights if math_path else None
        p = self.dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=self.scale)
        return self.project_out(y), None

    def project_out(self, y: torch.Tensor) -> torch.Tensor:
        """Heads y (B, H, T, Dh) concatenated and projected: (B, T, D)."""
        B, H, T, Dh = y.shape
        return self.out(y.transpose(1, 2).reshape(B, T, H * Dh))

    def forward(self, x: torch.Tensor, mask, need_weights: bool = False):
        """Self-attention of x (B, T, D)."""
        q, k, v = self.project_self(x)
        return self.attend(q, k, v, mask, need_weights)
