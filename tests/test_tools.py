"""Every script in tools/ at tiny size, run as a user runs it (`python tools/x.py ...`), and
its figures read back: they parse, and they are plausible. The figures of docs/ came from these
scripts at full size; here they only have to run and say something sound.

tools/gpu/preflight.py and tools/gpu/check_graphs.py have their own tests (test_preflight.py,
test_graphs.py). The GPU kit's bundle.sh (its data part; the wheels need the network) and
run.sh run at tiny size on the CPU in a copy of the repository (slow: make test runs it,
make test-fast leaves it out).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO, edit_params
from nmt.core.records import write_record
from nmt.core.runs import Run
from nmt.models import MODELS
from nmt.pipeline.params import load_params
from nmt.stages import vocab
from train_helpers import TINY_MODEL, params_file, tiny_data

pytestmark = pytest.mark.usefixtures("one_thread")

DEMO_UPDATES = 40  # the tiny demo recipe's train.max_updates

spec = importlib.util.spec_from_file_location("gpu_plan", REPO / "tools/gpu/plan.py")
gpu_plan = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gpu_plan  # its dataclass looks itself up there
spec.loader.exec_module(gpu_plan)


def tool(script: str, *args, timeout: float = 300) -> str:
    """`python tools/<script> args` in a fresh single-threaded process; its stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, str(REPO / "tools" / script), *map(str, args)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def number(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.fixture(scope="module")
def tiny(prepared, tmp_path_factory) -> dict:
    """The first 300 training and 50 validation pairs of the session's data with its test sets,
    a word vocabulary of the words seen 4 times or more (most are not: the tiny models write
    <unk>, whose copies unknowns_check.py follows), and a params.yaml whose published recipe
    and demo recipe are tiny (the demo's: 40 updates of 512-token batches, fp32)."""
    root = tmp_path_factory.mktemp("tools")
    data = tiny_data(prepared, root, train=300, val=50)
    for path in prepared["tokenized"].glob("test_*"):
        shutil.copy(path, data["tokenized"])
    params = load_params(REPO / "params.yaml")
    vocab.build(params | {"vocab": {**params["vocab"], "min_freq": 4}},
                vocab.Paths(data["tokenized"], root / "vocab" / "rare"))
    path = params_file(root)
    recipes = yaml.safe_load(path.read_text())["recipes"]
    recipes["demo"]["model"].update(TINY_MODEL)
    recipes["demo"]["train"].update(max_updates=DEMO_UPDATES, max_tokens=512, precision="fp32")
    edit_params(path, recipes=recipes)
    return {"root": root, "tokenized": data["tokenized"], "vocab": root / "vocab" / "rare",
            "params": path}


def test_allocator_bench(tmp_path):
    out = tool("allocator_bench.py", "--threads", 1, "--pairs", 1, "--steps", 2,
               "--sentences", 8)
    rows = re.findall(r"^(default|kept) +([\d,]+) ms a step +([\d,]+) faults +([\d,]+) MB peak$",
                      out, re.M)
    assert [row[0] for row in rows] == ["default", "kept"], out
    for _, ms, faults, peak in rows:
        assert number(ms) > 0 and number(faults) >= 0 and number(peak) > 100  # torch alone
    low, high = map(float, re.search(r"^kept is ([\d.]+)-([\d.]+)x as fast \(1 pairs, 1 threads\)$",
                                     out, re.M).groups())
    assert 0 < low <= high


def test_beam_speed(tmp_path):
    size = ["--threads", 1, "--repeats", 1, "--layers", 1, "--d-model", 32, "--heads", 2,
            "--ffn", 64, "--sentences", 8, "--length", 8]
    saved = tmp_path / "ours.json"
    first = tool("beam_speed.py", *size, "--save", saved)
    again = tool("beam_speed.py", *size, "--check", saved)
    for out in (first, again):
        assert out.startswith("beam 5, 8 sentences of 8 tokens, 1+1 layers, d_model 32, 2 heads, "
                              "ffn 64, 1 threads, 1 repeats"), out
        medians = dict(re.findall(r"^(nmt|ctranslate2) +median +([\d.]+) s", out, re.M))
        assert set(medians) == {"nmt", "ctranslate2"}, out
        assert all(float(m) >= 0 for m in medians.values())
        assert float(re.search(r"our speed / CTranslate2's: ([\d.]+)", out).group(1)) > 0
    ours = json.loads(saved.read_text())
    assert len(ours) == 8 and all(isinstance(token, int) for hyp in ours for token in hyp)
    assert again.rstrip().endswith(": True"), again  # the same outputs, run to run


def test_demo_minutes(tiny):
    out = tool("demo_minutes.py", "--params", tiny["params"], "--tokenized", tiny["tokenized"],
               "--vocab", tiny["vocab"], "--updates", 5, "--threads", 1)
    whole, epochs = map(int, re.search(rf"^recipe demo: ({DEMO_UPDATES}) updates, (\d+) epochs; "
                                       r"timing the first 5 of each model", out, re.M).groups())
    rows = re.findall(r"^(\w+): ([\d,]+) ms an update, (-?[\d.]+) s a validation pass, "
                      r"(\w+) \(\w+\): about ([\d.]+) minutes for the whole run$", out, re.M)
    assert [row[0] for row in rows] == list(MODELS), out  # every model of the registry
    for _, ms, validation, precision, minutes in rows:
        ms, validation, minutes = number(ms), float(validation), float(minutes)
        assert ms > 0 and precision == "fp32"  # as the recipe pins it
        # train.json's train_minutes has 4 decimals (6 ms either way); the bound is the old one
        assert validation > -0.35
        # the extrapolation, within the printed figures' rounding
        assert abs(minutes - (ms / 1000 * whole + validation * epochs) / 60) < 0.01


@pytest.fixture(scope="module")
def precision_check(tiny) -> tuple[str, Path]:
    """precision_check.py's output and results: the tiny demo's scratch model, seed 0, fp32
    and bf16."""
    results = tiny["root"] / "precision-check"
    out = tool("precision_check.py", "--params", tiny["params"], "--tokenized",
               tiny["tokenized"], "--vocab", tiny["vocab"], "--seeds", 0, "--results", results)
    return out, results


def test_precision_check(precision_check):
    out, results = precision_check
    rows = json.loads((results / "check.json").read_text())
    assert [(r["precision"], r["seed"]) for r in rows] == [("fp32", 0), ("bf16", 0)]
    for r in rows:
        assert r["updates"] == DEMO_UPDATES and 0 < r["valid_loss"] < 20
        assert r["minutes"] > 0 and r["ms_per_update"] > 0 and r["valid_bleu"] >= 0
    # the same training in bf16: at tiny size its loss stays close (tests/test_precision.py)
    assert abs(rows[0]["valid_loss"] - rows[1]["valid_loss"]) < 0.01
    for r in rows:  # the table: a row per run, and per precision the mean (of one seed here)
        assert re.search(rf"^ +{r['precision']} +0 +{DEMO_UPDATES} +{r['valid_loss']:.4f} ", out,
                         re.M), out
        assert re.search(rf"^ +{r['precision']} +mean +{r['valid_loss']:.4f} ", out, re.M), out


def test_unknowns_check(tiny, precision_check):
    run = Run("demo", "scratch", 0).files(precision_check[1] / "fp32").folder
    out = tool("unknowns_check.py", "--run", run, "--recipe", "demo", "--vocab", tiny["vocab"],
               "--tokenized", tiny["tokenized"])
    sentences, lacking = map(int, re.search(r" on val: (\d+) sentences, (\d+) \(\d+%\) with a "
                                            r"source word the vocabulary lacks", out).groups())
    assert sentences == 50 and 0 < lacking <= 50
    for method in ("greedy", "beam"):
        assert re.search(rf"^{method}: BLEU dropped [\d.]+$", out, re.M), out
        unknowns = {mode: re.search(rf"^{method}: BLEU {mode} +[\d.]+ \((\d+) <unk> in (\d+) "
                                    r"outputs\)$", out, re.M).groups() for mode in ("mark", "copy")}
        count, outputs = map(int, unknowns["mark"])
        assert unknowns["copy"] == unknowns["mark"] and count >= outputs > 0, out
        for layers in ("last", "first", "mean"):
            lacks, total, right = map(int, re.search(
                rf"^{method}: copies by the {layers} layer's attention: (\d+) of (\d+) \(\d+%\) a "
                r"source word the vocabulary lacks, (\d+) \(\d+%\) in the reference$", out,
                re.M).groups())
            assert total == count and lacks <= total and right <= total  # a copy each <unk>


def test_save_cost(tiny, tmp_path):
    out = tool("save_cost.py", "--params", tiny["params"], "--tokenized", tiny["tokenized"],
               "--vocab", tiny["vocab"], "--results", tmp_path, "--repeats", 2)
    assert re.search(r"^recipe published, scratch: [\d,]+ parameters, a resume state of [\d,]+ "
                     r"MB, 2 saves$", out, re.M), out
    waits, whole = (float(re.search(rf"^  {what} +([\d.]+) s \(median; ", out, re.M)[1])
                    for what in ("the loop waits", "the whole write"))
    assert 0 <= waits <= whole, out
    assert list(tmp_path.iterdir()) == []  # its temporary run folder is gone


def test_update_ops():
    """Operators an update, by phase, on the GPU's attention path and the CPU's."""
    counts = {}
    for path in ("fused", "cpu"):
        out = tool("update_ops.py", "--path", path, "--d-model", 16)
        assert re.search(rf"^recipe published \(6\+6 layers, 8 heads\), {path} path: ", out, re.M)
        rows = re.findall(r"^  (\w+) +(\d+): forward\+loss (\d+), backward (\d+), "
                          r"norm\+clip\+adam (\d+)$", out, re.M)
        assert [row[0] for row in rows] == list(MODELS), out  # every model of the registry
        for name, total, *phases in rows:
            assert int(total) == sum(map(int, phases)) and min(map(int, phases)) > 0
            counts[path, name] = int(total)
    for name in MODELS:  # dropout's own ops on the CPU's path
        assert counts["cpu", name] > counts["fused", name]


def test_step_profile(tiny):
    out = tool("step_profile.py", "--params", tiny["params"], "--vocab", tiny["vocab"],
               "--tokenized", tiny["tokenized"], "--steps", 2, "--repeats", 1)
    assert re.search(r"^recipe demo: scratch, 2 batches x 1 passes, 1 threads, [\d.]+ GFLOP a "
                     r"step$", out, re.M), out
    blocks = re.split(r"^\n", out, flags=re.M)[1:]
    assert len(blocks) == 2, out
    for precision, block in zip(("fp32", "bf16"), blocks, strict=True):
        head, *lines = block.strip().split("\n")
        wall, total, faults = re.fullmatch(
            rf"{precision}: (\d+) ms a step \(profiled; [\d.]+ GFLOP/s\), operators' self time "
            r"(\d+) ms, ([\d,]+) page faults", head).groups()
        assert int(wall) > 0 and int(total) > 0 and number(faults) >= 0
        kinds = {kind: (float(ms), float(share)) for kind, ms, share in
                 (re.match(r"^  (.+?) +([\d.]+) ms +([\d.]+)%", line).groups() for line in lines)}
        assert {"matrix products", "optimizer (Adam)", "softmax and loss"} <= set(kinds), block
        assert set(kinds) <= {kind for kind, _ in profile_kinds()} | {"other"}
        assert abs(sum(ms for ms, _ in kinds.values()) - int(total)) <= 0.5 + 0.05 * len(kinds)
        assert abs(sum(share for _, share in kinds.values()) - 100) <= 0.05 * len(kinds)


def profile_kinds():
    """step_profile.py's kinds of operator."""
    spec = importlib.util.spec_from_file_location("step_profile", REPO / "tools/step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.KINDS


# ---- tools/gpu/plan.py ----------------------------------------------------------------------

def test_plan_takes_the_published_pair_first_then_what_fits():
    published = [Run("published", m, 0) for m in ("baseline", "scratch", "decoder_only")]
    other = [Run("tuned", m, 0) for m in ("baseline", "scratch")]
    extra = [Run("published", "scratch", 1)]
    order = gpu_plan.in_priority(other + published, extra)
    assert order == [published[0], published[1], *extra, published[2], *other]
    seconds = {"published": 100.0, "tuned": 30.0}
    candidates = [gpu_plan.Planned(run, 1, seconds[run.recipe]) for run in order]
    chosen = [c.run for c in gpu_plan.plan(candidates, 265)]
    # the pair, then what still fits: not the extra seed or decoder_only (100 s), both tuned
    assert chosen == [published[0], published[1], *other]
    # the published pair starts even when it does not fit (it resumes on the next call)
    assert [c.run for c in gpu_plan.plan(candidates, 50)] == published[:2]


def test_plan_takes_a_recipe_seed_by_seed_and_narrows_to_whole_seeds():
    models, seeds = ("baseline", "scratch", "decoder_only"), (0, 1, 2)
    study = [Run(recipe, m, s) for recipe in ("published", "tuned") for m in models
             for s in seeds]  # as nmt.core.runs.runs lists them: model by model
    order = gpu_plan.in_priority(study, [])
    assert order[:6] == [Run("published", "baseline", 0), Run("published", "scratch", 0),
                         Run("published", "decoder_only", 0), Run("published", "baseline", 1),
                         Run("published", "scratch", 1), Run("published", "decoder_only", 1)]
    assert order[9:12] == [Run("tuned", m, 0) for m in models] and len(order) == 18
    params = {"pipeline": {"recipes": ["published", "tuned"], "models": list(models),
                           "seeds": list(seeds)}}
    assert gpu_plan.covered(params, order[:8]) == (["published"], [0, 1])  # s2: 2 of 3 models
    assert gpu_plan.covered(params, order[:12]) == (["published"], [0, 1, 2])  # 3 > 2 x 1
    assert gpu_plan.covered(params, order[:2]) == ([], [])


def test_plan_ms_per_update(tmp_path):
    assert gpu_plan.ms_per_update(None, 5.1) == (5.1, "given (--ms)")
    assert gpu_plan.ms_per_update(tmp_path / "absent.json")[0] == gpu_plan.UNMEASURED_MS
    check = tmp_path / "check_graphs.json"
    timed = {"graphs_cuda_graphs": 3, "graphs_ms_per_update": 5.0, "eager_ms_per_update": 9.0}
    check.write_text(json.dumps({"ok": True, "equivalence": timed}))
    assert gpu_plan.ms_per_update(check) == (5.0, "measured, CUDA graphs")
    check.write_text(json.dumps({"ok": False, "equivalence": timed}))
    assert gpu_plan.ms_per_update(check)[0] == 9.0  # a failed graph check: eager


def test_plan_narrows_to_the_recipes_trained_whole(tiny, tmp_path):
    """The tiny published recipe (3 epochs of 10 batches: 30 updates) and demo (40 updates) at
    1 s an update: the minutes hold the published pair and one demo run, so the report covers
    published only."""
    params = edit_params(Path(shutil.copy(tiny["params"], tmp_path / "params.yaml")),
                         pipeline={"recipes": ["published", "demo"],
                                   "models": ["baseline", "scratch"], "seeds": [0]})
    shutil.copytree(REPO / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    data = tmp_path / "data"
    data.mkdir()
    (data / "tokenized").symlink_to(tiny["tokenized"])
    (data / "vocab").mkdir()
    (data / "vocab" / "published").symlink_to(tiny["vocab"])
    runs = 1.15 * (30 + 30 + 40)  # seconds, validation's share included
    out = tool("gpu/plan.py", "--params", params, "--data", data, "--ms", 1000, "--minutes",
               (gpu_plan.AFTER_TRAINING + runs + 10) / 60, "--targets", tmp_path / "targets.txt",
               "--stages", tmp_path / "stages.txt", "--narrowed", tmp_path / "narrowed.yaml",
               "--results", tmp_path / "results")
    marks = re.findall(r"^  (yes|no ) (\S+) +(\d+) updates", out, re.M)
    assert marks == [("yes", "published-baseline-s0", "30"), ("yes", "published-scratch-s0", "30"),
                     ("yes", "demo-baseline-s0", "40"), ("no ", "demo-scratch-s0", "40")], out
    assert "the whole pipeline does NOT fit" in out
    targets = (tmp_path / "targets.txt").read_text().split()
    assert targets == ["results/published-baseline-s0/metrics.json",
                       "results/published-scratch-s0/metrics.json",
                       "results/demo-baseline-s0/metrics.json", "results/bench.json"]
    assert (tmp_path / "stages.txt").read_text().split() == [
        f"{stage}@{run}-0" for run in ("published-baseline", "published-scratch", "demo-baseline")
        for stage in ("train", "evaluate")]
    narrowed = yaml.safe_load((tmp_path / "narrowed.yaml").read_text())
    assert (narrowed["pipeline"]["recipes"], narrowed["pipeline"]["seeds"]) == (["published"], [0])



def test_plan_with_measured_concurrency_fits_more_runs():
    """Six published runs of 100 s alone each, 300 s to train in: with seconds that add up,
    three fit; with S(3) = 2.0 and S(6) = 3.0 measured (2 at 2 at once, interpolated), all six
    (600 s / 3.0 = 200 s). At most the profile's units run at once: with 3 units, six runs
    take 600 / S(3) = 300 s. And never less than the longest run alone."""
    runs = [Run("published", m, s) for s in (0, 1) for m in ("baseline", "scratch",
                                                             "decoder_only")]
    candidates = [gpu_plan.Planned(run, 1, 100.0) for run in runs]
    assert len(gpu_plan.plan(candidates, 300)) == 3  # no model: seconds add up
    assert len(gpu_plan.plan(candidates, 300, gpu_plan.no_gain(18))) == 3
    measured = gpu_plan.Concurrency({1: 1.0, 3: 2.0, 6: 3.0}, 18, "test")
    assert measured.factor(2) == pytest.approx(1.5) and measured.factor(9) == 3.0
    assert measured.factor(4) == pytest.approx(2 + 1 / 3)
    assert len(gpu_plan.plan(candidates, 300, measured)) == 6
    assert len(gpu_plan.plan(candidates, 299, gpu_plan.Concurrency(measured.factors, 3,
                                                                   "3 units"))) == 5
    assert measured.wall([100.0, 10.0]) == 100.0  # 110 / 1.5 = 73 s: the 100 s run bounds it
    assert measured.wall([]) == 0.0


def concurrency_file(path: Path, factors) -> Path:
    path.write_text(json.dumps({"mps": True, "device": "NVIDIA H100 80GB HBM3",
                                "alone_updates_per_s": 190.0, "factors": factors}))
    return path


def test_plan_reads_a_concurrency_file(tmp_path):
    jobs = gpu_plan.profile_jobs(REPO / "workflow/profiles/gpu/config.yaml")
    assert jobs == 18  # the study at once (tests/test_gpu_profile.py)
    read = gpu_plan.read_concurrency(concurrency_file(tmp_path / "c.json",
                                                      {"1": 1.0, "3": 2.4}), jobs)
    assert read.factors == {1: 1.0, 3: 2.4} and read.jobs == 18
    assert read.source == "measured (c.json, MPS on): S(1) = 1.00, S(3) = 2.40"
    (tmp_path / "text.json").write_text("{ not json")
    bad = {"absent.json": "no such file", "text.json": "not concurrency.py's JSON",
           "none.json": "not concurrency.py's JSON (KeyError",
           "no-one.json": "are not S(N) > 0 for N >= 1 with S(1) = 1.0",
           "zero.json": "are not S(N) > 0", "word.json": "not concurrency.py's JSON (ValueError"}
    (tmp_path / "none.json").write_text("{}")
    concurrency_file(tmp_path / "no-one.json", {"3": 2.0})
    concurrency_file(tmp_path / "zero.json", {"1": 1.0, "3": 0})
    concurrency_file(tmp_path / "word.json", {"1": 1.0, "three": 2.0})
    for name, why in bad.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            gpu_plan.read_concurrency(tmp_path / name, jobs)
    # on the command line: one line, exit 2, before any data is read
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/plan.py"), "--minutes", "5",
                           "--concurrency", str(tmp_path / "text.json"), "--data",
                           str(tmp_path / "no-data")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert re.fullmatch(r"plan\.py: error: --concurrency \S+text\.json: not concurrency\.py's "
                        r"JSON \(JSONDecodeError: .*\n", done.stderr), done.stderr



# ---- tools/gpu/concurrency.py ---------------------------------------------------------------

def test_concurrency_measures_trainings_at_once(tiny, tmp_path):
    """concurrency.py on the CPU: the tiny published recipe's scratch model, shrunk further by
    the size options, 1 and then 2 processes at once of 4 updates each; the printed figures
    and the JSON agree, and plan.py reads the JSON."""
    env = {key: value for key, value in os.environ.items()
           if key != "CUDA_MPS_PIPE_DIRECTORY"}  # as run.sh's measurement without MPS
    saved = tmp_path / "concurrency.json"
    args = ["--params", tiny["params"], "--tokenized", tiny["tokenized"], "--vocab",
            tiny["vocab"], "--updates", 4, "--steps", 2, "--layers", 1, "--d-model", 16,
            "--heads", 2, "--ffn", 32]
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/concurrency.py"),
                           *map(str, args), "--counts", "2", "--json", str(saved)],
                          env={**env, "OMP_NUM_THREADS": "1"}, cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(saved.read_text())
    assert (report["mps"], report["device"], report["graphed"]) == (False, "cpu", False)
    assert report["model_size"] == {"num_encoder_layers": 1, "num_decoder_layers": 1,
                                    "d_model": 16, "nhead": 2, "dim_feedforward": 32}
    assert [run["processes"] for run in report["runs"]] == [1, 2]
    alone, together = report["runs"]
    assert report["alone_updates_per_s"] == alone["updates_per_s"] > 0
    assert report["factors"]["1"] == 1.0
    assert report["factors"]["2"] == round(together["updates_per_s"] / alone["updates_per_s"], 3)
    assert 0 < report["factors"]["2"] < 3  # two processes on (at most) two cores
    for run in report["runs"]:
        assert len(run["each_updates_per_s"]) == run["processes"]
        # the aggregate over the span of all of them: at most the sum of each one's own rate
        assert run["updates_per_s"] <= sum(run["each_updates_per_s"]) * 1.001
        assert run["updates_per_s"] == pytest.approx(run["processes"] * 4 / run["seconds"],
                                                     rel=1e-2)
    lines = re.findall(r"^(\d) at once: ([\d.]+) updates/s in all, ([\d.]+)x one alone "
                       r"\([\d.]+ s; MPS off\)$", done.stdout, re.M)
    assert [(int(n), float(rate), float(x)) for n, rate, x in lines] == [
        (run["processes"], round(run["updates_per_s"], 1),
         round(report["factors"][str(run["processes"])], 2)) for run in report["runs"]]
    eager = report["kernels_per_update"]["eager"]
    assert eager["count"] > 50 and eager["of"] == "aten operators (nested ones too)"
    assert "graphed" not in report["kernels_per_update"]  # no CUDA graph on the CPU
    assert f"one eager update: {eager['count']} aten operators" in done.stdout
    read = gpu_plan.read_concurrency(saved, jobs=18)
    assert read.factor(2) == report["factors"]["2"]
    assert read.source.startswith("measured (concurrency.json, MPS off): S(1) = 1.00, S(2) = ")


def test_concurrency_says_what_failed_in_one_line(tiny, tmp_path):
    """A process that fails (here: no vocabulary where --vocab points) ends the measurement
    with one line naming it; bad counts are refused before any process starts."""
    done = subprocess.run([sys.executable, str(REPO / "tools/gpu/concurrency.py"), "--params",
                           str(tiny["params"]), "--tokenized", str(tiny["tokenized"]),
                           "--vocab", str(tmp_path / "absent"), "--counts", "1",
                           "--updates", "1"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.fullmatch(r"concurrency\.py: 1 at once: process 0 failed: \w+: .*absent.*\n",
                        done.stdout), done.stdout
    for counts in ("0,3", "three"):
        refused = subprocess.run([sys.executable, str(REPO / "tools/gpu/concurrency.py"),
                                  "--counts", counts], cwd=REPO, capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.splitlines()[-1].endswith(
            f"argument --counts: {counts!r}: not whole numbers of 1 or more, e.g. 1,3,6,9")


# ---- tools/gpu/bundle.sh and run.sh ---------------------------------------------------------

@pytest.mark.slow
def test_gpu_kit_at_tiny_size(mirror, tmp_path):
    """bundle.sh's data part (dvc repro verify) in a tiny copy of the repository, then run.sh
    there as on a GPU machine: the wheels' site already there (this Python has the packages),
    no preflight or graph check (their own tests run them), MPS off (no daemon here), the
    concurrency of 2 tiny trainings measured and planned with, the published scratch run
    trained, evaluated, benched and reported by Snakemake, recorded by `dvc commit`, packed.
    One planned run: the plan's choice among several is tested above (test_plan_*); a second
    run here only added a training and an evaluation. Then run.sh is called again on the same
    copy, as a second call on the same machine, and trains nothing: the first H200 study
    session's second call retrained the runs its first had finished."""
    from tiny import scratch_copy

    copy = scratch_copy(tmp_path / "copy")
    edit_params(copy / "params.yaml", pipeline={"recipes": ["published"], "models": ["scratch"],
                                                "seeds": [0], "export": []})
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # each script sets its own: the copy's src
    bundled = subprocess.run(["bash", "tools/gpu/bundle.sh"], cwd=copy, capture_output=True,
                             text=True, timeout=600,
                             env={**env, "BIN": str(bin_dir), "STEPS": "data",
                                  "PYTHONPATH": str(copy / "src")})
    assert bundled.returncode == 0, bundled.stdout[-3000:] + bundled.stderr[-3000:]
    assert "== wheels" not in bundled.stdout and "== ready: data/" in bundled.stdout
    assert json.loads((copy / "results/verify/published-scratch.json").read_text())["passed"]
    assert not (copy / ".whl").exists()
    # The carried validation set, cut to 100 pairs (and recorded so): train's closing greedy
    # BLEU over all 1,014 of an untrained model's sentences (each to its length limit) took
    # 24 s a run.
    for path in (copy / "data/tokenized").glob("val.*"):
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:100]))
    write_record(copy / "data/tokenized", "tokenize")

    out, kit = tmp_path / "out", tmp_path / "kit"
    (kit / "nmt-site").mkdir(parents=True)
    ran = subprocess.run(["bash", "tools/gpu/run.sh", "3"], cwd=copy, capture_output=True,
                         text=True, timeout=600,
                         env={**env, "OUT": str(out), "KIT": str(kit), "CHECKS": "concurrency",
                              "CONCURRENCY_OPTIONS": "--counts 2 --updates 4 --steps 2",
                              "CHECK_DIR": str(tmp_path / "checks")})
    log = (out / "log").read_text()
    assert ran.returncode == 0, log[-4000:]
    # no MPS daemon here: one line says so, and the run goes on without it
    assert [line for line in log.splitlines() if line.startswith("MPS: ")] == [
        "MPS: off, no nvidia-cuda-mps-control on this machine; the processes share the GPU as "
        "separate contexts"], log
    assert (out / "mps.txt").read_text() == "off: no nvidia-cuda-mps-control on this machine\n"
    # the concurrency measurement without MPS (the only one here), handed to the plan
    factors = json.loads((out / "concurrency-nomps.json").read_text())["factors"]
    assert not (out / "concurrency-mps.json").exists()
    assert (f"plan: concurrency measured (concurrency-nomps.json, MPS off): S(1) = 1.00, "
            f"S(2) = {factors['2']:.2f}; up to 18 trainings at once") in log, log
    assert "plan: 1 of 1 runs" in log and "the whole pipeline fits" in log, log
    assert "dvc.lock: every stage recorded" in log, log[-4000:]
    runs = [Run("published", "scratch", 0)]
    assert (out / "targets.txt").read_text().split() == [
        *(str(run.files().metrics) for run in runs), "results/bench.json", "reports/report.md"]
    assert (out / "stages.txt").read_text().split() == [
        f"{stage}@{run.recipe}-{run.model}-{run.seed}" for run in runs
        for stage in ("train", "evaluate")]
    with tarfile.open(out / "results.tgz") as packed:
        names = set(packed.getnames())
        metrics = json.load(packed.extractfile(str(runs[0].files().metrics)))
    assert {"reports/report.md", "dvc.lock", "results/bench.json", "params.yaml"} <= names
    assert not [name for name in names if name.endswith(".pt")]  # no checkpoints
    assert all(str(run.files().metrics) in names for run in runs)
    for testset in ("test_2016_flickr", "test_2017_flickr"):
        assert 0 < metrics[testset]["loss"] < 20 and 0 <= metrics[testset]["bleu"] <= 100
    lock = yaml.safe_load((copy / "dvc.lock").read_text())["stages"]
    assert {"train@published-scratch-0", "evaluate@published-scratch-0", "bench",
            "report"} <= set(lock)
    bench = json.loads((copy / "results/bench.json").read_text())
    # pipeline.models is scratch alone here: bench times it and nothing else, without a ratio
    assert bench["device"] == "cpu" and bench["train"]["scratch"] > 0 < bench["beam"]["scratch"]
    assert set(bench["train"]) == {"scratch"} and bench["ratio_spread"] == {}

    # A second call on the same machine: the carried inputs are not touched again, the plan
    # counts the finished run done, and Snakemake trains and evaluates nothing.
    trained = (copy / runs[0].files().summary).read_bytes()  # its seconds: another run's differ
    again = subprocess.run(["bash", "tools/gpu/run.sh", "3"], cwd=copy, capture_output=True,
                           text=True, timeout=600,
                           env={**env, "OUT": str(tmp_path / "again"), "KIT": str(kit),
                                "CHECKS": "", "CHECK_DIR": str(tmp_path / "checks")})
    log = (tmp_path / "again" / "log").read_text()
    assert again.returncode == 0, log[-4000:]
    assert "not touched again" in log and "--touch" not in log, log
    assert re.search(r"^  done published-scratch-s0 ", log, re.M), log
    assert "rule train:" not in log and "rule evaluate:" not in log, log
    assert (copy / runs[0].files().summary).read_bytes() == trained

    # Killed by SIGKILL (no trap of its own can run) while a check runs, the kit leaves no
    # process behind: its watcher stops them (a killed kit left check_graphs.py running;
    # here the concurrency measurement, given updates enough to run for minutes).
    killed = subprocess.Popen(["bash", "tools/gpu/run.sh", "3"], cwd=copy,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**env, "OUT": str(tmp_path / "out2"), "KIT": str(kit),
                                   "CHECKS": "concurrency", "CHECK_DIR": str(tmp_path / "c2"),
                                   "CONCURRENCY_OPTIONS": "--counts 1 --updates 100000"})
    deadline = time.monotonic() + 120
    while not any("concurrency.py" in cmd for cmd in processes_in(copy)):
        assert killed.poll() is None and time.monotonic() < deadline, "the check never ran"
        time.sleep(0.2)
    time.sleep(3)  # the watcher looks every 2 s
    killed.kill()
    killed.wait()
    assert not still_in(copy)


def processes_in(folder: Path) -> list[str]:
    """The command lines of this machine's processes whose working folder is in folder."""
    return list(process_ids_in(folder).values())


def process_ids_in(folder: Path) -> dict[int, str]:
    """{process id: command line} of this machine's processes whose working folder is in
    folder."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            cwd = Path(os.readlink(proc / "cwd"))
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # not a process, gone, or a zombie
            continue
        if cwd == folder or folder in cwd.parents:
            found[int(proc.name)] = cmd
    return found


def still_in(folder: Path, seconds: float = 20) -> dict[int, str]:
    """process_ids_in(folder) once they have all ended, or after `seconds` (a killed kit's
    watcher stops what it left: it looks every 2 s)."""
    deadline = time.monotonic() + seconds
    while (left := process_ids_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_the_kits_watcher_stops_its_processes_when_the_kit_dies_before_a_list(tmp_path):
    """run.sh's watcher, its own lines run alone, when the kit dies between the watcher's check
    that it lives and its list of the kit's processes (a loaded host's moment, widened here to
    a second by a sleep put in that place, and hit on the watcher's second round): the
    processes the kit started are stopped all the same. The watcher took that list, empty
    once the kit is gone, for the whole, and left them running: the GPU kit's test failed
    so under make test, and 9 of 24 kills at random moments left processes behind with the
    sleep put there (0 of 24 since)."""
    script = (REPO / "tools/gpu/run.sh").read_text()
    end = ") </dev/null >/dev/null 2>&1 &\n"
    watcher = script[script.index("descendants() {"):script.index(end) + len(end)]
    check = '    while kill -0 "$kit_pid" 2>/dev/null; do\n'
    assert check in watcher
    kit = tmp_path / "kit.sh"
    kit.write_text("\n".join(["#!/bin/bash", watcher.replace(check, check + "sleep 1.01\n"),
                              "(sleep 60; :) &", "(sleep 60; :) &", "wait", ""]))
    proc = subprocess.Popen(["bash", str(kit)], cwd=tmp_path)
    try:
        waits, deadline = set(), time.monotonic() + 60
        while len(waits) < 2:  # the first list is taken whole: die during the second wait
            assert time.monotonic() < deadline, "the watcher never waited twice"
            waits |= {pid for pid, cmd in process_ids_in(tmp_path).items()
                      if cmd == "sleep 1.01 "}
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        assert not still_in(tmp_path)
    finally:
        for pid in process_ids_in(tmp_path):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def kit_copy(tmp_path: Path, *carried: str) -> Path:
    """tools/ alone in a folder (run.sh works in the folder above tools/), with `carried`
    folders made empty."""
    shutil.copytree(REPO / "tools", tmp_path / "tools")
    for folder in carried:
        (tmp_path / folder).mkdir(parents=True)
    return tmp_path


def run_kit(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "tools/gpu/run.sh", *args], cwd=folder, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


@pytest.mark.parametrize("minutes", ["abc", "-1", "0", "2.5x"])
def test_the_gpu_kit_refuses_minutes_that_are_no_positive_number(tmp_path, minutes):
    """One line and exit 2 before any work (it ran on with '-1.75 min left')."""
    folder = kit_copy(tmp_path)
    done = run_kit(folder, minutes, OUT=str(tmp_path / "out"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"run.sh: MINUTES is '{minutes}': give a positive number of "
                           "minutes (e.g. 9)\n")
    assert not (tmp_path / "out").exists() and not (folder / ".kit").exists()


def test_the_gpu_kit_refuses_an_out_it_cannot_write_and_a_tree_without_its_data(tmp_path):
    """An OUT that is a file (an unwritable OUT was a tee warning, and the kit went on),
    then each carried folder missing in turn (a tree without data/ ended in Snakemake's
    MissingRuleException): one line each, exit 2, nothing written."""
    folder = kit_copy(tmp_path / "kit")
    (tmp_path / "a-file").write_text("")
    done = run_kit(folder, "3", OUT=str(tmp_path / "a-file"))
    assert (done.returncode, done.stderr) == (2, f"run.sh: OUT '{tmp_path / 'a-file'}' is not "
                                                 "a folder this user can write (fix: "
                                                 "OUT=<a writable folder>)\n")
    carried = ["data/tokenized", "data/vocab", "results/verify", "params", ".whl"]
    for missing in carried:
        for folder_name in carried:
            path = folder / folder_name
            path.mkdir(parents=True, exist_ok=True) if folder_name != missing else (
                shutil.rmtree(path, ignore_errors=True))
        done = run_kit(folder, "3", OUT=str(tmp_path / "out"))
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.startswith(f"run.sh: the kit has no {missing} (fix: make gpu-bundle")
        assert not (tmp_path / "out" / "log").exists() and not (folder / ".kit").exists()


def start_mps(tmp_path: Path, bin_dir: Path, **env) -> tuple[str, dict]:
    """tools/gpu/mps.sh's start_mps in bash with `bin_dir` first on PATH: its output, and
    what it left: MPS_ON, the MPS variables, mps.txt."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    script = ('source tools/gpu/mps.sh; start_mps "$1"; '
              'echo "left: $MPS_ON ${CUDA_MPS_PIPE_DIRECTORY-unset} '
              '${CUDA_MPS_LOG_DIRECTORY-unset}"')
    path = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    done = subprocess.run(["bash", "-c", script, "start_mps", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path, "MPS_ROOT": str(tmp_path / "mps"),
                               **env})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    *said, left = done.stdout.splitlines()
    return "\n".join(said), {"left": left, "mps.txt": (out / "mps.txt").read_text()}


