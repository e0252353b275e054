"""The twin checks: the scratch Transformer against torch.nn.Transformer, its twin.

The baseline is built with seeded weights and the scratch model receives the same weights
through models.mapping, so every difference measured below is a difference of the code.
twin_checks() takes the checklist, float32, float64 and bf16 autocast, then the training
trajectory, then the checklist again with the other LayerNorm placement (model.norm_first).
They run where the baseline can express the configuration (nmt.stages.verify.suite).
"""

import contextlib
import dataclasses
import math

import torch
import torch.nn as nn

from nmt.models import ModelConfig, build_model
from nmt.models.baseline import plain_path
from nmt.models.mapping import baseline_to_scratch, scratch_to_baseline
from nmt.stages.verify.checklist import Checklist, timed
from nmt.stages.verify.measure import (
    FUSED_TOLERANCE,
    TOLERANCE,
    TRAJECTORY_ADAM,
    TRAJECTORY_STEPS,
    fused_math_diff,
    loss_of,
    max_abs_diff,
)

TRAJECTORY_TOLERANCE = 1e-8


@contextlib.contextmanager
def reference_mode(seed: int):
    """The plain path, and the global RNG seeded; the caller's RNG state is restored after."""
    with plain_path(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_pair(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int):
    """(baseline, scratch) in eval mode, scratch holding the baseline's weights."""
    baseline = build_model("baseline", cfg, src_vocab_size, tgt_vocab_size, pad_id)
    scratch = build_model("scratch", cfg, src_vocab_size, tgt_vocab_size, pad_id)
    scratch.load_state_dict(baseline_to_scratch(baseline.state_dict()))
    return baseline.eval(), scratch.eval()


def forward_outputs(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> dict:
    """The tensors compared by the forward checks, for either model."""
    tgt_in, seen = tgt[:, :-1], {}
    hook = model.generator.register_forward_hook(lambda m, args, out: seen.update(h=args[0]))
    try:
        with torch.no_grad():
            logits = model(src, tgt_in)
    finally:
        hook.remove()
    with torch.no_grad():
        return {"embeddings": torch.cat([model.embed_src(src), model.embed_tgt(tgt_in)], dim=1),
                "encoder memory": model.encode(src), "decoder output": seen["h"],
                "logits": logits}


def attention_diff(baseline, scratch, src, tgt) -> float:
    """Max difference over every layer and head of the three kinds of attention."""
    want = baseline.attention_maps(src, tgt[:, :-1])
    with torch.no_grad():
        got = scratch.attention_maps(src, tgt[:, :-1])
    diffs = [max_abs_diff(w, g) for kind in want for w, g in zip(want[kind], got[kind],
                                                                    strict=True)]
    return max(diffs)


def gradient_diff(baseline, scratch, src, tgt, pad_id: int) -> float:
    """One backward pass each; every parameter's gradient compared under baseline names."""
    grads = []
    for model in (baseline, scratch):
        model.zero_grad(set_to_none=True)
        loss_of(model, src, tgt, pad_id).backward()
        # A parameter the loss never reached has no gradient: count it as zeros.
        grads.append({n: p.grad if p.grad is not None else torch.zeros_like(p)
                      for n, p in model.named_parameters(remove_duplicate=False)})
        model.zero_grad(set_to_none=True)
    want, got = grads[0], scratch_to_baseline(grads[1])
    if want.keys() != got.keys():
        return math.inf
    return max(max_abs_diff(want[n], got[n]) for n in want)


def incremental_diff(baseline, scratch, src, tgt) -> float:
    """Scratch's key/value-cached decode_step at every position against baseline.decode."""
    tgt_in = tgt[:, :-1]
    with torch.no_grad():
        want = baseline.decode(tgt_in, baseline.encode(src), src)  # (B, T, V)
        cache = scratch.init_cache(scratch.encode(src), src)
        got = torch.stack([scratch.decode_step(cache, tgt_in[:, t])
                           for t in range(tgt_in.size(1))], dim=1)
    return max_abs_diff(want, got)


def count_diff(baseline, scratch) -> float:
    """Difference of the parameter counts (shared weights counted once)."""
    return abs(sum(p.numel() for p in baseline.parameters())
               - sum(p.numel() for p in scratch.parameters()))


def shape_mismatches(baseline, scratch, src, tgt) -> float:
    """How many outputs (forward, encode, decode, decode_step, attention maps) differ in shape
    between the models, plus one if the logits are not (B, T, V)."""
    tgt_in = tgt[:, :-1]

    def shapes(model, maps):
        with torch.no_grad():
            memory = model.encode(src)
            step = model.decode_step(model.init_cache(memory, src), tgt_in[:, 0])
            outs = [model(src, tgt_in), memory, model.decode(tgt_in, memory, src), step]
        return [t.shape for t in outs] + [w.shape for ws in maps.values() for w in ws]

    want = shapes(baseline, baseline.attention_maps(src, tgt_in))
    with torch.no_grad():
        got = shapes(scratch, scratch.attention_maps(src, tgt_in))
    mismatches = sum(a != b for a, b in zip(want, got, strict=False)) + abs(len(want) - len(got))
    return float(mismatches + (want[0] != (*tgt_in.shape, baseline.generator.out_features)))


def forward_diffs(baseline, scratch, batches) -> dict:
    """Each forward output's largest difference over the batches: {name: diff}."""
    diffs = {}
    for batch in batches:
        want, got = forward_outputs(baseline, *batch), forward_outputs(scratch, *batch)
        for key in want:
            diffs[key] = max(diffs.get(key, 0.0), max_abs_diff(want[key], got[key]))
    return diffs


def trajectory(cfg, src_vocab_size, tgt_vocab_size, pad_id, train_batches, steps):
    """Loss curves of both models over the same Adam steps from the same weights, float64:
    (largest difference between the curves, {"baseline": losses, "scratch": losses})."""
    baseline, scratch = build_pair(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    curves = {}
    for name, model in (("baseline", baseline.double().train()),
                        ("scratch", scratch.double().train())):
        opt = torch.optim.Adam(model.parameters(), **TRAJECTORY_ADAM)
        curves[name] = []
        for src, tgt in train_batches[:steps]:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model, src, tgt, pad_id)
            loss.backward()
            opt.step()
            curves[name].append(loss.item())
    diff = max(abs(a - b) for a, b in zip(curves["baseline"], curves["scratch"], strict=True))
    return diff, curves


def dtype_checks(checklist: Checklist, baseline, scratch, dtype, unpadded, padded,
                 pad_id: int) -> None:
    """The checks of one dtype on the models, already cast to it."""
    tol, suffix = TOLERANCE[dtype], f" ({str(dtype).removeprefix('torch.')})"
    diffs, seconds = timed(forward_diffs, baseline, scratch, (unpadded, padded))
    for key, diff in diffs.items():  # one measurement, its time shared by its rows
        checklist.record(key + suffix, diff, tol, seconds / len(diffs))
    checklist.check("attention weights" + suffix, tol, attention_diff, baseline, scratch, *padded)
    checklist.check("gradients" + suffix, tol, gradient_diff, baseline, scratch, *padded, pad_id)
    checklist.check("kv-cache decoding" + suffix, tol, incremental_diff, baseline, scratch,
                    *padded)
    checklist.check("fused vs math attention" + suffix, FUSED_TOLERANCE[dtype], fused_math_diff,
                    scratch, *padded)


def pair_checks(checklist: Checklist, pair, unpadded, padded, pad_id: int) -> None:
    """Parameter count and shapes, then every dtype's checks, on one (baseline, scratch)."""
    baseline, scratch = pair
    checklist.check("parameter count", 0.0, count_diff, baseline, scratch)
    checklist.check("output shapes", 0.0, shape_mismatches, baseline, scratch, *padded)
    for dtype in (torch.float32, torch.float64):
        dtype_checks(checklist, baseline.to(dtype), scratch.to(dtype), dtype, unpadded, padded,
                     pad_id)
    # float32 weights under bf16 autocast: the path train.precision bf16 runs on a GPU.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dtype_checks(checklist, baseline.float(), scratch.float(), torch.bfloat16, unpadded,
                     padded, pad_id)


def twin_checks(cfg: ModelConfig, vocab: tuple, pad_id: int, train_batches: list,
                tcfg: ModelConfig, seed: int, unpadded, padded):
    """The whole twin checklist: (checks, {"baseline": losses, "scratch": losses})."""
    checklist = Checklist(kind="twin")
    with reference_mode(seed):
        pair_checks(checklist, build_pair(cfg, *vocab, pad_id), unpadded, padded, pad_id)
        (diff, curves), seconds = timed(trajectory, tcfg, *vocab, pad_id, train_batches,
                                        TRAJECTORY_STEPS)
        checklist.record("training trajectory (float64)", diff, TRAJECTORY_TOLERANCE, seconds)
    # The other LayerNorm placement (model.norm_first) is proven equal too, so a recipe may
    # switch it without a gap in the proof.
    other = Checklist(kind="twin", prefix=f"norm_first {not cfg.norm_first}: ")
    with reference_mode(seed):
        flipped = dataclasses.replace(cfg, norm_first=not cfg.norm_first)
        pair_checks(other, build_pair(flipped, *vocab, pad_id), unpadded, padded, pad_id)
    return checklist.checks + other.checks, curves
