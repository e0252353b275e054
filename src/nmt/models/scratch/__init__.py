"""The Transformer written from scratch: one module per block of the paper's Figure 1."""

from nmt.models.scratch.attention import MultiHeadAttention, scaled_dot_product_attention
from nmt.models.scratch.decoder import Decoder, DecoderLayer, KVCache
from nmt.models.scratch.dropout import Dropout
from nmt.models.scratch.embedding import Embeddings, PositionalEncoding, sinusoids
from nmt.models.scratch.encoder import Encoder, EncoderLayer
from nmt.models.scratch.feed_forward import FeedForward
from nmt.models.scratch.transformer import ScratchTransformer, causal_mask, padding_mask

__all__ = [
    "Decoder", "DecoderLayer", "Dropout", "Embeddings", "Encoder", "EncoderLayer", "FeedForward",
    "KVCache", "MultiHeadAttention", "PositionalEncoding", "ScratchTransformer",
    "causal_mask", "padding_mask", "scaled_dot_product_attention", "sinusoids",
]
