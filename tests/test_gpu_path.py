"""The GPU's training path, run on the CPU: bf16 autocast (train.precision), padded batch
lengths (train.pad_multiple), torch.compile with dynamic shapes (train.compile, inductor), and
the device report in train.json. The GPU path ran once, on an H100; these tests run it on the CPU.

Tolerances (stated once, here):
- padding: the same batch padded to a multiple of 8 gives the same loss and gradients in
  float64 within 1e-10 (pads are masked; only the summation order may change);
- bf16 vs fp32 training: every epoch's loss within BF16_LOSS_TOLERANCE, 0.01 nats on losses of
  about 7 (measured: 2e-4; bf16 keeps ~3 significant digits, and updates compound them);
- compiled vs eager: every epoch's loss within 1e-4, the final weights within 1e-3 relative
  (L2 norm of the difference over the norm; measured 5.7e-5). Inductor fuses and reorders
  float32 reductions; Adam turns that noise in near-zero gradients into lr-sized steps, so the
  largest single weight difference (6e-4 at lr 1e-3) measures Adam, not the compiler.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import re
import shutil
import signal

import pytest
import torch
from torch._dynamo.utils import counters

from nmt import cli
from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs, pad, padded_length
from nmt.core.loss import token_loss
from nmt.core.runs import Run
from nmt.core.runtime import cpu_features, resolve_compile
from nmt.models import MODELS, ModelConfig, build_model
from nmt.stages.evaluate import Paths as EvalPaths
from nmt.stages.evaluate import evaluate
from nmt.training import precision_cache, precision_timing
from nmt.training.loop import train
from nmt.training.step import compiled
from train_helpers import (
    TINY_MODEL,
    nmt_process,
    params_file,
    tiny_data,
    tiny_params,
    train_argv,
    train_paths,
)

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = Run("published", "scratch", 0)
BF16_LOSS_TOLERANCE = 0.01
COMPILE_TOLERANCE = 1e-4  # on losses
COMPILE_WEIGHTS_TOLERANCE = 1e-3  # relative L2 norm
EVERY_STEP = 1e-9  # save_every_minutes: a resume state after every update


@pytest.fixture(scope="module")
def data(prepared, tmp_path_factory):
    """200 training pairs, 60 validation pairs, and test_2016_flickr's first 100 sentences."""
    out = tiny_data(prepared, tmp_path_factory.mktemp("gpu_path"), train=200, val=60)
    for path in prepared["tokenized"].glob("test_2016_flickr.*"):
        shutil.copy(path, out["tokenized"])
    return out


@pytest.fixture(scope="module")
def pairs(data):
    return load_pairs(data["tokenized"], "train", *load_codecs(data["vocab"] / "published"), 256)


def test_padded_length_rounds_up_but_not_past_the_limit():
    assert [padded_length(n, 8) for n in (1, 8, 9, 13, 16)] == [8, 8, 16, 16, 16]
    assert padded_length(13, 1) == 13  # 1: off
    assert padded_length(250, 8, limit=256) == 256
    assert padded_length(253, 8, limit=254) == 254  # 256 would overrun the positional table
    batch = pad([[2, 5, 3], [2, 3]], multiple=8)
    assert batch.tolist() == [[2, 5, 3] + [PAD_ID] * 5, [2, 3] + [PAD_ID] * 6]


