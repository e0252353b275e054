"""Faults inside the stages (issue 22): a disk that fills up, a checkpoint of another
configuration, a killed evaluate's temporary folder, a SIGTERM before the training loop, a
folder given as --file, misaligned sides for nmt vocab.

All real: a real full file system (a small tmpfs, mounted as root; skipped with the reason
where mounting is not permitted), real `python -m nmt` processes stopped and killed by real
signals, a real checkpoint trained under another params file. Tiny model, 300 pairs, 2 epochs.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, edit_params
from nmt import cli
from nmt.core import files
from nmt.core.checkpoint import load, setting_differences
from nmt.core.errors import EX_IOERR, NmtError
from nmt.core.records import RECORD
from nmt.core.runs import Run
from nmt.pipeline import preflight
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from train_helpers import assert_same_outputs, params_file, tiny_data, train_argv

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = Run("published", "scratch", 0)
FREE_FIX = (r" \(\d+\.\d MB free\); nothing was half-written \(fix: free space on that disk, or "
            r"point the output at a larger one, then run the same command again\)")


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    """Tiny data, its params.yaml (2 epochs) and an uninterrupted run of it: the reference."""
    root = tmp_path_factory.mktemp("faults")
    data = tiny_data(prepared, root)
    for path in prepared["tokenized"].glob("test_*"):  # 40 sentences of each test set
        lines = path.read_text("utf-8").splitlines(True)[:40]
        (data["tokenized"] / path.name).write_text("".join(lines), "utf-8")
    params = params_file(root, epochs=2)
    assert cli.main(train_argv(params, {**data, "results": root / "reference"})) == 0
    return {"data": data, "params": params, "reference": RUN.dir(root / "reference")}


def nmt_env(**extra) -> dict:
    """The environment of a `python -m nmt` process: one thread, this checkout, `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "NMT_TEST_KILL_AT"}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"), **extra}


def evaluate_argv(params: Path, data: dict, results: Path) -> list[str]:
    return ["--params", str(params), "evaluate", "--recipe", "published", "--model", "scratch",
            "--tokenized", str(data["tokenized"]), "--vocab", str(data["vocab"] / "published"),
            "--results", str(results)]


def last_line(err: str) -> str:
    """The error line; nothing else on stderr may look like a failure."""
    assert "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- item 1: a disk that fills up ------------------------------------------------------------

@pytest.fixture
def disk(tmp_path):
    """A real 64 MB file system of its own (tmpfs), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): "
                    "the full-disk cases need root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write zeros until the disk takes no more; returns the file that holds them."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler


def wait_stopped(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the process is stopped (SIGSTOP from the test hook)."""
    status = Path(f"/proc/{proc.pid}/status")
    deadline = time.monotonic() + timeout
    while "\nState:\tT" not in status.read_text():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the training never reached the stop"
        time.sleep(0.05)


def test_a_disk_that_fills_during_training_is_one_line_and_the_rerun_resumes(trained, disk,
                                                                              caplog):
    """The disk fills while the run is stopped mid-epoch 2; the end-of-epoch resume state then
    finds no room: exit 74, one line, the epoch-1 state intact, and after freeing the space the
    same command resumes to the uninterrupted run's bytes."""
    argv = train_argv(trained["params"], {**trained["data"], "results": disk / "results"})
    proc = subprocess.Popen([sys.executable, "-m", "nmt", *argv], stderr=subprocess.PIPE,
                            text=True, env=nmt_env(NMT_TEST_KILL_AT="step:14:STOP"))
    wait_stopped(proc)
    filler = fill(disk)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    run_dir = RUN.dir(disk / "results")
    assert proc.returncode == EX_IOERR, err[-3000:]
    assert re.fullmatch(f"nmt train: error: {re.escape(str(run_dir))}: no space left on its disk "
                        f"while writing resume.pt{FREE_FIX}", last_line(err)), last_line(err)
    assert sorted(p.name for p in run_dir.iterdir()) == ["resume.pt"]  # no temporary, no output

    filler.unlink()
    with caplog.at_level(logging.INFO, logger="nmt"):
        assert cli.main(argv) == 0
    assert "resuming from epoch 2, step 10 of 20 " in caplog.text
    assert_same_outputs(trained["reference"], run_dir)

    # evaluate on the full disk: the same line, nothing of its outputs, then a clean re-run.
    filler = fill(disk)
    proc = subprocess.run([sys.executable, "-m", "nmt", *evaluate_argv(
        trained["params"], trained["data"], disk / "results")], capture_output=True, text=True,
        env=nmt_env(), timeout=300)
    assert proc.returncode == EX_IOERR, proc.stderr[-3000:]
    assert re.fullmatch(f"nmt evaluate: error: {re.escape(str(run_dir))}: no space left on its "
                        f"disk while writing translations{FREE_FIX}", last_line(proc.stderr))
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.pt", "history.csv", "last.pt",
                                                         "train.json"]
    filler.unlink()
    assert cli.main(evaluate_argv(trained["params"], trained["data"], disk / "results")) == 0
    assert (run_dir / "metrics.json").is_file() and not hidden(run_dir)


@pytest.mark.parametrize("stage", ["download", "vocab"])
def test_a_full_disk_in_a_data_stage_is_one_line(prepared, mirror, disk, capsys, monkeypatch,
                                                 stage):
    monkeypatch.chdir(REPO)  # download reads workflow/multi30k.sha256
    out = disk / "data" / stage
    argv = {"download": ["download", "--out", str(out)],
            "vocab": ["vocab", "--tokenized", str(prepared["tokenized"]), "--out", str(out)]}
    filler = fill(disk)
    assert cli.main(["--params", str(REPO / "params.yaml"), *argv[stage]]) == EX_IOERR
    err = capsys.readouterr().err
    assert re.fullmatch(f"nmt {stage}: error: {re.escape(str(out.parent))}: no space left on its "
                        f"disk while writing {stage}{FREE_FIX}", last_line(err)), last_line(err)
    assert os.listdir(out.parent) == []  # no half folder, no temporary
    filler.unlink()
    assert cli.main(["--params", str(REPO / "params.yaml"), *argv[stage]]) == 0
    assert os.listdir(out.parent) == [stage]


# --- item 2: a checkpoint of another configuration -------------------------------------------

def test_a_best_pt_trained_with_other_settings_is_refused(trained, tmp_path, capsys):
    """A best.pt of the right run name, trained for 1 epoch with d_model 16 under another
    params file, placed as the run's best.pt: evaluate and translate --run refuse it."""
    other = tmp_path / "other"
    other.mkdir()
    params = params_file(other, model={"d_model": 16}, epochs=1)
    assert cli.main(train_argv(params, {**trained["data"], "results": other / "results"})) == 0
    results = tmp_path / "results"
    RUN.dir(results).mkdir(parents=True)
    shutil.copy(RUN.files(other / "results").best, RUN.files(results).best)
    capsys.readouterr()

    argv = evaluate_argv(trained["params"], trained["data"], results)
    assert cli.main(argv) == 2
    line = last_line(capsys.readouterr().err)
    assert line == (f"nmt evaluate: error: {RUN.files(results).best} was trained with other "
                    "settings than recipe published has now: model.d_model (trained 16, now 32), "
                    "train.epochs (trained 1, now 2) (fix: re-run `nmt train --recipe published "
                    "--model scratch --seed 0`, or restore those settings in params.yaml)")
    assert sorted(p.name for p in RUN.dir(results).iterdir()) == ["best.pt"]

    translate = ["--params", str(trained["params"]), "translate", "--results", str(results),
                 "--vocab", str(trained["data"]["vocab"]), "--device", "cpu"]
    assert cli.main([*translate, "--run", RUN.name, "Ein Mann."]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "model.d_model (trained 16, now 32)" in last_line(err)
    # A file named with --checkpoint is taken as it is: no run to compare with.
    assert cli.main([*translate, "--checkpoint", str(RUN.files(results).best), "Ein Mann."]) == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_where_a_run_trained_is_no_difference(trained):
    """device, compile and save_every_minutes say where and how often, not what is learnt."""
    settings = resolve(load_params(trained["params"]), "published")
    ckpt = load(trained["reference"] / "best.pt")[1]
    assert setting_differences(ckpt, settings) == []
    settings["train"] |= {"device": "cuda", "compile": True, "save_every_minutes": 5}
    assert setting_differences(ckpt, settings) == []
    settings["train"]["betas"] = [0.9, 0.99]
    settings["model"]["dropout"] = 0.3
    assert setting_differences(ckpt, settings) == [
        "model.dropout (trained 0.1, now 0.3)", "train.betas (trained [0.9, 0.98], now [0.9, "
        "0.99])"]


# --- item 6: a killed evaluate's temporary folder --------------------------------------------

def test_a_killed_evaluate_leaves_nothing_once_it_runs_again(trained, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(trained["reference"], RUN.dir(results))
    argv = evaluate_argv(trained["params"], trained["data"], results)
    proc = subprocess.Popen([sys.executable, "-m", "nmt", *argv], stderr=subprocess.DEVNULL,
                            env=nmt_env())
    deadline = time.monotonic() + 300
    while not hidden(RUN.dir(results)):  # translating: its temporary folder exists
        assert proc.poll() is None and time.monotonic() < deadline, "evaluate never started"
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    left = hidden(RUN.dir(results))
    assert len(left) == 1 and re.fullmatch(r"\.translations\.\w{8}\.tmp", left[0])
    assert cli.main(argv) == 0
    assert hidden(RUN.dir(results)) == []
    assert (RUN.dir(results) / "translations").is_dir()


# --- item 8: small ones ----------------------------------------------------------------------

def test_sigterm_before_the_training_loop_is_one_line_and_143(trained, tmp_path):
    argv = train_argv(trained["params"], {**trained["data"], "results": tmp_path / "results"})
    proc = subprocess.run([sys.executable, "-m", "nmt", *argv], capture_output=True, text=True,
                          env=nmt_env(NMT_TEST_KILL_AT="start:1:TERM"), timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    state = RUN.files(tmp_path / "results").resume
    assert proc.stderr.strip() == (
        f"nmt train: stopped by SIGTERM; outputs appear only when training completes; {state}, "
        "if there, is kept and the same nmt train command resumes from it")


def test_translate_file_that_is_a_folder(trained, tmp_path, capsys):
    argv = ["--params", str(trained["params"]), "translate", "--checkpoint",
            str(trained["reference"] / "best.pt"), "--vocab", str(trained["data"]["vocab"]),
            "--device", "cpu", "--file", str(tmp_path)]
    assert cli.main(argv) == 2
    assert last_line(capsys.readouterr().err) == (
        f"nmt translate: error: {tmp_path} is a folder, not a file (fix: give a text file, one "
        "sentence a line)")


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_vocab_refuses_misaligned_sides(prepared, tmp_path, capsys, kind):
    tokenized = tmp_path / "tokenized"
    # Without its SHA256SUMS, which would name the cut file first (tests/test_records.py): a
    # folder made by hand, whose sides are still compared.
    shutil.copytree(prepared["tokenized"], tokenized, ignore=shutil.ignore_patterns(RECORD))
    suffix = "tok" if kind == "word" else "txt"
    english = tokenized / f"train.en.{suffix}"
    english.write_text("".join(english.read_text("utf-8").splitlines(True)[:-3]), "utf-8")
    params = edit_params(params_file(tmp_path), vocab={"kind": kind, "bpe_size": 1000})
    out = tmp_path / "vocab"
    assert cli.main(["--params", str(params), "vocab", "--tokenized", str(tokenized),
                     "--out", str(out)]) == 2
    assert last_line(capsys.readouterr().err) == (
        f"nmt vocab: error: {tokenized}/train.de.{suffix} has 2000 lines but {english} has 1997: "
        "the train split is not aligned (fix: re-run nmt tokenize)")
    assert not out.exists()


# ---- replacing a finished output: the old one stays until the new one is in place ---------

# A write of the folder argv[1] ("new") that is SIGKILLed between two renames of replace_dir:
# argv[2] "exchange" after Linux's one-step swap, "aside" where the system cannot swap (the
# old folder already aside, the new one not yet in its place).
KILLED_REPLACE = """
import os, signal, sys
from pathlib import Path
from nmt.core import files

out, mode, real_replace = Path(sys.argv[1]), sys.argv[2], os.replace
if mode == "exchange":
    real_exchange = files.exchange
    def exchange(a, b):
        assert real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
    files.exchange = exchange
else:
    files.exchange = lambda a, b: False
    def replace(src, dst):
        if Path(dst) == out:
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(src, dst)
    os.replace = replace
with files.atomic_dir(out) as tmp:
    (tmp / "new.txt").write_text("new")
"""


@pytest.mark.parametrize("mode, left", [("exchange", "new"), ("aside", "old")])
def test_a_kill_while_a_folder_is_replaced_leaves_the_old_or_the_new_one(tmp_path, mode, left):
    """A kill at either instant of the replacement leaves one whole folder at `out` (after the
    next write starts, for the one set aside), and the next write leaves nothing else."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    proc = subprocess.run([sys.executable, "-c", KILLED_REPLACE, str(out), mode],
                          env=nmt_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(list(tmp_path.iterdir())) == 2  # out, or the folder aside; and a temporary
    with pytest.raises(RuntimeError), files.atomic_dir(out):  # a write that fails
        assert (out / f"{left}.txt").read_text() == left
        raise RuntimeError
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == [f"{left}.txt"]
    with files.atomic_dir(out) as tmp:
        (tmp / "newer.txt").write_text("newer")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["newer.txt"]


def test_a_second_training_of_a_run_in_training_is_refused(trained, tmp_path, capsys):
    """While one nmt train trains a run (here stopped after update 2, holding it), a second of
    the same run refuses with one line; once the first is killed, its lock goes with it."""
    data = {**trained["data"], "results": tmp_path / "results"}
    argv = train_argv(trained["params"], data)
    first = subprocess.Popen([sys.executable, "-m", "nmt", *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True,
                             env=nmt_env(NMT_TEST_KILL_AT="step:2:STOP"))
    try:
        wait_stopped(first)
        assert cli.main(argv) == 2
        assert last_line(capsys.readouterr().err) == (
            f"nmt train: error: another nmt train is training {RUN.dir(data['results'])} now "
            "(fix: wait until it ends, or stop it first)")
    finally:
        first.kill()
        first.wait()
    assert cli.main(argv) == 0
    assert (RUN.dir(data["results"]) / "best.pt").is_file()


def test_a_new_training_of_a_finished_run_keeps_it_until_it_has_its_own(trained, tmp_path):
    """Training a finished run again sets its outputs aside (*.previous, one line) instead of
    deleting them: killed at update 3, the new training leaves the finished model whole; run
    to its end, it deletes them."""
    data = {**trained["data"], "results": tmp_path / "results"}
    run_dir = RUN.dir(data["results"])
    shutil.copytree(trained["reference"], run_dir)
    finished = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    argv = train_argv(trained["params"], data)
    proc = subprocess.run([sys.executable, "-m", "nmt", *argv], capture_output=True, text=True,
                          env=nmt_env(NMT_TEST_KILL_AT="step:3"), timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert (f"set aside the finished run's best.pt, last.pt, history.csv, train.json in "
            f"{run_dir} as *.previous until this run has written its own (then they are "
            f"deleted; `rm {run_dir}/*.previous` deletes them sooner)") in proc.stderr
    kept = {p.name.removesuffix(".previous"): p.read_bytes() for p in run_dir.iterdir()
            if p.name.endswith(".previous")}
    assert kept == finished
    assert not (run_dir / "best.pt").exists()
    assert cli.main(argv) == 0
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(finished)


def test_out_of_memory_is_one_line_naming_what_to_make_smaller(trained, tmp_path):
    """A training whose model cannot be allocated under a memory cap (RLIMIT_AS, as
    `ulimit -v` sets it: 1.5 GB, about twice what torch takes to load; the feed-forward layers
    alone want 2 GB): torch's allocator fails, and the line says so and what to shrink."""
    params = params_file(tmp_path, {"dim_feedforward": 4_000_000})
    cap = 1536 * 2**20

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    data = {**trained["data"], "results": tmp_path / "results"}
    proc = subprocess.run([sys.executable, "-m", "nmt", *train_argv(params, data)],
                          capture_output=True, text=True, env=nmt_env(), preexec_fn=capped,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert re.fullmatch(
        r"nmt train: error: out of memory: an allocation of \d+ bytes failed \(fix: a smaller "
        r"train\.max_tokens \(token batches\) or train\.batch_size, with a larger "
        r"train\.accumulate for the same updates, or a smaller model; a training resumes from "
        r"its last resume state; then run the same command again\)", line), line


def test_a_file_where_an_output_folder_must_be_is_one_line(tmp_path):
    """Any stage's write under `results` when `results` is a plain file (nmt verify's JSON, a
    translations folder): the file is named with the fix, and it is left as it was."""
    (tmp_path / "results").write_text("x")
    want = (f"{tmp_path / 'results'} is a file where the pipeline needs a folder (fix: move the "
            f"file away, e.g. mv {tmp_path / 'results'} {tmp_path / 'results'}.moved)")
    with pytest.raises(NmtError) as err:
        files.write_json(tmp_path / "results" / "verify" / "published.json", {})
    assert str(err.value) == want
    with pytest.raises(NmtError) as err, files.atomic_dir(tmp_path / "results" / "run" / "out"):
        pass
    assert str(err.value) == want
    assert (tmp_path / "results").read_text() == "x"


# --- item 7: a SIGTERM once every output is written --------------------------------------------

def test_sigterm_during_evaluates_last_writes_waits_and_exits_0(trained, tmp_path, monkeypatch,
                                                                 capsys):
    """A SIGTERM that lands while evaluate writes its last outputs waits for them; the command
    then says they are complete and exits 0 (Snakemake would otherwise delete them). One that
    lands before them still stops it with 143."""
    import nmt.stages.evaluate

    results = tmp_path / "results"
    shutil.copytree(trained["reference"], RUN.dir(results))
    argv = evaluate_argv(trained["params"], trained["data"], results)
    real_write = nmt.stages.evaluate.write_json

    def write_then_stop(path, value):  # the signal arrives just as evaluation.json is written
        real_write(path, value)
        if path.name == "evaluation.json":
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(nmt.stages.evaluate, "write_json", write_then_stop)
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert last_line(err) == ("nmt evaluate: SIGTERM came after the last outputs were written; "
                              "they are complete")
    files = RUN.files(results)
    assert json.loads(files.metrics.read_text()) and json.loads(files.evaluation.read_text())

    real_score = nmt.stages.evaluate.score_testsets

    def score_then_stop(*args):  # before the last writes: a stop as any other
        scores = real_score(*args)
        os.kill(os.getpid(), signal.SIGTERM)
        return scores

    files.metrics.unlink()
    monkeypatch.setattr(nmt.stages.evaluate, "write_json", real_write)
    monkeypatch.setattr(nmt.stages.evaluate, "score_testsets", score_then_stop)
    assert cli.main(argv) == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in last_line(capsys.readouterr().err)
    assert not files.metrics.exists()


def test_sigterm_after_a_stage_returned_changes_nothing(trained, tmp_path):
    """Once `nmt <stage>` has returned 0, a SIGTERM while the process exits (torch's teardown
    takes a while) is ignored: the exit status stays 0. Before, the default handler was back
    and the process died of the signal (-15) with every output in place."""
    out = tmp_path / "published.yaml"
    script = ("import os, signal, sys\nfrom nmt import cli\n"
              f"sys.argv = ['nmt', '--params', {str(trained['params'])!r}, 'config', "
              f"'--recipe', 'published', '--out', {str(out)!r}]\n"
              "status = cli.main()\nos.kill(os.getpid(), signal.SIGTERM)\nsys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=nmt_env(), timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert out.is_file()


def test_an_undeletable_file_in_an_output_folder_costs_no_good_file(tmp_path):
    """One immutable file (chattr +i) in data/tokenized: replacing the folder swaps the new one
    in whole and leaves the old one aside, hidden, for a later write to remove, instead of
    deleting the good files before it stopped on the one it could not (PermissionError)."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("chattr +i needs root and chattr")
    folder = tmp_path / "tokenized"
    folder.mkdir()
    for name in ("train.de.tok", "stuck.tok"):
        (folder / name).write_text("old")
    if subprocess.run(["chattr", "+i", str(folder / "stuck.tok")]).returncode:
        pytest.skip("this filesystem has no immutable files")
    try:
        with files.atomic_dir(folder) as new:
            for name in ("train.de.tok", "stuck.tok"):
                (new / name).write_text("new")
        assert {p.name: p.read_text() for p in folder.iterdir()} == {
            "train.de.tok": "new", "stuck.tok": "new"}
        left = hidden(tmp_path)
        assert len(left) == 1 and (tmp_path / left[0] / "stuck.tok").read_text() == "old"
    finally:
        for stuck in tmp_path.rglob("stuck.tok"):
            subprocess.run(["chattr", "-i", str(stuck)])


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "aside"])
def test_an_output_folder_linked_outside_the_checkout_becomes_a_folder_in_it(
        tmp_path, monkeypatch, caplog, exchange):
    """data/raw a link to a folder outside: the new folder takes the link's place, with one
    warning; nothing is written or deleted where it pointed, and no hidden link is left (one
    was, `data/.raw.*.tmp -> outside`, before the old folder's removal knew links)."""
    if not exchange:
        monkeypatch.setattr(files, "exchange", lambda a, b: False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "train.de.gz").write_text("theirs")
    data = tmp_path / "checkout" / "data"
    data.mkdir(parents=True)
    (data / "raw").symlink_to(outside)
    with caplog.at_level("WARNING", logger="nmt.files"), files.atomic_dir(data / "raw") as tmp:
        (tmp / "train.de.gz").write_text("ours")
    assert not (data / "raw").is_symlink() and (data / "raw" / "train.de.gz").read_text() == "ours"
    assert [p.name for p in data.iterdir()] == ["raw"]
    assert [(p.name, p.read_text()) for p in outside.iterdir()] == [("train.de.gz", "theirs")]
    assert [r.getMessage() for r in caplog.records] == [
        f"{data / 'raw'} was a link to {outside}: it is now a folder in the checkout, and what "
        "the link pointed at is untouched"]


def test_an_output_linked_outside_the_checkout_is_refused_before_anything_is_deleted(tmp_path):
    """What DVC and Snakemake check first (sources; the Snakefile): a folder output that is a
    link out of the checkout is one line naming it; a link inside the checkout, or a link
    that is no output (data/corpus), passes."""
    root = tmp_path / "checkout"
    (root / "workflow").mkdir(parents=True)
    shutil.copy(REPO / "workflow" / "stages.yaml", root / "workflow")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "data" / "vocab").mkdir(parents=True)
    (root / "data" / "corpus").symlink_to(outside)
    (root / "kept").mkdir()
    (root / "data" / "raw").symlink_to(root / "kept")
    preflight.check_links(root)
    for output in ("data/vocab/demo", "results/demo-scratch-s0/translations", "reports/figures"):
        (root / output).parent.mkdir(parents=True, exist_ok=True)
        (root / output).symlink_to(outside)
        with pytest.raises(NmtError) as e:
            preflight.check_links(root)
        assert str(e.value).startswith(f"{root / output} is a link to {outside}, outside the "
                                       "checkout"), str(e.value)
        (root / output).unlink()
