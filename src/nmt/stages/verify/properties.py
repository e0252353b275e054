"""Property checks: what every model of the interface must do, with or without a PyTorch twin.

One checklist for scratch and decoder_only alike, each check of kind "property":
- structure_checks, on the model as built: its parameter count against the closed-form
  formula (nmt.models.decoder_only.size) and the interface's output shapes;
- float64_checks, on the model in float64: causality, the source reaching every target
  position, cached decoding (two beams a sentence, reordered, one sentence finished) = forward,
  extra padding changes nothing, fused = math attention, and finite gradients.
property_checks runs them on one model; `checks`, the check set the registry calls
"properties", runs them on a model with nothing of its own to add (the scratch model);
decoder_only.py adds that model's own checks.
"""

import torch
import torch.nn as nn

from nmt.models import ModelConfig, build_model, registry
from nmt.stages.verify.checklist import Checklist
from nmt.stages.verify.measure import (
    FUSED_TOLERANCE,
    TOLERANCE,
    check_batches,
    fused_math_diff,
    loss_of,
    max_abs_diff,
)

CAUSALITY_TOLERANCE = 1e-12
REACHED = 1e-9  # a logit or state that moved by more than this was reached by the change


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def other_token(tokens: torch.Tensor) -> torch.Tensor:
    """A different ordinary token (id >= 4) in place of each of tokens."""
    return torch.where(tokens == 4, 5, 4)


def real_rows(src: torch.Tensor, tgt_in: torch.Tensor, pad_id: int):
    """Each row alone, cut to its real tokens: [(src (1, s), tgt_in (1, t))]."""
    def cut(x, i):
        return x[i : i + 1, : int((x[i] != pad_id).sum())]

    return [(cut(src, i), cut(tgt_in, i)) for i in range(src.size(0))]


def params_off_formula(model, expected: int) -> float:
    """The model's parameter count (shared weights once) against the formula's."""
    return abs(n_params(model) - expected)


def wrong_shapes(model, src, tgt_in, tgt_vocab_size: int, nhead: int, layers: int) -> float:
    """How many of forward, decode_step and the decoder_cross maps have a wrong shape."""
    (B, S), T = src.shape, tgt_in.size(1)
    with torch.no_grad():
        logits = model(src, tgt_in)
        step = model.decode_step(model.init_cache(model.encode(src), src), tgt_in[:, 0])
        cross = model.attention_maps(src, tgt_in)["decoder_cross"]
    wrong = [logits.shape != (B, T, tgt_vocab_size), step.shape != (B, tgt_vocab_size),
             len(cross) != layers] + [w.shape != (B, nhead, T, S) for w in cross]
    return float(sum(wrong))


def causality_diff(model, src, tgt_in) -> float:
    """Largest change of the logits before target position t when the token at t changes."""
    T, diffs = tgt_in.size(1), []
    with torch.no_grad():
        base = model(src, tgt_in)
        for t in sorted({1, T - 1}):  # position 0 alone, and all but the last
            changed = tgt_in.clone()
            changed[:, t] = other_token(tgt_in[:, t])
            diffs.append(max_abs_diff(model(src, changed)[:, :t], base[:, :t]))
    return max(diffs)