def test_mps_falls_back_in_one_line(tmp_path):
    """Without the daemon's binary, with MPS=0, and when the torch probe fails (a stand-in
    nvidia-cuda-mps-control that records its calls, on this CPU, as root): one line says why,
    the daemon that started is told to quit, the variables are unset, MPS_ON is 0."""
    empty = tmp_path / "empty"
    empty.mkdir()
    said, left = start_mps(tmp_path, empty)
    assert said == ("MPS: off, no nvidia-cuda-mps-control on this machine; the processes "
                    "share the GPU as separate contexts")
    assert left == {"left": "left: 0 unset unset",
                    "mps.txt": "off: no nvidia-cuda-mps-control on this machine\n"}

    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    calls = tmp_path / "calls"
    (stand_in / "nvidia-cuda-mps-control").write_text(
        f'#!/bin/sh\n[ -t 0 ] && input= || input=$(cat)\n'
        f'echo "$* ${{input}} pipe=$CUDA_MPS_PIPE_DIRECTORY" >>{calls}\n')
    (stand_in / "nvidia-cuda-mps-control").chmod(0o755)
    said, left = start_mps(tmp_path, stand_in, MPS="0")
    assert said.startswith("MPS: off, MPS=0 turns it off;") and not calls.exists()
    if os.geteuid() != 0:
        pytest.skip("the daemon's path needs root")
    said, left = start_mps(tmp_path, stand_in)
    if torch.cuda.is_available():
        pytest.skip("the probe passes on a GPU")
    pipe = tmp_path / "mps" / "pipe"
    assert re.fullmatch(r"MPS: off, the torch probe under MPS failed \(exit 1; see \S+/mps\.log "
                        r"and \S+/mps/log/control\.log\); the processes share the GPU as "
                        r"separate contexts", said), said
    assert calls.read_text().splitlines() == [f"-d  pipe={pipe}", f" quit pipe={pipe}"]
    assert left["left"] == "left: 0 unset unset"
    assert left["mps.txt"].startswith("off: the torch probe")
    assert "Torch not compiled with CUDA enabled" in (tmp_path / "out" / "mps.log").read_text()


