"""The decoder-only translator: one pre-norm stack over [<bos> source <eos> | <sep> target].

Layout. A batch's source rows (B, S) and target rows (B, T) are concatenated as they come,
right padding and all: [source (S) | target (T)], so source padding sits in the middle. Each
token gets its own position (a source token its index, a target token the row's real source
length plus its index) and padded keys are masked, so padding moves and changes nothing.
The target's first token, <bos>, is fed as <sep>: its output predicts the first target word.

Attention over the source: "prefix" (the default) lets source tokens see one another both
ways; "causal" only backwards. Target tokens see the whole source and earlier target tokens.
forward returns logits at the target positions only, so the loss covers target tokens only.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt.models.beams import sentence_rows
from nmt.models.config import ModelConfig
from nmt.models.decoder_only.block import Stack
from nmt.models.decoder_only.embedding import JointEmbedding, Positions
from nmt.models.decoder_only.size import decoder_only_layers
from nmt.models.masks import bias


def packed_mask(src: torch.Tensor, tgt: torch.Tensor, pad_id: int, prefix: bool):
    """(B, 1, S+T, S+T): True where a query of [source | target] may attend a key."""
    S, n = src.size(1), src.size(1) + tgt.size(1)
    allowed = torch.ones(n, n, dtype=torch.bool, device=src.device).tril()  # causal
    if prefix:
        allowed[:S, :S] = True  # the source block both ways
    real = torch.cat([src != pad_id, tgt != pad_id], dim=1)  # (B, S+T)
    return allowed & real[:, None, None, :]


def positions(src: torch.Tensor, tgt: torch.Tensor, pad_id: int):
    """Position ids (B, S) and (B, T): the target goes on from each row's real source length."""
    B, S, T = src.size(0), src.size(1), tgt.size(1)
    src_len = (src != pad_id).sum(dim=1, keepdim=True)  # (B, 1)
    src_pos = torch.arange(S, device=src.device).expand(B, S)
    return src_pos, src_len + torch.arange(T, device=src.device)


@dataclass
class Prefix:
    """What encode returns: the source's keys and values in every layer."""

    kv: list  # per layer: keys, values (B, H, S, Dh)
    mask: torch.Tensor  # (B, 1, 1, S) True at real source tokens
    lengths: torch.Tensor  # (B,) real source tokens: the position of <sep>


@dataclass
class KVCache:
    """Decoding state kept between steps; every tensor has the batch first."""

    kv: list  # per layer: keys, values of source and target so far (B, H, S + t, Dh)
    mask: torch.Tensor  # (B, 1, 1, S + t) True at keys that are not padding
    lengths: torch.Tensor  # (B,) real source tokens
    beams: int = 1  # rows a sentence: row b * beams + i holds beam i of sentence b
    length: int = 0  # t, target positions decoded so far

    def reorder(self, index: torch.Tensor) -> "KVCache":
        """Row r continues the row index[r]: beam search's surviving hypotheses (rows may
        repeat). Every tensor moves, since the source's keys and values share the target's
        here, so index may also name other sentences' rows (verify's cache check does)."""
        def pick(t):
            return t.index_select(0, index)

        self.kv = [(pick(k), pick(v)) for k, v in self.kv]
        self.mask, self.lengths = pick(self.mask), pick(self.lengths)
        return self

    def keep(self, sentences: torch.Tensor) -> "KVCache":
        """Only these sentences (indices, ascending) go on decoding, with all their beams."""
        return self.reorder(sentence_rows(sentences, self.beams))


