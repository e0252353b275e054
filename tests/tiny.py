"""A tiny copy of the repository for end-to-end runs of both orchestrators (tests only)."""

from __future__ import annotations

import copy
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from conftest import REPO, edit_params

# A hung command fails its test; a whole tiny pipeline takes about 10 minutes on a quiet
# 2-core machine, twice that beside other work.
TIMEOUT = 2400
BIN = Path(sys.executable).parent  # nmt, dvc and snakemake live beside this python

TINY = {
    "data": {"max_train_pairs": 1000, "max_test_pairs": 50},
    # decoder_only_layers 2, not 0 (as many blocks as match the encoder-decoder's size): at this
    # size the matching gives 10 blocks to the others' 1+1, which only made its runs slow;
    # tests/test_decoder_only.py checks the matching.
    "model": {"num_encoder_layers": 1, "num_decoder_layers": 1, "d_model": 32, "nhead": 2,
              "dim_feedforward": 64, "dropout": 0.1, "decoder_only_layers": 2},
    # fp32: `auto` is bf16 on a CPU that has it, 1.7 times as slow at this size (test_gpu_path).
    "train": {"epochs": 1, "batch_size": 32, "precision": "fp32"},
    "evaluate": {"beam_size": 2, "batch_size": 50},
    "bench": {"steps": 2, "repeats": 1, "sentences": 10},
    "report": {"samples": 3},
    # One seed: the per-seed files (evaluation, bootstrap) flow into the report for real; the
    # statistics over seeds (mean ± std, Welch) are tested on results folders of several seeds
    # (tests/test_report.py, tests/test_stats.py). A second seed doubled the trainings,
    # evaluations and exports of both tiny pipelines and took make test over 15 minutes. One
    # model's runs exported: the export stage runs under both tools, and the contract covers it.
    "pipeline": {"recipes": ["published", "tuned"],
                 "models": ["baseline", "scratch", "decoder_only"], "seeds": [0],
                 "export": ["scratch"]},
}


def scratch_copy(dest: Path) -> Path:
    """The files a fresh clone has (tracked, plus new files not ignored), with tiny params."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, files.split("\0")):
        src = REPO / rel
        if src.is_file() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    # The real run's outputs are not the smoke's; the published full-size run the report
    # reads (an input: `nmt report --full-size`) stays.
    kept = dest / "reports" / "h200-published"
    for target in [dest / "dvc.lock", *(dest / "reports").iterdir()]:
        if target != kept:
            shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    recipes = {name: tiny_recipe(r) for name, r in params["recipes"].items()}
    edit_params(dest / "params.yaml", **TINY, recipes=recipes)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def tiny_recipe(recipe: dict) -> dict:
    """Keep what a recipe changes in kind (vocabulary, tying, batching); shrink what costs."""
    recipe = copy.deepcopy(recipe)
    if "model" in recipe:
        recipe["model"].update(TINY["model"])
    if "bpe_size" in recipe.get("vocab", {}):
        recipe["vocab"]["bpe_size"] = 500
    if "train" in recipe:  # the top level (published) trains 1 epoch already
        recipe["train"].update(epochs=1, average_last=min(recipe["train"].get("average_last",
                                                                              0), 1))
    if recipe.get("train", {}).get("batch_by") == "tokens":  # tuned: 2 DDP processes (Gloo)
        recipe["train"]["devices"] = 2
    if "evaluate" in recipe:
        recipe["evaluate"].update(beam_size=2)
    return recipe


def run(cmd: list[str], cwd: Path, env: dict | None = None, check: bool = True) -> str:
    return finish(start(cmd, cwd, env), check)


def start(cmd: list[str], cwd: Path, env: dict | None = None, cores: set[int] | None = None,
          new_session: bool = False) -> subprocess.Popen:
    """cmd started in cwd (in the background, so that a test can do something else meanwhile);
    cores: the only ones it and its children may run on (their torch takes that many threads,
    nmt.pipeline.commandline.usable_cores); new_session: in a session of its own (which a test hook
    can kill whole). Its output goes to a file, not a pipe: a pipe nobody reads while the test waits
    for something else fills up and stops the command until then."""
    # The copy runs its own sources (the venv's editable install points at the repository).
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(cwd / "src"),
           **(env or {})}
    output = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT,
                            preexec_fn=pin, start_new_session=new_session)
    proc.output = output
    return proc


def finish(proc: subprocess.Popen, check: bool = True) -> str:
    """What a started command printed, once it ended (within TIMEOUT seconds)."""
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    with proc.output as file:
        file.seek(0)
        output = file.read()
    assert proc.returncode == 0 or not check, f"{' '.join(proc.args)} failed:\n{output[-4000:]}"
    return output


def halves() -> tuple[set[int], set[int]]:
    """This machine's cores in two halves of one size, for two runs at once that must give the
    same numbers (the same thread count); on one core, that core twice."""
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    return (set(cores[:half]) or set(cores)), (set(cores[half:2 * half]) or set(cores))


def run_at_once(commands: list[tuple[list[str], Path, dict | None]]) -> list[str]:
    """Two (cmd, cwd, env) run at once, each on its own half of the cores (halves); what each
    printed, once both ended (a failure fails the test only then)."""
    running = [start(cmd, cwd, env, cores)
               for (cmd, cwd, env), cores in zip(commands, halves(), strict=True)]
    outputs = [finish(proc, check=False) for proc in running]
    for proc, output in zip(running, outputs, strict=True):
        assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{output[-4000:]}"
    return outputs


def check_report(root: Path) -> None:
    """Every (recipe, model, seed, test set) has its row; the report has its sections."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    p = params["pipeline"]
    with open(root / "reports" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    expected = {(r, m, t) for r in p["recipes"] for m in p["models"]
                for t in params["evaluate"]["testsets"]}
    assert {(r["recipe"], r["model"], r["testset"]) for r in rows} >= expected
    assert {r["seed"] for r in rows} == {str(s) for s in p["seeds"]}
    report = (root / "reports" / "report.md").read_text()
    for heading in ("## Verification", "## Setup"):
        assert heading in report
    # Each recipe: mean ± std over the seeds, and verdicts with a CI and a p-value.
    assert report.count("scratch - baseline:") >= 2 * len(p["recipes"])
    assert "± " in report and "95% CI" in report and "p = " in report
    # What the translations did with <unk>: copied (params' default), with each run's count.
    assert "Words the vocabulary lacks (`<unk>` in an output): copied from the source" in report
    assert f"published-scratch-s{p['seeds'][0]} " in report.split("Words the vocabulary")[1]
    assert (root / "reports" / "figures" / "loss.png").stat().st_size > 1000