def test_image_packages_leave_the_kits_own_to_carry():
    """tools/gpu/image-packages.txt, read as bundle.sh reads it (lower case, `_` and `.` as
    `-`): the image's torch and numpy are left out of the wheels, the packages the kit carries
    (Snakemake, DVC, jsonschema and the two bundle.sh builds from source) are not."""
    lines = (REPO / "tools/gpu/image-packages.txt").read_text().splitlines()
    names = [re.sub(r"[_.]", "-", line.lower()) for line in lines if not line.startswith("#")]
    assert len(names) == len(set(names)) and all(names)
    assert {"torch", "numpy"} <= set(names)
    assert not {"snakemake", "dvc", "jsonschema", "antlr4-python3-runtime",
                "connection-pool"} & set(names)


# ---- tools/gpu/cudnn_dropout_repro.py -------------------------------------------------------

def test_cudnn_dropout_repro_stands_alone(tmp_path):
    """Fit to paste into a bug report: under 80 lines, torch its only import beside sys. Without
    CUDA it says so in one line and exits 0; its method passes on the math backend (the control
    that runs here), each error within its bound."""
    script = REPO / "tools/gpu/cudnn_dropout_repro.py"
    text = script.read_text()
    assert len(text.splitlines()) < 80
    assert set(re.findall(r"^(?:import|from) (\w+)", text, re.M)) == {"sys", "torch"}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    def repro(*args):
        return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    if not torch.cuda.is_available():
        skipped = repro()
        assert (skipped.returncode, skipped.stderr) == (0, "")
        assert skipped.stdout == ("SKIP: no CUDA device, so no cuDNN attention "
                                  f"(torch {torch.__version__})\n")
    control = repro("math")
    assert control.returncode == 0, control.stdout + control.stderr
    checks = re.findall(r"^call ([12]) (out|dq|dk|dv): (PASS|FAIL) max abs error (\S+) "
                        r"\(bound (\S+)\)$", control.stdout, re.M)
    assert len(checks) == 8, control.stdout
    for _, _, verdict, error, bound in checks:
        assert verdict == "PASS" and float(error) <= float(bound), control.stdout
    assert control.stdout.splitlines()[-1] == "PASS: math, call 1 PASS, call 2 PASS"
    assert repro("flash").returncode == 2  # a backend it does not know: the usage line


