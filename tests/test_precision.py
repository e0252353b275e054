"""train.precision `auto` on a CPU: the faster precision, measured once a machine and cached.

The choice is tested with the real calibration at a tiny size, its clock planted (the passes
run; their seconds are the test's): steady figures that prefer each precision in turn (and one
too close to call), noisy ones, a load burst during one pass, a model slower in bf16 among
faster ones; the cache with real files, damaged ones of every kind included, and real processes
racing for its lock; the measurement itself at a tiny size, for real.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import time
from datetime import UTC, datetime, timedelta

import pytest
import torch

from nmt.models import MODELS
from nmt.training import precision_cache, precision_timing
from nmt.training.precision import choices, choose
from nmt.training.precision_cache import calibration
from nmt.training.precision_timing import (
    BF16_MIN_SPEEDUP,
    MAX_CALIBRATION_TOKENS,
    MAX_SPREAD,
    MIN_PAIRS,
    PAIRS,
    SENTENCE_TOKENS,
    Timing,
    Workload,
)

CPU = torch.device("cpu")
TINY = {"model": {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
                  "dim_feedforward": 64, "decoder_only_layers": 1},
        "train": {"batch_by": "tokens", "max_tokens": 256, "batch_size": 8,
                  "label_smoothing": 0.1, "clip_grad_norm": 1.0, "precision": "auto"}}


def workload(kind: str = "train", vocab: int = 50) -> Workload:
    return Workload.of(TINY, vocab, vocab, kind)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own; returns precision.json's path."""
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path))
    return tmp_path / "precision.json"


def plant_clock(monkeypatch, seconds) -> list:
    """The calibration's clock planted: each pass runs for real, and takes
    seconds(model, precision, n) by the clock, n counting that model's and precision's timed
    passes from 0. Returns the (model, precision) of every timed pass."""
    passes: list[tuple[str, str]] = []

    def timed(run, precision_name: str, model: str) -> float:
        run(precision_name)
        passes.append((model, precision_name))
        return seconds(model, precision_name, passes.count((model, precision_name)) - 1)

    monkeypatch.setattr(precision_timing, "timed", timed)
    return passes


def steady(fp32: float, bf16: float):
    """Every model, every pass: these seconds."""
    return lambda model, precision_name, n: fp32 if precision_name == "fp32" else bf16


def measurements(monkeypatch) -> list:
    """Counts the calibration's measurements (the real one, wrapped)."""
    calls: list = []
    real = precision_timing.measure

    def measure(work):
        calls.append(work)
        return real(work)

    monkeypatch.setattr(precision_timing, "measure", measure)
    return calls