def loss_and_grads(model, src, tgt) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed token loss of one batch and the flat gradient of every parameter."""
    model.zero_grad()
    loss, _ = token_loss(model, src, tgt, "cpu", precision="fp32")
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()
                                     if p.grad is not None])


@pytest.mark.parametrize("name", ["baseline", "scratch", "decoder_only"])
def test_padding_to_a_multiple_changes_no_loss(pairs, name):
    """Pads are masked, so extra pad columns change shapes, not the loss or the gradients."""
    torch.manual_seed(0)
    model = build_model(name, ModelConfig(**{**TINY_MODEL, "dropout": 0.0}), 2000, 2000)
    model = model.double()
    plain, padded = (Batches(pairs[:96], "sentences", 32, 0, shuffle=False, pad_multiple=m,
                             max_len=256) for m in (1, 8))
    for (src, tgt), (src8, tgt8) in zip(plain, padded, strict=True):
        assert src8.size(1) % 8 == 0 and tgt8.size(1) % 8 == 0
        assert (src8.size(1), tgt8.size(1)) != (src.size(1), tgt.size(1))  # really padded
        loss, grads = loss_and_grads(model, src, tgt)
        loss8, grads8 = loss_and_grads(model, src8, tgt8)
        assert abs(loss - loss8).item() <= 1e-10 * abs(loss).item()
        assert (grads - grads8).abs().max().item() <= 1e-10


def graphs_compiled(pairs, pad_multiples: tuple[int, ...]) -> tuple[list, int]:
    """(distinct batch shapes for each pad multiple, graphs dynamo compiled) over one epoch of
    real sentence batches for each pad multiple in turn, all through one scratch model
    compiled as train compiles it (nmt.training.step.compiled), with aot_eager for inductor:
    it traces forward and backward alike, without generating code."""
    torch.manual_seed(0)
    model = build_model("scratch", ModelConfig(**TINY_MODEL), 2000, 2000)
    step_model = compiled(model, backend="aot_eager")
    shapes = []
    for multiple in pad_multiples:
        batches = Batches(pairs, "sentences", 32, 400, shuffle=True, seed=0, pad_multiple=multiple,
                          max_len=256)
        shapes.append(set())
        for src, tgt in batches:
            shapes[-1].add((*src.shape, tgt.size(1)))
            token_loss(step_model, src, tgt, "cpu", precision="fp32")[0].backward()
    return [len(seen) for seen in shapes], counters["stats"]["unique_graphs"]


@pytest.mark.slow  # a compilation of forward and backward: 20-30 s, the compile tests' tier
def test_one_graph_for_every_batch_shape_padded_or_not(pairs, capsys):
    """Compiled for dynamic shapes without duck shaping, the model compiles once, whatever
    the lengths: one compilation serves an epoch of unpadded batches and then one padded to a
    multiple of 8 (with duck shaping it compiled twice here, padded or not; the two used to
    compile apart, and two compilations took twice the time to show the same). Padding to a
    multiple of 8 only lowers the number of distinct shapes (token batches: 9 either way)."""
    (shapes, shapes8), graphs = graphs_compiled(pairs, (1, 8))
    with capsys.disabled():
        print(f"\ndistinct shapes {shapes} -> {shapes8} with pad_multiple 8, "
              f"graphs compiled {graphs}")
    assert shapes8 < shapes
    assert graphs == 1


def fit(data, tmp_path, name: str, **settings) -> tuple[dict, list[dict]]:
    """Train in this process (the run's folder under tmp_path / name); (train.json, history)."""
    out = RUN.files(tmp_path / name)
    summary = train(tiny_params(**settings), train_paths(data, tmp_path / name, RUN))
    with open(out.history) as f:
        history = list(csv.DictReader(f))
    assert json.loads(out.summary.read_text()) == json.loads(json.dumps(summary))
    return summary, history


def assert_device_report(summary: dict, precision: str, compiled: bool) -> None:
    assert summary["precision"] == precision and summary["compile"] is compiled
    assert "CPU" in summary["device_name"] and summary["device"] == "cpu"
    assert summary["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(summary["cpu_bf16"]) <= {"avx512_bf16", "amx_bf16"}
    assert summary["peak_memory_of"] == "process peak RSS" and summary["peak_memory_mb"] > 50
    assert summary["tokens_per_second"] > 0 and summary["threads"] == torch.get_num_threads()
    assert ("compile_seconds" in summary) is compiled


def test_bf16_training_is_finite_and_close_to_fp32(data, tmp_path, capsys):
    runs = {p: fit(data, tmp_path, p, precision=p) for p in ("fp32", "bf16")}
    for precision, (summary, _) in runs.items():
        assert_device_report(summary, precision, compiled=False)
    (fp32, fp32_rows), (bf16, bf16_rows) = runs["fp32"], runs["bf16"]
    diffs = [abs(float(a[k]) - float(b[k])) for a, b in zip(fp32_rows, bf16_rows, strict=True)
             for k in ("train_loss", "valid_loss")]
    assert all(math.isfinite(float(r[k])) for r in bf16_rows for k in ("train_loss", "valid_loss"))
    assert max(diffs) <= BF16_LOSS_TOLERANCE, diffs
    assert max(diffs) > 0  # bf16 really ran: autocast on the CPU is no no-op
    with capsys.disabled():
        print(f"\nbf16 vs fp32: largest loss difference {max(diffs):.4f}; s/epoch "
              f"{bf16['seconds_per_epoch']} vs {fp32['seconds_per_epoch']}")


# /proc/cpuinfo of three CPUs: a Sapphire Rapids Xeon (AVX512-BF16 and AMX), an AVX2 laptop,
# an ARM board (no `flags` line; its bf16 is not one torch's CPU autocast uses natively here).
XEON = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse2 "
        "avx2 avx512f avx512_bf16 amx_bf16 amx_tile\nbugs\t\t: spectre_v1\n")
LAPTOP = "model name\t: AMD Ryzen 5 3600\nflags\t\t: fpu sse2 avx avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n"


def test_the_cpu_report_names_its_native_bf16_instructions():
    """train.json on a CPU carries torch's vector kind and the bf16 instructions /proc/cpuinfo
    lists: the Xeon has both, the laptop and the ARM board none."""
    assert cpu_features(XEON)["cpu_bf16"] == ["avx512_bf16", "amx_bf16"]
    assert cpu_features(LAPTOP)["cpu_bf16"] == [] == cpu_features(ARM)["cpu_bf16"]
    assert cpu_features(LAPTOP)["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize(("faster", "trains_in", "decodes_in"),
                         [("bf16", "bf16", "fp32"), ("fp32", "fp32", "bf16")])
def test_auto_precision_trains_and_decodes_in_what_the_calibration_found_faster(
        data, tmp_path, monkeypatch, faster, trains_in, decodes_in):
    """train.precision `auto` on a CPU: training in the precision the calibration of an update
    found faster, the validation's decoding in the one decoding's found faster (a stand-in
    calibration, which prefers `faster` for updates and the other for decoding); train.json
    says which ran and why, with the measured ratio."""
    def stand_in(workload):
        wins = faster if workload.kind == "train" else {"bf16": "fp32", "fp32": "bf16"}[faster]
        pair = (1.0, 0.5 if wins == "bf16" else 2.0)
        return {m: precision_timing.Timing((pair,) * precision_timing.MIN_PAIRS) for m in MODELS}

    monkeypatch.setattr(precision_timing, "measure", stand_in)
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path))  # no other test's figures
    summary, _ = fit(data, tmp_path, "auto", precision="auto", epochs=1)
    assert (summary["precision"], summary["decode_precision"]) == (trains_in, decodes_in)
    assert summary["bf16_speedup"] == (2.0 if trains_in == "bf16" else 0.5)
    assert summary["decode_bf16_speedup"] == (2.0 if decodes_in == "bf16" else 0.5)
    every_model = ", ".join(rf"{m} [.0-9]+x \(spread 0%\)" for m in MODELS)  # the registry's
    assert re.search(rf"auto: an update ran {every_model} as fast in bf16",
                     summary["precision_reason"])
    assert summary["decode_precision_reason"].startswith("auto: greedy decoding")