def load_mutate():
    """tools/mutate.py as a module, with tools/ on the path for the modules it imports."""
    if str(REPO / "tools") not in sys.path:
        sys.path.insert(0, str(REPO / "tools"))
    spec = importlib.util.spec_from_file_location("mutate", REPO / "tools/mutate.py")
    module = sys.modules["mutate"] = importlib.util.module_from_spec(spec)  # for @dataclass
    spec.loader.exec_module(module)
    return module


def test_mutate_has_mutmut_mutate_a_module_added_to_only_mutate(tmp_path):
    """A copy in mutants/ without its .meta was copied, not mutated (the module was not in
    only_mutate then): removed, so that mutmut mutates it; a mutated copy stays."""
    mutate = load_mutate()
    added, mutated = Path("src/nmt/stages/evaluate.py"), Path("src/nmt/core/stats.py")
    for path in (added, mutated):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    (tmp_path / "src/nmt/core/stats.py.meta").write_text("{}")
    assert mutate.forget_unmutated_copies([added, mutated, Path("src/gone.py")], tmp_path) == [
        added]
    assert not (tmp_path / added).exists() and (tmp_path / mutated).exists()


def test_mutate_of_one_module_goes_on_where_it_stopped(tmp_path):
    """make mutate MODULE=...: the module's mutants not killed yet (a run stopped half-way, or
    survivors to meet new tests); every mutant where mutmut has not mutated this version of
    the source (no results yet, or the source is newer than its mutated copy)."""
    import json
    import os

    mutate = load_mutate()
    path = Path("src/nmt/core/stats.py")
    assert mutate.names_to_run(path, tmp_path) == ["nmt.core.stats.*"]  # never mutated
    copy = tmp_path / "mutants" / path
    copy.parent.mkdir(parents=True)
    copy.write_text("# mutated\n")
    copy.with_name(copy.name + ".meta").write_text(json.dumps({
        "exit_code_by_key": {"nmt.core.stats.x_f__mutmut_1": 1, "nmt.core.stats.x_f__mutmut_2":
                             None, "nmt.core.stats.x_f__mutmut_3": 3},
        "durations_by_key": {}, "estimated_durations_by_key": {}}))
    assert mutate.names_to_run(path, tmp_path) == ["nmt.core.stats.x_f__mutmut_2"]
    source = (REPO / path).stat().st_mtime
    os.utime(copy, (source - 10, source - 10))  # the source changed since it was mutated
    assert mutate.names_to_run(path, tmp_path) == ["nmt.core.stats.*"]


