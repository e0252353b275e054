"""workflow/profiles/gpu: many trainings at once on one large GPU, each one's CUDA memory
bounded (--gpu-mem-mb from the rule's gpu_mem_mb resource), under Snakemake itself."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
import yaml

from conftest import REPO, edit_params
from nmt.cli import main
from nmt.core.errors import NmtError
from nmt.core.process import GPU_MEMORY_ENV
from nmt.core.runtime import bound_gpu_memory
from nmt.pipeline import declaration
from tiny import run, scratch_copy

PROFILE = ["--workflow-profile", "workflow/profiles/gpu"]
SETTINGS = yaml.safe_load((REPO / "workflow/profiles/gpu/config.yaml").read_text())
RESOURCES = dict(item.split("=") for item in SETTINGS["resources"])
TRAIN_MB = SETTINGS["set-resources"]["train"]["gpu_mem_mb"]
STUDY = 2 * 3 * 3  # trainings: 2 recipes x 3 models x 3 seeds
H100_MB = 85_017  # cuda's memory of an H100 80GB (reports/gpu-first-run/train-*.log)
CONTEXT_MB = 600  # a CUDA context, outside the allocator and its bound


def most_trainings_at_once(output: str) -> int:
    """From Snakemake's own output: the most train jobs started and not yet finished."""
    running, most, rule = set(), 0, None
    for line in output.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif (m := re.match(r"^\s+jobid: (\d+)$", line)) and rule == "train":
            running.add(m.group(1))
            most = max(most, len(running))
        elif m := re.match(r"^Finished jobid: (\d+)", line):
            running.discard(m.group(1))
    return most


def test_the_gpu_profile_plans_the_whole_comparison(tmp_path):
    """A dry run lists every job; trainings get 1 thread and a 3,800 MB bound, bench the
    whole GPU (so it is timed alone)."""
    out = run(["snakemake", "-n", *PROFILE], scratch_copy(tmp_path))
    counts = dict(re.findall(r"^(train|evaluate|bench)\s+(\d+)$", out, re.MULTILINE))
    assert counts == {"train": "6", "evaluate": "6", "bench": "1"}  # 2 recipes x 3 x 1 seed
    trainings = re.findall(r"^Shell command: nmt train .*$", out, re.MULTILINE)
    assert len(trainings) == 6
    assert all("--threads 1 --gpu-mem-mb 3800 " in cmd for cmd in trainings)
    assert re.search(r"resources: .*gpu=18, gpu_mem_mb=72000", out)  # bench


def committed_peaks_mb() -> list[float]:
    """The peak CUDA memory of every committed GPU training (train.json's, in the H200 run's
    report) and bench's (both GPU runs)."""
    table = (REPO / "reports/h200-published/report.md").read_text()
    peaks = [float(row.split("|")[-2]) for row in table.splitlines()
             if re.match(r"^\| published-\w+-s0 +\| cuda ", row)]
    assert len(peaks) == 3, "the report's training table moved: read its peak MB column"
    for bench in ("gpu-first-run/bench.json", "h200-published/bench-eager.json"):
        peaks += json.loads((REPO / "reports" / bench).read_text())["peak_memory_mib"].values()
    return peaks


def test_the_gpu_profile_fits_the_whole_study_on_an_h100():
    """The 18 trainings at once: a unit each, one thread each (at most 2 over the 16 cores),
    their bounds within the total, the total and their CUDA contexts within an H100's memory,
    and each bound 30% or more above the highest peak a GPU run measured."""
    assert int(RESOURCES["gpu"]) >= STUDY and SETTINGS["cores"] >= STUDY
    assert SETTINGS["set-threads"]["train"] * STUDY <= 16 + 2
    assert STUDY * TRAIN_MB <= int(RESOURCES["gpu_mem_mb"])
    assert int(RESOURCES["gpu_mem_mb"]) + STUDY * CONTEXT_MB <= H100_MB
    assert TRAIN_MB >= 1.3 * max(committed_peaks_mb())
    assert SETTINGS["set-resources"]["bench"] == {"gpu": int(RESOURCES["gpu"]),
                                                  "gpu_mem_mb": int(RESOURCES["gpu_mem_mb"])}


