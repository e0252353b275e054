"""Before a GPU run: do the attention kernels the models reach compute what they should, and do
scratch and the baseline train on the same expected gradient? At most 90 s on an H100/H200:

    python3 tools/gpu/preflight.py [--recipe published] [--draws 16] [--batches 8] [--updates 300]

A. One training step (train mode, dropout on, the training precision) of each model on a real
   batch under torch.profiler: every F.scaled_dot_product_attention call's arguments as the
   model makes them (shapes, strides, dtypes, mask, dropout_p, is_causal, scale), grouped into
   call types, and the kernels (CUDA) or aten ops (CPU) the step ran.
B. Each call type at its real layout and mask, under every SDPA backend (flash, efficient,
   cuDNN, math, and the default dispatch): without dropout, output and q/k/v gradients against
   a float64 math reference; with dropout, read the dropped weights through uniform attention
   (q = 0) and one-hot values, so the keep rate, the 1/(1-p) scale, zero weight on masked keys
   and that backward uses forward's mask (dv = P_dropped^T G) are seen from outside the kernel.
   A backend that refuses the inputs is "not available", not a failure.
C. Scratch against the baseline from the same weights (models.mapping): mean gradients over
   --draws dropout draws on --batches real batches, at initialisation and after --updates Adam
   updates of the baseline; the cross-model cosine against each model's split-half cosine.

Writes $OUT/preflight.json (or --json PATH); the last line printed is the verdict; exit 1 on
FAIL. On a CPU the same code runs CPU kernels (a dry run; shrink it with the options): on 2
shared cores `--draws 4 --batches 2 --updates 20` took 15 minutes at the published size (A 2,
B 0.1, C 13), so the default counts (about 800 training steps) are for a GPU only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.codecs import load_codecs  # noqa: E402
from nmt.core.data import Batches, load_pairs  # noqa: E402
from nmt.core.loss import token_loss  # noqa: E402
from nmt.core.runtime import (  # noqa: E402
    ATTENTION_KERNELS,
    ATTENTION_KERNELS_ENV,
    autocast,
    device_name,
    limit_attention_kernels,
    seed_everything,
)
from nmt.models import MODELS, ModelConfig, build_model  # noqa: E402
from nmt.models.mapping import baseline_to_scratch, scratch_to_baseline  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.training.graphs import resolve_cuda_graphs, resolve_pad_multiple  # noqa: E402
from nmt.training.precision import choose  # noqa: E402
from nmt.training.precision_timing import Workload  # noqa: E402

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
if hasattr(SDPBackend, "CUDNN_ATTENTION"):
    BACKENDS["cudnn"] = SDPBackend.CUDNN_ATTENTION
# relative L2 error (whole tensor) allowed against float64: (forward, gradients) per dtype
TOLERANCE = {torch.bfloat16: (2e-2, 5e-2), torch.float16: (5e-3, 1e-2),
             torch.float32: (1e-3, 5e-3), torch.float64: (1e-9, 1e-9)}
SCALE_TOLERANCE = 0.02  # a kept weight times n against 1/(1-p): bf16 rounds it by <= 0.4%
KERNEL_WORDS = ("attention", "fmha", "flash", "cudnn", "efficient", "softmax", "dropout",
                "bernoulli", "sdpa", "mha")


# ---- A: what the attention calls of a training step look like --------------------------------

def tensor_info(x: torch.Tensor | None) -> dict | None:
    if x is None:
        return None
    return {"shape": list(x.shape), "stride": list(x.stride()), "dtype": str(x.dtype),
            "contiguous": x.is_contiguous(), "storage_offset": x.storage_offset()}


def allowed_keys(mask, is_causal: bool, shape: tuple) -> torch.Tensor:
    """Bool (B, H, T, S): which keys each query may attend (True), from a bool or float mask."""
    allowed = torch.ones(shape, dtype=torch.bool, device="cpu")
    if mask is not None:
        allowed &= (mask if mask.dtype == torch.bool else mask > -math.inf).cpu()
    if is_causal:
        allowed &= torch.ones(shape[-2:], dtype=torch.bool).tril()
    return allowed


class SdpaRecorder:
    """Within `with`: records every F.scaled_dot_product_attention call (F is patched, so those
    of F.multi_head_attention_forward too) and marks it in the profile as `preflight.sdpa.<i>`;
    `where` is the stack (encoder/decoder) it happens in."""

    def __init__(self):
        self.calls, self.where = [], []
        self.original = F.scaled_dot_product_attention

    def __enter__(self):
        F.scaled_dot_product_attention = self.record
        return self

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = self.original

    def record(self, *args, **kwargs):
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                 **dict(zip(names, args, strict=False)), **kwargs}
        q, k, v, mask = (bound[n] for n in names[:4])
        self_attention = q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
        allowed = allowed_keys(mask, bound["is_causal"], (*q.shape[:-1], k.shape[-2]))
        self.calls.append({
            "where": f"{self.where[-1] if self.where else 'stack'} "
                     f"{'self' if self_attention else 'cross'}",
            "q": tensor_info(q), "k": tensor_info(k), "v": tensor_info(v),
            "mask": tensor_info(mask), "dropout_p": bound["dropout_p"],
            "is_causal": bound["is_causal"], "scale": bound["scale"],
            "mask_causal": bool(q.size(-2) > 1 and not allowed[..., 0, 1].any()),
            "mask_over_heads": mask is not None and (mask.dim() < 4 or mask.size(1) == 1
                                                     or mask.stride(1) == 0),
            "tensors": [x.detach().clone() for x in (q, k, v)], "mask_tensor": mask})
        with torch.profiler.record_function(f"preflight.sdpa.{len(self.calls) - 1}"):
            return self.original(*args, **kwargs)

    def watch(self, model: nn.Module) -> list:
        """Hooks that name the stack (module `encoder` or `decoder`) a call happens in."""
        hooks = []
        for name, module in model.named_modules():
            if name.split(".")[-1] in ("encoder", "decoder"):
                label = name.split(".")[-1]
                hooks.append(module.register_forward_pre_hook(
                    lambda *_, label=label: self.where.append(label)))
                hooks.append(module.register_forward_hook(lambda *_: self.where.pop() and None))
        return hooks


def training_step(model, src, tgt, device, precision: str) -> float:
    """One forward and backward of the training loss (mean over target tokens)."""
    model.train().zero_grad(set_to_none=True)
    loss, tokens = token_loss(model, src, tgt, device, precision=precision)
    (loss / tokens).backward()
    return float(loss.detach() / tokens)


def attention_without_dropout(model: nn.Module):
    """Attention modules with a fused path (`attend`) whose dropout is set to 0: on a CPU
    scratch takes its math path whenever it drops out attention weights, so its SDPA layout
    is seen only without. Returns a function that restores them."""
    saved = [(m.dropout, m.dropout.p) for m in model.modules()
             if hasattr(m, "attend") and isinstance(getattr(m, "dropout", None), nn.Dropout)]
    for dropout, _ in saved:
        dropout.p = 0.0
    return lambda: [setattr(dropout, "p", p) for dropout, p in saved]


def profile_step(model, src, tgt, device, precision: str) -> tuple[SdpaRecorder, list]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    recorder = SdpaRecorder()
    hooks = recorder.watch(model)
    try:
        with torch.profiler.profile(activities=activities) as prof, recorder:
            training_step(model, src, tgt, device, precision)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        for hook in hooks:
            hook.remove()
    return recorder, list(prof.events())


def event_names(event) -> list[str]:
    """An event's own name, its kernels' and those of every op below it."""
    names = [event.name] + [kernel.name for kernel in getattr(event, "kernels", [])]
    for child in getattr(event, "cpu_children", []):
        names += event_names(child)
    return names


def part_a(models: dict, src, tgt, device, precision: str) -> tuple[dict, list]:
    """Per model: its SDPA calls' arguments grouped into call types, and the attention kernels
    its step ran. Returns (report, call types, each with the tensors of its first call)."""
    report, call_types = {}, []
    for name, model in models.items():
        recorder, events = profile_step(model, src, tgt, device, precision)
        layout_pass = not recorder.calls
        if layout_pass:  # the math path under dropout (a CPU): record the fused layout
            restore = attention_without_dropout(model)
            recorder, _ = profile_step(model, src, tgt, device, precision)
            restore()
        kernels = {}
        for event in events:
            if (any(word in event.name.lower() for word in KERNEL_WORDS)
                    and not event.name.startswith("preflight.")):
                kernels[event.name] = kernels.get(event.name, 0) + 1
        types = {}
        for i, call in enumerate(recorder.calls):
            public = {k: v for k, v in call.items() if k not in ("tensors", "mask_tensor")}
            key = json.dumps({k: v for k, v in public.items() if k != "scale"}, sort_keys=True)
            if key not in types:
                ops = list(dict.fromkeys(n for e in events if e.name == f"preflight.sdpa.{i}"
                                         for n in event_names(e)[1:]))
                types[key] = {"model": name, **public, "calls": 0, "forward_ops": ops,
                              "tensors": call["tensors"], "mask_tensor": call["mask_tensor"]}
            types[key]["calls"] += 1
        call_types += types.values()
        report[name] = {"sdpa_calls": len(recorder.calls), "layout_pass": layout_pass,
                        "step_kernels": kernels, "call_types": [
                            {k: v for k, v in t.items() if k not in ("tensors", "mask_tensor")}
                            for t in types.values()]}
        print(f"A {name}: {len(recorder.calls)} SDPA calls in {len(types)} types"
              f"{' (layout pass: dropout off)' if layout_pass else ''}; kernels: "
              f"{sorted(kernels)[:8]}")
    return report, call_types


# ---- B: each call type under each backend, against float64 -----------------------------------

def sdpa_backend(backend):
    """The attention function of one backend (None: the default dispatch)."""
    def attention(q, k, v, mask, dropout_p, is_causal, scale):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale)
    return attention


def like(info: dict, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf, view): `values` in a view with info's shape, strides, offset and dtype."""
    shape, stride, offset = info["shape"], info["stride"], info["storage_offset"]
    size = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) + 1
    dtype = getattr(torch, info["dtype"].removeprefix("torch."))
    base = torch.zeros(size, dtype=dtype, device=values.device)
    base.as_strided(shape, stride, offset).copy_(values)
    base.requires_grad_()
    return base, base.as_strided(shape, stride, offset)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check_exact(call: dict, attention, device, precision: str) -> dict:
    """Dropout off: output and q/k/v gradients against float64 math on the same inputs."""
    views = [like(call[n], x.to(device))[1] for n, x in zip("qkv", call["tensors"], strict=True)]
    mask, causal, scale = call["mask_tensor"], call["is_causal"], call["scale"]
    with autocast(device, precision):
        out = attention(*views, mask, 0.0, causal, scale)
    upstream = torch.randn(out.shape, device=device, dtype=torch.float64)
    grads = torch.autograd.grad(out, views, upstream.to(out.dtype))
    exact = [x.detach().double().requires_grad_() for x in views]
    mask64 = mask if mask is None or mask.dtype == torch.bool else mask.double()
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(*exact, attn_mask=mask64, is_causal=causal,
                                             scale=scale)
    ref_grads = torch.autograd.grad(ref, exact, upstream)
    tol_out, tol_grad = TOLERANCE[out.dtype]
    errors = {"out": rel(out, ref), **{f"d{n}": rel(g, r) for n, g, r in
                                        zip("qkv", grads, ref_grads, strict=True)}}
    failed = [n for n, e in errors.items() if not e <= (tol_out if n == "out" else tol_grad)]
    return {"errors": errors, "dtype": str(out.dtype), "passed": not failed,
            "problem": f"relative error of {', '.join(failed)} over {tol_out}/{tol_grad}"
            if failed else None}