def test_the_watchdogs_kills_and_the_runs_minutes_are_named(tmp_path, monkeypatch):
    """A test past its limit under a mutant (tests/conftest.py's watchdog) exits 1, a kill for
    mutmut, and names the mutant and the test in mutants/'s watchdog log, which make mutate
    reads into docs/mutation.md as kills to check by hand; each mutmut run's minutes add up
    across the runs that stopped and went on; an earlier summary's watchdog lines stay apart
    from its survivors and its GPU-or-DDP-only lines."""
    mutate = load_mutate()
    core = tmp_path / "core"
    (core / "mutants").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO / 'src'}",
           "MUTANT_UNDER_TEST": "nmt.core.stats.x_f__mutmut_2"}
    died = subprocess.run([sys.executable, "-c", "import conftest; "
                           "conftest.hung('tests/test_stats.py::test_a', 35.4)"],
                          cwd=core / "mutants", env=env, capture_output=True, text=True)
    assert died.returncode == 1, died.stderr
    assert "tests/test_stats.py::test_a ran past 35 s: failed" in died.stderr
    (core / "mutants" / mutate.RUNS_LOG).write_text("2026-11-29 20:00\tall\t50.5\tt1\tcpu A\n")
    (tmp_path / "training" / "mutants").mkdir(parents=True)
    (tmp_path / "training" / "mutants" / mutate.RUNS_LOG).write_text(
        "2026-11-29 21:00\tall\t9.5\tt1\tcpu A\n2026-11-30 20:00\tall\t30.0\tt1\tcpu B\n")
    monkeypatch.setattr(mutate, "profiles", lambda: [
        mutate.Profile(name, tmp_path / name, {}) for name in ("core", "training")])
    assert mutate.watchdog_kills() == {
        "nmt.core.stats.x_f__mutmut_2": "tests/test_stats.py::test_a ran past 35 s"}
    assert mutate.runs_minutes() == (3, 90.0, ["tree t1 on cpu A", "tree t1 on cpu B"])
    # a profile that has not run here has no folder yet: no mutants (the summary keeps the
    # module's earlier row), not a FileNotFoundError
    assert mutate.mutants_of(Path("src/nmt/training/loop.py"), tmp_path / "never") == []

    path, line = "src/nmt/core/stats.py", "- `src/nmt/core/stats.py:{}` (f): `a` -> `b`"
    header = "| module | " + " | ".join(mutate.COLUMNS) + " | score |"
    text = [header, f"| {path} | 3 | 1 | 1 | 0 | 0 | 0 | 1 | 0 | 0 | 50.0 % |",
            "## Survivors (1)", line.format(1), f"{mutate.SECTION} (1)",
            line.format(2) + ": GPU only: why", f"{mutate.WATCHED} (1)",
            line.format(3) + ": tests/test_stats.py::test_a ran past 35 s"]
    count, survivors, apart, hung = mutate.earlier(Path(path), text)
    assert (count["killed"], count["GPU only"]) == (1, 1)
    assert [survivors, apart, hung] == [[text[3]], [text[5]], [text[7]]]


def test_under_a_mutant_a_sigterm_that_no_handler_takes_is_a_kill(tmp_path):
    """mutmut's fork server answers SIGTERM with exit 0, and the processes it forks to run a
    mutant's tests inherit that handler: a test whose SIGTERM found no handler of nmt's in
    place passed, so a mutant of StopSignals.__enter__ that never put one there survived.
    Under a mutant, tests/conftest.py fails such a test (exit 1, a kill); a SIGTERM that a
    handler takes is no failure."""
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {}}))
    (tmp_path / "test_stop.py").write_text(
        "import os, signal\n\n\n"
        "def test_unhandled():\n    os.kill(os.getpid(), signal.SIGTERM)\n\n\n"
        "def test_handled():\n    signal.signal(signal.SIGTERM, lambda *_: None)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n")
    harness = ("import os, signal, sys, pytest\n"  # the fork server's handler, then the tests
               "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
               "sys.exit(pytest.main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO / 'src'}",
           "MUTANT_UNDER_TEST": "nmt.training.resume.xǁStopSignalsǁ__enter____mutmut_1"}

    def run(test: str, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", harness, "-p", "no:cacheprovider",
                               *options, f"test_stop.py::{test}"],
                              cwd=tmp_path, env=env, capture_output=True, text=True)

    assert run("test_unhandled").returncode == 0  # without the fixture: mutmut's "survived"
    died = run("test_unhandled", "-p", "conftest")
    assert died.returncode == 1, died.stdout[-2000:]
    assert died.stderr.endswith("test_stop.py::test_unhandled: a SIGTERM reached the test's "
                                "process with no handler of nmt's: failed\n")
    handled = run("test_handled", "-p", "conftest")
    assert handled.returncode == 0, handled.stdout[-2000:]


