"""tools/gpu/preflight.py at tiny size on the CPU: its report holds every part, and part B's
checks catch an attention function that drops out wrongly, redraws its mask in backward or
ignores the mask."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO
from train_helpers import tiny_data

spec = importlib.util.spec_from_file_location("gpu_preflight", REPO / "tools/gpu/preflight.py")
preflight = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preflight)

TINY = {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
        "dim_feedforward": 64}
OPTIONS = SimpleNamespace(models=["baseline", "scratch"], parts="ABC", draws=4, batches=2,
                          updates=2)


@pytest.fixture(scope="module")
def tiny(prepared, tmp_path_factory, one_thread):
    """(settings, tiny model config, vocabulary sizes, train batches) of the published recipe."""
    data = tiny_data(prepared, tmp_path_factory.mktemp("preflight"), train=200, val=20)
    settings, cfg, vocab, batches = preflight.load("published", data["tokenized"].parent,
                                                   torch.device("cpu"))
    # bf16, what `auto` is on a GPU with tensor cores (where preflight runs), on any CPU: the
    # CPU's `auto` timed the recipe's three models at full size both ways, 50 of the 52 s.
    settings["train"]["precision"] = "bf16"
    return settings, dataclasses.replace(cfg, **TINY), vocab, batches


@pytest.fixture(scope="module")
def report(tiny):
    return preflight.run(*tiny, torch.device("cpu"), OPTIONS)


def test_report_has_every_part(report):
    assert report["passed"], report["verdict"]
    assert report["verdict"].startswith("preflight: PASS")
    json.dumps(report, default=str)  # what main() writes
    for model in OPTIONS.models:
        kinds = {t["where"] for t in report["A"][model]["call_types"]}
        assert kinds == {"encoder self", "decoder self", "decoder cross"}
    for model in OPTIONS.models:  # a bias in the queries' dtype, which the kernel takes as it is
        for call in report["A"][model]["call_types"]:  # (nmt.models.masks)
            assert call["mask"]["dtype"] == call["q"]["dtype"] != "torch.bool"
    rows = report["B"]["results"]
    assert len(rows) == 6 * len(preflight.BACKENDS)
    for row in rows:
        if row["backend"] in ("default", "math"):  # the CPU has both, with dropout
            assert row["exact"]["available"] and row["dropout"]["available"]
            assert abs(row["dropout"]["keep_rate"] - 0.9) < 0.03
    for phase in ("init", "after_2_updates"):
        assert report["C"][phase]["cross_cosine_halves"] > 0.9


@pytest.fixture(scope="module")
def call_type(tiny):
    """The scratch decoder's self-attention call (bool mask, causal and padding)."""
    settings, cfg, vocab, batches = tiny
    torch.manual_seed(0)
    model = preflight.build_model("scratch", cfg, *vocab)
    _, call_types = preflight.part_a({"scratch": model}, *batches.batch(batches.indices(1)[0]),
                                     torch.device("cpu"), "fp32")
    return next(t for t in call_types if t["where"] == "decoder self")


class NewMaskInBackward(torch.autograd.Function):
    """Dropped-out attention whose backward draws a fresh dropout mask for dv."""

    @staticmethod
    def forward(ctx, q, k, v, mask, p, scale):
        weights = ((q @ k.transpose(-2, -1)) * scale + mask).softmax(-1)  # mask: the bias
        ctx.save_for_backward(weights, k)
        ctx.p = p
        return F.dropout(weights, p) @ v

    @staticmethod
    def backward(ctx, grad):
        weights, k = ctx.saved_tensors
        dv = F.dropout(weights, ctx.p).transpose(-2, -1) @ grad
        return torch.zeros_like(grad), torch.zeros_like(k), dv, None, None, None


def wrong_keep_rate(q, k, v, mask, p, is_causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=2 * p, scale=scale)


def new_mask_in_backward(q, k, v, mask, p, is_causal, scale):
    if p == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return NewMaskInBackward.apply(q, k, v, mask, p, scale)


def ignores_mask(q, k, v, mask, p, is_causal, scale):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, scale=scale)


@pytest.mark.parametrize("fault, problem", [(wrong_keep_rate, "keep rate"),
                                            (new_mask_in_backward, "new mask in backward"),
                                            (ignores_mask, "masked key got weight")])
def test_part_b_catches_a_planted_fault(call_type, fault, problem):
    result = preflight.part_b([call_type], torch.device("cpu"), "fp32", 0.1, {"planted": fault})
    assert not result["passed"]
    assert any(problem in failure for failure in result["failures"]), result["failures"]


def test_part_b_passes_the_math_kernel(call_type):
    math = preflight.sdpa_backend(torch.nn.attention.SDPBackend.MATH)
    result = preflight.part_b([call_type], torch.device("cpu"), "bf16", 0.1, {"math": math})
    assert result["passed"], result["failures"]


def test_a_failed_kernel_is_routed_around(call_type):
    """A backend that fails a check is left out of the NMT_ATTENTION_KERNELS setting the
    preflight prints; math always stays, the others that passed too."""
    math = preflight.sdpa_backend(torch.nn.attention.SDPBackend.MATH)
    result = preflight.part_b([call_type], torch.device("cpu"), "fp32", 0.1,
                              {"efficient": wrong_keep_rate, "math": math})
    assert not result["passed"]
    assert preflight.route_around(result["results"]) == "flash,cudnn,math"
