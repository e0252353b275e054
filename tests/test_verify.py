"""The equivalence checklist passes on the real scratch model and catches deliberate bugs."""

import json
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

import nmt.stages.verify as verify
from nmt.models import MODELS, ModelConfig, registry
from nmt.models.scratch import attention as scratch_attention
from nmt.models.scratch import embedding as scratch_embedding
from nmt.models.scratch import transformer as scratch_transformer
from nmt.models.scratch.decoder import DecoderLayer
from nmt.stages.verify import equivalence, measure
from nmt.stages.verify.checklist import Checklist
from synthetic import synthetic_batches

CFG = ModelConfig(num_encoder_layers=2, num_decoder_layers=2, d_model=32, nhead=4,
                  dim_feedforward=64, dropout=0.1)
TRAJECTORY = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                         dim_feedforward=32)
pytestmark = pytest.mark.usefixtures("one_thread")
SRC_V, TGT_V, PAD = 60, 50, 1




@pytest.fixture(scope="module")
def batches():
    return synthetic_batches(30, 4, SRC_V, TGT_V, pad_id=PAD)


def run(batches):
    result = verify.run_checks(CFG, SRC_V, TGT_V, PAD, batches, trajectory_cfg=TRAJECTORY)
    return result, {c["name"]: c["passed"] for c in result["checks"]}


def test_unbroken_model_passes_everything(batches, capsys):
    result, passed = run(batches)
    assert result["passed"] and all(passed.values()), verify.format_table(result)
    for kind in ("embeddings", "encoder memory", "decoder output", "logits", "attention weights",
                 "gradients", "kv-cache decoding", "fused vs math attention"):
        assert all(f"{kind} ({dtype})" in passed for dtype in ("float32", "float64", "bfloat16"))
    assert {"parameter count", "output shapes", "training trajectory (float64)"} <= set(passed)
    for c in result["checks"]:
        assert set(c) == {"name", "kind", "passed", "max_abs_diff", "tolerance", "seconds"}
    assert len(result["trajectory"]["baseline"]) == verify.TRAJECTORY_STEPS
    # Both kinds ran: the twin, and every model's properties.
    assert result["twin"] and result["skipped"] == {} and "nn.Transformer" in result["twin_reason"]
    kinds = {c["name"]: c["kind"] for c in result["checks"]}
    assert kinds["logits (float64)"] == "twin" and kinds["training trajectory (float64)"] == "twin"
    for model in ("scratch", "decoder_only"):
        for prop in ("kv-cache decoding (float64)", "fused vs math attention (float64)",
                     "padding changes nothing (float64)", "gradients finite (float64)",
                     "parameter count"):
            assert kinds[f"{model}: {prop}"] == "property"
    json.dumps(result, allow_nan=False)  # what results/verify.json will hold
    verify.print_checklist(result)
    out = capsys.readouterr().out
    assert "training trajectory (float64)" in out and "max_abs_diff" in out
    assert "twin checks: ran" in out and " property " in out


def test_one_record_a_model_holds_that_models_checks(batches):
    """nmt verify's jobs, one a model: scratch's record holds the twin checks and its
    properties, the decoder-only model's its own, the baseline's none (the reference, which
    the twin checks hold scratch to); together, in the registry's order, every check of all
    models checked at once, with the same outcomes."""
    whole, _ = run(batches)
    records = {model: verify.run_checks(CFG, SRC_V, TGT_V, PAD, batches,
                                        trajectory_cfg=TRAJECTORY, models=(model,))
               for model in registry.names()}
    assert [(c["name"], c["passed"]) for r in records.values() for c in r["checks"]] == \
        [(c["name"], c["passed"]) for c in whole["checks"]]
    assert records["baseline"]["checks"] == [] and records["baseline"]["passed"]
    assert records["scratch"]["twin"] and records["scratch"]["trajectory"]
    assert {c["kind"] for c in records["scratch"]["checks"]} == {"twin", "property"}
    assert records["decoder_only"]["twin"] is None and records["baseline"]["twin"] is None
    assert all(c["name"].startswith("decoder_only: ") for c in records["decoder_only"]["checks"])
    assert [r["models"] for r in records.values()] == [[m] for m in registry.names()]
    assert "decoder_only" in records["decoder_only"]["config"]
    assert "decoder_only" not in records["scratch"]["config"]