def mutmut_project(root: Path, files: dict[str, str]) -> Path:
    """A small project for mutmut's real runs: each file's text at its path under root."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run_mutmut(project: Path) -> dict[str, int | None]:
    """`mutmut run` in project, then its verdicts of src/pkg/m.py (mutant -> exit code)."""
    subprocess.run([sys.executable, "-m", "mutmut", "run"], cwd=project, check=True,
                   capture_output=True)
    return json.loads((project / "mutants/src/pkg/m.py.meta").read_text())["exit_code_by_key"]


def test_a_mutants_limits_count_the_fixtures_its_tests_set_up(tmp_path):
    """mutmut sets a mutant's time limits from its tests' times, and times only each test's
    call. A process that runs a mutant's tests also sets up their fixtures, so a survivor
    whose tests read a slow module fixture's result was called a timeout. This happened to
    collate's equivalent mutants, whose tests read test_headline's evaluation. In mutmut's
    stats run, tests/mutmut_seconds.py adds to each test's time the setup of every fixture
    the test uses. mutmut runs for real here, on a one-function project with a fixture of
    1.5 s: with the hooks, the survivor survives and both tests count the setup; without
    them, both tests count about nothing and the survivor is a timeout."""
    def run(hooks: bool) -> tuple[int, dict[str, float]]:
        files = {"src/pkg/__init__.py": "", "src/pkg/m.py": "def three():\n    return 3\n",
                 "tests/conftest.py": "import sys\nsys.path.insert(0, 'src')\n" + (
                     "from mutmut_seconds import pytest_fixture_setup, "
                     "pytest_runtest_makereport  # noqa: F401\n" if hooks else ""),
                 "tests/mutmut_seconds.py": (REPO / "tests" / "mutmut_seconds.py").read_text(),
                 # three() is called in the fixture only, and 4 passes too: a survivor
                 "tests/test_m.py": "import time\n\nimport pytest\nfrom pkg.m import three\n\n\n"
                                    "@pytest.fixture(scope='module')\ndef value():\n"
                                    "    time.sleep(1.5)\n    return three()\n\n\n"
                                    "def test_a(value):\n    assert value > 0\n\n\n"
                                    "def test_b(value):\n    assert value > 0\n",
                 "pyproject.toml": "[tool.mutmut]\nsource_paths = ['src']\n"
                                   "only_mutate = ['src/pkg/m.py']\n"
                                   "pytest_add_cli_args_test_selection = ['tests/test_m.py']\n"
                                   "process_isolation = 'forkserver'\n"
                                   "timeout_multiplier = 3.0\ntimeout_constant = 0.1\n"}
        project = mutmut_project(tmp_path / ("with" if hooks else "without"), files)
        codes = run_mutmut(project)
        seconds = json.loads((project / "mutants/mutmut-stats.json").read_text())
        return (codes["pkg.m.x_three__mutmut_1"],
                {test.split("::")[1]: s for test, s in seconds["duration_by_test"].items()})

    code, seconds = run(hooks=False)
    assert (code, max(seconds.values()) < 0.5) == (-24, True)  # SIGXCPU: mutmut's timeout
    code, seconds = run(hooks=True)
    assert code == 0 and min(seconds["test_a"], seconds["test_b"]) >= 1.5, (code, seconds)


def test_a_whole_run_goes_on_in_a_new_clone_from_the_committed_record(tmp_path, monkeypatch,
                                                                     capsys):
    """make mutate writes mutmut's verdicts and its logs into docs/mutation-record.json after
    each run (tools/mutate_record.py); a whole run in a new clone, whose mutants/ holds none,
    starts from them where the record is of this tree: mutmut, run for real on a two-function
    project, tests only the mutants the record holds no verdict for. Of another tree (a test
    that runs changed, the source, the settings) the run starts afresh; a test file the
    selection names whole or by a test's id is part of the tree, one it does not name, the
    exclusions' list, or make mutate's own code (tools/mutate.py and the modules it imports)
    is not."""
    mutate = load_mutate()
    import mutate_record as record

    first, clone = tmp_path / "first", tmp_path / "clone"
    mutmut_project(first, {"src/pkg/__init__.py": "",
                          "src/pkg/m.py": "def add(a, b):\n    return a + b\n\n\n"
                                          "def scale(a):\n    return a * 3 + 1\n",
                          "tests/conftest.py": "import sys\nsys.path.insert(0, 'src')\n",
                          "tests/test_m.py": "from pkg.m import add, scale\n\n\ndef test_m():\n"
                                             "    assert add(2, 3) == 5 and scale(2) == 7\n",
                          "tests/test_other.py": "", "tests/test_some.py": "",
                          "tests/mutation_equivalent.yaml": "[]\n",
                          "pyproject.toml": "[tool.mutmut]\nsource_paths = ['src']\n"
                                            "only_mutate = ['src/pkg/m.py']\n"
                                            "pytest_add_cli_args_test_selection = "
                                            "['tests/test_m.py']\n"})
    shutil.copytree(first, clone)
    assert set(run_mutmut(first).values()) == {1}  # five mutants, each killed
    config, paths, logs = {"only_mutate": ["src/pkg/m.py"],
                           "pytest_add_cli_args_test_selection": [
                               "tests/test_m.py", "tests/test_some.py::test_a"]}, [
        Path("src/pkg/m.py")], mutate.LOGS
    (first / "mutants" / mutate.RUNS_LOG).write_text("2026-11-30 01:00\tall\t0.1\ttree\tcpu A\n")
    tree = record.tree_of(config, first)
    monkeypatch.setattr(record, "RECORD", tmp_path / "record.json")
    record.save("core", record.entry_of(first / "mutants", paths, logs, tree))
    held = record.load()["core"]
    assert held["verdicts"]["src/pkg/m.py"]["codes"] == {"pkg.m.x_add": [1],
                                                         "pkg.m.x_scale": [1, 1, 1, 1]}
    # a verdict the clone must keep (marked survived, which no run here gives) and one it
    # must find (none)
    held["verdicts"]["src/pkg/m.py"]["codes"]["pkg.m.x_scale"][1:3] = [0, None]
    record.save("core", held)
    assert record.tree_of(config, clone) == tree
    profile = mutate.Profile("core", clone, config)
    mutate.resume(profile, tree)
    assert "goes on from the 4 verdicts" in capsys.readouterr().out
    codes = run_mutmut(clone)
    assert (codes["pkg.m.x_scale__mutmut_2"], codes["pkg.m.x_scale__mutmut_3"]) == (0, 1)
    assert (clone / "mutants" / mutate.RUNS_LOG).read_text() == (
        first / "mutants" / mutate.RUNS_LOG).read_text()

    shutil.rmtree(clone / "mutants")
    mutate.resume(profile, "another")
    assert "for another tree (" + tree in capsys.readouterr().out
    assert not (clone / "mutants").exists()
    for name, part_of_tree in (("tests/test_other.py", False),
                               ("tests/mutation_equivalent.yaml", False),
                               ("tests/test_m.py", True), ("tests/test_some.py", True),
                               ("tests/conftest.py", True),
                               ("src/pkg/m.py", True)):
        (clone / name).write_text((first / name).read_text() + "# changed\n")
        assert (record.tree_of(config, clone) != tree) == part_of_tree, name
        (clone / name).write_text((first / name).read_text())
    assert record.tree_of({**config, "timeout_multiplier": 3.0}, clone) != tree
    copying = {**config, "also_copy": ["tools"]}  # as the profiles copy tools/
    (clone / "tools").mkdir()
    for name in ("mutate.py", "mutate_record.py", "mutmut_results.py", "doc_figures.py"):
        (clone / "tools" / name).write_text("")
    copied = record.tree_of(copying, clone)
    for name, part_of_tree in (("mutate.py", False), ("mutate_record.py", False),
                               ("mutmut_results.py", False), ("doc_figures.py", True)):
        (clone / "tools" / name).write_text("# changed\n")
        assert (record.tree_of(copying, clone) != copied) == part_of_tree, name
        (clone / "tools" / name).write_text("")

    meta = first / "mutants/src/pkg/m.py.meta"  # results mutmut 3 does not write: one line
    meta.write_text(json.dumps({"exit_code_by_key": {"pkg.m.x_add__mutmut_2": 1},
                                "hash_by_function_name": {}}))
    with pytest.raises(SystemExit, match="numbers pkg.m.x_add's mutants with gaps"):
        record.verdicts(first / "mutants", paths)


def test_a_stop_keeps_the_verdicts_of_the_snapshot_and_no_other(tmp_path):
    """make mutate-stop takes a snapshot of mutmut's verdicts before it stops the run: a
    verdict given after it (which the stop may have given) is set back to not run, and a .meta
    that the stop cut short mid-write is the snapshot's again (tools/mutate_stop.py)."""
    load_mutate()
    import mutate_stop

    def meta(*codes: int | None) -> dict:  # a .meta of pkg.m.f's mutants 1, 2, ...
        return {"exit_code_by_key": {f"pkg.m.x_f__mutmut_{n}": code
                                     for n, code in enumerate(codes, start=1)},
                "hash_by_function_name": {"pkg.m.x_f": "h"}, "type_check_error_by_key": {},
                "durations_by_key": {}, "estimated_durations_by_key": {}}

    late, torn = tmp_path / "late.py.meta", tmp_path / "torn.py.meta"
    for path in (late, torn):
        path.write_text(json.dumps(meta(1, None, None)))
    snapshot = mutate_stop.snapshot_of(tmp_path, [Path("late.py"), Path("torn.py")])
    late.write_text(json.dumps(meta(1, 0, 1)))  # two verdicts since
    torn.write_text(late.read_text()[:40])  # the stop's SIGTERM in mutmut's write
    assert mutate_stop.set_back(snapshot) == ["pkg.m.x_f__mutmut_2", "pkg.m.x_f__mutmut_3"]
    for path in (late, torn):
        assert json.loads(path.read_text()) == meta(1, None, None), path
    assert mutate_stop.given_after({"a": 1, "b": None}, {"a": 0, "b": 1, "c": None}) == ["a", "b"]


