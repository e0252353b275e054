"""The decoder-only model's checklist: it has no PyTorch twin, so its properties are checked.

Its LayerNorm equals nn.LayerNorm, causality, attention over the source (prefix or causal),
cached decoding with beam reordering, padding, parameter count and output shapes; each check
is named "decoder_only: <property>".
"""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt.models import ModelConfig, build_model
from nmt.models.decoder_only import (
    LayerNorm,
    decoder_only_layers,
    decoder_only_param_count,
    encoder_decoder_param_count,
)
from nmt.stages.verify.checklist import Checklist
from nmt.stages.verify.measure import (
    FUSED_TOLERANCE,
    TOLERANCE,
    check_batches,
    fused_math_diff,
    max_abs_diff,
)

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


def count_diff(model, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> float:
    """The model's parameter count against decoder_only_param_count's formula."""
    return abs(n_params(model) - decoder_only_param_count(cfg, src_vocab_size, tgt_vocab_size))


def sizes(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict:
    """Its layers and parameters at cfg's size, and the encoder-decoder's parameters."""
    return {"layers": decoder_only_layers(cfg, src_vocab_size, tgt_vocab_size),
            "parameters": decoder_only_param_count(cfg, src_vocab_size, tgt_vocab_size),
            "encoder_decoder_parameters": encoder_decoder_param_count(
                cfg, src_vocab_size, tgt_vocab_size)}


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


def shape_mismatches(model, src, tgt_in, tgt_vocab_size: int) -> float:
    """How many of forward, decode_step and the decoder_cross maps have a wrong shape."""
    (B, S), T, H = src.shape, tgt_in.size(1), model.stack.layers[0].attn.nhead
    with torch.no_grad():
        logits = model(src, tgt_in)
        step = model.decode_step(model.init_cache(model.encode(src), src), tgt_in[:, 0])
        cross = model.attention_maps(src, tgt_in)["decoder_cross"]
    wrong = [logits.shape != (B, T, tgt_vocab_size), step.shape != (B, tgt_vocab_size),
             len(cross) != model.num_layers] + [w.shape != (B, H, T, S) for w in cross]
    return float(sum(wrong))


def property_checks(checklist: Checklist, model, src, tgt, pad_id: int, attention: str) -> None:
    """The float64 properties, in order; LayerNorm first (it draws from the seeded RNG)."""
    tgt_in, f64 = tgt[:, :-1], TOLERANCE[torch.float64]
    checklist.check("LayerNorm = nn.LayerNorm (float64)", LAYER_NORM_TOLERANCE, layer_norm_diff,
                    model, src, tgt_in)
    checklist.check("causality (float64)", CAUSALITY_TOLERANCE, causality_diff, model, src,
                    tgt_in)
    checklist.check("source reaches every target position (float64)", 0.0, unreached_targets,
                    model, src, tgt_in, pad_id)
    if attention == "prefix":
        checklist.check("prefix: source sees later source (float64)", 0.0, prefix_unreached,
                        model, src, tgt_in, pad_id)
    else:
        checklist.check("causal: source sees no later source (float64)", CAUSALITY_TOLERANCE,
                        causal_source_diff, model, src, tgt_in, pad_id)
    checklist.check("kv-cache decoding (float64)", f64, cached_decoding_diff, model, src, tgt_in)
    checklist.check("padding changes nothing (float64)", f64, padding_diff, model, src, tgt_in,
                    pad_id)
    checklist.check("fused vs math attention (float64)", FUSED_TOLERANCE[torch.float64],
                    fused_math_diff, model, src, tgt)


def decoder_only_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                        pad_id: int, batches: list, seed: int = 0) -> list[dict]:
    """The decoder-only model's property checks on a real padded batch, rows as run_checks's."""
    _, (src, tgt) = check_batches([(s.cpu(), t.cpu()) for s, t in batches], pad_id)
    checklist = Checklist(prefix="decoder_only: ")
    with torch.random.fork_rng(devices=[]):  # seeded weights and LayerNorm inputs
        torch.manual_seed(seed)
        model = build_model("decoder_only", cfg, src_vocab_size, tgt_vocab_size, pad_id).eval()
        checklist.check("parameter count", 0.0, count_diff, model, cfg, src_vocab_size,
                        tgt_vocab_size)
        checklist.check("output shapes", 0.0, shape_mismatches, model, src, tgt[:, :-1],
                        tgt_vocab_size)
        property_checks(checklist, model.double(), src, tgt, pad_id, cfg.attention)
    return checklist.checks