class DecoderOnlyTransformer(nn.Module):
    """GPT-style decoder: joint token table, sinusoidal positions, pre-norm stack, tied head."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int = 1, bos_id: int = 2):
        super().__init__()
        if cfg.positions != "sinusoidal":
            raise ValueError(f"decoder_only has sinusoidal positions only, not model.positions "
                             f"{cfg.positions!r} (fix: train scratch, or positions: sinusoidal)")
        self.pad_id, self.max_len = pad_id, cfg.max_len
        self.prefix = cfg.attention == "prefix"
        self.num_layers = decoder_only_layers(cfg, src_vocab_size, tgt_vocab_size)
        self.embed = JointEmbedding(cfg, src_vocab_size, tgt_vocab_size, bos_id)
        # Source and target each up to max_len tokens: positions 0 .. 2 * max_len - 1.
        self.pos = Positions(cfg.d_model, cfg.dropout, 2 * cfg.max_len)
        self.stack = Stack(self.num_layers, cfg.d_model, cfg.nhead, cfg.dim_feedforward,
                           cfg.dropout)
        for p in self.parameters():  # Xavier-uniform for every matrix
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def check_length(self, n: int, side: str) -> None:
        if n > self.max_len:
            raise ValueError(f"{side} of {n} positions exceeds max_len={self.max_len}; "
                             "raise model.max_len")

    def embed_packed(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Token and position embeddings of [source | target]: (B, S+T, D)."""
        self.check_length(src.size(1), "source")
        self.check_length(tgt_in.size(1), "target")
        rows = torch.cat([self.embed.source_rows(src), self.embed.target_rows(tgt_in)], dim=1)
        return self.pos(self.embed(rows), torch.cat(positions(src, tgt_in, self.pad_id), dim=1))

    def states(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Final states of [source | target] (B, S+T, D), per-layer keys/values and weights."""
        mask = packed_mask(src, tgt_in, self.pad_id, self.prefix)  # (B, 1, S+T, S+T)
        x = self.embed_packed(src, tgt_in)
        return self.stack(x, bias(mask, x), need_weights=need_weights)  # one bias, every layer

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """LM head tied to the target rows of the token table: (..., D) -> (..., Vt)."""
        return F.linear(x, self.embed.head_weight())

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) starting with <bos> -> logits (B, T, Vt)."""
        x, _, _ = self.states(src, tgt_in)
        return self.head(x[:, src.size(1):])

    def encode(self, src: torch.Tensor) -> Prefix:
        """Run the source alone through the stack; keep its keys and values."""
        _, kv, _ = self.states(src, src[:, :0])
        real = src != self.pad_id
        return Prefix(kv, real[:, None, None, :], real.sum(dim=1))

    def init_cache(self, memory: Prefix, src: torch.Tensor, beams: int = 1) -> KVCache:
        """Start incremental decoding after the source (src is already in memory), for `beams`
        rows a sentence (row b * beams + i: beam i of sentence b)."""
        def rows(t):
            return t.repeat_interleave(beams, 0)

        return KVCache([(rows(k), rows(v)) for k, v in memory.kv], rows(memory.mask),
                       rows(memory.lengths), beams)

    def decode_step(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (B,) at the next target position; logits (B, Vt) of the token after."""
        self.check_length(cache.length + 1, "target")
        pos = (cache.lengths + cache.length)[:, None]  # (B, 1)
        x = self.pos(self.embed(self.embed.target_rows(tokens[:, None])), pos)  # (B, 1, D)
        # The newest position may attend every earlier one: only padding is masked.
        keep = (tokens != self.pad_id)[:, None, None, None]  # (B, 1, 1, 1)
        cache.mask = torch.cat([cache.mask, keep], dim=-1)
        x, cache.kv, _ = self.stack(x, bias(cache.mask, x), past_kv=cache.kv)
        cache.length += 1
        return self.head(x[:, 0])

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict:
        """Per-head weights of every layer from the math path: "self" over [source | target]
        (B, H, S+T, S+T) and its block "decoder_cross" (B, H, T, S), target queries over
        source keys (what evaluate draws)."""
        _, _, weights = self.states(src, tgt_in, need_weights=True)
        S = src.size(1)
        return {"self": weights, "decoder_cross": [w[:, :, S:, :S] for w in weights]}

    def set_fused_attention(self, enabled: bool) -> None:
        """Use F.scaled_dot_product_attention (True) or the explicit math path (False)."""
        self.stack.set_fused(enabled)