def test_make_mutate_stop_ends_the_run_and_records_what_the_tests_gave(tmp_path):
    """A run stopped by make mutate-stop (tools/mutate_stop.py) leaves no process behind, the
    mutants it was running among them, and its record holds each verdict the tests gave and
    none for the mutants the stop cut short. mutmut runs for real (tools/mutate.py, as make
    mutate runs it) on a project whose fast() mutants are killed at once and whose slow()
    mutants sleep a minute in their test, the stop coming while they sleep."""
    files = {"src/pkg/__init__.py": "",
             "src/pkg/m.py": "def fast(a):\n    return a * 3\n\n\n"
                             "def slow(a):\n    return a + 1\n",
             "tests/conftest.py": "import sys\nsys.path.insert(0, 'src')\n",
             "tests/test_m.py": (
                 "import os\nimport time\nfrom pathlib import Path\n\n"
                 "from pkg.m import fast, slow\n\n\ndef test_fast():\n"
                 "    assert fast(2) == 6\n\n\ndef test_slow():\n"
                 "    if 'x_slow' in os.environ.get('MUTANT_UNDER_TEST', ''):\n"
                 "        (Path(os.environ['SLEEPING']) / str(os.getpid())).touch()\n"
                 "        time.sleep(60)\n"
                 "    time.sleep(0.3)  # in the stats too: mutmut runs slow()'s mutants last\n"
                 "    assert slow(1) == 2\n"),
             "tests/mutation_equivalent.yaml": "[]\n",
             "pyproject.toml": "[tool.mutmut]\nsource_paths = ['src']\n"
                               "only_mutate = ['src/pkg/m.py']\n"
                               "pytest_add_cli_args_test_selection = ['tests/test_m.py']\n"
                               "process_isolation = 'forkserver'\n",
             **{f"tools/{name}": (REPO / "tools" / name).read_text() for name in (
                 "mutate.py", "mutate_record.py", "mutmut_results.py", "mutate_stop.py")}}
    project, sleeping = mutmut_project(tmp_path / "project", files), tmp_path / "sleeping"
    (project / "docs").mkdir()
    sleeping.mkdir()
    env = {**os.environ, "SLEEPING": str(sleeping)}
    log = open(tmp_path / "make-mutate.out", "w")  # noqa: SIM115 (mutmut's spinner: a file)
    run = subprocess.Popen([sys.executable, "tools/mutate.py", "--profile", "core"],
                           cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT)
    meta = project / "mutants/src/pkg/m.py.meta"

    def fast_codes() -> list:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            return [code for name, code in codes.items() if "x_fast" in name]
        return []

    deadline = time.monotonic() + 120
    while not (any(sleeping.iterdir()) and fast_codes() and None not in fast_codes()):
        assert run.poll() is None and time.monotonic() < deadline, log.name
        time.sleep(0.2)
    started = time.monotonic()
    stop = subprocess.run([sys.executable, "tools/mutate_stop.py", "--wait", "20"],
                          cwd=project, capture_output=True, text=True, timeout=90)
    assert stop.returncode == 0 and time.monotonic() - started < 30, stop.stderr
    assert run.wait(timeout=10) != 0, "mutmut's stop is not a finished run"
    log.close()
    assert (tmp_path / "make-mutate.out").read_text().splitlines()[-1] == (
        "mutate: mutmut run ended by SIGTERM; its verdicts so far are in "
        "docs/mutation-record.json, where the next run goes on")
    sleepers = [int(path.name) for path in sleeping.iterdir()]
    assert not [pid for pid in sleepers if pid_lives(pid)], "a mutant's tests still run"

    held = json.loads((project / "docs/mutation-record.json").read_text())["core"]
    codes = held["verdicts"]["src/pkg/m.py"]["codes"]
    assert set(codes["pkg.m.x_fast"]) == {1} and set(codes["pkg.m.x_slow"]) == {None}, codes
    given = len(codes["pkg.m.x_fast"])
    total = given + len(codes["pkg.m.x_slow"])
    assert f"stopped at {given} of {total} verdicts (tree {held['tree']}); 0 given" in stop.stdout
    again = subprocess.run([sys.executable, "tools/mutate_stop.py"], cwd=project,
                           capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stderr.strip()) == (1, f"mutate-stop: no make mutate of "
                                                           f"{project} is running mutmut "
                                                           f"(nothing stopped)")


def pid_lives(pid: int) -> bool:
    """The process runs (a zombie that no parent reaped yet does not)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_mutmut_copies_a_file_inside_a_folder_once_make_mutate_made_the_folder(tmp_path):
    """also_copy lists what the tests read, a file inside a folder among them
    (tools/gpu/check_graphs.py): mutmut's own copy of it fails without its folder in mutants/,
    and succeeds once make mutate made it."""
    mutate = load_mutate()
    config = {"source_paths": ["src"],
              "also_copy": ["params.yaml", "tools/gpu/check.py", "reports/run"]}
    for name in ("src/pkg/m.py", "params.yaml", "tools/gpu/check.py", "reports/run/a.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "pyproject.toml").write_text(mutate.with_mutmut_table(
        "[tool.mutmut]\n", config))
    copy = [sys.executable, "-c", "from mutmut.utils.file_utils import copy_also_copy_files; "
            "copy_also_copy_files()"]
    (tmp_path / "mutants").mkdir()  # mutmut's copy of src/ made it
    assert subprocess.run(copy, cwd=tmp_path, capture_output=True).returncode != 0
    mutate.copy_folders(mutate.Profile("core", tmp_path, config))
    subprocess.run(copy, cwd=tmp_path, capture_output=True, check=True)
    for name in ("params.yaml", "tools/gpu/check.py", "reports/run/a.json"):
        assert (tmp_path / "mutants" / name).read_text() == name


def test_mutate_places_a_mutation_on_its_line():
    """tools/mutmut_results.py reads mutmut's diff of a function (counted from its `def`) into the
    mutated line's distance from the `def` and the text before and after."""
    load_mutate()
    import mutmut_results as results

    diff = ["@@ -1,5 +1,5 @@", " def f(x):", "     y = 2", "-    return x + y", "+    return x - y",
            "     # end"]
    assert results.changed_lines(diff) == (2, "return x + y", "return x - y")
    assert results.changed_lines(["@@ -3,2 +3,2 @@", "-    a,", "-    b)", "+    a)"]) == (
        2, "a, b)", "a)")
    mutant = results.Mutant("nmt.core.stats.xǁSummaryǁformat__mutmut_6", Path("src/x.py"),
                           "survived", 51, "a", "b")
    assert mutant.function == "nmt.core.stats.Summary.format"
    assert dataclasses.replace(mutant, name="nmt.core.loss.x_token_loss__mutmut_2").function \
        == "nmt.core.loss.token_loss"


def test_an_exclusion_no_surviving_mutant_needs_is_named():
    """An entry of tests/mutation_equivalent.yaml whose mutant a test kills now is listed for
    deletion, but only where its module ran (a run of one module says nothing of the rest)
    and its function's mutants all did (a stopped run says nothing of those not run yet);
    the model interface's protocol stubs are not mutated (a mutant breaks isinstance)."""
    mutate = load_mutate()
    known = {("nmt.core.loss.corpus_loss", "a", "b"): ("equivalent", "why"),
             ("nmt.core.loss.corpus_loss", "c", "d"): ("GPU only", "why"),
             ("nmt.core.stats.aggregate", "e", "f"): ("equivalent", "why")}
    used = {("nmt.core.loss.corpus_loss", "a", "b")}
    assert mutate.unneeded(known, used, {"nmt.core.loss"}) == [
        ("nmt.core.loss.corpus_loss", "c", "d")]
    assert mutate.unneeded(known, used, {"nmt.core.lo"}) == []  # a module's name, whole
    # a run stopped before corpus_loss's mutants: no verdict on them yet, nothing to delete
    assert mutate.unneeded(known, used, {"nmt.core.loss"}, {"nmt.core.loss.corpus_loss"}) == []
    assert mutate.module_of(Path("src/nmt/models/__init__.py")) == "nmt.models"
    paths = mutate.mutated_paths()
    assert Path("src/nmt/models/interface.py") not in paths
    assert Path("src/nmt/models/masks.py") in paths


