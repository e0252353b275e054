"""Decoder layer, decoder stack and the key/value cache for incremental decoding
(paper section 3.1, right half of Figure 1)."""

from dataclasses import dataclass

import torch
import torch.nn as nn

from nmt.models.scratch.attention import MultiHeadAttention
from nmt.models.scratch.feed_forward import FeedForward


@dataclass
class KVCache:
    """Decoding state kept between steps; every tensor has the batch first."""

    memory_mask: torch.Tensor  # (B, 1, 1, S) True at real source tokens
    cross_kv: list  # per layer: keys, values of the memory, each (B, H, S, Dh), computed once
    self_kv: list  # per layer: keys, values of the target prefix, each (B, H, t, Dh)
    prefix_mask: torch.Tensor  # (B, 1, 1, t) True at non-pad prefix tokens
    length: int = 0  # t, positions decoded so far

    def reorder(self, index: torch.Tensor, group: int = 1) -> "KVCache":
        """Keep the rows in index (beam search's surviving hypotheses; rows may repeat).
        group > 1: index keeps each row within its block of `group` rows (the beams of one
        sentence), which share one source, so the memory's keys and values stay as they are."""
        def pick(t):
            return t.index_select(0, index)

        if group == 1:
            self.memory_mask = pick(self.memory_mask)
            self.cross_kv = [(pick(k), pick(v)) for k, v in self.cross_kv]
        self.prefix_mask = pick(self.prefix_mask)
        self.self_kv = [(pick(k), pick(v)) for k, v in self.self_kv]
        return self


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, feed-forward; each post-norm,
    or pre-norm with norm_first (as in EncoderLayer)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float,
                 norm_first: bool = False):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout)
        self.cross_attn = MultiHeadAttention(d_model, nhead, dropout)
        self.ff = FeedForward(d_model, dim_feedforward, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(dropout) for _ in range(3))

    def forward(self, x, memory_kv, tgt_mask, memory_mask, past_kv=None, need_weights=False):
        """x: (B, T, D) new target positions; memory_kv: the memory's keys and values;
        past_kv: keys and values of earlier positions when decoding step by step.
        Returns x, this layer's self-attention keys and values (past and new), the weights."""
        q, k, v = self.self_attn.project_self(self.sublayer_input(x, self.norm1))  # (B,H,T,Dh)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        a, w_self = self.self_attn.attend(q, k, v, tgt_mask, need_weights)
        x = self.residual(x, self.dropout1(a), self.norm1)
        q = self.cross_attn.project_query(self.sublayer_input(x, self.norm2))
        a, w_cross = self.cross_attn.attend(q, *memory_kv, memory_mask, need_weights)
        x = self.residual(x, self.dropout2(a), self.norm2)
        ff = self.ff(self.sublayer_input(x, self.norm3))
        x = self.residual(x, self.dropout3(ff), self.norm3)
        return x, (k, v), (w_self, w_cross)

    def sublayer_input(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """What a sublayer reads: x, or norm(x) when pre-norm."""
        return norm(x) if self.norm_first else x

    def residual(self, x: torch.Tensor, update: torch.Tensor, norm: nn.LayerNorm):
        """x + update, normalized after the sum unless the sublayer's input was (pre-norm)."""
        return x + update if self.norm_first else norm(x + update)


class Decoder(nn.Module):
    """A stack of decoder layers and a final LayerNorm, as nn.TransformerDecoder has."""

    def __init__(self, num_layers: int, d_model: int, nhead: int, dim_feedforward: int,
                 dropout: float, norm_first: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(d_model, nhead, dim_feedforward, dropout,
                                                 norm_first) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, memory, tgt_mask, memory_mask, need_weights=False):
        """All positions at once: x (B, T, D), memory (B, S, D), tgt_mask (B, 1, T, T),
        memory_mask (B, 1, 1, S). Returns (B, T, D) and per-layer self and cross weights."""
        self_w, cross_w = [], []
        for layer in self.layers:
            memory_kv = layer.cross_attn.project_memory(memory)
            x, _, (ws, wc) = layer(x, memory_kv, tgt_mask, memory_mask, need_weights=need_weights)
            self_w.append(ws)
            cross_w.append(wc)
        return self.norm(x), self_w, cross_w

    def init_cache(self, memory: torch.Tensor, memory_mask: torch.Tensor) -> KVCache:
        """Project the memory's keys and values once for every layer; empty prefix."""
        cross_kv = [layer.cross_attn.project_memory(memory) for layer in self.layers]
        empty = cross_kv[0][0][:, :, :0]  # (B, H, 0, Dh)
        return KVCache(memory_mask, cross_kv, [(empty, empty)] * len(self.layers),
                       memory_mask[..., :0])

    def step(self, x: torch.Tensor, cache: KVCache, token_mask: torch.Tensor) -> torch.Tensor:
        """Decode one new position: x (B, 1, D), token_mask (B, 1, 1, 1); extends the cache."""
        # The newest position may attend every earlier one: no causal mask is needed.
        cache.prefix_mask = torch.cat([cache.prefix_mask, token_mask], dim=-1)  # (B, 1, 1, t)
        for i, layer in enumerate(self.layers):
            x, cache.self_kv[i], _ = layer(x, cache.cross_kv[i], cache.prefix_mask,
                                           cache.memory_mask, past_kv=cache.self_kv[i])
        cache.length += 1
        return self.norm(x)  # (B, 1, D)