def check_dropout(call: dict, attention, device, precision: str, p: float) -> dict:
    """Dropout p through uniform attention (q = 0) and one-hot values, block by block of keys:
    output row i is the dropped, scaled weight row i. Keep rate, scale, masked keys and that
    dv = P_dropped^T G (backward drew no new mask)."""
    q_info, k_info, v_info = call["q"], call["k"], call["v"]
    S, Dh = v_info["shape"][-2], v_info["shape"][-1]
    mask, causal = call["mask_tensor"], call["is_causal"]
    allowed = allowed_keys(mask, causal, (*q_info["shape"][:-1], S)).to(device)
    n = allowed.sum(-1, keepdim=True).double()  # unmasked keys of each query
    kept = total = 0
    scale_dev = dv_err = 0.0
    masked_weight = 0.0
    for start in range(0, S, Dh):
        width = min(Dh, S - start)
        one_hot = torch.zeros(v_info["shape"], device=device)
        one_hot[..., start:start + width, :width] = torch.eye(width, device=device)
        views = [like(q_info, torch.zeros(q_info["shape"], device=device))[1],
                 like(k_info, call["tensors"][1].to(device))[1], like(v_info, one_hot)[1]]
        with autocast(device, precision):
            out = attention(*views, mask, p, causal, call["scale"])
        upstream = torch.randn(out.shape, device=device, dtype=torch.float64)
        dv = torch.autograd.grad(out, views, upstream.to(out.dtype))[2]
        weights = out.detach().double()[..., :width]  # (B, H, T, width)
        block = allowed[..., start:start + width].expand(weights.shape)
        masked_weight = max(masked_weight, float(weights[~block].abs().max()) if
                            (~block).any() else 0.0)
        nonzero = (weights != 0) & block
        kept, total = kept + int(nonzero.sum()), total + int(block.sum())
        scaled = (weights * n)[nonzero]
        if scaled.numel():
            scale_dev = max(scale_dev, float((scaled * (1 - p) - 1).abs().max()))
        expected = torch.einsum("bhtj,bhtd->bhjd", weights, upstream)
        dv_err = max(dv_err, rel(dv[..., start:start + width, :], expected))
    keep = kept / max(total, 1)
    sigma = math.sqrt(p * (1 - p) / max(total, 1))
    problems = []
    if abs(keep - (1 - p)) > 5 * sigma + 0.002:
        problems.append(f"keep rate {keep:.4f}, expected {1 - p:.4f} +- {5 * sigma:.4f}")
    if scale_dev > SCALE_TOLERANCE:
        problems.append(f"kept weights scaled {scale_dev:.3f} away from 1/(1-p)")
    if masked_weight != 0:
        problems.append(f"a masked key got weight {masked_weight:.3g}")
    if not dv_err <= TOLERANCE[out.dtype][1]:
        problems.append(f"dv differs from P_dropped^T G by {dv_err:.3f} (a new mask in backward?)")
    return {"keep_rate": keep, "keys_seen": total, "scale_max_deviation": scale_dev,
            "masked_key_max_weight": masked_weight, "dv_error": dv_err,
            "passed": not problems, "problem": "; ".join(problems) or None}