def test_mutate_runs_the_training_profile_in_a_folder_of_its_own(tmp_path):
    """The training modules are mutated apart from the core (their tests train): the profiles
    share no module, each module has one, and the training profile's folder holds links to
    the checkout and a pyproject.toml whose [tool.mutmut] is the profile's settings (mutmut
    reads no other), every other table as the checkout's."""
    import tomllib

    mutate = load_mutate()
    core, training = mutate.profiles()
    assert (core.name, core.root, training.name) == ("core", REPO, "training")
    assert not set(core.paths()) & set(training.paths())
    assert Path("src/nmt/training/loop.py") in training.paths()
    assert mutate.profile_of("src/nmt/training/state.py") == training
    assert mutate.profile_of("src/nmt/core/stats.py") == core
    with pytest.raises(SystemExit, match="src/nmt/cli.py is not a module"):
        mutate.profile_of("src/nmt/cli.py")
    assert training.config["process_isolation"] == core.config["process_isolation"]
    assert "tests/test_train.py" in training.config["pytest_add_cli_args_test_selection"]
    assert "tests/test_train.py" not in core.config["pytest_add_cli_args_test_selection"]

    here = dataclasses.replace(training, root=tmp_path / "training")
    mutate.workspace(here)
    mutate.workspace(here)  # again: the links stay, the file is rewritten
    for name in ("src", "tests", *training.config["also_copy"]):
        assert (here.root / name).resolve() == REPO / name
    written = tomllib.loads((here.root / "pyproject.toml").read_text())
    checkout = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert written["tool"]["mutmut"] == training.config
    assert {k: v for k, v in written["tool"].items() if k != "mutmut"} == \
        {k: v for k, v in checkout["tool"].items() if k != "mutmut"}
    assert {k: v for k, v in written.items() if k != "tool"} == \
        {k: v for k, v in checkout.items() if k != "tool"}


@pytest.mark.parametrize("argv, ran", [([], ["core", "training"]),
                                       (["--profile", "training"], ["training"])])
def test_make_mutate_profile_runs_that_profile_alone(argv, ran, tmp_path, monkeypatch):
    """make mutate PROFILE=training: one profile's whole run (a whole run spread over
    sessions), then the summary; a name that is no profile is refused in one line."""
    mutate = load_mutate()
    runs = []
    monkeypatch.setattr(mutate, "run_mutmut", lambda profile: runs.append(profile.name) or 1.0)
    monkeypatch.setattr(mutate, "summary", lambda minutes: f"ran {minutes}\n## Survivors\n")
    shutil.copy(REPO / "pyproject.toml", tmp_path)  # the profiles
    monkeypatch.setattr(mutate, "ROOT", tmp_path)  # main() goes there: back after the test
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mutate, "SUMMARY", tmp_path / "mutation.md")
    monkeypatch.setattr(sys, "argv", ["mutate.py", *argv])
    mutate.main()
    assert runs == ran and mutate.SUMMARY.read_text().startswith(f"ran {float(len(ran))}")
    refused = subprocess.run([sys.executable, "tools/mutate.py", "--profile", "models"],
                             cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2 and "invalid choice: 'models'" in refused.stderr


def test_every_equivalent_mutant_is_a_line_of_the_code_with_a_reason():
    """tests/mutation_equivalent.yaml stays true to the code: each entry names a function of a
    module make mutate mutates, its `before` is that function's text, and it says why (and,
    for a path a CPU never takes, that it is GPU only)."""
    mutate = load_mutate()
    modules = {".".join(p.with_suffix("").parts[1:]): p for p in mutate.mutated_paths()}
    for entry in yaml.safe_load(mutate.EQUIVALENT.read_text()):
        assert set(entry) - {"kind"} == {"function", "before", "after", "why"} and entry["why"]
        assert entry.get("kind", "equivalent") in mutate.KINDS, entry
        module = max((m for m in modules if entry["function"].startswith(m + ".")), key=len)
        *owner, name = entry["function"][len(module) + 1:].split(".")
        tree = ast.parse((REPO / modules[module]).read_text())
        scope = [n for n in tree.body if isinstance(n, ast.ClassDef) and [n.name] == owner]
        [function] = [n for n in (scope[0].body if owner else tree.body)
                      if isinstance(n, ast.FunctionDef) and n.name == name]
        text = " ".join(line.strip() for line in ast.get_source_segment(
            (REPO / modules[module]).read_text(), function).splitlines())
        assert entry["before"] in text and entry["before"] != entry["after"], entry


# ---- tools/cpu_seconds.py: make test's table of CPU-seconds ---------------------------------

def test_make_tests_table_counts_each_tests_processes_on_every_worker(tmp_path):
    """Two workers, each running a module: a test whose child process burns a CPU-second is
    counted with its child's seconds (which --durations would give as wall seconds, whatever
    else the machine ran), under its module; the total is every test's. The census counts
    the Python processes started (two workers, two children), the one that imported torch,
    and leaves neither its .pth file in the environment nor its own file."""
    burn = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    (tmp_path / "test_busy.py").write_text(
        "import subprocess, sys\n\n\ndef test_child_burns():\n"
        f"    subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n\n\n"
        "def test_child_imports_torch():\n"
        "    subprocess.run([sys.executable, '-c', 'import torch'], check=True)\n")
    (tmp_path / "test_idle.py").write_text("def test_nothing():\n    pass\n")
    site = Path(sysconfig.get_paths()["purelib"])
    before, temp = set(site.glob("*.pth")), tmp_path / "temp"
    temp.mkdir()
    # Options given to make test's own pytest are not the inner run's: with
    # PYTEST_ADDOPTS="--durations=0 -v" its durations' lines were read as the table's.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "cpu_seconds.py"), "-n", "2",
                           "-p", "no:cacheprovider", "--host-repeats", "0", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stdout[-3000:]
    lines = done.stdout.splitlines()
    total = next(line for line in lines if line.startswith("CPU-seconds in the tests"))
    assert total.endswith("over 3 tests"), total
    busy = [float(line.split()[0]) for line in lines if line.endswith("::test_child_burns")]
    assert len(busy) == 1 and 1.0 <= busy[0] < 5, lines
    census = next(line for line in lines if line.startswith("Python processes"))
    assert census.startswith("Python processes the run started: 4; 1 imported torch"), census
    assert not [line for line in lines if line.startswith("this host after")]  # --host-repeats 0
    during = next(line for line in lines if line.startswith("this host during the run"))
    assert int(during.split("(")[1].split()[0]) >= 2, during  # a sample a module a worker
    assert set(site.glob("*.pth")) == before
    assert not list(temp.glob("make-test-processes-*"))


def test_make_tests_table_ends_with_the_host():
    spec = importlib.util.spec_from_file_location("cpu_seconds", REPO / "tools/cpu_seconds.py")
    cpu_seconds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu_seconds)

    census = cpu_seconds.Census(processes=1200, torch_imports=[2.0, 3.0, 9.5])
    host = cpu_seconds.Host("Some CPU, amx_bf16", [(0.05, 0.3), (0.07, 0.1), (0.2, 0.2)],
                            2.345, 3)
    lines = cpu_seconds.table({"tests/test_a.py::t1": 3.0, "tests/test_a.py::t2": 1.0,
                               "tests/test_b.py::t": 4.0}, census, host)
    assert lines[0].endswith(": 8 over 3 tests") and lines[1] == "by module:"
    assert lines[2:4] == ["      4.0  50.0 %  tests/test_a.py",
                          "      4.0  50.0 %  tests/test_b.py"]
    assert lines[-4:] == [
        "Python processes the run started: 1,200; 3 imported torch, in 14 CPU-seconds "
        "(median 3.00 each)",
        "this host during the run (3 samples, median and range, CPU-seconds): a Python loop of "
        "3,000,000 steps 0.07 (0.05-0.20), 64 MB of fresh memory written 0.20 (0.10-0.30)",
        "this host after the run: import torch takes 2.35 CPU-seconds (median of 3)",
        "this host: Some CPU, amx_bf16"]
    no_host = cpu_seconds.table({"tests/test_a.py::t": 1.0}, None,
                                cpu_seconds.Host("x", [], None, 0))
    assert no_host[-2:] == ["      1.0  tests/test_a.py::t", "this host: x"]

    loop, write = cpu_seconds.probe()  # real figures: each costs something, neither minutes
    assert 0 < loop < 60 and 0 < write < 60


def test_the_tests_guard_names_what_a_test_wrote_into_the_checkouts_pipeline_files(tmp_path):
    """tests/conftest.py fails a session that changed what a later run in the checkout reads
    (test_precision's estimate once wrote results/precision/<recipe>.json there)."""
    from conftest import changed, pipeline_files

    (tmp_path / "results" / "precision").mkdir(parents=True)
    (tmp_path / "results" / "old.json").write_text("{}")
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "sources.sha256").write_text("the Snakefile writes it\n")
    before = pipeline_files(tmp_path)
    assert sorted(before) == ["params.yaml", "results/old.json"]
    assert changed(before, pipeline_files(tmp_path)) == []

    (tmp_path / "results" / "precision" / "demo.json").write_text("{}")
    (tmp_path / "params.yaml").write_text("seed: 12\n")
    (tmp_path / "results" / "old.json").unlink()
    (tmp_path / "docs" / "notes.md").write_text("not a pipeline file")
    (tmp_path / "params" / "sources.sha256").write_text("rewritten on every read\n")
    (tmp_path / "params" / "demo.yaml").write_text("model: {}\n")
    assert changed(before, pipeline_files(tmp_path)) == [
        "params.yaml (changed)", "params/demo.yaml (new)", "results/old.json (removed)",
        "results/precision/demo.json (new)"]
