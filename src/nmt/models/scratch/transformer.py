"""The full encoder-decoder model of Figure 1, built from the blocks of this package."""

import torch
import torch.nn as nn

from nmt.models.config import ModelConfig
from nmt.models.masks import bias
from nmt.models.scratch.attention import MultiHeadAttention
from nmt.models.scratch.decoder import Decoder, KVCache
from nmt.models.scratch.embedding import Embeddings, PositionalEncoding
from nmt.models.scratch.encoder import Encoder
from nmt.models.scratch.rotary import Rotary


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, 1, 1, S): True at real tokens, the keys every query may attend."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(size: int, device) -> torch.Tensor:
    """(T, T): True where query i may attend key j, that is j <= i."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


class ScratchTransformer(nn.Module):
    """Post-norm Transformer, the same architecture as torch.nn.Transformer, written by hand;
    with cfg.positions "rotary", positions rotate self-attention's queries and keys instead of
    adding sinusoids to the embeddings (an architecture nn.Transformer cannot express)."""

    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int = 1):
        super().__init__()
        d_model = cfg.d_model
        self.pad_id = pad_id
        self.src_embed = Embeddings(src_vocab_size, d_model)
        self.tgt_embed = Embeddings(tgt_vocab_size, d_model)
        self.pos = PositionalEncoding(cfg)
        rotary = Rotary(d_model // cfg.nhead, cfg.max_len) if cfg.positions == "rotary" else None
        self.encoder, self.decoder = Encoder(cfg, rotary), Decoder(cfg, rotary)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if cfg.tie_embeddings:  # one matrix for source, target and output tokens
            self.tgt_embed.token.weight = self.src_embed.token.weight
            self.generator.weight = self.src_embed.token.weight
        # As the PyTorch translation tutorial: Xavier-uniform for every matrix.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed_src(self, src: torch.Tensor) -> torch.Tensor:
        return self.pos(self.src_embed(src))  # (B, S, D)

    def embed_tgt(self, tgt: torch.Tensor) -> torch.Tensor:
        return self.pos(self.tgt_embed(tgt))  # (B, T, D)

    def tgt_mask(self, tgt_in: torch.Tensor) -> torch.Tensor:
        """(B, 1, T, T): earlier or same positions that are not padding."""
        return padding_mask(tgt_in, self.pad_id) & causal_mask(tgt_in.size(1), tgt_in.device)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """src (B, S) -> memory (B, S, D)."""
        memory, _, _ = self.encoded(src)
        return memory

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src: torch.Tensor):
        """Logits (B, T, V) of every next token; src only masks the memory's padding."""
        x, _, _ = self.decoded(tgt_in, memory, bias(padding_mask(src, self.pad_id), memory))
        return self.generator(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_bias, _ = self.encoded(src)
        x, _, _ = self.decoded(tgt_in, memory, src_bias)
        return self.generator(x)

    def encoded(self, src: torch.Tensor, need_weights: bool = False):
        """Memory (B, S, D); the source's padding as the bias (B, 1, 1, S) that the encoder's
        and the decoder's attention over it add (nmt.models.masks: built once, for every
        layer); the encoder's weights (None unless needed)."""
        x = self.embed_src(src)
        src_bias = bias(padding_mask(src, self.pad_id), x)
        memory, weights = self.encoder(x, src_bias, need_weights=need_weights)
        return memory, src_bias, weights

    def decoded(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_bias: torch.Tensor,
                need_weights: bool = False):
        """Final decoder states (B, T, D), and the self- and cross-attention weights of every
        layer (None unless needed)."""
        x = self.embed_tgt(tgt_in)
        return self.decoder(x, memory, bias(self.tgt_mask(tgt_in), x), src_bias,
                            need_weights=need_weights)

    def init_cache(self, memory: torch.Tensor, src: torch.Tensor, beams: int = 1) -> KVCache:
        """Start incremental decoding of `beams` rows a sentence (row b * beams + i: beam i of
        sentence b); the cross-attention keys and values are projected once, for the sentence."""
        return self.decoder.init_cache(memory, bias(padding_mask(src, self.pad_id), memory),
                                       beams)

    def decode_step(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """Feed tokens (B*K,) at the next position; logits (B*K, V) of the token after them."""
        x = self.pos(self.tgt_embed(tokens[:, None]), offset=cache.length)  # (B*K, 1, D)
        return self.generator(self.decoder.step(x, cache, tokens != self.pad_id)[:, 0])

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict:
        """Per-head weights of every layer, lists of (B, H, T_query, T_key), from the math path."""
        memory, src_bias, enc = self.encoded(src, need_weights=True)
        _, dec_self, dec_cross = self.decoded(tgt_in, memory, src_bias, need_weights=True)
        return {"encoder_self": enc, "decoder_self": dec_self, "decoder_cross": dec_cross}

    def set_fused_attention(self, enabled: bool) -> None:
        """Use F.scaled_dot_product_attention (True) or the explicit math path (False)."""
        for m in self.modules():
            if isinstance(m, MultiHeadAttention):
                m.fused = enabled
