"""The equivalence checklist: the scratch Transformer against torch.nn.Transformer.

The baseline is built with seeded weights and the scratch model receives the same weights
through models.mapping, so every difference measured below is a difference of the code.
The decoder-only model has no PyTorch twin: decoder_only_checks() tests its properties instead
(its LayerNorm equals nn.LayerNorm, causality, attention over the source, cached decoding,
padding, parameter count), and run_checks() appends them to its list.
run_checks() returns {"passed", "checks": [{"name", "passed", "max_abs_diff", "tolerance",
"seconds"}], "config", "trajectory"}; print_table() shows it.
"""

import contextlib
import copy
import dataclasses
import logging
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt.data import Batches, load_pairs
from nmt.files import write_json
from nmt.models import ModelConfig, build_model
from nmt.models.baseline import plain_path
from nmt.models.decoder_only import (
    LayerNorm,
    decoder_only_layers,
    decoder_only_param_count,
    encoder_decoder_param_count,
)
from nmt.models.mapping import baseline_to_scratch, scratch_to_baseline
from nmt.vocab import PAD_ID, load_codecs

log = logging.getLogger("nmt.verify")

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}
FUSED_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}
TRAJECTORY_TOLERANCE = 1e-8
TRAJECTORY_STEPS = 30
TRAJECTORY_ADAM = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9}  # the published optimizer
TRAJECTORY_SIZE = {"num_encoder_layers": 2, "num_decoder_layers": 2, "d_model": 64, "nhead": 4,
                   "dim_feedforward": 128}
CHECK_ROWS = 4  # sentences in the forward/attention/gradient check batches


