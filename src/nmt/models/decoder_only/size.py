"""Parameter counts in closed form, and the layer count that matches the encoder-decoder.

With cfg.decoder_only_layers = 0 the decoder-only stack gets as many blocks as bring its
parameter count nearest to that of the encoder-decoder (scratch, baseline) of the same cfg.
"""

from nmt.models.config import ModelConfig


def block_param_count(cfg: ModelConfig) -> int:
    """One block: Q/K/V and output projections, the feed-forward net, two LayerNorms."""
    d, f = cfg.d_model, cfg.dim_feedforward
    return (4 * d * d + 4 * d) + (2 * d * f + f + d) + 2 * (2 * d)


def table_rows(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """Rows of the one token table: [source | target | <sep>], or [shared | <sep>] when tied."""
    return (0 if cfg.tie_embeddings else src_vocab_size) + tgt_vocab_size + 1


def decoder_only_param_count(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                             num_layers: int | None = None) -> int:
    """Token table (the LM head reads it: no weights of its own), blocks, final LayerNorm."""
    if num_layers is None:
        num_layers = decoder_only_layers(cfg, src_vocab_size, tgt_vocab_size)
    d = cfg.d_model
    return (table_rows(cfg, src_vocab_size, tgt_vocab_size) * d
            + num_layers * block_param_count(cfg) + 2 * d)


def encoder_decoder_param_count(cfg: ModelConfig, src_vocab_size: int,
                                tgt_vocab_size: int) -> int:
    """The scratch (= baseline) model: embeddings, generator, layers, two final LayerNorms."""
    d = cfg.d_model
    encoder_layer = block_param_count(cfg)  # self-attention, feed-forward, two norms
    decoder_layer = encoder_layer + (4 * d * d + 4 * d) + 2 * d  # + cross-attention, norm3
    matrices = 1 if cfg.tie_embeddings else 3  # source, target embedding; generator weight
    vocab = src_vocab_size * d + (matrices - 1) * tgt_vocab_size * d + tgt_vocab_size
    return (vocab + cfg.num_encoder_layers * encoder_layer
            + cfg.num_decoder_layers * decoder_layer + 2 * (2 * d))


def decoder_only_layers(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """cfg.decoder_only_layers if set, else the count nearest the encoder-decoder's size."""
    if cfg.decoder_only_layers > 0:
        return cfg.decoder_only_layers
    budget = (encoder_decoder_param_count(cfg, src_vocab_size, tgt_vocab_size)
              - decoder_only_param_count(cfg, src_vocab_size, tgt_vocab_size, num_layers=0))
    return max(1, round(budget / block_param_count(cfg)))