@pytest.mark.slow
def test_the_gpu_profile_runs_trainings_at_once(tmp_path, mirror):
    """Four tiny trainings (CPU, 1 thread each) run at the same time under the profile, each
    told its memory bound (a no-op on the CPU that says so). Four seeds of one model: the
    profile schedules trainings, whatever their model, and one model is one verification
    before them, not two."""
    root = scratch_copy(tmp_path)
    seeds = [0, 1, 2, 3]
    edit_params(root / "params.yaml", pipeline={"recipes": ["published"], "models": ["baseline"],
                                                "seeds": seeds, "export": []})
    targets = [f"results/published-baseline-s{s}/best.pt" for s in seeds]
    out = run(["snakemake", *targets, *PROFILE, "--set-threads", "train=1", "verify=1"], root)
    assert most_trainings_at_once(out) == 4, out[-3000:]
    for log in (root / "logs").glob("train-*.log"):
        assert f"NMT_GPU_MEM_MB={TRAIN_MB}: no CUDA memory to bound on cpu" in log.read_text()


def test_the_memory_bound_is_a_resource_for_snakemake_and_a_number_for_dvc():
    """The declared gpu_mem_mb: Snakemake's rule passes its resource (a profile raises it),
    DVC's command the declared 0 (NMT_GPU_MEM_MB then decides)."""
    declared = declaration.load(REPO / declaration.DECLARATION)["train"]
    assert declared.gpu_mem_mb == 0 and "--gpu-mem-mb {gpu_mem_mb}" in declared.cmd
    dvc = yaml.safe_load(declaration.render_dvc(REPO / declaration.DECLARATION))["stages"]["train"]
    assert dvc["cmd"].endswith("--threads 8 --gpu-mem-mb 0")
    rule = declaration.smk_rule(declared, declaration.load(REPO / declaration.DECLARATION))
    assert "        gpu_mem_mb=0," in rule and "--gpu-mem-mb {resources.gpu_mem_mb}" in rule


def test_the_memory_bound_comes_from_the_command_line_or_the_environment(monkeypatch, caplog):
    monkeypatch.delenv(GPU_MEMORY_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="nmt.runtime"):
        bound_gpu_memory(torch.device("cpu"))  # unset: nothing to say
        assert not caplog.records
        monkeypatch.setenv(GPU_MEMORY_ENV, "9000")
        bound_gpu_memory(torch.device("cpu"))
    assert caplog.messages == [f"{GPU_MEMORY_ENV}=9000: no CUDA memory to bound on cpu"]
    monkeypatch.setenv(GPU_MEMORY_ENV, "9 GB")
    with pytest.raises(NmtError, match="not a whole number of megabytes"):
        bound_gpu_memory(torch.device("cpu"))


def test_the_memory_bound_names_the_gpu_by_its_index(monkeypatch):
    """On the first GPU run, `cuda` (no index) reached torch.cuda.set_per_process_memory_fraction,
    which wants one (torch 2.11: ValueError). No GPU here, so torch.cuda's three calls are
    stood in for; the argument check is torch's own (_get_device_index, no CUDA needed)."""
    from torch.cuda._utils import _get_device_index

    calls = []
    monkeypatch.setenv(GPU_MEMORY_ENV, "9000")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: type("Props", (), {"total_memory": 85_017 * 10**6}))
    def set_fraction(fraction, device):
        calls.append((fraction, _get_device_index(device)))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", set_fraction)
    bound_gpu_memory(torch.device("cuda"))
    bound_gpu_memory(torch.device("cuda:1"))
    assert [index for _, index in calls] == [0, 1]
    assert calls[0][0] == pytest.approx(9000 / 85_017)
    with pytest.raises(ValueError, match="specified index"):  # what the GPU run hit
        _get_device_index(torch.device("cuda"))


def test_a_negative_memory_bound_stops_with_one_line(capsys):
    assert main(["train", "--model", "scratch", "--gpu-mem-mb", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("nmt train: error: --gpu-mem-mb -1 is negative (fix: a number of megabytes, "
                   "or 0 for no bound)")
