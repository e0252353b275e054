"""NMT_ATTENTION_KERNELS (nmt.core.runtime.limit_attention_kernels): the attention kernels a
process may use, the route around a kernel tools/gpu/preflight.py found wrong. The switches are
torch.backends.cuda's, which exist and are read on a CPU build too."""

from __future__ import annotations

import pytest
import torch

from nmt.core.errors import NmtError
from nmt.core.runtime import ATTENTION_KERNELS_ENV, limit_attention_kernels

SWITCHES = {"flash": torch.backends.cuda.flash_sdp_enabled,
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled,
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled,
            "math": torch.backends.cuda.math_sdp_enabled}


@pytest.fixture(autouse=True)
def restore_switches():
    before = {name: enabled() for name, enabled in SWITCHES.items()}
    yield
    torch.backends.cuda.enable_flash_sdp(before["flash"])
    torch.backends.cuda.enable_mem_efficient_sdp(before["efficient"])
    torch.backends.cuda.enable_cudnn_sdp(before["cudnn"])
    torch.backends.cuda.enable_math_sdp(before["math"])


def test_unset_changes_no_switch(monkeypatch):
    monkeypatch.delenv(ATTENTION_KERNELS_ENV, raising=False)
    before = {name: enabled() for name, enabled in SWITCHES.items()}
    assert limit_attention_kernels() == "any"
    assert {name: enabled() for name, enabled in SWITCHES.items()} == before


def test_only_the_named_kernels_stay_on(monkeypatch):
    monkeypatch.setenv(ATTENTION_KERNELS_ENV, "efficient, math")
    assert limit_attention_kernels() == "efficient,math"
    assert {name: enabled() for name, enabled in SWITCHES.items()} == {
        "flash": False, "efficient": True, "cudnn": False, "math": True}


@pytest.mark.parametrize("value", ["efficient", "cudnn,fast,math"])
def test_a_setting_without_math_or_with_an_unknown_name_is_one_line(monkeypatch, value):
    monkeypatch.setenv(ATTENTION_KERNELS_ENV, value)
    with pytest.raises(NmtError, match=f"{ATTENTION_KERNELS_ENV}=.*fix:"):
        limit_attention_kernels()


def test_any_allows_every_kernel_whatever_the_environment_says(monkeypatch):
    """train.attention_kernels: any, the A/B runs' setting (recipe published_cudnn)."""
    monkeypatch.setenv(ATTENTION_KERNELS_ENV, "efficient,math")
    assert limit_attention_kernels("route") == "efficient,math"  # cudnn and flash off now
    assert limit_attention_kernels("any") == "any"
    assert all(enabled() for enabled in SWITCHES.values())


def test_an_unknown_setting_is_one_line():
    with pytest.raises(NmtError, match="train.attention_kernels: 'cudnn' is neither route nor "
                       "any \\(fix:"):
        limit_attention_kernels("cudnn")


def test_a_checkpoint_trained_before_the_setting_reads_as_route():
    """A best.pt whose train: section predates train.attention_kernels is of a routed run: no
    difference against route, one against any."""
    from dataclasses import asdict

    from conftest import REPO
    from nmt.core.checkpoint import setting_differences
    from nmt.models import ModelConfig
    from nmt.pipeline.params import load_params
    from nmt.pipeline.recipes import resolve

    settings = resolve(load_params(REPO / "params.yaml"), "published")
    older = {k: v for k, v in settings["train"].items() if k != "attention_kernels"}
    ckpt = {"model_config": asdict(ModelConfig.from_dict(settings["model"])),
            "params": {"train": older}}
    assert settings["train"]["attention_kernels"] == "route"
    assert setting_differences(ckpt, settings) == []
    settings["train"]["attention_kernels"] = "any"
    assert setting_differences(ckpt, settings) == [
        "train.attention_kernels (trained route, now any)"]


@pytest.mark.parametrize("setting, env, recorded", [("route", "efficient,math", "efficient,math"),
                                                    ("any", "efficient,math", "any")])
def test_a_run_records_the_kernels_it_was_allowed(prepared, tmp_path, monkeypatch, setting, env,
                                                  recorded):
    from nmt.core.runs import Run
    from nmt.training.loop import train
    from train_helpers import tiny_data, tiny_params, train_paths

    data = tiny_data(prepared, tmp_path / "data", train=64, val=32)
    monkeypatch.setenv(ATTENTION_KERNELS_ENV, env)
    summary = train(tiny_params(epochs=1, attention_kernels=setting),
                    train_paths(data, tmp_path / "results", Run("published", "scratch", 0)))
    assert summary["attention_kernels"] == recorded
