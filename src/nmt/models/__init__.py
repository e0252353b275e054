"""The models behind one interface: build_model(name, cfg, src_vocab_size, tgt_vocab_size).

Two encoder-decoders (baseline: torch.nn.Transformer; scratch: the same written by hand) and a
decoder-only translator (decoder_only: one stack over <bos> source <eos> <sep> target).

Every model takes src (B, S) and tgt_in (B, T) token ids and derives its masks from pad_id:
forward -> logits (B, T, V); encode(src) -> memory (what the model's cache starts from);
init_cache(memory, src) and decode_step(cache, tokens (B,)) -> logits (B, V) for search, with
cache.reorder(index) for beam search; attention_maps(src, tgt_in) -> per-head weights of every
layer, with at least "decoder_cross": (B, H, T, S) per layer, target queries over the source.
"""

import torch.nn as nn

from nmt.config import MODEL_NAMES, ModelConfig
from nmt.models.baseline import BaselineTransformer
from nmt.models.decoder_only import DecoderOnlyTransformer
from nmt.models.scratch import ScratchTransformer

MODELS = {"baseline": BaselineTransformer, "scratch": ScratchTransformer,
          "decoder_only": DecoderOnlyTransformer}
assert tuple(MODELS) == MODEL_NAMES  # the torch-free list the CLI and schema offer


def build_model(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                pad_id: int = 1) -> nn.Module:
    """A freshly initialised model of the given name."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    if cfg.tie_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"tie_embeddings needs one shared vocabulary, got source "
                         f"{src_vocab_size} and target {tgt_vocab_size}")
    return MODELS[name](cfg, src_vocab_size, tgt_vocab_size, pad_id=pad_id)


__all__ = ["MODELS", "MODEL_NAMES", "BaselineTransformer", "DecoderOnlyTransformer", "ModelConfig",
           "ScratchTransformer", "build_model"]
