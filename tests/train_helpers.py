"""Tiny training runs on real data, shared by test_train, test_resume and test_distributed."""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO
from nmt.core.runs import Run, RunFiles
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from nmt.training.loop import TIMING_FIELDS
from nmt.training.state import Paths

TINY_MODEL = {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
              "dim_feedforward": 64, "dropout": 0.1}
# fp32: on a CPU with native bf16, `auto` trains in bf16, which at this size takes about 1.7
# times as long an epoch (tests/test_gpu_path.py covers bf16 training on its own).
TINY_TRAIN = {"epochs": 3, "batch_size": 32, "lr": 1.0e-3, "device": "cpu", "precision": "fp32"}
# train.json's values that differ between two processes of identical numbers: wall-clock,
# the process's peak memory and its compile time.
SUMMARY_TIMING = ("seconds_per_epoch", "train_minutes", "tokens_per_second", "peak_memory_mb",
                  "compile_seconds", "seconds")


def tiny_data(prepared: dict, dest: Path, train: int = 300, val: int = 100) -> dict:
    """The first `train` / `val` pairs of the prepared data, and the word vocabulary as
    <dest>/vocab/published (where `nmt train --recipe published` looks)."""
    tok = dest / "tokenized"
    tok.mkdir(parents=True)
    for path in prepared["tokenized"].iterdir():
        split = path.name.split(".")[0]
        keep = {"train": train, "val": val}.get(split)
        if keep is not None and path.suffix in (".txt", ".tok"):
            lines = path.read_text("utf-8").split("\n")[:keep]
            (tok / path.name).write_text("\n".join(lines) + "\n", "utf-8")
    shutil.copytree(prepared["word"], dest / "vocab" / "published")
    return {"tokenized": tok, "vocab": dest / "vocab", "results": dest / "results"}


def tiny_params(**train) -> dict:
    """The published recipe, resolved, with a tiny model and `train` overrides."""
    params = resolve(load_params(REPO / "params.yaml"), "published")
    params["model"].update(TINY_MODEL)
    params["train"].update({**TINY_TRAIN, **train})
    return params


def train_paths(data: dict, results: Path, run: Run) -> Paths:
    """What `train` reads the tiny data from (tiny_data) and writes run's folder under."""
    return Paths(tokenized=data["tokenized"], vocab=data["vocab"] / "published",
                 run=run.files(results))


def params_file(dest: Path, model: dict | None = None, **train) -> Path:
    """A params.yaml (with its schema) whose top level, the published recipe, is tiny."""
    shutil.copytree(REPO / "workflow" / "schemas", dest / "workflow" / "schemas",
                    dirs_exist_ok=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["model"].update({**TINY_MODEL, **(model or {})})
    params["train"].update({**TINY_TRAIN, **train})
    path = dest / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def train_argv(params: Path, data: dict, *extra: str, model: str = "scratch") -> list[str]:
    return ["--params", str(params), "train", "--recipe", "published", "--model", model,
            "--tokenized", str(data["tokenized"]), "--vocab", str(data["vocab"] / "published"),
            "--results", str(data["results"]), *extra]


def nmt_process(argv: list[str], kill_at: str | None = None, timeout: float = 120,
                launcher: list[str] | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m nmt <argv>` (or `<launcher> -m nmt <argv>`) in a fresh single-threaded process
    (with `env` added to this one's environment); kill_at sets the test hook NMT_TEST_KILL_AT."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"), **(env or {})}
    env.pop("NMT_TEST_KILL_AT", None)
    if kill_at:
        env["NMT_TEST_KILL_AT"] = kill_at
    cmd = (launcher or [sys.executable]) + ["-m", "nmt", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def read_outputs(run_dir: Path) -> dict:
    """What must be identical between two runs of one seed: checkpoint bytes, history and
    summary without their wall-clock fields."""
    files = RunFiles(run_dir)
    with open(files.history) as f:
        history = [{k: v for k, v in row.items() if k not in TIMING_FIELDS}
                   for row in csv.DictReader(f)]
    summary = json.loads(files.summary.read_text())
    for key in SUMMARY_TIMING:
        summary.pop(key, None)
    return {"best.pt": files.best.read_bytes(), "last.pt": files.last.read_bytes(),
            "history": history, "summary": summary}


def assert_same_outputs(a: Path, b: Path) -> None:
    x, y = read_outputs(a), read_outputs(b)
    assert x["history"] == y["history"]
    assert x["summary"] == y["summary"]
    assert x["last.pt"] == y["last.pt"], "last.pt differs"
    assert x["best.pt"] == y["best.pt"], "best.pt differs"


def with_train(params: dict, **train) -> dict:
    out = copy.deepcopy(params)
    out["train"].update(train)
    return out
