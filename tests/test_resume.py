"""Interrupted training resumes to the same numbers: SIGKILL anywhere, SIGTERM, SIGINT.

Killed runs are real processes (`python -m nmt train` with the test hook NMT_TEST_KILL_AT,
read in nmt/training/faults.py); each is resumed in this process and its outputs compared byte
for byte with an uninterrupted run: best.pt, last.pt, history.csv and train.json (wall-clock
columns aside, nmt.training.loop.TIMING_FIELDS). Tiny model, 300 pairs: 10 updates an epoch,
3 epochs.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from conftest import rows_of_lines
from nmt import cli
from nmt.core.errors import NmtError
from nmt.core.runs import Run
from nmt.training import resume, state_writer
from nmt.training.distributed import World
from nmt.training.resume import StopSignals
from train_helpers import (
    assert_same_outputs,
    nmt_process,
    params_file,
    read_outputs,
    tiny_data,
    train_argv,
)

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = Run("published", "scratch", 0)
EVERY_STEP = 1e-9  # save_every_minutes: a resume state after every update


@pytest.fixture(scope="module")
def setup(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    data = tiny_data(prepared, root)
    files, refs = {}, {}
    for name, every in (("epochs", 0), ("steps", EVERY_STEP)):
        (root / name).mkdir()
        files[name] = params_file(root / name, epochs=3, average_last=2, save_every_minutes=every)
        # Checkpoints embed the params, save_every_minutes included: one reference each.
        assert cli.main(train_argv(files[name], {**data, "results": root / name})) == 0
        refs[name] = RUN.dir(root / name)
    return {"data": data, "params": files, "reference": refs}


def resume_in_process(argv: list[str], caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nmt"):
        assert cli.main(argv) == 0
    return caplog.text


def killed(setup, tmp_path, kill_at: str, saves: str) -> tuple[list[str], object]:
    data = {**setup["data"], "results": tmp_path / "results"}
    argv = train_argv(setup["params"][saves], data)
    proc = nmt_process(argv, kill_at)
    # the signal's line, said while the epoch's bar was drawn, has a row of its own
    rows_of_lines(proc.stderr)
    return argv, proc


@pytest.mark.parametrize("kill_at, saves, resumed_from", [
    ("step:14", "epochs", "epoch 2, step 10 of 30"),  # mid-epoch: back to the epoch's start
    ("step:14", "steps", "epoch 2, step 13 of 30"),  # mid-epoch: from the state of step 13
    ("save:5", "steps", "epoch 1, step 4 of 30"),  # half-way through writing a state
    ("valid:2", "epochs", "epoch 2, step 10 of 30"),  # during validation
    ("valid:4", "epochs", "epoch 4, step 30 of 30"),  # validating the averaged weights
])
def test_sigkill_then_resume_is_bit_identical(setup, tmp_path, caplog, kill_at, saves,
                                              resumed_from):
    argv, proc = killed(setup, tmp_path, kill_at, saves)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    reference = setup["reference"][saves]
    run_dir = RUN.dir(tmp_path / "results")
    outputs = RUN.files(tmp_path / "results").trained
    assert not any(path.exists() for path in outputs)  # nothing looks finished
    if kill_at.startswith("save"):
        assert list(run_dir.glob(".resume.pt.*.tmp"))  # the write really was cut short
    log = resume_in_process(argv, caplog)
    assert f"resuming from {resumed_from} " in log
    assert_same_outputs(reference, run_dir)
    # The outputs alone: the resume state and the temporary file are gone.
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in outputs)


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_signal_stops_after_the_step_and_keeps_a_state(setup, tmp_path, caplog, sig):
    argv, proc = killed(setup, tmp_path, f"step:14:{sig}", "epochs")
    number = getattr(signal, f"SIG{sig}")
    assert proc.returncode == 128 + number, proc.stderr[-2000:]
    run_dir = RUN.dir(tmp_path / "results")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"nmt train: stopped by SIG{sig} at epoch 2, step 14 of 30; kept "
                           f"{run_dir / 'resume.pt'} (epoch 2, step 14 of 30); ")
    assert "--model scratch --seed 0` (same options) again resumes from there" in last
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["resume.pt"]
    state = torch.load(run_dir / "resume.pt", weights_only=True)  # plain types and tensors
    assert state["format"] == resume.FORMAT and len(state["ranks"]) == 1
    assert {"model", "optimizer", "scheduler", "config", "config_hash", "progress"} <= set(state)
    p = state["progress"]
    assert (p["epoch"], p["batch"], p["step"], len(p["history"]), len(p["recent"])) == (
        2, 4, 14, 1, 1)
    killed_wall = p["earlier"]["wall"]  # the stopped process's seconds, from its start
    assert killed_wall > p["earlier"]["start"] > 0
    assert "resuming from epoch 2, step 14 of 30 " in resume_in_process(argv, caplog)
    assert {"precision kept from the run's start: training fp32, decoding fp32",
            "resuming from epoch 2, step 14 of 30 (batch 4 of 10 of the epoch), from "
            f"{run_dir / 'resume.pt'}"} <= set(caplog.messages)  # each line whole
    assert_same_outputs(setup["reference"]["epochs"], run_dir)
    seconds = json.loads(RUN.files(tmp_path / "results").summary.read_text())["seconds"]
    assert seconds["wall"] > killed_wall  # both processes' time, not only the last one's


def test_a_run_resumed_with_other_threads_says_so_and_records_both(setup, tmp_path, caplog):
    """On a CPU the bits of a training depend on torch's thread count: a state written by a run
    of 7 threads, resumed by this one-thread process, goes on with a warning, and train.json
    records both counts."""
    argv, proc = killed(setup, tmp_path, "step:14:TERM", "epochs")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    state_file = RUN.dir(tmp_path / "results") / "resume.pt"
    state = torch.load(state_file, weights_only=True)
    assert state["threads"] == 1
    torch.save({**state, "threads": 7}, state_file)
    resume_in_process(argv, caplog)
    assert ("torch threads: the run began with 7 and goes on with 1, so its numbers differ from "
            "an uninterrupted run's in the last digits (train.json records both; `--threads 7` "
            "on a machine with that many cores resumes it exactly)") in caplog.messages
    summary = json.loads(RUN.files(tmp_path / "results").summary.read_text())
    assert summary["threads"] == "7, then 1 from step 14"


def test_other_settings_or_restart_set_the_state_aside(setup, tmp_path, caplog):
    argv, proc = killed(setup, tmp_path, "step:14:TERM", "epochs")
    run_dir = RUN.dir(tmp_path / "results")
    state = (run_dir / "resume.pt").read_bytes()

    log = resume_in_process(argv + ["--restart"], caplog)  # a fresh run: the reference again
    assert "resuming" not in log and "set aside" in log and "--restart asks" in log
    assert_same_outputs(setup["reference"]["epochs"], run_dir)
    assert (run_dir / "resume.pt.stale").read_bytes() == state

    (run_dir / "resume.pt").write_bytes(state)
    other = tmp_path / "other"
    other.mkdir()
    argv[1] = str(params_file(other, epochs=3, average_last=2, lr=2.0e-3))
    log = resume_in_process(argv, caplog)
    assert "resuming" not in log
    assert "it was written with other settings (changed: train.lr); training starts fresh" in log
    assert not (run_dir / "resume.pt").exists()

    (run_dir / "resume.pt").write_bytes(state[: len(state) // 3])  # truncated
    log = resume_in_process(argv, caplog)
    assert "resuming" not in log and "it is unreadable" in log


def test_resume_state_outside_the_declared_outputs(setup):
    """resume.pt is in no stage's outputs (DVC and Snakemake would delete or track it)."""
    from conftest import REPO
    from nmt.pipeline.declaration import load

    for stage in load(REPO / "workflow" / "stages.yaml").values():  # both tools' outputs
        assert not any("resume" in out for out in stage.outs + stage.metrics + stage.plots)
    assert "resume.pt" in (REPO / ".dvcignore").read_text()