def test_both_layer_norm_placements_are_checked(batches, monkeypatch):
    """The recipe's norm_first and the other one: a bug only in pre-norm fails only those."""
    _, passed = run(batches)
    pre = {n: ok for n, ok in passed.items() if n.startswith("norm_first True: ")}
    assert "norm_first True: logits (float64)" in pre and all(pre.values())

    def cross_attention_reads_unnormed(self, x, norm):  # the pre-norm decoder's second norm lost
        return x if norm is self.norm2 else (norm(x) if self.norm_first else x)

    monkeypatch.setattr(DecoderLayer, "sublayer_input", cross_attention_reads_unnormed)
    result, passed = run(batches)
    assert not result["passed"]
    assert not passed["norm_first True: logits (float64)"]
    assert passed["logits (float64)"]  # post-norm, the recipe's, never reads sublayer_input


def test_run_checks_is_deterministic(batches):
    a, b = run(batches)[0], run(batches)[0]
    assert [c["max_abs_diff"] for c in a["checks"]] == [c["max_abs_diff"] for c in b["checks"]]
    assert a["trajectory"] == b["trajectory"]


def test_needs_padded_batches_and_enough_steps(batches):
    unpadded = [(s[:1, :3], t[:1, :3]) for s, t in batches]
    with pytest.raises(ValueError, match="padding"):
        verify.run_checks(CFG, SRC_V, TGT_V, PAD, unpadded, trajectory_cfg=TRAJECTORY)
    with pytest.raises(ValueError, match="at least 30"):
        verify.run_checks(CFG, SRC_V, TGT_V, PAD, batches[:5], trajectory_cfg=TRAJECTORY)


def test_the_trajectory_trains_the_recipes_model_at_most_at_its_cap():
    """A full-size recipe's trajectory runs at TRAJECTORY_SIZE; a smaller recipe's at its own
    size, never larger than the model the recipe trains; always a valid model, no dropout."""
    published = ModelConfig(6, 6, 512, 8, 2048, 0.1)
    assert measure.trajectory_model(published) == replace(
        published, **measure.TRAJECTORY_SIZE, dropout=0.0)
    tiny = ModelConfig(1, 1, 32, 2, 64, 0.1, norm_first=True)
    assert measure.trajectory_model(tiny) == replace(tiny, dropout=0)
    narrow = ModelConfig(3, 1, 48, 6, 512, 0.1)  # 48 = 6 heads of 8: its own heads, capped rest
    assert measure.trajectory_model(narrow) == ModelConfig(2, 1, 48, 6, 128, 0.0)
    for cfg in (published, tiny, narrow, ModelConfig(2, 2, 96, 12, 96, 0.1)):
        small = measure.trajectory_model(cfg)
        assert small.d_model % small.nhead == 0 and small.d_model <= min(cfg.d_model, 64)


# --- deliberately broken scratch models -------------------------------------------------


def after_build(monkeypatch, breakage):
    """Apply breakage(model) to every scratch model run_checks builds."""
    build = equivalence.build_model

    def broken_build(name, *args, **kwargs):
        model = build(name, *args, **kwargs)
        if name == "scratch":
            breakage(model)
        return model

    monkeypatch.setattr(equivalence, "build_model", broken_build)


def causal_off_by_one(monkeypatch):
    """Each target position may also see the next one."""
    monkeypatch.setattr(scratch_transformer, "causal_mask",
                        lambda size, device: torch.ones(size, size, dtype=torch.bool).tril(1))


def no_scale(monkeypatch):
    """Scores not divided by sqrt(d_k), in both attention paths."""
    def unscale(model):
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.scale = 1.0

    after_build(monkeypatch, unscale)


def padding_ignored(monkeypatch):
    """Padding mask that lets every query attend padded keys."""
    monkeypatch.setattr(scratch_transformer, "padding_mask",
                        lambda tokens, pad_id: torch.ones_like(tokens, dtype=torch.bool)[
                            :, None, None, :])