REFUSALS = ("no available kernel", "no viable backend")  # a backend that refuses the inputs


def guarded(check, *args) -> dict:
    """One check's result; a backend that refuses the inputs is "not available", another error
    a failure."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each refusal's reasons
            return {"available": True, **check(*args)}
    except RuntimeError as err:
        if any(words in str(err).lower() for words in REFUSALS):
            return {"available": False, "passed": True}
        return {"available": True, "passed": False,
                "problem": f"error: {str(err).splitlines()[0]}"}


def part_b(call_types: list, device, precision: str, p: float, backends=None) -> dict:
    """Every call type under every backend (`backends`: name -> attention function)."""
    backends = backends or {name: sdpa_backend(b) for name, b in BACKENDS.items()}
    results = []
    for call in call_types:
        mask = call["mask"]["dtype"] if call["mask"] else "no"
        label = f"{call['model']} {call['where']} ({mask} mask)"
        for name, attention in backends.items():
            row = {"call_type": label, "backend": name,
                   "exact": guarded(check_exact, call, attention, device, precision),
                   "dropout": guarded(check_dropout, call, attention, device, precision, p)}
            results.append(row)
            print(f"B {label} {name}: " + "; ".join(
                f"{c} " + ("n/a" if not row[c]["available"] else "pass" if row[c]["passed"]
                           else f"FAIL {row[c]['problem']}") for c in ("exact", "dropout")))
    failures = [f"{r['call_type']} {r['backend']} {c}: {r[c]['problem']}"
                for r in results for c in ("exact", "dropout") if not r[c]["passed"]]
    return {"results": results, "passed": not failures, "failures": failures}


# ---- C: scratch's expected gradient against the baseline's -----------------------------------

def mean_gradients(model, batches: list, draws: int, device, precision: str, to_baseline) -> list:
    """Four quarter-means (draws split into four groups in order) of the training gradient over
    `batches`, each a dict of float32 tensors named as the baseline names its parameters."""
    quarters = [{} for _ in range(4)]
    for b, (src, tgt) in enumerate(batches):
        for draw in range(draws):
            seed_everything(10_000 * b + draw)
            training_step(model, src, tgt, device, precision)
            grads = to_baseline({n: p.grad.float() for n, p in model.named_parameters()})
            quarter = quarters[4 * draw // draws]
            for n, g in grads.items():
                quarter[n] = quarter[n] + g if n in quarter else g.clone()
    return quarters


def cosine(a: dict, b: dict, names=None) -> float:
    names = names or a.keys()
    dot = sum(float((a[n].double() * b[n].double()).sum()) for n in names)
    norm_a = math.sqrt(sum(float(a[n].double().pow(2).sum()) for n in names))
    norm_b = math.sqrt(sum(float(b[n].double().pow(2).sum()) for n in names))
    return dot / max(norm_a * norm_b, 1e-30)


def add(a: dict, b: dict) -> dict:
    return {n: a[n] + b[n] for n in a}


def compare_gradients(base: list, scratch: list) -> dict:
    """Cross-model cosine of half-means against the models' own split-half cosines. If both
    expect one gradient g and a half's noise has squared norm nu_m, cos(half, half') is about
    |g|^2 / sqrt((|g|^2 + nu)(|g|^2 + nu')): the cross cosine's expectation is the geometric
    mean of the two split-half cosines. Their scatter between two ways of halving the draws
    (first/second, odd/even quarters) sizes the margin's statistical part (3 x scatter); the
    rest lets the cross decorrelation (1 - cosine) exceed the expected one by a fifth, for the
    geometric-mean approximation and the two models' different bf16 rounding. A systematic
    difference of relative size d between the expected gradients costs about d^2 / 2."""
    def halves(q):
        return [(add(q[0], q[1]), add(q[2], q[3])), (add(q[0], q[2]), add(q[1], q[3]))]
    split = {m: [cosine(*h) for h in halves(q)] for m, q in (("baseline", base),
                                                             ("scratch", scratch))}
    (b1, b2), (s1, s2) = halves(base)[0], halves(scratch)[0]
    cross = (cosine(s1, b2) + cosine(s2, b1)) / 2
    expected = math.sqrt(split["baseline"][0] * split["scratch"][0])
    scatter = max(abs(a - b) for a, b in split.values())
    margin = 3 * scatter + 0.2 * (1 - expected)
    full_b, full_s = add(b1, b2), add(s1, s2)
    norm = lambda g: math.sqrt(sum(float(x.double().pow(2).sum()) for x in g.values()))  # noqa: E731
    per_param = sorted(((n, cosine(s1, b2, [n]), math.sqrt(max(cosine(b1, b2, [n]), 0) *
                                                             max(cosine(s1, s2, [n]), 0)))
                        for n in b1), key=lambda t: t[1] - t[2])[:6]
    return {"split_half_cosine": {m: c[0] for m, c in split.items()},
            "split_half_cosine_odd_even": {m: c[1] for m, c in split.items()},
            "cross_cosine_halves": cross, "expected_cross_cosine": expected,
            "margin": margin, "cross_cosine_full": cosine(full_s, full_b),
            "norm_ratio_scratch_over_baseline": norm(full_s) / max(norm(full_b), 1e-30),
            "split_norm_ratio": {"baseline": norm(b1) / norm(b2), "scratch": norm(s1) / norm(s2)},
            "worst_parameters": [{"name": n, "cross": c, "expected": e} for n, c, e in per_param],
            "passed": cross >= expected - margin}


def part_c(cfg: ModelConfig, vocab: tuple, batches: list, train_batches: list, device,
           precision: str, draws: int, updates: int, adam: dict) -> dict:
    """compare_gradients at initialisation and after `updates` Adam updates of the baseline."""
    seed_everything(0)
    baseline = build_model("baseline", cfg, *vocab).to(device)
    scratch = build_model("scratch", cfg, *vocab).to(device)
    report = {}
    for phase in ("init", f"after_{updates}_updates"):
        if phase != "init":
            optimizer = torch.optim.Adam(baseline.parameters(), **adam)
            for i in range(updates):
                src, tgt = train_batches[i % len(train_batches)]
                training_step(baseline, src, tgt, device, precision)
                optimizer.step()
        scratch.load_state_dict(baseline_to_scratch(baseline.state_dict()))
        started = time.perf_counter()
        base = mean_gradients(baseline, batches, draws, device, precision, dict)
        ours = mean_gradients(scratch, batches, draws, device, precision, scratch_to_baseline)
        report[phase] = compare_gradients(base, ours)
        report[phase]["seconds"] = round(time.perf_counter() - started, 1)
        r = report[phase]
        print(f"C {phase}: cross cosine {r['cross_cosine_halves']:.4f} (expected "
              f"{r['expected_cross_cosine']:.4f} - margin {r['margin']:.4f}); split-half "
              f"baseline {r['split_half_cosine']['baseline']:.4f}, scratch "
              f"{r['split_half_cosine']['scratch']:.4f}; norm ratio "
              f"{r['norm_ratio_scratch_over_baseline']:.4f}; {r['seconds']} s")
    return {**report, "passed": all(r["passed"] for r in report.values())}


# ---- the run ---------------------------------------------------------------------------------

def environment(device) -> dict:
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None, "device": device_name(device),
            "sdp_enabled": {n: getattr(torch.backends.cuda, f"{n}_sdp_enabled")() for n in
                            ("flash", "mem_efficient", "math", "cudnn")
                            if hasattr(torch.backends.cuda, f"{n}_sdp_enabled")}}


def load(recipe: str, data: Path, device) -> tuple:
    """(settings, model config, vocabulary sizes, train Batches) as training builds them."""
    settings = resolve(load_params(REPO / "params.yaml"), recipe)
    cfg = ModelConfig.from_dict(settings["model"])
    codecs = load_codecs(data / "vocab" / recipe)
    train = settings["train"]
    pairs = load_pairs(data / "tokenized", "train", *codecs, cfg.max_len)
    graphs = resolve_cuda_graphs(train["cuda_graphs"], device, compiled=False, processes=1,
                                 accumulate=1)
    batches = Batches.for_training(pairs, train, seed=0, max_len=cfg.max_len,
                                   pad_multiple=resolve_pad_multiple(train["pad_multiple"], graphs))
    return settings, cfg, (len(codecs[0]), len(codecs[1])), batches


def run(settings, cfg, vocab, batches, device, args) -> dict:
    """Parts A, B and C (those in args.parts) into one report with a verdict."""
    precision = choose(settings["train"]["precision"], device,
                       Workload.of(settings, *vocab, "train")).precision
    plan = [batches.batch(idx) for idx in batches.indices(1)]
    report = {"environment": environment(device), "precision": precision, "seconds": {},
              "options": {k: v for k, v in vars(args).items() if k != "json"}}
    print(f"preflight on {report['environment']['device']}, torch {torch.__version__}, "
          f"{precision}")
    started = time.perf_counter()
    seed_everything(0)
    models = {name: build_model(name, cfg, *vocab).to(device) for name in args.models}
    report["A"], call_types = part_a(models, *plan[0], device, precision)
    report["seconds"]["A"] = round(time.perf_counter() - started, 1)
    del models
    if "B" in args.parts:
        started = time.perf_counter()
        report["B"] = part_b(call_types, device, precision, cfg.dropout or 0.1)
        report["seconds"]["B"] = round(time.perf_counter() - started, 1)
    if "C" in args.parts:
        started = time.perf_counter()
        train = settings["train"]
        adam = {"lr": train["lr"], "betas": tuple(train["betas"]), "eps": train["eps"]}
        report["C"] = part_c(cfg, vocab, plan[:args.batches], plan[args.batches:], device,
                             precision, args.draws, args.updates, adam)
        report["seconds"]["C"] = round(time.perf_counter() - started, 1)
    failures = [f"B {f}" for f in report.get("B", {}).get("failures", [])]
    for phase, r in report.get("C", {}).items():
        if isinstance(r, dict) and not r["passed"]:
            failures.append(f"C {phase}: scratch-vs-baseline gradient cosine "
                            f"{r['cross_cosine_halves']:.4f} < expected "
                            f"{r['expected_cross_cosine']:.4f} - {r['margin']:.4f}")
    report["passed"] = not failures
    report["verdict"] = ("preflight: PASS " + summary(report) if not failures else
                         "preflight: FAIL " + " | ".join(failures[:4]))
    if "B" in report and not report["B"]["passed"]:
        report["attention_kernels"] = route_around(report["B"]["results"])
        report["verdict"] += (f"; route: {ATTENTION_KERNELS_ENV}="
                              f"{report['attention_kernels']}")
    return report


def route_around(results: list[dict]) -> str:
    """The NMT_ATTENTION_KERNELS setting that leaves out every backend that failed a check of
    part B at any call type (math stays: every call can take it)."""
    failed = {r["backend"] for r in results
              if any(r[check]["available"] and not r[check]["passed"]
                     for check in ("exact", "dropout"))}
    return ",".join(name for name in ATTENTION_KERNELS if name not in failed or name == "math")


def summary(report: dict) -> str:
    parts = [f"A {sum(len(m['call_types']) for m in report['A'].values())} call types"]
    if "B" in report:
        rows = report["B"]["results"]
        ran = sum(r[c]["available"] for r in rows for c in ("exact", "dropout"))
        parts.append(f"B {ran} checks pass ({2 * len(rows) - ran} not available)")
    for phase, r in report.get("C", {}).items():
        if isinstance(r, dict):
            parts.append(f"C {phase} cross {r['cross_cosine_halves']:.3f} vs split "
                         f"{r['split_half_cosine']['baseline']:.3f}/"
                         f"{r['split_half_cosine']['scratch']:.3f}")
    return "; ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--data", type=Path, default=REPO / "data",
                        help="folder of tokenized/ and vocab/<recipe>/")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="models of parts A and B, comma-separated (default: all)")
    parser.add_argument("--parts", default="ABC", help="A always runs (B needs its call types)")
    parser.add_argument("--draws", type=int, default=16, help="C: dropout draws a batch (4k)")
    parser.add_argument("--batches", type=int, default=8, help="C: real batches")
    parser.add_argument("--updates", type=int, default=300, help="C: baseline Adam updates")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="default: $OUT/preflight.json")
    args = parser.parse_args(argv)
    if args.draws < 4 or args.draws % 4:
        parser.error("--draws: a multiple of 4, at least 4")
    args.models = args.models.split(",")
    out = args.json or (Path(os.environ["OUT"]) / "preflight.json" if "OUT" in os.environ
                        else None)
    device = torch.device(args.device)
    # As the stages do: run again with the setting a failed check printed, part B's default
    # dispatch shows the route passing.
    limit_attention_kernels()
    started = time.perf_counter()
    report = run(*load(args.recipe, args.data, device), device, args)
    report["seconds"]["total"] = round(time.perf_counter() - started, 1)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"{report['verdict']} ({report['seconds']['total']} s)")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
