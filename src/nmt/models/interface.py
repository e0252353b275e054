"""The model interface: what the pipeline asks of every model it trains, written once.

A model is an nn.Module that its registry entry (nmt.models.registry) names as "module:Class",
built as `Class(cfg, src_vocab_size, tgt_vocab_size, pad_id=...)` (and `bos_id=...` where the
entry says `reads_bos`). Its constructor refuses a configuration it cannot build with a
ValueError that names the setting and the fix: a `model.positions` outside the entry's
`positions` with the word "positions" in it (params validation and verify read that refusal).

Every model is a `TranslationModel`: training calls forward, decoding (nmt.core.decoding:
greedy and beam search, evaluate, export's check, bench) the rest. What no signature shows,
and tests/test_models.py holds every registered model to:
- forward(src, tgt_in): src (B, S) and tgt_in (B, T, starting with <bos>) of token ids,
  <pad> where a row is shorter -> logits (B, T, V) for the token after each target position;
  padding changes no other position's logits;
- encode(src) -> memory, whatever init_cache takes (an encoder-decoder's encoder output
  (B, S, d_model); the decoder-only model's keys and values of the source prefix);
- init_cache(memory, src, beams=1) -> a DecoderCache of B * beams rows, row b * beams + i
  beam i of sentence b;
- decode_step(cache, tokens (B,)) -> logits (B, V) of the token after the position fed, the
  same as forward's there (verify: cached = full decoding), the cache moved on one position;
- attention_maps(src, tgt_in) -> {"decoder_cross": one (B, heads, T, S) map a decoder
  layer, target queries over source keys, ...}: evaluate draws the last layer's,
  unknown-word replacement averages its heads (an encoder-decoder's rows sum to 1; the
  decoder-only model's are the source block of attention that also sees the target).
An `EncoderDecoder` (the entry's `encoder_decoder`) also has decode(tgt_in, memory, src),
forward's logits through the memory; nmt export converts only these. A model with property
checks (the entry's `checks`: nmt.stages.verify) is also `FusedSwitchable`: verify compares its
fused attention with the math path (a model without a fused path: a method that does nothing).

The protocols check names only (runtime_checkable); the tests check the rules above. This
module imports nothing of the pipeline and no model: a new model needs no edit here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the registry's light readers import no torch
    import torch


@runtime_checkable
class DecoderCache(Protocol):
    """A model's decoding state between steps, batch first: row r one hypothesis."""

    def reorder(self, index: torch.Tensor) -> Any:
        """Row r goes on from row index[r] (beam search's survivors; rows may repeat)."""

    def keep(self, sentences: torch.Tensor) -> Any:
        """Only these sentences (indices, ascending) go on decoding, all their beams."""


@runtime_checkable
class TranslationModel(Protocol):
    """What training and decoding call (the rules in the module docstring)."""

    def __call__(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor: ...

    def encode(self, src: torch.Tensor) -> Any: ...

    def init_cache(self, memory: Any, src: torch.Tensor, beams: int = 1) -> DecoderCache: ...

    def decode_step(self, cache: DecoderCache, tokens: torch.Tensor) -> torch.Tensor: ...

    def attention_maps(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict: ...


@runtime_checkable
class EncoderDecoder(TranslationModel, Protocol):
    """A TranslationModel with an encoder and a decoder: decode runs the decoder alone."""

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               src: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class FusedSwitchable(Protocol):
    """A model whose attention verify compares fused against math."""

    def set_fused_attention(self, enabled: bool) -> None: ...