def test_compile_auto_compiles_nowhere():
    assert resolve_compile("auto", torch.device("cuda")) is False
    assert resolve_compile("auto", torch.device("cpu")) is False
    assert resolve_compile(True, torch.device("cpu")) is True
    assert resolve_compile(False, torch.device("cuda")) is False


@pytest.mark.slow
def test_a_failed_compile_trains_eagerly_and_says_why(data, tmp_path):
    """A compiler that cannot run (here inductor's C++ compiler, CXX named to a path that does
    not exist; on a GPU it would be Triton's) costs the speed, not the run: one line says why,
    the run goes on eagerly from its first update, exactly as an eager run (dropout 0: the
    failed attempt drew no random numbers), and train.json records it. In a process of its
    own: inductor remembers the compiler it found."""
    runs = {}
    for name, compile_on in (("eager", False), ("failed", True)):
        (tmp_path / name).mkdir()
        argv = train_argv(params_file(tmp_path / name, {"dropout": 0.0}, epochs=1,
                                      compile=compile_on),
                          {**data, "results": tmp_path / name / "results"})
        proc = nmt_process(argv, timeout=600, env={"CXX": str(tmp_path / "no-such-g++")})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = (proc.stderr, RUN.files(tmp_path / name / "results"))
    (_, eager), (stderr, failed) = runs["eager"], runs["failed"]
    warnings = re.findall(r"nmt\.train: torch\.compile failed.*", stderr)  # (after a bar)
    assert warnings == [
        f"nmt.train: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found in "
        f"torch._inductor.config.cpp.cxx: (None, '{tmp_path / 'no-such-g++'}')): training "
        "eagerly from here"], warnings
    summary = json.loads(failed.summary.read_text())
    assert summary["compile"] is False and "no-such-g++" in summary["compile_failed"]
    assert "compile_seconds" not in summary
    assert "compile_failed" not in json.loads(eager.summary.read_text())
    learnt = ("epoch", "train_loss", "valid_loss", "lr")  # not the seconds
    rows = {n: [{k: r[k] for k in learnt} for r in csv.DictReader(open(f.history))]
            for n, f in (("eager", eager), ("failed", failed))}
    assert rows["failed"] == rows["eager"]


