"""The decoder-only (GPT-style) translator: one file per block, as in the scratch package."""

from nmt.models.decoder_only.attention import SelfAttention
from nmt.models.decoder_only.block import Block, Stack
from nmt.models.decoder_only.embedding import JointEmbedding, Positions
from nmt.models.decoder_only.feed_forward import FeedForward
from nmt.models.decoder_only.layer_norm import LayerNorm
from nmt.models.decoder_only.model import (
    DecoderOnlyTransformer,
    KVCache,
    Prefix,
    packed_mask,
    positions,
)
from nmt.models.decoder_only.size import (
    block_param_count,
    decoder_only_layers,
    decoder_only_param_count,
    encoder_decoder_param_count,
)

__all__ = [
    "Block", "DecoderOnlyTransformer", "FeedForward", "JointEmbedding", "KVCache", "LayerNorm",
    "Positions", "Prefix", "SelfAttention", "Stack", "block_param_count",
    "decoder_only_layers", "decoder_only_param_count", "encoder_decoder_param_count",
    "packed_mask", "positions",
]