def last_word_changed(src: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(src with each row's last source word, the one before <eos>, changed; that word's
    position in each row (B,))."""
    rows, last = torch.arange(src.size(0)), (src != pad_id).sum(dim=1) - 2
    changed = src.clone()
    changed[rows, last] = other_token(src[rows, last])
    return changed, last


def unreached_targets(model, src, tgt_in, pad_id: int) -> float:
    """How many real target positions' logits a change of each row's last source word (the
    one before <eos>) leaves as they were."""
    changed, _ = last_word_changed(src, pad_id)
    with torch.no_grad():
        logit_change = (model(changed, tgt_in) - model(src, tgt_in)).abs().amax(-1)  # (B, T)
    return float(((logit_change <= REACHED) & (tgt_in != pad_id)).sum())


def cached_decoding_diff(model, src, tgt_in) -> float:
    """init_cache/decode_step against forward, two beams a sentence as beam search runs them:
    beam 0 feeds its sentence's target, beam 1 the next sentence's; after a third of the steps
    even sentences swap their beams and odd ones continue beam 1 in both rows (reorder, rows
    repeat), after two thirds the first sentence is finished (keep). Every step's logits are
    compared with a full forward pass over the prefix that row holds."""
    B, T = tgt_in.shape
    sentence = torch.arange(B).repeat_interleave(2)  # row 2b + i: beam i of sentence b
    fed = torch.stack([tgt_in, tgt_in.roll(-1, dims=0)], dim=1).view(2 * B, T)
    beam = torch.where(sentence % 2 == 0, torch.tensor([1, 0]).repeat(B), 1)
    index, reorder_at, keep_at = 2 * sentence + beam, T // 3, 2 * T // 3
    diffs = []
    with torch.no_grad():
        before, after = model(src[sentence], fed), model(src[sentence], fed[index])
        cache, rows = model.init_cache(model.encode(src), src, beams=2), torch.arange(2 * B)
        for t in range(T):
            if t == reorder_at:
                cache.reorder(index)
            if t == keep_at:
                cache.keep(torch.arange(1, B))
                rows = rows[2:]
            want = (before if t < reorder_at else after)[rows, t]
            diffs.append(max_abs_diff(model.decode_step(cache, (fed if t < reorder_at else
                                                                fed[index])[rows, t]), want))
    return max(diffs)


def padding_diff(model, src, tgt_in, pad_id: int) -> float:
    """Each row alone against the batch with extra pad columns, at every real position."""
    B = src.size(0)
    with torch.no_grad():
        batched = model(torch.cat([src, src.new_full((B, 3), pad_id)], dim=1),
                        torch.cat([tgt_in, tgt_in.new_full((B, 2), pad_id)], dim=1))
        return max(max_abs_diff(model(s, t)[0], batched[i, : t.size(1)])
                   for i, (s, t) in enumerate(real_rows(src, tgt_in, pad_id)))


def gradient_faults(model, src, tgt, pad_id: int) -> float:
    """One backward pass of the loss: how many parameters get a gradient that is not finite
    (inf or NaN), plus one if the loss is not. A parameter the loss never reaches (a skipped final
    LayerNorm) is no fault: an architecture may leave one unused; the twin checks compare."""
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, src, tgt, pad_id)
    loss.backward()
    faults = sum(not bool(p.grad.isfinite().all()) for p in model.parameters()
                 if p.grad is not None) + (not bool(loss.isfinite()))
    model.zero_grad(set_to_none=True)
    return float(faults)


def structure_checks(checklist: Checklist, model, expected_params: int, src, tgt_in,
                     tgt_vocab_size: int, nhead: int, layers: int) -> None:
    """Parameter count against its formula, and output shapes, on the model as built."""
    checklist.check("parameter count", 0.0, params_off_formula, model, expected_params)
    checklist.check("output shapes", 0.0, wrong_shapes, model, src, tgt_in, tgt_vocab_size,
                    nhead, layers)


def float64_checks(checklist: Checklist, model, src, tgt, pad_id: int) -> None:
    """The properties every model has, on the model already in float64."""
    tgt_in, f64 = tgt[:, :-1], TOLERANCE[torch.float64]
    checklist.check("causality (float64)", CAUSALITY_TOLERANCE, causality_diff, model, src,
                    tgt_in)
    checklist.check("source reaches every target position (float64)", 0.0, unreached_targets,
                    model, src, tgt_in, pad_id)
    checklist.check("kv-cache decoding (float64)", f64, cached_decoding_diff, model, src, tgt_in)
    checklist.check("padding changes nothing (float64)", f64, padding_diff, model, src, tgt_in,
                    pad_id)
    checklist.check("fused vs math attention (float64)", FUSED_TOLERANCE[torch.float64],
                    fused_math_diff, model, src, tgt)
    checklist.check("gradients finite (float64)", 0.0, gradient_faults, model, src, tgt,
                    pad_id)


def property_checks(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                    pad_id: int, batches: list, seed: int, *, expected_params: int,
                    layers: int, own_checks=None) -> list[dict]:
    """Model `name`'s property checks on a real padded batch, named "<name>: ...": built with
    seeded weights, its structure, then in float64 `own_checks(checklist, model, src, tgt)`
    (what only this model must do; it may draw from the seeded RNG) and every model's."""
    _, (src, tgt) = check_batches([(s.cpu(), t.cpu()) for s, t in batches], pad_id)
    checklist = Checklist(kind="property", prefix=f"{name}: ")
    with torch.random.fork_rng(devices=[]):  # seeded weights (and own checks' draws)
        torch.manual_seed(seed)
        model = build_model(name, cfg, src_vocab_size, tgt_vocab_size, pad_id).eval()
        structure_checks(checklist, model, expected_params, src, tgt[:, :-1], tgt_vocab_size,
                         cfg.nhead, layers)
        model = model.double()
        if own_checks is not None:
            own_checks(checklist, model, src, tgt)
        float64_checks(checklist, model, src, tgt, pad_id)
    return checklist.checks


def checks(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
           pad_id: int, batches: list, seed: int = 0) -> list[dict]:
    """Encoder-decoder `name`'s property checks, its parameter count held to the registry's
    formula: for scratch, the whole proof of a configuration nn.Transformer cannot express
    (cfg.positions rotary)."""
    expected = registry.entry(name).parameters(cfg, src_vocab_size, tgt_vocab_size)
    return property_checks(name, cfg, src_vocab_size, tgt_vocab_size, pad_id, batches, seed,
                           layers=cfg.num_decoder_layers, expected_params=expected)
