"""The baseline: torch.nn.Transformer wrapped as the PyTorch translation tutorial does."""

import contextlib
import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn

from nmt.models.beams import sentence_rows
from nmt.models.config import ModelConfig
from nmt.models.masks import bias


@contextlib.contextmanager
def plain_path():
    """nn.Transformer without its eval fast path (fused kernels, nested tensors), so that its
    attention modules are really called and padded positions keep their values."""
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def plain_under_autocast(device: torch.device):
    """plain_path() while autocast is on for `device`, else nothing. torch's encoder fast path
    steps aside only for CUDA's autocast (torch.is_autocast_enabled() asks about CUDA): under
    the CPU's bf16 autocast it ran its fused kernel on bf16 inputs with fp32 weights and
    failed ("expected scalar type Float but found BFloat16")."""
    on = torch.is_autocast_enabled(torch.device(device).type)
    return plain_path() if on else contextlib.nullcontext()


class TokenEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d_model)."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.d_model = d_model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens) * math.sqrt(self.d_model)  # (B, T, D)


class PositionalEncoding(nn.Module):
    """Sinusoidal positions added to the embeddings, then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int):
        super().__init__()
        den = torch.exp(-torch.arange(0, d_model, 2, dtype=torch.float64)
                        * math.log(10000) / d_model)
        pos = torch.arange(max_len, dtype=torch.float64).reshape(max_len, 1)
        table = torch.zeros(max_len, d_model, dtype=torch.float64)
        table[:, 0::2] = torch.sin(pos * den)
        table[:, 1::2] = torch.cos(pos * den)
        self.register_buffer("pos_embedding", table.float(), persistent=False)  # (L, D)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.size(1) > self.pos_embedding.size(0):
            raise ValueError(f"sequence of {x.size(1)} positions exceeds "
                             f"max_len={self.pos_embedding.size(0)}; raise model.max_len")
        return self.dropout(x + self.pos_embedding[: x.size(1)])


@dataclass
class PrefixCache:
    """Decoding state of the baseline: the prefix so far, re-run through the decoder each step."""

    tokens: torch.Tensor  # (B, t)
    memory: torch.Tensor  # (B, S, D)
    src: torch.Tensor  # (B, S), for the memory padding mask
    beams: int = 1  # rows a sentence: row b * beams + i holds beam i of sentence b

    def reorder(self, index: torch.Tensor) -> "PrefixCache":
        """Row r continues the prefix in row index[r], a row of its own sentence (beam search's
        surviving hypotheses; rows may repeat): the source side stays as it is."""
        self.tokens = self.tokens.index_select(0, index)
        return self

    def keep(self, sentences: torch.Tensor) -> "PrefixCache":
        """Only these sentences (indices, ascending) go on decoding, with all their beams."""
        rows = sentence_rows(sentences, self.beams)
        self.tokens, self.memory, self.src = (t.index_select(0, rows) for t in
                                              (self.tokens, self.memory, self.src))
        return self


class BaselineTransformer(nn.Module):
    """Embeddings, positions, nn.Transformer(batch_first=True) and a generator."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int = 1):
        super().__init__()
        if cfg.positions != "sinusoidal":
            raise ValueError(f"the baseline (torch.nn.Transformer) has sinusoidal positions only, "
                             f"not model.positions {cfg.positions!r} (fix: train scratch, or "
                             "positions: sinusoidal)")
        d_model, dropout = cfg.d_model, cfg.dropout
        self.pad_id = pad_id
        with warnings.catch_warnings():  # pre-norm: "nested tensors are not used", as wanted
            warnings.filterwarnings("ignore", "enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                d_model=d_model, nhead=cfg.nhead, num_encoder_layers=cfg.num_encoder_layers,
                num_decoder_layers=cfg.num_decoder_layers, dim_feedforward=cfg.dim_feedforward,
                dropout=dropout, batch_first=True, norm_first=cfg.norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, d_model)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, dropout, cfg.max_len)
        if cfg.tie_embeddings:  # one matrix for source, target and output tokens
            self.tgt_tok_emb.embedding.weight = self.src_tok_emb.embedding.weight
            self.generator.weight = self.src_tok_emb.embedding.weight
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed_src(self, src: torch.Tensor) -> torch.Tensor:
        return self.positional_encoding(self.src_tok_emb(src))  # (B, S, D)

    def embed_tgt(self, tgt: torch.Tensor) -> torch.Tensor:
        return self.positional_encoding(self.tgt_tok_emb(tgt))  # (B, T, D)

    @staticmethod
    def causal_mask(size: int, device) -> torch.Tensor:
        """(T, T) bool, True above the diagonal: the future positions a query may not see.

        nn.Transformer takes its masks as bool (True: masked) and turns each into an additive
        bias again in every attention it reaches: 19 times a forward at 6+6 layers, two kernels
        each. In training, forward hands it the biases (nmt.models.masks), built once; in
        evaluation the bool masks, which its fast path (a masked softmax) needs."""
        return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        x, y = self.embed_src(src), self.embed_tgt(tgt_in)
        src_pad, tgt_pad = src == self.pad_id, tgt_in == self.pad_id  # True at padding
        causal = self.causal_mask(tgt_in.size(1), tgt_in.device)
        if self.training:  # each mask as its bias, once, not converted again in every layer
            src_pad, tgt_pad, causal = (bias(~mask, x) for mask in (src_pad, tgt_pad, causal))
        with plain_under_autocast(src.device):
            out = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                                   tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                                   tgt_is_causal=True)
        return self.generator(out)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, S) -> memory (B, S, D)."""
        with plain_under_autocast(src.device):
            return self.transformer.encoder(self.embed_src(src),
                                            src_key_padding_mask=src == self.pad_id)

    def decoder_output(self, tgt_in, memory, src) -> torch.Tensor:
        """Final decoder states (B, T, D)."""
        return self.transformer.decoder(
            self.embed_tgt(tgt_in), memory,
            tgt_mask=self.causal_mask(tgt_in.size(1), tgt_in.device),
            tgt_key_padding_mask=tgt_in == self.pad_id,
            memory_key_padding_mask=src == self.pad_id, tgt_is_causal=True)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor):
        """Logits (B, T, V) of every next token; src only masks the memory's padding."""
        return self.generator(self.decoder_output(tgt_in, memory, src))

    def init_cache(self, memory: torch.Tensor, src: torch.Tensor, beams: int = 1) -> PrefixCache:
        """An empty prefix for each of `beams` rows a sentence (row b * beams + i: beam i of b)."""
        memory, src = memory.repeat_interleave(beams, 0), src.repeat_interleave(beams, 0)
        return PrefixCache(src.new_empty(src.size(0), 0), memory, src, beams)

    def decode_step(self, cache: PrefixCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (B,) at the next position; logits (B, V) of the token after them."""
        cache.tokens = torch.cat([cache.tokens, tokens[:, None]], dim=1)  # (B, t)
        # nn.Transformer has no cache: the whole prefix goes through the decoder again.
        h = self.decoder_output(cache.tokens, cache.memory, cache.src)
        return self.generator(h[:, -1])

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict:
        """Per-head weights of every layer, lists of (B, H, T_query, T_key), as each
        nn.MultiheadAttention returns them (need_weights=True, average_attn_weights=False)
        when called again on the inputs it saw in a forward pass."""
        calls = {}

        def save(module, args, kwargs, out):
            calls[module] = (args, kwargs)

        hooks = [m.register_forward_hook(save, with_kwargs=True)
                 for m in self.modules() if isinstance(m, nn.MultiheadAttention)]
        try:
            with torch.no_grad(), plain_path():
                self(src, tgt_in)
        finally:
            for h in hooks:
                h.remove()

        def weights(m):
            args, kwargs = calls[m]
            return m(*args, **{**kwargs, "need_weights": True, "average_attn_weights": False})[1]

        enc, dec = self.transformer.encoder.layers, self.transformer.decoder.layers
        with torch.no_grad(), plain_path():
            return {"encoder_self": [weights(layer.self_attn) for layer in enc],
                    "decoder_self": [weights(layer.self_attn) for layer in dec],
                    "decoder_cross": [weights(layer.multihead_attn) for layer in dec]}
