"""Decoder layer, decoder stack and the key/value cache for incremental decoding
(paper section 3.1, right half of Figure 1)."""

from dataclasses import dataclass

import torch
import torch.nn as nn

from nmt.models.config import ModelConfig
from nmt.models.scratch.attention import MultiHeadAttention, beam_attention
from nmt.models.scratch.dropout import Dropout
from nmt.models.scratch.feed_forward import FeedForward
from nmt.models.scratch.rotary import Rotary

CAPACITY = 32  # positions the target's keys and values have room for; doubles when full


def by_sentence(x: torch.Tensor, beams: int) -> torch.Tensor:
    """One position of each row, (B*K, H, 1, Dh), as K positions of each sentence: (B, H, K, Dh)."""
    N, H, _, Dh = x.shape
    return x.transpose(1, 2).reshape(N // beams, beams, H, Dh).transpose(1, 2)


def by_row(x: torch.Tensor) -> torch.Tensor:
    """K positions of each sentence, (B, K, D), as one position of each row: (B*K, 1, D)."""
    B, K, D = x.shape
    return x.reshape(B * K, 1, D)


@dataclass
class KVCache:
    """Decoding state kept between steps for B sentences of K beams each (greedy search: K = 1),
    row b * K + i holding beam i of sentence b.

    The source side is kept once a sentence. The target side never moves: step t writes each
    row's keys and values into its slot of position t, and `slots` records where each beam's
    earlier positions lie, so beam search's reorder moves only that record (beam_attention
    reads a beam's prefix through it)."""

    memory_bias: torch.Tensor  # (B, 1, 1, S) 0 at real source tokens, -inf at padding
    cross_kv: list  # per layer: keys, values of the memory, each (B, H, S, Dh), computed once
    self_kv: list  # per layer: keys, values of the target, each (B, H, capacity, K, Dh)
    slots: torch.Tensor  # (B, K, t) the slot holding beam i's position t
    real: torch.Tensor  # (B, K, t) True where beam i's token at position t is not <pad>
    length: int = 0  # t, positions decoded so far

    @property
    def beams(self) -> int:
        return self.slots.size(1)

    def reorder(self, index: torch.Tensor) -> "KVCache":
        """Row r continues the beam in row index[r], one of its own sentence's K rows (rows may
        repeat): beam search's surviving hypotheses. Only the record of slots moves."""
        B, K, t = self.slots.shape
        beam = (index % K).view(B, K, 1).expand(B, K, t)
        self.slots, self.real = self.slots.gather(1, beam), self.real.gather(1, beam)
        return self

    def keep(self, sentences: torch.Tensor) -> "KVCache":
        """Only these sentences (indices, ascending) go on decoding, with all their beams."""
        def pick(t):
            return t.index_select(0, sentences)

        self.memory_bias, self.slots, self.real = map(pick, (self.memory_bias, self.slots,
                                                             self.real))
        self.cross_kv = [(pick(k), pick(v)) for k, v in self.cross_kv]
        self.self_kv = [(pick(k), pick(v)) for k, v in self.self_kv]
        return self

    def advance(self, real: torch.Tensor) -> None:
        """Open position t for every row; real (B*K,): its new token is not <pad>."""
        B, K, t = self.slots.shape
        new_slots = torch.arange(K, device=self.slots.device).expand(B, K)
        self.slots = torch.cat([self.slots, new_slots[..., None]], dim=2)
        self.real = torch.cat([self.real, real.view(B, K, 1)], dim=2)
        if t == self.self_kv[0][0].size(2):  # full: twice the room
            self.self_kv = [(grown(k), grown(v)) for k, v in self.self_kv]
        self.length = t + 1

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store each row's keys and values (B*K, H, 1, Dh) of the newest position in its slot;
        the layer's keys and values so far, (B, H, t, K, Dh) each."""
        keys, values = self.self_kv[layer]
        keys[:, :, self.length - 1] = by_sentence(k, self.beams)
        values[:, :, self.length - 1] = by_sentence(v, self.beams)
        return keys[:, :, : self.length], values[:, :, : self.length]


def grown(buffer: torch.Tensor) -> torch.Tensor:
    """buffer (B, H, capacity, K, Dh) with twice the capacity, the old positions first."""
    B, H, capacity, K, Dh = buffer.shape
    out = buffer.new_empty(B, H, 2 * capacity, K, Dh)
    out[:, :, :capacity] = buffer
    return out


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, feed-forward; each post-norm,
    or pre-norm with norm_first (as in EncoderLayer)."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None):
        super().__init__()
        d_model, dropout = cfg.d_model, cfg.dropout
        self.norm_first = cfg.norm_first
        self.self_attn = MultiHeadAttention(d_model, cfg.nhead, dropout, rotary)
        self.cross_attn = MultiHeadAttention(d_model, cfg.nhead, dropout)
        self.ff = FeedForward(d_model, cfg.dim_feedforward, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (Dropout(dropout) for _ in range(3))

    def forward(self, x, memory_kv, tgt_mask, memory_mask, need_weights=False):
        """All positions at once: x (B, T, D); memory_kv: the memory's keys and values.
        Returns x and this layer's self- and cross-attention weights (None unless needed)."""
        a, w_self = self.self_attn(self.sublayer_input(x, self.norm1), tgt_mask, need_weights)
        x = self.residual(x, self.dropout1(a), self.norm1)
        q = self.cross_attn.project_query(self.sublayer_input(x, self.norm2))
        a, w_cross = self.cross_attn.attend(q, *memory_kv, memory_mask, need_weights)
        x = self.residual(x, self.dropout2(a), self.norm2)
        return self.feed_forward(x), (w_self, w_cross)

    def step(self, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        """The newest position of every row, x (B*K, 1, D), with the cache's earlier ones;
        stores its keys and values there. The K beams of a sentence are its K queries."""
        K, attn, newest = cache.beams, self.self_attn, cache.length - 1  # every row's position
        q, k, v = attn.project_self(self.sublayer_input(x, self.norm1), newest)  # (B*K,H,1,Dh)
        keys, values = cache.write(layer, k, v)
        y = beam_attention(by_sentence(q, K), keys, values, cache.slots, cache.real, attn.scale)
        x = self.residual(x, self.dropout1(by_row(attn.project_out(y))), self.norm1)
        q = self.cross_attn.project_query(self.sublayer_input(x, self.norm2))
        a, _ = self.cross_attn.attend(by_sentence(q, K), *cache.cross_kv[layer],
                                      cache.memory_bias)
        x = self.residual(x, self.dropout2(by_row(a)), self.norm2)
        return self.feed_forward(x)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        ff = self.ff(self.sublayer_input(x, self.norm3))
        return self.residual(x, self.dropout3(ff), self.norm3)

    def sublayer_input(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """What a sublayer reads: x, or norm(x) when pre-norm."""
        return norm(x) if self.norm_first else x

    def residual(self, x: torch.Tensor, update: torch.Tensor, norm: nn.LayerNorm):
        """x + update, normalized after the sum unless the sublayer's input was (pre-norm)."""
        return x + update if self.norm_first else norm(x + update)


class Decoder(nn.Module):
    """A stack of decoder layers and a final LayerNorm, as nn.TransformerDecoder has."""

    def __init__(self, cfg: ModelConfig, rotary: Rotary | None = None):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg, rotary)
                                    for _ in range(cfg.num_decoder_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x, memory, tgt_mask, memory_mask, need_weights=False):
        """All positions at once: x (B, T, D), memory (B, S, D), the biases tgt_mask
        (B, 1, T, T) and memory_mask (B, 1, 1, S) (nmt.models.masks). Returns (B, T, D) and
        per-layer self and cross weights."""
        self_w, cross_w = [], []
        for layer in self.layers:
            memory_kv = layer.cross_attn.project_memory(memory)
            x, (ws, wc) = layer(x, memory_kv, tgt_mask, memory_mask, need_weights=need_weights)
            self_w.append(ws)
            cross_w.append(wc)
        return self.norm(x), self_w, cross_w

    def init_cache(self, memory: torch.Tensor, memory_bias: torch.Tensor, beams: int) -> KVCache:
        """Project the memory's keys and values once for every layer; room for the target's
        keys and values of `beams` rows a sentence; empty prefix."""
        cross_kv = [[t.contiguous() for t in layer.cross_attn.project_memory(memory)]
                    for layer in self.layers]
        B, H, _, Dh = cross_kv[0][0].shape
        self_kv = [tuple(memory.new_empty(B, H, CAPACITY, beams, Dh) for _ in "kv")
                   for _ in self.layers]
        none = torch.zeros(B, beams, 0, dtype=torch.long, device=memory.device)
        return KVCache(memory_bias, cross_kv, self_kv, none, none.bool())

    def step(self, x: torch.Tensor, cache: KVCache, real: torch.Tensor) -> torch.Tensor:
        """Decode one new position of each row: x (B*K, 1, D), real (B*K,) True where its
        token is not <pad>; extends the cache. Returns (B*K, 1, D)."""
        # The newest position may attend every earlier one: no causal mask is needed.
        cache.advance(real)
        for i, layer in enumerate(self.layers):
            x = layer.step(x, cache, i)
        return self.norm(x)
