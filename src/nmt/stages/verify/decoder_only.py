"""The decoder-only model's checklist: it has no PyTorch twin, so its properties are checked.

Every model's properties (properties.py: parameter count, output shapes, causality, the source
reaching the target, cached decoding with beam reordering, padding, fused = math, gradients)
and this model's own: its LayerNorm equals nn.LayerNorm, and attention over the source is
prefix (both ways) or causal as configured. Each check is named "decoder_only: <property>".
"""

import copy

import torch
import torch.nn.functional as F

from nmt.models import ModelConfig, registry
from nmt.models.decoder_only.layer_norm import LayerNorm
from nmt.models.decoder_only.size import decoder_only_layers
from nmt.stages.verify.checklist import Checklist
from nmt.stages.verify.measure import max_abs_diff
from nmt.stages.verify.properties import (
    CAUSALITY_TOLERANCE,
    REACHED,
    last_word_changed,
    property_checks,
)

LAYER_NORM_TOLERANCE = 1e-12


def sizes(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict:
    """Its layers and parameters at cfg's size, and the encoder-decoder's (the reference's)
    parameters, which its layer count matches."""
    vocab = (src_vocab_size, tgt_vocab_size)
    return {"layers": decoder_only_layers(cfg, *vocab),
            "parameters": registry.entry("decoder_only").parameters(cfg, *vocab),
            "encoder_decoder_parameters": registry.entry(registry.REFERENCE).parameters(
                cfg, *vocab)}


def layer_norm_diff(model, src, tgt_in) -> float:
    """The model's LayerNorm, random weight and bias, against F.layer_norm on real inputs."""
    norm = copy.deepcopy(next(m for m in model.modules() if isinstance(m, LayerNorm)))
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
        x = model.embed_packed(src, tgt_in)  # (B, S+T, D)
        x = torch.cat([x, 10 * x + 3])  # also off-centre and wide
        want = F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, eps=1e-5)
        return max_abs_diff(norm(x), want)


def source_change(model, src, tgt_in, pad_id: int):
    """Change each row's last source word: (|change| of the source states (B, S), max over
    features; real earlier source positions (B, S))."""
    S = src.size(1)
    changed, last = last_word_changed(src, pad_id)
    with torch.no_grad():  # final states of [source | target]
        (before, _, _), (after, _, _) = model.states(src, tgt_in), model.states(changed, tgt_in)
        state_change = (after[:, :S] - before[:, :S]).abs().amax(-1)
    earlier = torch.arange(S)[None, :] < last[:, None]  # (B, S), all real tokens
    return state_change, earlier


def prefix_unreached(model, src, tgt_in, pad_id: int) -> float:
    """prefix: how many earlier source positions a change of a later source word leaves."""
    state_change, earlier = source_change(model, src, tgt_in, pad_id)
    return float(((state_change <= REACHED) & earlier).sum())


def causal_source_diff(model, src, tgt_in, pad_id: int) -> float:
    """causal: the largest change of an earlier source position's state."""
    state_change, earlier = source_change(model, src, tgt_in, pad_id)
    return state_change.masked_select(earlier).max().item() if earlier.any() else 0.0


def checks(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
           pad_id: int, batches: list, seed: int = 0) -> list[dict]:
    """The decoder-only model's (`name`'s) property checks on a real padded batch, rows as
    run_checks's: every model's (properties.py) and its own."""

    def own_checks(checklist: Checklist, model, src, tgt) -> None:
        tgt_in = tgt[:, :-1]
        # LayerNorm first: it draws its weights and inputs from the seeded RNG.
        checklist.check("LayerNorm = nn.LayerNorm (float64)", LAYER_NORM_TOLERANCE,
                        layer_norm_diff, model, src, tgt_in)
        if cfg.attention == "prefix":
            checklist.check("prefix: source sees later source (float64)", 0.0,
                            prefix_unreached, model, src, tgt_in, pad_id)
        else:
            checklist.check("causal: source sees no later source (float64)",
                            CAUSALITY_TOLERANCE, causal_source_diff, model, src, tgt_in,
                            pad_id)

    return property_checks(name, cfg, src_vocab_size, tgt_vocab_size, pad_id, batches, seed,
                           own_checks=own_checks,
                           expected_params=registry.entry(name).parameters(
                               cfg, src_vocab_size, tgt_vocab_size),
                           layers=decoder_only_layers(cfg, src_vocab_size, tgt_vocab_size))