def test_evaluate_scores_in_the_precision_trained_in(data, tmp_path):
    """The bf16 run is scored under bf16 (test loss and decoding), close to fp32 scoring."""
    fit(data, tmp_path, "run", precision="bf16", epochs=1)
    scores = {}
    for precision in ("bf16", "fp32"):
        settings = tiny_params(precision=precision, epochs=1)  # the run's own settings
        settings["evaluate"] |= {"testsets": ["test_2016_flickr"], "beam_size": 2,
                                 "batch_size": 100}
        files = RUN.files(tmp_path / "run")
        scores[precision] = evaluate(settings, EvalPaths(data["tokenized"],
                                                         data["vocab"] / "published", files))
        assert json.loads(files.evaluation.read_text())["precision"] == precision
    bf16, fp32 = (scores[p]["test_2016_flickr"] for p in ("bf16", "fp32"))
    assert math.isfinite(bf16["loss"]) and bf16["loss"] != fp32["loss"]
    assert abs(bf16["loss"] - fp32["loss"]) <= BF16_LOSS_TOLERANCE


def relative_difference(a, b) -> float:
    """||wa - wb|| / ||wa|| over all the weights of two checkpoints."""
    wa, wb = (torch.load(p, weights_only=True)["state_dict"] for p in (a, b))
    va, vb = (torch.cat([w[k].double().flatten() for k in wa]) for w in (wa, wb))
    return ((va - vb).norm() / va.norm()).item()


@pytest.mark.slow
def test_compiled_run_resumes_after_a_kill_and_matches_eager(data, tmp_path, caplog):
    """train.compile on the CPU (inductor, dynamic shapes, padded lengths): killed at update 10
    of 14, resumed, it ends where the eager run ends. Dropout 0: inductor draws its own random
    numbers, so only a deterministic model can match the eager one."""
    runs = {}
    for compile_on in (False, True):
        root = tmp_path / ("compiled" if compile_on else "eager")
        root.mkdir()
        argv = train_argv(params_file(root, model={"dropout": 0.0}, epochs=2, compile=compile_on,
                                      save_every_minutes=EVERY_STEP),
                          {**data, "results": root / "results"})
        if compile_on:
            killed = nmt_process(argv, "step:10", timeout=900)
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        with caplog.at_level(logging.INFO, logger="nmt"):
            assert cli.main(argv) == 0
        runs[compile_on] = RUN.files(root / "results")
    assert "resuming from epoch 2, step 9 of 14" in caplog.text
    rows = {c: list(csv.DictReader(open(f.history))) for c, f in runs.items()}
    for eager_row, compiled_row in zip(rows[False], rows[True], strict=True):
        for key in ("train_loss", "valid_loss"):
            assert abs(float(eager_row[key]) - float(compiled_row[key])) <= COMPILE_TOLERANCE
    assert relative_difference(runs[False].last, runs[True].last) <= COMPILE_WEIGHTS_TOLERANCE
    summary = json.loads(runs[True].summary.read_text())
    assert_device_report(summary, "fp32", compiled=True)
    assert summary["compile_seconds"] > 0 and summary["compiled_graphs"] >= 1
    print(f"\ncompile: {summary['compile_seconds']} s, {summary['compiled_graphs']} graphs")


@pytest.mark.slow
def test_compiled_ddp_on_two_processes_trains_like_eager_accumulation(data, tmp_path):
    """train.compile with train.devices 2: torch.compile wraps DistributedDataParallel (Gloo
    on the CPU); the two ranks' updates equal one eager process accumulating 2 (dropout 0),
    within the compiled-vs-eager tolerances."""
    runs = {}
    for name, settings in (("eager", {"accumulate": 2}), ("ddp", {"devices": 2, "compile": True})):
        (tmp_path / name).mkdir()
        argv = train_argv(params_file(tmp_path / name, {"dropout": 0.0}, epochs=2, **settings),
                          {**data, "results": tmp_path / name / "results"})
        proc = nmt_process(argv, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = RUN.files(tmp_path / name / "results")
    rows = {name: list(csv.DictReader(open(f.history))) for name, f in runs.items()}
    for eager_row, ddp_row in zip(rows["eager"], rows["ddp"], strict=True):
        for key in ("train_loss", "valid_loss"):
            assert abs(float(eager_row[key]) - float(ddp_row[key])) <= COMPILE_TOLERANCE
    assert relative_difference(runs["eager"].last, runs["ddp"].last) <= COMPILE_WEIGHTS_TOLERANCE
    summary = json.loads(runs["ddp"].summary.read_text())
    assert summary["compile"] and summary["compiled_graphs"] >= 1
