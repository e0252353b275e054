"""train.precision `auto` on a CPU: the faster precision, measured once a machine and cached.

The choice is tested with stand-in calibrations that prefer each precision in turn (and one
too close to call); the cache with real files, a damaged one included, and real processes
racing for its lock; the measurement itself at a tiny size, for real.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time

import pytest
import torch

from nmt.training import precision
from nmt.training.precision import BF16_MIN_SPEEDUP, Workload, calibration, choose

CPU = torch.device("cpu")
TINY = {"model": {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
                  "dim_feedforward": 64, "decoder_only_layers": 1},
        "train": {"batch_by": "tokens", "max_tokens": 256, "batch_size": 8,
                  "label_smoothing": 0.1, "clip_grad_norm": 1.0}}


def workload(kind: str = "train", vocab: int = 50) -> Workload:
    return Workload.of(TINY, vocab, vocab, kind)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own; returns precision.json's path."""
    monkeypatch.setenv(precision.CACHE_ENV, str(tmp_path))
    return tmp_path / "precision.json"


def stand_in(fp32: float, bf16: float, calls: list | None = None):
    """A calibration that finds these seconds for every model (and counts its calls)."""
    def measure(work):
        if calls is not None:
            calls.append(work)
        return {m: {"fp32": fp32, "bf16": bf16} for m in ("baseline", "scratch")}
    return measure


@pytest.mark.parametrize(("fp32", "bf16", "chosen"), [
    (1.0, 0.6, "bf16"),  # bf16 1.67x as fast
    (1.0, 1.4, "fp32"),  # bf16 0.71x as fast (a Xeon without AMX, issue 48)
    (1.0, 0.95, "fp32"),  # 1.05x: within the margin, fp32 kept
])
@pytest.mark.parametrize("kind", ["train", "decode"])
def test_auto_keeps_the_precision_the_calibration_found_faster(cache, monkeypatch, fp32, bf16,
                                                               chosen, kind):
    monkeypatch.setattr(precision, "measure", stand_in(fp32, bf16))
    choice = choose("auto", CPU, workload(kind))
    assert choice.precision == chosen
    assert choice.speedup == round(fp32 / bf16, 3)
    assert (choice.speedup >= BF16_MIN_SPEEDUP) is (chosen == "bf16")
    assert f"{fp32 / bf16:.2f}x as fast in bf16" in choice.reason
    assert choice.record("decode_") == {"decode_precision": chosen,
                                        "decode_precision_reason": choice.reason,
                                        "decode_bf16_speedup": choice.speedup}


def test_fp32_and_bf16_are_taken_as_given_and_nothing_is_measured(cache, monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "measure", stand_in(1.0, 0.5, calls))
    for given in ("fp32", "bf16"):
        assert choose(given, CPU, workload()).precision == given
        assert choose(given, CPU, workload()).reason == f"train.precision: {given}"
    assert choose("auto", CPU, None).precision == "fp32"  # no workload: nothing to time
    assert calls == [] and not cache.exists()


def test_a_calibration_is_measured_once_a_machine_and_workload(cache, monkeypatch):
    """The second run on a machine reads the first's figures; another workload, another kind
    of machine (here oneDNN capped at AVX2, as a laptop stand-in) or changed model code is
    measured anew."""
    calls = []
    monkeypatch.setattr(precision, "measure", stand_in(1.0, 0.5, calls))
    first = calibration(workload())
    assert calibration(workload()) == first and len(calls) == 1
    calibration(workload(vocab=60))
    calibration(workload("decode"))
    assert len(calls) == 3
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    calibration(workload())
    assert len(calls) == 4
    code = precision.models_code()
    monkeypatch.setattr(precision, "models_code", lambda: "a changed model")
    calibration(workload())
    assert len(calls) == 5
    entries = json.loads(cache.read_text())
    assert [e["machine"]["isa_caps"] for e in entries] == [{}, {}, {}] + [
        {"ONEDNN_MAX_CPU_ISA": "AVX2"}] * 2
    assert [e["models"] for e in entries] == [code] * 4 + ["a changed model"]
    assert {e["machine"]["torch"] for e in entries} == {torch.__version__}
    assert all(e["seconds"] == first and e["measured"] for e in entries)


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"a": 1}', "\xff"])
def test_a_damaged_cache_is_measured_over_with_one_warning(cache, monkeypatch, caplog, damage):
    cache.write_text(damage, encoding="latin-1")
    calls = []
    monkeypatch.setattr(precision, "measure", stand_in(1.0, 0.5, calls))
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "bf16"
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{cache} is not a list of precision measurements: measuring again, and it is "
        "rewritten"]
    assert len(json.loads(cache.read_text())) == 1  # rewritten whole