def only_asks(sig: int) -> None:
    """Send `sig` to this process, which must only ask for a stop: a KeyboardInterrupt here
    fails the test (left to escape, it would stop pytest instead, which counts as no
    failure)."""
    try:
        os.kill(os.getpid(), sig)
    except KeyboardInterrupt:
        pytest.fail(f"{signal.Signals(sig).name} stopped at once")


def test_second_ctrl_c_stops_at_once():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when started in the background (nohup)
    with StopSignals() as stop:
        only_asks(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM  # the first only asks
        only_asks(signal.SIGTERM)  # (torchrun's shutdown repeats it): still asking
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before  # restored


def orchestrate(cmd: list[str], root, kill_at: str | None = None,
                cores: set[int] | None = None):
    """dvc or snakemake started in its own session, on `cores` only; kill_at: the test hook,
    killing the session."""
    from tiny import start

    return start(cmd, root, {"OMP_NUM_THREADS": "1", "NMT_TEST_KILL_AT": kill_at or ""}, cores,
                 new_session=True)


def run_numbers(root) -> dict:
    """The run's checkpoints, history and summary (wall-clock aside) and its evaluation."""
    run_dir = RUN.dir(root / "results")
    return read_outputs(run_dir) | {"metrics": (run_dir / "metrics.json").read_text()}


# Each tool is run to the run's evaluation: the report and the bench (8 and 5 s a pipeline
# here, of three) add nothing to what a resumed training must equal.
TARGETS = {"dvc": ["dvc", "repro", "evaluate@published-scratch-0"],
           "snakemake": ["snakemake", "--cores", "2", "results/published-scratch-s0/metrics.json"]}


def two_epoch_copy(dest: Path) -> Path:
    """A tiny copy whose pipeline trains published scratch, seed 0, 2 epochs: one training,
    the one the kill lands in (a second model only added a training and an evaluation to each
    of the three pipelines)."""
    from conftest import edit_params
    from tiny import scratch_copy

    root = scratch_copy(dest)
    path = root / "params.yaml"
    recipes = yaml.safe_load(path.read_text())["recipes"]
    recipes["published"].setdefault("train", {})["epochs"] = 2  # the smoke copy trains 1
    edit_params(path, recipes=recipes, pipeline={"recipes": ["published"],
                                                 "models": ["scratch"], "seeds": [0],
                                                 "export": []})
    return root


@pytest.fixture(scope="module")
def uninterrupted(mirror, tmp_path_factory):
    """The numbers of the copy run whole, the reference of both killed runs below: one
    `dvc repro` of the evaluation on half of the cores, started at once (the first killed run
    goes on the other half); calling it waits for the numbers. DVC and Snakemake run the same
    commands, with one thread each here, to the same numbers (tests/test_pipeline.py), so one
    reference serves both."""
    from tiny import finish, halves

    root = two_epoch_copy(tmp_path_factory.mktemp("whole"))
    whole = orchestrate(TARGETS["dvc"], root, cores=halves()[0])

    @functools.cache
    def numbers() -> dict:
        finish(whole)  # the uninterrupted copy: it must have succeeded
        return run_numbers(root)
    yield numbers
    numbers()


@pytest.mark.slow
@pytest.mark.parametrize("tool", list(TARGETS))
def test_orchestrator_killed_mid_training_resumes(uninterrupted, tmp_path, tool):
    """The orchestrator and its training are SIGKILLed together in epoch 2 (1,000 pairs / 32:
    32 updates an epoch); run again, the training resumes: its checkpoints byte for byte, its
    history and its evaluation are those of the uninterrupted run."""
    from tiny import finish, halves

    cmd = TARGETS[tool]
    root = two_epoch_copy(tmp_path)
    cores = halves()[1]
    killed = orchestrate(cmd, root, "step:40:KILL:session", cores)
    output = finish(killed, check=False)
    assert killed.returncode == -signal.SIGKILL, output[-6000:]
    states = list((root / "results").glob("*/resume.pt"))
    assert len(states) == 1 and not (states[0].parent / "best.pt").exists()
    # (a SIGKILLed Snakemake leaves its lock, which the rerun's Snakefile removes)
    again = orchestrate(cmd, root, cores=cores)
    output = finish(again, check=False)
    assert again.returncode == 0, output[-5000:]
    logs = "".join(p.read_text() for p in (root / "logs").rglob("*.log")
                   ) if tool == "snakemake" else output
    assert "resuming from epoch 2, step 32 of 64 " in logs
    assert not states[0].exists()
    assert run_numbers(root) == uninterrupted()


@pytest.mark.slow
def test_a_snakemake_killed_alone_stops_its_training_and_the_rerun_resumes(uninterrupted,
                                                                            tmp_path):
    """Snakemake SIGKILLed in epoch 2 while its training goes on (issue 69 item 5: the orphan
    trained to the end, the rerun needed `--unlock`, failed on the run's lock, and once the
    orphan ended trained again from scratch). The orphan now sees its orchestrator gone, stops
    at its next step and keeps its resume state; the rerun, without `--unlock`, removes the
    killed run's lock and resumes, to the uninterrupted run's numbers."""
    from tiny import finish, halves

    cmd = TARGETS["snakemake"]
    root = two_epoch_copy(tmp_path)
    cores = halves()[1]
    killed = orchestrate(cmd, root, "step:40:KILL:others", cores)
    finish(killed, check=False)
    assert killed.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while any(" train " in command for command in running_in(root)):
        assert time.monotonic() < deadline, "the orphaned training goes on"
        time.sleep(0.5)
    state = RUN.dir(root / "results") / "resume.pt"
    assert state.exists() and not (state.parent / "best.pt").exists()
    assert list((root / ".snakemake" / "locks").glob("*.lock"))  # the killed run's lock
    log = root / "logs" / "train-published-scratch-0.log"
    assert "nmt: snakemake (pid " in log.read_text() and "is gone: stopping" in log.read_text()
    again = orchestrate(cmd, root, cores=cores)
    output = finish(again, check=False)
    assert again.returncode == 0, output[-5000:]
    assert "snakemake: removed the lock a killed snakemake left" in output
    assert "resuming from epoch 2, step 40 of 64 " in log.read_text()  # the rerun's log
    assert not state.exists()
    assert run_numbers(root) == uninterrupted()


def running_in(root: Path) -> list[str]:
    """The command lines of the live processes whose working folder is root. A zombie has
    ended: an orphan's waits for whichever process adopted it to reap it, and in a container
    that may be late (CI once read one's command line and failed on psutil.ZombieProcess)."""
    import psutil

    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and Path(process.cwd()) == root:
                found.append(" ".join(process.cmdline()))
        except psutil.Error:  # ZombieProcess and NoSuchProcess among them: it ended meanwhile
            continue
    return found


class Blocking:
    """A value whose pickling waits for `release`: a write that is still in flight."""

    def __init__(self):
        self.release, self.pickling = threading.Event(), threading.Event()

    def __reduce__(self):
        self.pickling.set()
        assert self.release.wait(30), "the test never released the write"
        return (dict, ())


def test_a_state_is_written_while_the_caller_goes_on(tmp_path):
    path, writer, blocking = tmp_path / "resume.pt", state_writer.StateWriter(), Blocking()
    writer.submit(path, {"format": resume.FORMAT, "weights": torch.ones(3), "held": blocking})
    assert blocking.pickling.wait(30)  # the thread is writing; submit has returned
    assert not path.exists()  # nothing renamed onto the state's name before it is whole
    blocking.release.set()
    writer.wait()
    assert torch.equal(torch.load(path, weights_only=False)["weights"], torch.ones(3))
    assert not list(tmp_path.glob(".resume.pt.*.tmp"))


def test_a_second_state_waits_for_the_first_and_lands_after_it(tmp_path):
    path, writer, blocking = tmp_path / "resume.pt", state_writer.StateWriter(), Blocking()
    writer.submit(path, {"n": 1, "held": blocking})
    assert blocking.pickling.wait(30)
    threading.Timer(0.2, blocking.release.set).start()
    writer.submit(path, {"n": 2})  # waits for the first, then writes
    writer.wait()
    assert torch.load(path, weights_only=False)["n"] == 2 and writer.seconds_waited > 0.1


def test_a_failed_write_is_raised_in_the_callers_thread(tmp_path):
    writer = state_writer.StateWriter()
    (tmp_path / "folder").write_text("a file where the run's folder should be")
    writer.submit(tmp_path / "folder" / "resume.pt", {"n": 1})
    with pytest.raises(NmtError, match="folder"):
        writer.wait()
    writer.wait()  # raised once: the writer is usable again


def test_a_snapshot_keeps_the_values_of_its_instant():
    """The weights and Adam's moments go on changing in place while the state is written."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    taken = state_writer.snapshot({"model": model.state_dict(),
                                   "optimizer": optimizer.state_dict()})
    before = copy.deepcopy(taken)
    optimizer.step()  # in place: weights, exp_avg, exp_avg_sq, step
    assert not torch.equal(model.weight, before["model"]["weight"])
    for key, value in before["model"].items():
        assert torch.equal(taken["model"][key], value)
    for index, moments in before["optimizer"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(taken["optimizer"]["state"][index][name], value), name


# ---- the resume state's decisions, each on its own (no training) -----------------------------

def key(tmp_path: Path, **train) -> dict:
    """resume.config_key of a tiny settings dict, its vocabulary two files and a folder."""
    vocab = tmp_path / "vocab"
    (vocab / "folder").mkdir(parents=True, exist_ok=True)  # not a file: not in the key
    (vocab / "src.json").write_text('["a"]')
    (vocab / "tgt.json").write_text('["b"]')
    params = {"model": {"d_model": 32},
              "train": {"lr": 1.0, "save_every_minutes": 5.0, **train},
              "data": {"source_lang": "de", "target_lang": "en", "max_train_pairs": 0,
                       "corpus": "multi30k"}}
    return resume.config_key(params, "published-scratch-s0", 3, vocab, 2)


def test_a_resume_states_key_is_what_changes_its_numbers(tmp_path):
    """The key holds the run, seed, processes, model, train settings but save_every_minutes
    (when states are kept changes no number), three data settings and the vocabulary files'
    sha256; save_every_minutes alone leaves the hash as it was."""
    import hashlib

    sha = {name: hashlib.sha256(text.encode()).hexdigest()
           for name, text in (("src.json", '["a"]'), ("tgt.json", '["b"]'))}
    assert key(tmp_path) == {
        "run": "published-scratch-s0", "seed": 3, "world_size": 2, "model": {"d_model": 32},
        "train": {"lr": 1.0}, "data": {"source_lang": "de", "target_lang": "en",
                                       "max_train_pairs": 0}, "vocab": sha}
    assert resume.config_hash(key(tmp_path, save_every_minutes=0.5)) == \
        resume.config_hash(key(tmp_path))
    assert resume.config_hash(key(tmp_path, lr=2.0)) != resume.config_hash(key(tmp_path))
    assert resume.config_hash(key(tmp_path)) == hashlib.sha256(
        json.dumps(key(tmp_path), sort_keys=True).encode()).hexdigest()


def test_a_state_of_other_settings_names_the_first_four_changed(tmp_path):
    """usable_state: none there; --restart; other settings (dotted names, sorted, four at
    most); readable and matching: the state itself."""
    path = tmp_path / "resume.pt"
    mine = key(tmp_path)
    assert resume.usable_state(path, mine, restart=False) == (None, "")
    other = {**key(tmp_path, lr=2.0, warmup=1, a=1, b=2), "seed": 4}
    torch.save({"format": resume.FORMAT, "config": other,
                "config_hash": resume.config_hash(other)}, path)
    assert resume.usable_state(path, mine, restart=True) == (
        None, "--restart asks for a fresh start")
    assert resume.usable_state(path, mine, restart=False) == (
        None, "it was written with other settings (changed: seed, train.a, train.b, train.lr)")
    assert resume.differences({"x": {"y": {"z": 1}}, "w": 1}, {"x": {"y": {"z": 2}}}) == [
        "w", "x.y.z"]
    assert resume.differences({"x": {"y": 1}, "v": 2}, {"x": 5, "v": {"y": 1}}) == ["v", "x"]
    state = {"format": resume.FORMAT, "config": mine, "config_hash": resume.config_hash(mine)}
    torch.save(state, path)
    assert resume.usable_state(path, mine, restart=False) == (state, "")


def test_a_state_that_cannot_be_read_says_why(tmp_path, monkeypatch):
    """read: an unpickling error's type and its first line, cut at 80 characters; a state of
    another format or none at all."""
    path = tmp_path / "resume.pt"
    torch.save({"format": resume.FORMAT - 1}, path)
    assert resume.read(path) == (None, f"it is not a format-{resume.FORMAT} resume state")
    torch.save(["format", resume.FORMAT], path)
    assert resume.read(path) == (None, f"it is not a format-{resume.FORMAT} resume state")

    def refuse(*args, **kwargs):
        raise EOFError("x" * 90 + "\nsecond line")

    with monkeypatch.context() as patched:
        patched.setattr(resume.torch, "load", refuse)
        assert resume.read(path) == (None, f"it is unreadable (EOFError: {'x' * 80})")


def test_a_state_set_aside_is_renamed_with_one_warning(tmp_path, caplog):
    path = tmp_path / "resume.pt"
    path.write_bytes(b"state")
    with caplog.at_level(logging.WARNING, logger="nmt.train"):
        stale = resume.set_aside(path, "it is unreadable")
    assert stale == tmp_path / "resume.pt.stale" and stale.read_bytes() == b"state"
    assert not path.exists()
    assert caplog.messages == [f"set aside {path} as resume.pt.stale: it is unreadable; "
                               "training starts fresh"]


def test_what_a_resumed_run_took_from_the_machine_is_kept_or_both_are_recorded(caplog):
    """precisions: the state's choices, with one line; none without a state or a record.
    went_on: the value now, or both with the step, and one warning."""
    from nmt.training.precision import Choice

    assert resume.precisions(None) is None and resume.precisions({"format": 3}) is None
    recorded = {"train": {"precision": "bf16", "reason": "measured", "speedup": 1.5},
                "decode": {"precision": "fp32", "reason": "asked", "speedup": None}}
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        kept = resume.precisions({"precisions": recorded})
        assert resume.went_on("torch threads", None, 4, 9) == 4  # recorded by no state
        assert resume.went_on("torch threads", 4, 4, 9) == 4
        both = resume.went_on("torch threads", 7, 1, 14, ", so it differs", "; fix it")
    assert kept == {"train": Choice("bf16", "measured", 1.5), "decode": Choice("fp32", "asked")}
    assert both == "7, then 1 from step 14"
    assert caplog.messages == [
        "precision kept from the run's start: training bf16, decoding fp32",
        "torch threads: the run began with 7 and goes on with 1, so it differs (train.json "
        "records both; fix it)"]


def test_a_stop_is_announced_once_and_torchruns_echo_of_a_ctrl_c_is_not_a_second(capsys,
                                                                                 monkeypatch):
    """StopSignals: the first signal asks for a stop with one line on stderr (announce: the
    main rank only); under torchrun (echo 1 s) a second Ctrl-C within the second after the
    first is its echo, one after it stops at once; the old handlers come back."""
    clock = [100.0]
    monkeypatch.setattr(resume.time, "monotonic", lambda: clock[0])
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(echo=1.0) as stop:
        only_asks(signal.SIGINT)
        assert stop.signum == signal.SIGINT
        clock[0] = 100.99
        only_asks(signal.SIGINT)  # torchrun passing the terminal's Ctrl-C on
        clock[0] = 101.0
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == (
        "nmt train: SIGINT: finishing this step, then saving the resume state (Ctrl-C again: "
        "stop at once)\n")
    with StopSignals(announce=False) as stop:  # another rank: the main one says it
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.signum == signal.SIGTERM and capsys.readouterr().err == ""
    assert resume.Stopped(143, "why").code == 143 and str(resume.Stopped(143, "why")) == "why"


def stand_in_trainer(tmp_path: Path, lr, device: str = "cpu", **fields) -> SimpleNamespace:
    """What resume.save and resume.restore read of a Trainer, around a 2x2 linear model with
    Adam at `lr` and a constant schedule (a run's parts, without its data); `fields`: what a
    test adds or sets otherwise."""
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return SimpleNamespace(**{
        "update": SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler,
                                  graphs=None),
        "device": torch.device(device), "world": World(), "total_updates": 30,
        "attention_kernels": "any", "threads": 1, "saved": "",
        "paths": SimpleNamespace(run=SimpleNamespace(resume=tmp_path / "resume.pt")),
        **fields})


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_resumed_graphed_run_gets_its_lr_back_as_a_tensor_on_its_device(tmp_path, device):
    """With CUDA graphs (train.cuda_graphs) the captured Adam reads its lr from a tensor on
    the device: restore puts the state's lr (a number here; a tensor read to the CPU when the
    state was written under graphs) back as one, with the state's value. `meta` stands for a
    GPU: a device that is not the CPU, which a CPU has. The state holds a CUDA generator's
    state too (written on a GPU): where the run goes on, without CUDA, it is let be."""
    trainer = stand_in_trainer(tmp_path, lr=torch.tensor(0.5), device=device,
                               plan=lambda epoch: [None] * 10)
    update = trainer.update
    update.graphs = object()  # the updates it replays
    written = update.optimizer.state_dict()
    written["param_groups"][0]["lr"] = 0.25
    state = {"model": update.model.state_dict(), "optimizer": written,
             "scheduler": update.scheduler.state_dict(), "progress": {},
             "ranks": [{"rng": {**resume.rng_state(torch.device("cpu")),  # written on a GPU
                                "cuda": torch.zeros(16, dtype=torch.uint8)},
                        "loss_sum": 0.0, "tokens": 0, "sums": {}}]}
    resume.restore(trainer, state)
    lr = update.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device == trainer.device
    assert device == "meta" or lr.item() == 0.25  # a meta tensor holds no value


def test_a_state_written_on_a_gpu_is_read_on_a_cpu_and_a_pickle_never(tmp_path, monkeypatch):
    """read loads every tensor to the CPU (a state of a GPU run records cuda:0, which a
    machine without CUDA cannot place), and only tensors and plain types, even where
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns torch.load's default to full unpickling."""
    import io

    from test_robustness import as_if_saved_on_a_gpu, torch_bytes

    path = tmp_path / "resume.pt"
    torch.save({"format": resume.FORMAT, "model": {"w": torch.ones(2)}}, path)
    path.write_bytes(as_if_saved_on_a_gpu(path.read_bytes()))
    state, why = resume.read(path)
    assert why == "" and state["model"]["w"].device.type == "cpu"
    assert torch.equal(state["model"]["w"], torch.ones(2))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path.write_bytes(torch_bytes({"format": resume.FORMAT, "model": io.BytesIO}))
    state, why = resume.read(path)
    assert state is None and why.startswith("it is unreadable (UnpicklingError: "), why


def test_a_resume_state_holds_what_restore_reads_and_its_time_adds_up(tmp_path, monkeypatch):
    """save hands the writer one state: the format, the key and its hash, what the run took
    from the machine, CPU snapshots of the weights, optimizer, schedule and each rank's
    generators and sums, and the progress with the seconds so far; each save's time adds to
    the run's "saving" seconds (a clock that moves one second a reading: two saves, 2 s)."""
    from nmt.training import state as training_state
    from nmt.training.precision import Choice
    from nmt.training.state import Progress

    ticks = iter(range(100))
    monkeypatch.setattr(resume.time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(training_state, "process_seconds", lambda: 9.0)
    written = []
    key = {"run": "published-scratch-s0"}
    trainer = stand_in_trainer(
        tmp_path, lr=0.5, resume_key=key, threads=2, clock={"start": 1.0}, last_save=0.0,
        writer=SimpleNamespace(submit=lambda path, state: written.append((path, state))),
        precisions={"train": Choice("fp32", "asked"), "decode": Choice("bf16", "measured", 1.5)})
    model, scheduler = trainer.update.model, trainer.update.scheduler
    progress = Progress(epoch=2, step=12, loss_sum=3.5, tokens=7, sums={"grad_norm": 1.5})
    resume.save(trainer, progress)
    resume.save(trainer, progress)
    assert trainer.clock == {"start": 1.0, "saving": 2.0} and trainer.saved == (
        "epoch 2, step 12 of 30")
    path, state = written[0]
    assert path == tmp_path / "resume.pt" and state["format"] == resume.FORMAT
    assert (state["config"], state["config_hash"]) == (key, resume.config_hash(key))
    assert state["precisions"] == {
        "train": {"precision": "fp32", "reason": "asked", "speedup": None},
        "decode": {"precision": "bf16", "reason": "measured", "speedup": 1.5}}
    assert (state["attention_kernels"], state["threads"]) == ("any", 2)
    assert torch.equal(state["model"]["weight"], model.weight.detach())
    assert state["optimizer"]["param_groups"][0]["lr"] == 0.5
    assert state["scheduler"] == scheduler.state_dict()
    [rank] = state["ranks"]
    assert (rank["loss_sum"], rank["tokens"], rank["sums"]) == (3.5, 7, {"grad_norm": 1.5})
    assert torch.equal(rank["rng"]["torch"], torch.get_rng_state())
    assert state["progress"]["epoch"] == 2 and state["progress"]["step"] == 12
    assert state["progress"]["earlier"] == {"start": 1.0, "wall": 9.0}