def keys_values_swapped(monkeypatch):
    """Packed projection read as [W_q; W_v; W_k] instead of nn.MultiheadAttention's order."""
    def project_self(self, x, start=None):
        q, k, v = [self.split_heads(t) for t in self.qkv(x).chunk(3, dim=-1)]
        return q, v, k

    monkeypatch.setattr(MultiHeadAttention, "project_self", project_self)


def math_softmax_over_queries(monkeypatch):
    """The explicit path normalises over queries; the fused path (used for outputs) is fine."""
    def softmax_over_queries(q, k, v, bias, scale, dropout):
        scores = (q * scale) @ k.transpose(-2, -1) + bias
        weights = scores.softmax(dim=-2).nan_to_num()
        return weights @ v, weights

    monkeypatch.setattr(scratch_attention, "scaled_dot_product_attention", softmax_over_queries)


def fused_ignores_mask(monkeypatch):
    """The fused path drops the mask; the explicit path (used for weights) is fine."""
    attend = MultiHeadAttention.attend

    def broken(self, q, k, v, mask, need_weights=False):
        return attend(self, q, k, v, mask if need_weights or not self.fused else None,
                      need_weights)

    monkeypatch.setattr(MultiHeadAttention, "attend", broken)


def embedding_detached(monkeypatch):
    """Outputs are right but no gradient reaches the embeddings."""
    monkeypatch.setattr(scratch_embedding.Embeddings, "forward",
                        lambda self, tokens: self.token(tokens).detach() * self.scale)


def generator_tied(monkeypatch):
    """Generator weight shared with the target embedding although the config says untied."""
    def tie(model):
        model.generator.weight = model.tgt_embed.token.weight

    after_build(monkeypatch, tie)


def heads_averaged(monkeypatch):
    """attention_maps returns head-averaged weights (B, T, S) instead of per head."""
    maps = scratch_transformer.ScratchTransformer.attention_maps

    def averaged(self, src, tgt_in):
        return {k: [w.mean(1) for w in ws] for k, ws in maps(self, src, tgt_in).items()}

    monkeypatch.setattr(scratch_transformer.ScratchTransformer, "attention_maps", averaged)


MultiHeadAttention = scratch_attention.MultiHeadAttention
# BF16: float32 weights under bf16 autocast, with bf16's tolerance (nmt.stages.verify.measure): the
# big bugs still fail it.
F32, F64, BF16 = " (float32)", " (float64)", " (bfloat16)"

# breakage: (checks that must fail, checks that must still pass)
BREAKAGES = {
    causal_off_by_one: (
        ["logits" + F64, "decoder output" + F32, "attention weights" + F64, "gradients" + F64,
         "training trajectory (float64)", "logits" + BF16, "gradients" + BF16],
        # Step-by-step decoding never sees the future, so it still matches the baseline.
        ["embeddings" + F64, "encoder memory" + F64, "kv-cache decoding" + F64,
         "kv-cache decoding" + BF16]),
    no_scale: (
        ["encoder memory" + F64, "logits" + F32, "attention weights" + F64, "gradients" + F64,
         "training trajectory (float64)", "encoder memory" + BF16, "logits" + BF16],
        ["embeddings" + F64, "parameter count", "embeddings" + BF16]),
    padding_ignored: (
        ["encoder memory" + F64, "logits" + F32, "attention weights" + F64, "gradients" + F64,
         "encoder memory" + BF16, "logits" + BF16],
        ["embeddings" + F64, "parameter count", "output shapes"]),
    keys_values_swapped: (
        ["encoder memory" + F64, "logits" + F32, "attention weights" + F64, "gradients" + F64],
        ["embeddings" + F64]),
    math_softmax_over_queries: (
        ["attention weights" + F64, "attention weights" + F32, "fused vs math attention" + F64,
         "attention weights" + BF16, "fused vs math attention" + BF16],
        ["logits" + F64, "gradients" + F64, "training trajectory (float64)"]),
    fused_ignores_mask: (
        ["encoder memory" + F64, "logits" + F64, "fused vs math attention" + F64,
         "fused vs math attention" + BF16],
        ["attention weights" + F64, "embeddings" + F64]),
    embedding_detached: (
        ["gradients" + F64, "gradients" + F32, "training trajectory (float64)",
         "gradients" + BF16],
        ["logits" + F64, "attention weights" + F64, "parameter count"]),
    generator_tied: (  # loading fills the shared matrix twice: the generator's copy wins
        ["parameter count", "embeddings" + F64, "logits" + F64, "gradients" + F64],
        ["encoder memory" + F64, "output shapes"]),
    heads_averaged: (
        ["output shapes", "attention weights" + F64],
        ["logits" + F64, "gradients" + F64]),
}