@contextlib.contextmanager
def reference_mode(seed: int):
    """The plain path, and the global RNG seeded; the caller's RNG state is restored after."""
    with plain_path(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute elementwise difference; inf when the shapes differ."""
    if a.shape != b.shape:
        return math.inf
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def build_pair(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int):
    """(baseline, scratch) in eval mode, scratch holding the baseline's weights."""
    baseline = build_model("baseline", cfg, src_vocab_size, tgt_vocab_size, pad_id)
    scratch = build_model("scratch", cfg, src_vocab_size, tgt_vocab_size, pad_id)
    scratch.load_state_dict(baseline_to_scratch(baseline.state_dict()))
    return baseline.eval(), scratch.eval()


def check_batches(train_batches, pad_id: int, rows: int = CHECK_ROWS):
    """(unpadded, padded) (src, tgt) batches: the first batch whose first `rows` sentences have
    padding in source and target input, and the same sentences cut to their shortest length."""
    def trim(x):  # drop the columns that are padding in every row
        return x[:, : int((x != pad_id).sum(1).max())]

    for src, tgt in train_batches:
        src, tgt = trim(src[:rows]), trim(tgt[:rows])
        if (src == pad_id).any() and (tgt[:, :-1] == pad_id).any():
            break
    else:
        raise ValueError("no batch has padding in both source and target input; "
                         "pass real padded batches (bos/eos added, right-padded)")
    s, t = int((src != pad_id).sum(1).min()), int((tgt != pad_id).sum(1).min())
    return (src[:, :s], tgt[:, :t]), (src, tgt)


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


def loss_of(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token-level cross entropy of teacher-forced next-token prediction, padding ignored."""
    logits = model(src, tgt[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=pad_id)


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


def fused_math_diff(scratch, src, tgt) -> float:
    """Logits of the fused scaled_dot_product_attention path against the explicit math path."""
    with torch.no_grad():
        fused = scratch(src, tgt[:, :-1])
        scratch.set_fused_attention(False)
        try:
            math_path = scratch(src, tgt[:, :-1])
        finally:
            scratch.set_fused_attention(True)
    return max_abs_diff(fused, math_path)


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


def trajectory(cfg, src_vocab_size, tgt_vocab_size, pad_id, train_batches, steps):
    """Loss curves of both models over the same Adam steps from the same weights, float64."""
    baseline, scratch = build_pair(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    curves = []
    for model in (baseline.double().train(), scratch.double().train()):
        opt = torch.optim.Adam(model.parameters(), **TRAJECTORY_ADAM)
        losses = []
        for src, tgt in train_batches[:steps]:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model, src, tgt, pad_id)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    return curves


def run_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
               train_batches: list, trajectory_cfg: ModelConfig | None = None,
               seed: int = 0) -> dict:
    """Run the whole checklist on CPU; see the module docstring for the result's layout."""
    if len(train_batches) < TRAJECTORY_STEPS:
        raise ValueError(f"run_checks needs at least {TRAJECTORY_STEPS} training batches for "
                         f"the trajectory check, got {len(train_batches)}")
    tcfg = dataclasses.replace(trajectory_cfg or dataclasses.replace(cfg, **TRAJECTORY_SIZE),
                               dropout=0.0)
    train_batches = [(s.cpu(), t.cpu()) for s, t in train_batches]
    unpadded, padded = check_batches(train_batches, pad_id)
    checks = []

    def record(name: str, diff: float, tolerance: float, seconds: float) -> None:
        checks.append({"name": name, "passed": diff <= tolerance, "max_abs_diff": float(diff),
                       "tolerance": tolerance, "seconds": round(seconds, 3)})

    def check(name: str, tolerance: float, measure, *args) -> None:
        start = time.perf_counter()
        diff = measure(*args)
        record(name, diff, tolerance, time.perf_counter() - start)

    started = time.perf_counter()
    with reference_mode(seed):
        baseline, scratch = build_pair(cfg, src_vocab_size, tgt_vocab_size, pad_id)
        check("parameter count", 0.0, count_diff, baseline, scratch)
        check("output shapes", 0.0, shape_mismatches, baseline, scratch, *padded)
        for dtype in (torch.float32, torch.float64):
            baseline, scratch = baseline.to(dtype), scratch.to(dtype)
            tol, suffix = TOLERANCE[dtype], f" ({str(dtype).removeprefix('torch.')})"
            start, diffs = time.perf_counter(), {}
            for batch in (unpadded, padded):
                want, got = forward_outputs(baseline, *batch), forward_outputs(scratch, *batch)
                for key in want:
                    diffs[key] = max(diffs.get(key, 0.0), max_abs_diff(want[key], got[key]))
            for key, diff in diffs.items():  # one measurement, its time shared by its rows
                record(key + suffix, diff, tol, (time.perf_counter() - start) / len(diffs))
            check("attention weights" + suffix, tol, attention_diff, baseline, scratch, *padded)
            check("gradients" + suffix, tol, gradient_diff, baseline, scratch, *padded, pad_id)
            check("kv-cache decoding" + suffix, tol, incremental_diff, baseline, scratch, *padded)
            check("fused vs math attention" + suffix, FUSED_TOLERANCE[dtype], fused_math_diff,
                  scratch, *padded)
        del baseline, scratch
        curves = []

        def trajectory_diff():
            curves.extend(trajectory(tcfg, src_vocab_size, tgt_vocab_size, pad_id,
                                     train_batches, TRAJECTORY_STEPS))
            return max(abs(a - b) for a, b in zip(*curves, strict=True))

        check("training trajectory (float64)", TRAJECTORY_TOLERANCE, trajectory_diff)
    checks += decoder_only_checks(cfg, src_vocab_size, tgt_vocab_size, pad_id, train_batches, seed)
    return {
        "passed": all(c["passed"] for c in checks),
        "checks": checks,
        "config": {"model": dataclasses.asdict(cfg), "trajectory_model": dataclasses.asdict(tcfg),
                   "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size,
                   "pad_id": pad_id, "seed": seed, "trajectory_steps": TRAJECTORY_STEPS,
                   "trajectory_adam": TRAJECTORY_ADAM,
                   "decoder_only": {
                       "layers": decoder_only_layers(cfg, src_vocab_size, tgt_vocab_size),
                       "parameters": decoder_only_param_count(cfg, src_vocab_size,
                                                              tgt_vocab_size),
                       "encoder_decoder_parameters": encoder_decoder_param_count(
                           cfg, src_vocab_size, tgt_vocab_size)},
                   "check_batches": {"unpadded": list(unpadded[0].shape) + [unpadded[1].size(1)],
                                     "padded": list(padded[0].shape) + [padded[1].size(1)]},
                   "torch": torch.__version__, "seconds": round(time.perf_counter() - started, 2)},
        "trajectory": {"baseline": curves[0], "scratch": curves[1]},
    }


# --- the decoder-only model: properties instead of a twin ----------------------------------

LAYER_NORM_TOLERANCE = 1e-12
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


def source_change(model, src, tgt_in, pad_id: int):
    """Change each row's last source word: (|change| of target logits (B, T) and of the
    source states (B, S), max over features; real earlier source positions (B, S))."""
    B, S = src.shape
    last = (src != pad_id).sum(dim=1) - 2  # the word before <eos>
    changed = src.clone()
    changed[torch.arange(B), last] = other_token(src[torch.arange(B), last])
    with torch.no_grad():  # final states of [source | target] and the target's logits
        (before, _, _), (after, _, _) = model.states(src, tgt_in), model.states(changed, tgt_in)
        logit_change = (model.head(after[:, S:]) - model.head(before[:, S:])).abs().amax(-1)
        state_change = (after[:, :S] - before[:, :S]).abs().amax(-1)
    earlier = torch.arange(S)[None, :] < last[:, None]  # (B, S), all real tokens
    return logit_change, state_change, earlier


def unreached_targets(model, src, tgt_in, pad_id: int) -> float:
    """How many real target positions' logits a source change leaves as they were."""
    logit_change, _, _ = source_change(model, src, tgt_in, pad_id)
    return float(((logit_change <= REACHED) & (tgt_in != pad_id)).sum())


def prefix_unreached(model, src, tgt_in, pad_id: int) -> float:
    """prefix: how many earlier source positions a change of a later source word leaves."""
    _, state_change, earlier = source_change(model, src, tgt_in, pad_id)
    return float(((state_change <= REACHED) & earlier).sum())


def causal_source_diff(model, src, tgt_in, pad_id: int) -> float:
    """causal: the largest change of an earlier source position's state."""
    _, state_change, earlier = source_change(model, src, tgt_in, pad_id)
    return state_change.masked_select(earlier).max().item() if earlier.any() else 0.0


def cached_decoding_diff(model, src, tgt_in) -> float:
    """init_cache/decode_step against forward; halfway, reorder(index) with repeated rows."""
    B, T = tgt_in.shape
    index, half = torch.arange(B).flip(0).repeat_interleave(2), T // 2
    with torch.no_grad():
        full = model(src, tgt_in)
        cache = model.init_cache(model.encode(src), src)
        steps = [model.decode_step(cache, tgt_in[:, t]) for t in range(half)]
        cache.reorder(index)
        rest = [model.decode_step(cache, tgt_in[index, t]) for t in range(half, T)]
    return max(max_abs_diff(torch.stack(steps, 1), full[:, :half]),
               max_abs_diff(torch.stack(rest, 1), full[index, half:]))


def padding_diff(model, src, tgt_in, pad_id: int) -> float:
    """Each row alone against the batch with extra pad columns, at every real position."""
    B = src.size(0)
    with torch.no_grad():
        batched = model(torch.cat([src, src.new_full((B, 3), pad_id)], dim=1),
                        torch.cat([tgt_in, tgt_in.new_full((B, 2), pad_id)], dim=1))
        return max(max_abs_diff(model(s, t)[0], batched[i, : t.size(1)])
                   for i, (s, t) in enumerate(real_rows(src, tgt_in, pad_id)))


def decoder_only_shape_mismatches(model, src, tgt_in, tgt_vocab_size: int) -> float:
    """How many of forward, decode_step and the decoder_cross maps have a wrong shape."""
    (B, S), T, H = src.shape, tgt_in.size(1), model.stack.layers[0].attn.nhead
    with torch.no_grad():
        logits = model(src, tgt_in)
        step = model.decode_step(model.init_cache(model.encode(src), src), tgt_in[:, 0])
        cross = model.attention_maps(src, tgt_in)["decoder_cross"]
    wrong = [logits.shape != (B, T, tgt_vocab_size), step.shape != (B, tgt_vocab_size),
             len(cross) != model.num_layers] + [w.shape != (B, H, T, S) for w in cross]
    return float(sum(wrong))


def decoder_only_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                        pad_id: int, batches: list, seed: int = 0) -> list[dict]:
    """The decoder-only model's property checks on a real padded batch, rows as run_checks's."""
    _, (src, tgt) = check_batches([(s.cpu(), t.cpu()) for s, t in batches], pad_id)
    tgt_in, checks = tgt[:, :-1], []

    def check(name: str, tolerance: float, measure, *args) -> None:
        start = time.perf_counter()
        diff = measure(*args)
        checks.append({"name": "decoder_only: " + name, "passed": diff <= tolerance,
                       "max_abs_diff": float(diff), "tolerance": tolerance,
                       "seconds": round(time.perf_counter() - start, 3)})

    def count_diff():
        want = decoder_only_param_count(cfg, src_vocab_size, tgt_vocab_size)
        return abs(n_params(model) - want)

    f64 = TOLERANCE[torch.float64]
    with torch.random.fork_rng(devices=[]):  # seeded weights and LayerNorm inputs
        torch.manual_seed(seed)
        model = build_model("decoder_only", cfg, src_vocab_size, tgt_vocab_size, pad_id).eval()
        check("parameter count", 0.0, count_diff)
        check("output shapes", 0.0, decoder_only_shape_mismatches, model, src, tgt_in,
              tgt_vocab_size)
        model.double()
        check("LayerNorm = nn.LayerNorm (float64)", LAYER_NORM_TOLERANCE, layer_norm_diff,
              model, src, tgt_in)
        check("causality (float64)", CAUSALITY_TOLERANCE, causality_diff, model, src, tgt_in)
        check("source reaches every target position (float64)", 0.0, unreached_targets,
              model, src, tgt_in, pad_id)
        if cfg.attention == "prefix":
            check("prefix: source sees later source (float64)", 0.0, prefix_unreached, model,
                  src, tgt_in, pad_id)
        else:
            check("causal: source sees no later source (float64)", CAUSALITY_TOLERANCE,
                  causal_source_diff, model, src, tgt_in, pad_id)
        check("kv-cache decoding (float64)", f64, cached_decoding_diff, model, src, tgt_in)
        check("padding changes nothing (float64)", f64, padding_diff, model, src, tgt_in,
              pad_id)
        check("fused vs math attention (float64)", FUSED_TOLERANCE[torch.float64],
              fused_math_diff, model, src, tgt)
    return checks


def format_table(result: dict) -> str:
    """The checks as an aligned text table."""
    rows = [("check", "passed", "max_abs_diff", "tolerance", "seconds")]
    rows += [(c["name"], "yes" if c["passed"] else "NO", f"{c['max_abs_diff']:.3g}",
              f"{c['tolerance']:.0e}", f"{c['seconds']:.2f}") for c in result["checks"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in
                       enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"all passed: {'yes' if result['passed'] else 'NO'}")
    return "\n".join(lines)


def print_table(result: dict) -> None:
    """Print the checks: check, passed, max_abs_diff, tolerance, seconds."""
    print(format_table(result))


def synthetic_batches(n: int, batch_size: int, src_vocab_size: int, tgt_vocab_size: int,
                      pad_id: int = 1, bos_id: int = 2, eos_id: int = 3, max_tokens: int = 12,
                      seed: int = 0) -> list:
    """n random (src, tgt) batches shaped like real ones: <bos> words <eos>, right-padded."""
    g = torch.Generator().manual_seed(seed)

    def side(vocab_size):
        lengths = torch.randint(1, max_tokens + 1, (batch_size,), generator=g).tolist()
        out = torch.full((batch_size, max(lengths) + 2), pad_id, dtype=torch.long)
        for row, n_words in enumerate(lengths):
            words = torch.randint(4, vocab_size, (n_words,), generator=g)
            out[row, : n_words + 2] = torch.cat([torch.tensor([bos_id]), words,
                                                 torch.tensor([eos_id])])
        return out

    return [(side(src_vocab_size), side(tgt_vocab_size)) for _ in range(n)]


def verify(params: dict, tokenized_dir, vocab_dir, out_path) -> bool:
    """Stage verify: run the checklist at one recipe's size on real batches; write the JSON."""
    src_codec, tgt_codec = load_codecs(vocab_dir)
    cfg = ModelConfig.from_dict(params["model"])
    pairs = load_pairs(tokenized_dir, "train", src_codec, tgt_codec, cfg.max_len)
    # Published-style batches (32 sentences, shuffled): the checks need padded rows, whatever
    # batching the recipe trains with.
    batches = Batches(pairs, "sentences", 32, 0, shuffle=True, seed=0)
    train_batches = list(batches)[:TRAJECTORY_STEPS]
    log.info("checking %s at d_model %d, %d+%d layers, vocab %d/%d on %d real batches",
             vocab_dir.name, cfg.d_model, cfg.num_encoder_layers, cfg.num_decoder_layers,
             len(src_codec), len(tgt_codec), len(train_batches))
    result = run_checks(cfg, len(src_codec), len(tgt_codec), PAD_ID, train_batches)
    for c in result["checks"]:  # strict JSON: a shape mismatch measures inf
        if not math.isfinite(c["max_abs_diff"]):
            c["max_abs_diff"] = None
    print_table(result)
    write_json(out_path, result)
    log.info("wrote %s (%s)", out_path, "all checks passed" if result["passed"] else "FAILED")
    return result["passed"]