def slow_stand_in(work):
    """A calibration that takes a while and leaves a mark for each time it ran."""
    with open(precision.cache_path().with_name("measured"), "a") as marks:
        marks.write("x")
    time.sleep(0.5)
    return {"scratch": {"fp32": 1.0, "bf16": 0.5}}


def calibrate_in_a_process(queue) -> None:
    precision.measure = slow_stand_in  # this process's own module, forked with the test's
    queue.put(choose("auto", CPU, workload()).precision)


def test_processes_that_start_together_measure_once_and_agree(cache):
    """DDP ranks and parallel Snakemake jobs ask at once: one measures, the others wait for
    its figures (a file lock), so all of them train in the same precision."""
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=calibrate_in_a_process, args=(queue,))
                 for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0, 0, 0]
    assert sorted(queue.get() for _ in processes) == ["bf16"] * 3
    assert cache.with_name("measured").read_text() == "x"


@pytest.mark.parametrize("kind", ["train", "decode"])
def test_the_calibration_times_every_model_in_both_precisions(cache, kind):
    """The real measurement, at a tiny size: each model's median seconds in fp32 and bf16."""
    seconds = calibration(workload(kind))
    assert set(seconds) == {"baseline", "scratch", "decoder_only"}
    assert all(set(s) == {"fp32", "bf16"} and min(s.values()) > 0 for s in seconds.values())
    choice = choose("auto", CPU, workload(kind))  # from the cache now
    ratio = sum(s["fp32"] for s in seconds.values()) / sum(s["bf16"] for s in seconds.values())
    assert choice.speedup == round(ratio, 3)


def test_estimate_gives_each_models_minutes_in_the_chosen_precision(cache, monkeypatch,
                                                                     tmp_path):
    """`nmt estimate` (make demo prints it first): max_updates x the calibrated update of the
    precision auto chose x what validation adds, before any vocabulary exists (sizes guessed)."""
    from nmt.commands.estimate import GUESSED_WORDS, WHOLE_OVER_CALIBRATED, estimate

    monkeypatch.setattr(precision, "measure", lambda work: {
        "baseline": {"fp32": 0.5, "bf16": 0.6}, "scratch": {"fp32": 0.4, "bf16": 0.5},
        "decoder_only": {"fp32": 0.45, "bf16": 0.5}})
    settings = TINY | {"train": TINY["train"] | {"precision": "auto", "max_updates": 1200,
                                                 "device": "cpu"},
                       "vocab": {"kind": "word", "bpe_size": 8000}}
    lines = estimate(settings, "demo", ["scratch", "decoder_only"], tmp_path / "absent")
    assert lines[1].startswith("training in fp32: auto: an update of the recipe's models ran "
                               "0.84x as fast in bf16")
    assert f"{GUESSED_WORDS:,} and {GUESSED_WORDS:,} entries assumed" in lines[2]
    minutes = 1200 * 0.4 * WHOLE_OVER_CALIBRATED / 60
    assert lines[3] == (f"scratch: about {minutes:.1f} minutes of training (1,200 updates of "
                        "400 ms, plus validation)")
    assert lines[4].startswith("decoder_only: about ")
    assert lines[-1] == (f"all 2 trainings: about "
                         f"{(1200 * 0.85 * WHOLE_OVER_CALIBRATED / 60):.0f} minutes")


def test_estimate_refuses_a_model_it_does_not_know(cache):
    from nmt import cli

    assert cli.main(["estimate", "--recipe", "demo", "--models", "scratch,transformer"]) == 2


def test_a_cache_that_cannot_be_kept_costs_a_measurement_not_the_run(tmp_path, monkeypatch,
                                                                    caplog):
    """A read-only home (here: the cache's folder is a file): measured, one warning, a choice."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(precision.CACHE_ENV, str(blocked / "nmt"))
    calls = []
    monkeypatch.setattr(precision, "measure", stand_in(1.0, 0.5, calls))
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "bf16"
    assert len(calls) == 1
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"cannot keep precision measurements in {blocked / 'nmt'} (")
    assert message.endswith("measuring for this run only (fix: NMT_CACHE_DIR=<a writable "
                            "folder>)")