def assert_fails_exactly(checks: list[dict], passed: dict, must_fail, must_pass) -> None:
    """A planted bug fails the checks meant to catch it and leaves the others passing; the
    checks' table is the message."""
    table = verify.format_table({"checks": checks, "passed": False})
    assert not any(passed[name] for name in must_fail), table
    assert all(passed[name] for name in must_pass), table


@pytest.mark.parametrize("breakage", list(BREAKAGES), ids=lambda f: f.__name__)
def test_broken_model_fails_the_right_checks(breakage, batches, monkeypatch):
    breakage(monkeypatch)
    result, passed = run(batches)
    assert not result["passed"], verify.format_table(result)
    assert_fails_exactly(result["checks"], passed, *BREAKAGES[breakage])


# --- a configuration without a twin: rotary positions, property checks only ---------------

ROTARY = replace(CFG, positions="rotary")
PROPERTIES = ["parameter count", "output shapes", "causality (float64)",
              "source reaches every target position (float64)", "kv-cache decoding (float64)",
              "padding changes nothing (float64)", "fused vs math attention (float64)",
              "gradients finite (float64)"]


def test_rotary_passes_on_its_properties_and_reports_no_twin(batches, capsys):
    result = verify.run_checks(ROTARY, SRC_V, TGT_V, PAD, batches, trajectory_cfg=TRAJECTORY)
    table = verify.format_table(result)
    assert result["passed"], table
    assert not result["twin"] and "sinusoidal positions only" in result["twin_reason"]
    names = [c["name"] for c in result["checks"]]
    assert [n for n in names if n.startswith("scratch: ")] == [f"scratch: {p}" for p in PROPERTIES]
    # every model with checks that has rotary positions, and no other
    assert {n.split(": ")[0] for n in names} == {
        name for name, model in MODELS.items() if model.checks and "rotary" in model.positions}
    assert all(c["kind"] == "property" for c in result["checks"])
    assert "decoder_only" in result["skipped"] and result["trajectory"] == {}
    json.dumps(result, allow_nan=False)
    verify.print_checklist(result)
    out = capsys.readouterr().out
    assert "twin checks: none (the baseline (torch.nn.Transformer)" in out
    assert "decoder_only not checked: " in out


def rotary_run(batches):
    checks = verify.model_checks("scratch", ROTARY, SRC_V, TGT_V, PAD, batches)
    return checks, {c["name"].removeprefix("scratch: "): c["passed"] for c in checks}


def hook_skipped_in_beam_path(monkeypatch):
    """Positions act in the full-sequence paths (math and fused) but not in the cached step's
    beam_attention: the step's queries and keys (its explicit positions) go unrotated."""
    at_positions = MultiHeadAttention.at_positions
    monkeypatch.setattr(MultiHeadAttention, "at_positions", lambda self, x, start:
                        x if start is not None else at_positions(self, x, start))


def cached_position_off_by_one(monkeypatch):
    """Cached decoding rotates the newest position as if it were one further on."""
    at_positions = MultiHeadAttention.at_positions
    monkeypatch.setattr(MultiHeadAttention, "at_positions", lambda self, x, start:
                        at_positions(self, x, None if start is None else start + 1))


ROTARY_BREAKAGES = {
    hook_skipped_in_beam_path: (["kv-cache decoding (float64)"],
                                [p for p in PROPERTIES if p != "kv-cache decoding (float64)"]),
    cached_position_off_by_one: (["kv-cache decoding (float64)"],
                                 [p for p in PROPERTIES if p != "kv-cache decoding (float64)"]),
}


