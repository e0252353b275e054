"""The models behind one interface: build_model(name, cfg, src_vocab_size, tgt_vocab_size).

Two encoder-decoders (baseline: torch.nn.Transformer; scratch: the same written by hand) and a
decoder-only translator (decoder_only: one stack over <bos> source <eos> <sep> target).

Every model takes src (B, S) and tgt_in (B, T) token ids and derives its masks from pad_id:
forward -> logits (B, T, V); encode(src) -> memory (what the model's cache starts from);
init_cache(memory, src, beams=K) (B*K rows, row b*K + i: beam i of sentence b) and
decode_step(cache, tokens (B*K,)) -> logits (B*K, V) for search, with cache.reorder(index) for
beam search (row r continues row index[r], one of its own sentence's K) and
cache.keep(sentences) (the others are finished); attention_maps(src, tgt_in) -> per-head
weights of every layer, with at least "decoder_cross": (B, H, T, S) per layer, target queries
over the source.

The package stands alone: it imports torch and nothing of the pipeline, so a notebook can
    from nmt.models import ModelConfig, build_model
    model = build_model("scratch", ModelConfig(d_model=256, nhead=4), 8000, 6000)
"""

import torch.nn as nn

from nmt.models.baseline import BaselineTransformer
from nmt.models.config import ModelConfig
from nmt.models.decoder_only import DecoderOnlyTransformer
from nmt.models.scratch import ScratchTransformer

MODELS = {"baseline": BaselineTransformer, "scratch": ScratchTransformer,
          "decoder_only": DecoderOnlyTransformer}
# The special token ids the pipeline's vocabularies use (<unk> <pad> <bos> <eos> = 0..3);
# pass others to build_model for other vocabularies.
PAD_ID, BOS_ID = 1, 2


def build_model(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                pad_id: int = PAD_ID, bos_id: int = BOS_ID) -> nn.Module:
    """A freshly initialised model of the given name. pad_id marks padding in src and tgt;
    bos_id starts every target (the decoder-only model reads it as its source/target break)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if cfg.tie_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"tie_embeddings needs one shared vocabulary, got source "
                         f"{src_vocab_size} and target {tgt_vocab_size}")
    ids = {"pad_id": pad_id, "bos_id": bos_id} if name == "decoder_only" else {"pad_id": pad_id}
    return MODELS[name](cfg, src_vocab_size, tgt_vocab_size, **ids)


__all__ = ["BOS_ID", "MODELS", "PAD_ID", "BaselineTransformer", "DecoderOnlyTransformer",
           "ModelConfig", "ScratchTransformer", "build_model"]
