"""The models behind one interface: build_model(name, cfg, src_vocab_size, tgt_vocab_size).

Two encoder-decoders (baseline: torch.nn.Transformer; scratch: the same written by hand) and a
decoder-only translator (decoder_only: one stack over <bos> source <eos> <sep> target), each
an entry of the registry (registry.py: its class, and what the pipeline asks of it).

Every model keeps one interface, written down once in interface.py: what training and
decoding call (forward, encode, init_cache / decode_step with the cache's reorder and keep,
attention_maps; decode for an encoder-decoder), as protocols, and the rules no signature
shows (tests/test_models.py holds every registered model to them).

The package stands alone: it imports torch and nothing of the pipeline, so a notebook can
    from nmt.models import ModelConfig, build_model
    model = build_model("scratch", ModelConfig(d_model=256, nhead=4), 8000, 6000)
Importing it imports no torch: a model's module is imported when a model of it is built
(its class: nmt.models.<model>, or registry.entry(name).model_class()).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nmt.models.config import ModelConfig
from nmt.models.registry import MODELS, entry

if TYPE_CHECKING:
    import torch.nn as nn

# The special token ids the pipeline's vocabularies use (<unk> <pad> <bos> <eos> = 0..3);
# pass others to build_model for other vocabularies.
PAD_ID, BOS_ID = 1, 2


def build_model(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                pad_id: int = PAD_ID, bos_id: int = BOS_ID) -> nn.Module:
    """A freshly initialised model of the given name. pad_id marks padding in src and tgt;
    bos_id starts every target (a model that reads it, the decoder-only one, takes it as its
    source/target break)."""
    model = entry(name)
    if cfg.tie_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(f"tie_embeddings needs one shared vocabulary, got source "
                         f"{src_vocab_size} and target {tgt_vocab_size}")
    ids = {"pad_id": pad_id, "bos_id": bos_id} if model.reads_bos else {"pad_id": pad_id}
    return model.model_class()(cfg, src_vocab_size, tgt_vocab_size, **ids)


__all__ = ["BOS_ID", "MODELS", "PAD_ID", "ModelConfig", "build_model"]