@pytest.mark.parametrize("breakage", list(ROTARY_BREAKAGES), ids=lambda f: f.__name__)
def test_broken_rotary_fails_the_right_property_checks(breakage, batches, monkeypatch):
    assert all(rotary_run(batches)[1].values())  # unbroken first
    breakage(monkeypatch)
    assert_fails_exactly(*rotary_run(batches), *ROTARY_BREAKAGES[breakage])
    # The default (sinusoidal) model has the identity hook: the same breakage leaves it whole.
    default = verify.model_checks("scratch", CFG, SRC_V, TGT_V, PAD, batches)
    assert all(c["passed"] for c in default), verify.format_table(
        {"checks": default, "passed": False})


def test_a_measure_that_raises_fails_its_check_with_the_error():
    checklist = Checklist(kind="property")
    checklist.check("divides", 0.0, lambda: 1 / 0)
    checklist.check("fine", 0.0, lambda: 0.0)
    broken, fine = checklist.checks
    assert not broken["passed"] and broken["max_abs_diff"] == float("inf")
    assert broken["error"].startswith("ZeroDivisionError") and "error" not in fine
    assert not checklist.passed and fine["passed"]
    assert "divides: ZeroDivisionError" in verify.format_table(
        {"checks": checklist.checks, "passed": False})


def test_max_abs_diff_shapes_and_nan():
    assert verify.max_abs_diff(torch.zeros(2), torch.zeros(3)) == float("inf")
    assert verify.max_abs_diff(torch.zeros(2), torch.tensor([0.0, -0.5])) == 0.5
    nan = verify.max_abs_diff(torch.zeros(1), torch.tensor([float("nan")]))
    assert not nan <= 1.0  # a NaN difference never passes


def test_baseline_attention_maps_are_per_head():
    torch.manual_seed(0)
    baseline, _ = equivalence.build_pair(CFG, SRC_V, TGT_V, PAD)
    src, tgt = synthetic_batches(1, 3, SRC_V, TGT_V)[0]
    maps = baseline.attention_maps(src, tgt[:, :-1])  # fast path or not
    B, S, T = src.size(0), src.size(1), tgt.size(1) - 1
    assert [w.shape for w in maps["encoder_self"]] == [(B, CFG.nhead, S, S)] * 2
    assert [w.shape for w in maps["decoder_cross"]] == [(B, CFG.nhead, T, S)] * 2
    assert isinstance(baseline.transformer, nn.Transformer)


def test_the_stage_writes_a_failed_shape_check_as_null(prepared, tmp_path, monkeypatch, capsys):
    """A shape mismatch measures inf: the stage prints its table, writes strict JSON (null)
    and reports failure instead of dying on the way."""
    from conftest import REPO
    from nmt.pipeline.params import load_params
    from nmt.pipeline.recipes import resolve

    settings = resolve(load_params(REPO / "params.yaml"), "published")
    settings["model"].update(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                             dim_feedforward=32, decoder_only_layers=1)
    heads_averaged(monkeypatch)
    out = tmp_path / "verify.json"
    assert not verify.verify(settings, verify.Paths(prepared["tokenized"], prepared["word"], out),
                             "scratch")
    written = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    assert written["output shapes"]["max_abs_diff"] == 3.0  # one mismatch a kind of attention
    assert written["attention weights" + F32]["max_abs_diff"] is None
    assert "attention weights (float32)" in capsys.readouterr().out


def test_the_stage_passes_a_rotary_recipe_on_its_properties(prepared, tmp_path, capsys):
    """model.positions rotary: no twin, the scratch model's properties pass, the JSON and the
    table say so."""
    from conftest import REPO
    from nmt.pipeline.params import load_params
    from nmt.pipeline.recipes import resolve

    settings = resolve(load_params(REPO / "params.yaml"), "published")
    assert settings["model"]["positions"] == "sinusoidal"  # the default in params.yaml
    settings["model"].update(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                             dim_feedforward=32, positions="rotary")
    out = tmp_path / "verify.json"
    assert verify.verify(settings, verify.Paths(prepared["tokenized"], prepared["word"], out),
                         "scratch")
    written = json.loads(out.read_text())
    assert written["passed"] and not written["twin"] and written["twin_reason"]
    assert {c["kind"] for c in written["checks"]} == {"property"}
    assert "twin checks: none" in capsys.readouterr().out