@pytest.mark.parametrize(("fp32", "bf16", "chosen"), [
    (1.0, 0.6, "bf16"),  # bf16 1.67x as fast
    (1.0, 1.4, "fp32"),  # bf16 0.71x as fast (a Xeon without AMX, issue 48)
    (1.0, 0.95, "fp32"),  # 1.05x: within the margin, fp32 kept
])
@pytest.mark.parametrize("kind", ["train", "decode"])
def test_auto_keeps_the_precision_the_calibration_found_faster(cache, monkeypatch, fp32, bf16,
                                                               chosen, kind):
    passes = plant_clock(monkeypatch, steady(fp32, bf16))
    choice = choose("auto", CPU, workload(kind))
    assert choice.precision == chosen
    assert choice.speedup == round(fp32 / bf16, 3)
    assert (choice.speedup >= BF16_MIN_SPEEDUP) is (chosen == "bf16")
    assert f"{fp32 / bf16:.2f}x (spread 0%)" in choice.reason
    assert choice.record("decode_") == {"decode_precision": chosen,
                                        "decode_precision_reason": choice.reason,
                                        "decode_bf16_speedup": choice.speedup}
    # Each model: its pairs, alternating (fp32 first, then bf16 first); steady ones settle
    # after MIN_PAIRS.
    for model in MODELS:
        mine = [p for m, p in passes if m == model]
        assert mine == ["fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]
    assert json.loads(cache.read_text())[0]["seconds"]["scratch"] == {"fp32": fp32,
                                                                      "bf16": bf16}


def test_a_noisy_measurement_is_fp32_for_this_run_and_not_cached(cache, monkeypatch):
    """Load that comes and goes during the scratch model's bf16 passes: its pairs' ratios
    scatter (2.5x, 0.6x, ...). Inconclusive: fp32 for this run, said why, and not kept as
    the machine's figures: it holds only for the processes that start with this one."""
    noisy_bf16 = [0.4, 1.6, 0.5, 1.5, 0.45]

    def seconds(model, precision_name, n):
        if precision_name == "fp32":
            return 1.0
        return noisy_bf16[n % PAIRS] if model == "scratch" else 0.5

    plant_clock(monkeypatch, seconds)
    calls = measurements(monkeypatch)
    choice = choose("auto", CPU, workload())
    assert choice.precision == "fp32" and choice.speedup is None
    assert choice.reason.startswith("auto: fp32 for this run, as the measurement was "
                                    "inconclusive: the bf16/fp32 speed ratios of scratch varied")
    assert choice.reason.endswith("not cached: a run that starts over 5 minutes later "
                                  "measures again")
    assert "baseline 2.00x (spread 0%)" in choice.reason
    # Processes that start with it (DDP ranks, parallel jobs: they wait for its lock) agree...
    assert choose("auto", CPU, workload()) == choice and len(calls) == 1
    # ... and a run that starts later measures again.
    [entry] = json.loads(cache.read_text())
    assert entry["inconclusive"] is True
    then = datetime.now(UTC) - timedelta(seconds=precision_cache.INCONCLUSIVE_HOLD_SECONDS + 1)
    cache.write_text(json.dumps([entry | {"measured": then.isoformat()}]))
    choose("auto", CPU, workload())
    assert len(calls) == 2
    assert len(json.loads(cache.read_text())) == 1  # the stale entry replaced


def test_a_load_burst_during_one_pass_does_not_decide(cache, monkeypatch):
    """Issue 58: one pass of the decoder-only model's fp32 caught another job (1,402 ms against
    bf16's 89) and put the recipe in bf16 for good. Alternating pairs' median: bf16 gains
    nothing here, and one slowed pass does not change that."""
    def seconds(model, precision_name, n):
        if model == "decoder_only" and precision_name == "fp32" and n == 0:
            return 15.0
        return 1.0

    passes = plant_clock(monkeypatch, seconds)
    choice = choose("auto", CPU, workload())
    assert choice.precision == "fp32" and choice.speedup == 1.0
    # The burst unsettled the first pairs: PAIRS of them, the others MIN_PAIRS.
    assert [m for m, _ in passes].count("decoder_only") == 2 * PAIRS
    assert [m for m, _ in passes].count("scratch") == 2 * MIN_PAIRS
    assert "decoder_only 1.00x (spread 0%)" in choice.reason
    assert len(json.loads(cache.read_text())) == 1  # sound: cached


def test_a_model_slower_in_bf16_is_not_put_in_bf16_by_the_others_gain(cache, monkeypatch):
    """Issue 58: a cached decode entry chose bf16 from the models' summed seconds, although the
    baseline decoded in 100 ms in fp32 and 3,300 in bf16. The recipe's models train and decode
    in one precision (they are compared), bf16 only where every one gains."""
    def seconds(model, precision_name, n):
        if model == "baseline":
            return 0.1 if precision_name == "fp32" else 3.3
        return 10.0 if precision_name == "fp32" else 2.0

    plant_clock(monkeypatch, seconds)
    choice = choose("auto", CPU, workload("decode"))
    assert choice.precision == "fp32"
    assert choice.speedup == round(0.1 / 3.3, 3)
    assert "baseline 0.03x (spread 0%), scratch 5.00x" in choice.reason
    assert choice.reason.endswith("the slowest here: baseline")


def test_a_huge_batch_is_calibrated_on_a_bounded_one(cache, monkeypatch):
    """train.batch_size 10**9 under auto asked 128 GB inside the calibration, and 5,000
    sentences spent minutes there: the calibration's batch holds MAX_CALIBRATION_TOKENS at
    most (the real update, run on it), and nmt estimate scales the seconds to the recipe's."""
    from nmt.commands.estimate import estimate

    huge = TINY | {"train": TINY["train"] | {"batch_by": "sentences", "batch_size": 10**9}}
    for train in (huge["train"], TINY["train"] | {"max_tokens": 10**9}):
        work = Workload.of(huge | {"train": train}, 50, 50, "train")
        assert work.sentences * SENTENCE_TOKENS == MAX_CALIBRATION_TOKENS
    shapes = []
    real_update = precision_timing.update

    def update(model, batch, work):
        shapes.append(tuple(batch.shape))
        return real_update(model, batch, work)

    monkeypatch.setattr(precision_timing, "update", update)
    plant_clock(monkeypatch, steady(1.0, 0.5))
    settings = huge | {"train": huge["train"] | {"max_updates": 10, "device": "cpu"},
                       "vocab": {"kind": "bpe", "bpe_size": 50}}
    monkeypatch.chdir(cache.parent)  # estimate records its choice in ./results/precision/
    lines = estimate(settings, "tiny", ["scratch"], cache.parent / "absent")
    assert shapes == [(MAX_CALIBRATION_TOKENS // SENTENCE_TOKENS, SENTENCE_TOKENS)] * len(MODELS)
    assert lines[2] == (f"(an update timed on {MAX_CALIBRATION_TOKENS:,} tokens and scaled to "
                        f"the recipe's {10**9 * SENTENCE_TOKENS:,})")
    per_update = 0.5 * 10**9 / (MAX_CALIBRATION_TOKENS // SENTENCE_TOKENS)
    assert f"10 updates of {1e3 * per_update:,.0f} ms" in lines[-1]


def test_fp32_and_bf16_are_taken_as_given_and_nothing_is_measured(cache, monkeypatch):
    passes = plant_clock(monkeypatch, steady(1.0, 0.5))
    for given in ("fp32", "bf16"):
        assert choose(given, CPU, workload()).precision == given
        assert choose(given, CPU, workload()).reason == f"train.precision: {given}"
    assert choose("auto", CPU, None).precision == "fp32"  # no workload: nothing to time
    assert passes == [] and not cache.exists()


def test_a_calibration_is_measured_once_a_machine_and_workload(cache, monkeypatch):
    """The second run on a machine reads the first's figures; another workload, another kind
    of machine (here oneDNN capped at AVX2, as a laptop stand-in) or changed model code is
    measured anew."""
    plant_clock(monkeypatch, steady(1.0, 0.5))
    calls = measurements(monkeypatch)
    first = calibration(workload())
    assert calibration(workload()) == first and len(calls) == 1
    calibration(workload(vocab=60))
    calibration(workload("decode"))
    assert len(calls) == 3
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    calibration(workload())
    assert len(calls) == 4
    code = precision_cache.models_code()
    monkeypatch.setattr(precision_cache, "models_code", lambda: "a changed model")
    calibration(workload())
    assert len(calls) == 5
    entries = json.loads(cache.read_text())
    assert [e["machine"]["isa_caps"] for e in entries] == [{}, {}, {}] + [
        {"ONEDNN_MAX_CPU_ISA": "AVX2"}] * 2
    assert [e["models"] for e in entries] == [code] * 4 + ["a changed model"]
    assert {e["machine"]["torch"] for e in entries} == {torch.__version__}
    assert all(e["pairs"] == {m: [[1.0, 0.5]] * MIN_PAIRS for m in MODELS} and e["measured"]
               for e in entries)


def test_entries_of_earlier_versions_are_left_for_their_clones(cache, monkeypatch, caplog):
    """An entry of the single-pass calibration (no `calibration` field; summed seconds) is not
    read, and not called damage: the clones that wrote it still read it."""
    earlier = {"machine": precision_cache.machine(), "models": precision_cache.models_code(),
               "workload": precision_cache.jsonable(workload()),
               "seconds": {m: {"fp32": 1.0, "bf16": 0.1} for m in MODELS}, "measured": "then"}
    cache.write_text(json.dumps([earlier]))
    plant_clock(monkeypatch, steady(1.0, 1.0))
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "fp32"
    assert caplog.records == []
    assert json.loads(cache.read_text())[0] == earlier


def valid_entry(cache, monkeypatch) -> dict:
    """A sound calibration of workload() written to the cache, and its entry."""
    plant_clock(monkeypatch, steady(1.0, 0.5))
    choose("auto", CPU, workload())
    [entry] = json.loads(cache.read_text())
    return entry


BARE = ("NaN", "Infinity", "1e400")  # JSON that Python reads as floats that are no seconds
# Every kind of value a damaged cache may hold where a figure belongs (issue 58: a string gave
# a TypeError, a 0 a ZeroDivisionError, a missing precision a KeyError, in every later run).
WRONG_FIGURES = ["0.5", 0, -1.0, True, None, [], {}, [0.5], *BARE]


@pytest.mark.parametrize("damage", [
    *[("a figure", wrong) for wrong in WRONG_FIGURES],
    ("a pair", "0.5, 0.5"), ("a pair", [0.5, 0.5, 0.5]), ("a pair", {"fp32": 1, "bf16": 1}),
    ("a model's pairs", [[1.0, 0.5]]), ("a model's pairs", "pairs"), ("a model's pairs", None),
    ("the pairs", {}), ("the pairs", [1, 2]), ("the pairs", None), ("the entry", "text"),
    ("the entry", 7), ("the calibration format", "2"), ("the inconclusive mark", "yes"),
    ("the inconclusive mark's time", "an hour ago"),
])
def test_a_wrong_value_in_a_cache_entry_is_one_warning_and_a_fresh_measurement(
        cache, monkeypatch, caplog, damage):
    where, wrong = damage
    entry = valid_entry(cache, monkeypatch)
    if where == "a figure":
        entry["pairs"]["scratch"][1][1] = wrong
    elif where == "a pair":
        entry["pairs"]["baseline"][0] = wrong
    elif where == "a model's pairs":
        entry["pairs"]["decoder_only"] = wrong
    elif where == "the pairs":
        entry["pairs"] = wrong
    elif where == "the calibration format":
        entry["calibration"] = wrong
    elif where == "the inconclusive mark":
        entry["inconclusive"] = wrong
    elif where == "the inconclusive mark's time":
        entry |= {"inconclusive": True, "measured": wrong}
    else:
        entry = wrong
    text = json.dumps([entry])
    for word in BARE:  # as bare words in the file, not strings
        text = text.replace(f'"{word}"', word)
    cache.write_text(text)
    calls = measurements(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "bf16"
        assert choose("auto", CPU, workload()).precision == "bf16"  # the rewritten file
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{cache} holds 1 damaged precision measurement(s): they are dropped from it (and "
        "measured again where needed)"]
    [rewritten] = json.loads(cache.read_text())
    assert all(math.isfinite(s) for pairs in rewritten["pairs"].values() for pair in pairs
               for s in pair)


@pytest.mark.parametrize("damage", ["{not json", '{"a": 1}', "\xff", "null", '"text"', "3",
                                    ""])
def test_a_damaged_cache_file_is_measured_over_with_one_warning(cache, monkeypatch, caplog,
                                                                damage):
    cache.write_text(damage, encoding="latin-1")
    plant_clock(monkeypatch, steady(1.0, 0.5))
    calls = measurements(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "bf16"
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{cache} is not a list of precision measurements: measuring again, and it is "
        "rewritten"]
    assert len(json.loads(cache.read_text())) == 1  # rewritten whole


def test_a_folder_at_the_cache_path_is_one_warning_and_a_measurement_a_run(cache, monkeypatch,
                                                                           caplog):
    """Issue 58: four warnings, one saying falsely that the folder was rewritten. A run
    (training's and decoding's choice) warns once, measures, and leaves the folder be."""
    cache.mkdir()
    plant_clock(monkeypatch, steady(1.0, 0.5))
    calls = measurements(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        both = choices(TINY, CPU, 50, 50)
    assert [choice.precision for choice in both.values()] == ["bf16", "bf16"]
    assert [work.kind for work in calls] == ["train", "decode"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{cache} is a folder, not a file of precision measurements: measuring for this run "
        "only (fix: remove it, or NMT_CACHE_DIR=<another folder>)"]
    assert cache.is_dir() and list(cache.iterdir()) == []


def slow_stand_in(work):
    """A calibration that takes a while and leaves a mark for each time it ran."""
    with open(precision_cache.cache_path().with_name("measured"), "a") as marks:
        marks.write("x")
    time.sleep(0.5)
    return {m: Timing(((1.0, 0.5),) * MIN_PAIRS) for m in MODELS}


def calibrate_in_a_process(queue) -> None:
    precision_timing.measure = slow_stand_in  # this process's own module, forked with the test's
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
    """The real measurement, at a tiny size: each model's pairs in fp32 and bf16; cached and
    read back where it was sound, measured again (this machine was busy) where not."""
    timings = calibration(workload(kind))
    assert set(timings) == set(MODELS)
    assert all(len(t.pairs) in (MIN_PAIRS, PAIRS) and min(map(min, t.pairs)) > 0
               for t in timings.values())
    sound = all(t.spread <= MAX_SPREAD for t in timings.values())
    assert ("inconclusive" not in json.loads(cache.read_text())[0]) is sound
    if sound:
        assert calibration(workload(kind)) == timings
        slowest = min(t.speedup for t in timings.values())
        assert choose("auto", CPU, workload(kind)).speedup == round(slowest, 3)


def test_estimate_gives_each_models_minutes_in_the_chosen_precision(cache, monkeypatch,
                                                                     tmp_path):
    """`nmt estimate` (make demo prints it first): max_updates x the calibrated update of the
    precision auto chose x what validation adds, before any vocabulary exists (sizes guessed)."""
    from nmt.commands.estimate import GUESSED_WORDS, WHOLE_OVER_CALIBRATED, estimate

    update_seconds = {"baseline": {"fp32": 0.5, "bf16": 0.6},
                      "scratch": {"fp32": 0.4, "bf16": 0.5},
                      "decoder_only": {"fp32": 0.45, "bf16": 0.5}}
    # a further model of the registry updates as fast as scratch
    plant_clock(monkeypatch, lambda model, name, n: update_seconds.get(
        model, update_seconds["scratch"])[name])
    settings = TINY | {"train": TINY["train"] | {"max_updates": 1200, "device": "cpu"},
                       "vocab": {"kind": "word", "bpe_size": 8000}}
    monkeypatch.chdir(tmp_path)  # estimate records its choice in ./results/precision/
    lines = estimate(settings, "demo", ["scratch", "decoder_only"], tmp_path / "absent")
    assert lines[1].startswith("training in fp32: auto: an update ran baseline 0.83x (spread "
                               "0%), scratch 0.80x (spread 0%), decoder_only 0.90x")
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
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(blocked / "nmt"))
    plant_clock(monkeypatch, steady(1.0, 0.5))
    calls = measurements(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="nmt.precision"):
        assert choose("auto", CPU, workload()).precision == "bf16"
    assert len(calls) == 1
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"cannot keep precision measurements in {blocked / 'nmt'} (")
    assert message.endswith("measuring for this run only (fix: NMT_CACHE_DIR=<a writable "
                            "folder>)")


# ---- one precision for a recipe's runs (nmt.training.precision_record) --------------------

def test_the_first_run_of_a_recipe_decides_and_every_later_one_takes_it(tmp_path, caplog):
    """A busy machine: the first run's measurement is inconclusive (fp32), the next one's would
    say bf16. Recorded, the first decision is every later run's, with its reason and where it
    was recorded: the runs of one comparison train in one precision (a fresh clone's make demo
    trained the baseline in fp32 and scratch in bf16, and the verdict followed the precision)."""
    from nmt.training.precision import Choice
    from nmt.training.precision_record import decided, record_path

    record = record_path(tmp_path / "results", "demo")
    noisy = {"train": Choice("fp32", "auto: fp32 for this run, as the measurement was "
                             "inconclusive"), "decode": Choice("fp32", "auto: decode inconclusive")}
    quiet = {"train": Choice("bf16", "auto: bf16 1.4x", 1.4),
             "decode": Choice("bf16", "auto: bf16 1.2x", 1.2)}
    calls = []
    first = decided(record, lambda: calls.append("first") or noisy)
    later = decided(record, lambda: calls.append("later") or quiet)
    assert calls == ["first"] and first == noisy
    assert {kind: c.precision for kind, c in later.items()} == {"train": "fp32", "decode": "fp32"}
    assert later["train"].reason.startswith(noisy["train"].reason + " (recorded for the recipe in "
                                            f"{record} by its first run here, ")
    saved = json.loads(record.read_text())
    assert saved["machine"] == precision_cache.machine() and saved["train"]["precision"] == "fp32"

    # Another machine's record is decided again, with one line; a damaged one, with a warning.
    record.write_text(json.dumps(saved | {"machine": {"cpu": "another CPU"}}))
    with caplog.at_level(logging.INFO, logger="nmt.precision"):
        again = decided(record, lambda: quiet)
    assert again == quiet and json.loads(record.read_text())["train"]["precision"] == "bf16"
    assert f"{record} was decided on another machine (another CPU): deciding again here" in (
        caplog.text)
    record.write_text("{not json")
    assert decided(record, lambda: noisy) == noisy
    assert f"{record} is damaged: deciding the recipe's precision again" in caplog.text


def test_only_a_measured_choice_is_recorded(tmp_path):
    """`auto` on a CPU is measured, so recorded; a precision given, or no record asked for,
    takes nothing from a record and writes none."""
    from conftest import REPO
    from nmt.pipeline.params import load_params
    from nmt.pipeline.recipes import resolve
    from nmt.training.precision_record import recipe_choices, record_path

    demo = resolve(load_params(REPO / "params.yaml"), "demo")
    settings = demo | {"train": demo["train"] | {"precision": "fp32"}}
    record = record_path(tmp_path, "demo")
    chosen = recipe_choices(settings, torch.device("cpu"), 10, 10, record)
    assert chosen["train"].precision == "fp32" and not record.exists()
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"machine": precision_cache.machine(), "decided": "then",
                                  **{k: {"precision": "bf16", "reason": "recorded"}
                                     for k in ("train", "decode")}}))
    assert recipe_choices(settings, torch.device("cpu"), 10, 10, record)["train"].precision == \
        "fp32"  # given, not measured: the record does not apply
    auto = demo | {"train": demo["train"] | {"precision": "auto"}}
    assert recipe_choices(auto, torch.device("cpu"), 10, 10, record)["decode"].reason == (
        f"recorded (recorded for the recipe in {record} by its first run here, then)")
