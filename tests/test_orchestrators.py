"""Orchestrator faults (issue 22, items 3, 4, 5, 7): neither tool deletes an output for a job
bound to fail, the second orchestrator started in a folder refuses, a params.yaml YAML error
names its line under Snakemake, and Snakemake notices a file damaged inside a folder output.

The slow tests share one tiny copy in which DVC trained one run (published, baseline, seed 0);
each restores what it changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import edit_params, rows_of_lines
from nmt.core.errors import NmtError
from nmt.pipeline import orchestrators, preflight
from tiny import finish, run, scratch_copy
from tiny import start as start_as

RUN = Path("results/published-baseline-s0")
TRAINED = [RUN / f for f in ("best.pt", "last.pt", "train.json", "history.csv")]
HOLD_DVC_LOCK = ("import sys, time; from dvc.repo import Repo\n"
                 "with Repo(sys.argv[1]).lock:\n    print('held', flush=True); time.sleep(120)")


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "error" in line.lower()]


def digests(root: Path, paths) -> dict:
    return {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in paths}


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    from tiny import BIN

    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(cwd / "src")}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


# ---- item 5: a YAML syntax error in params.yaml, under Snakemake ----------------------------

def test_snakemake_names_params_yaml_and_the_line_of_a_yaml_error(tmp_path, mirror):
    root = scratch_copy(tmp_path)
    text = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(text.replace("epochs: 1\n", "epochs: [1\n", 1))
    line = next(i for i, x in enumerate(text.splitlines(), 1) if x.strip() == "epochs: 1")
    smk = run(["snakemake", "-n"], root, check=False)
    nmt = run(["nmt", "download"], root, check=False)
    want = "params.yaml: not valid YAML at line"
    assert error_lines(smk) == [f"snakemake: error: {error_lines(nmt)[0].split(': ', 2)[2]}"]
    assert want in smk and int(smk.split("at line ")[1].split()[0]) >= line, smk
    assert "Snakefile" not in smk and "JSON" not in smk


# ---- item 4: who holds the folder ------------------------------------------------------------

def test_a_live_snakemake_marker_refuses_and_a_stale_one_does_not(tmp_path):
    marker = tmp_path / orchestrators.MARKERS / "nmt-running.1"
    marker.parent.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "snakemake"])
    # Until the child has exec'd, its command line is still pytest's (a make test run beside
    # other work read it so once, and nothing was refused): wait for it to read as snakemake.
    deadline = time.monotonic() + 10
    while "snakemake" not in psutil.Process(other.pid).cmdline() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        for pid, refused in ((other.pid, True), (os.getpid(), False)):
            marker.write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
            if refused:  # a live snakemake that did not start this process
                with pytest.raises(NmtError, match=f"snakemake \\(pid {pid}\\) is running"):
                    orchestrators.refuse_others(tmp_path, "nmt train")
            else:  # this process is no snakemake: a reused pid blocks nothing
                orchestrators.refuse_others(tmp_path, "nmt train")
    finally:
        other.kill()
        other.wait()
    marker.write_text(json.dumps({"pid": other.pid, "host": socket.gethostname()}))
    orchestrators.refuse_others(tmp_path, "nmt train")  # the killed run's marker is stale


@contextlib.contextmanager
def dvc_lock_held(root: Path):
    """A DVC repository in root (a new one) whose lock another process holds: that process,
    until the block ends (then killed)."""
    from tiny import BIN

    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=root, check=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_DVC_LOCK, str(root)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_dvc_holding_its_lock_is_seen_and_released_lock_is_not(tmp_path):
    with dvc_lock_held(tmp_path) as holder:
        assert orchestrators.dvc_holder(tmp_path) == holder.pid
        with pytest.raises(NmtError, match=f"dvc \\(pid {holder.pid}\\) is running"):
            orchestrators.refuse_others(tmp_path, "snakemake")
    assert orchestrators.dvc_holder(tmp_path) is None  # the lock file stays; the flock is gone


# A Snakemake's onstart marks the folder, then its job starts; a `dvc repro` started between
# the two held DVC's lock while the job checked: the job refused, Snakemake failed and deleted
# the job's outputs, and the `dvc repro` refused too (a CI run of
# test_dvc_refuses_while_snakemake_runs). The job of the Snakemake that holds the folder goes on.
JOB_OF_SNAKEMAKE = """import json, os, socket, subprocess, sys
root = sys.argv[1]
marker = os.path.join(root, ".snakemake", f"nmt-running.{os.getpid()}")
os.makedirs(os.path.dirname(marker), exist_ok=True)
with open(marker, "w") as file:  # as Snakemake's onstart writes it
    json.dump({"pid": os.getpid(), "host": socket.gethostname()}, file)
job = ("import sys; from pathlib import Path; from nmt.pipeline import orchestrators; "
       "orchestrators.refuse_others(Path(sys.argv[1]), 'nmt verify')")
sys.exit(subprocess.run([sys.executable, "-c", job, root]).returncode)
"""


def test_a_job_of_the_snakemake_holding_the_folder_goes_on_while_dvc_holds_its_lock(tmp_path):
    src = Path(orchestrators.__file__).parents[2]
    with dvc_lock_held(tmp_path) as holder:
        snakemake = subprocess.run(  # "snakemake" in its command line, as _alive looks for
            [sys.executable, "-c", JOB_OF_SNAKEMAKE, str(tmp_path), "snakemake"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)})
        assert snakemake.returncode == 0, snakemake.stderr
        # the same job with no Snakemake holding the folder (the marker's process is gone)
        with pytest.raises(NmtError, match=f"dvc \\(pid {holder.pid}\\) is running"):
            orchestrators.refuse_others(tmp_path, "nmt verify")


def test_a_dvc_repro_running_a_stage_is_seen(tmp_path):
    """While a stage's command runs, `dvc repro` holds no flock on .dvc/tmp/lock (DVC 3.67):
    Snakemake's onstart finds it in .dvc/tmp/rwlock and refuses to start."""
    from tiny import BIN

    subprocess.run([str(BIN / "dvc"), "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text("stages:\n  wait:\n    cmd: sleep 30 && touch out\n"
                                       "    outs: [out]\n")
    dvc = subprocess.Popen([str(BIN / "dvc"), "repro", "-q"], cwd=tmp_path)
    try:
        for _ in range(100):  # until the stage runs
            if (tmp_path / orchestrators.DVC_RWLOCK).is_file():
                break
            time.sleep(0.1)
        assert orchestrators.dvc_holder(tmp_path, stages=True) == dvc.pid
        with pytest.raises(NmtError, match=f"dvc \\(pid {dvc.pid}\\) is running"):
            orchestrators.claim_for_snakemake(tmp_path)
        assert not list((tmp_path / orchestrators.MARKERS).glob("nmt-running.*"))
    finally:  # with its stage's command, which DVC starts in a session of its own
        for process in [*psutil.Process(dvc.pid).children(recursive=True), dvc]:
            process.kill()
        dvc.wait()
    assert orchestrators.dvc_holder(tmp_path, stages=True) is None  # its pid is gone


# ---- item 3, without a pipeline: the checks themselves ---------------------------------------

def test_prechecks_name_the_key_and_the_fix(params_file):
    from nmt.pipeline.params import load_params

    params = load_params(params_file)
    preflight.check_devices(params)  # auto: the CPU here
    tuned = params["recipes"]["tuned"]
    tuned.setdefault("train", {})["devices"] = 2
    preflight.check_devices(params | {"pipeline": {**params["pipeline"], "recipes": ["tuned"]}})
    params["train"]["device"] = "cuda"
    with pytest.raises(NmtError, match="params.yaml: train: train.device 'cuda' asked for, but "
                                       "no CUDA GPUs are visible"):
        preflight.check_devices(params)
    params["data"]["testsets"] = ["test_2016_flickr", "test_2018_flickr"]
    root = params_file.parent
    (root / "workflow" / "multi30k.sha256").write_text(f"{'a' * 64}  train.de.gz\n")
    with pytest.raises(NmtError, match="train.en.gz has no pinned sha256"):
        preflight.check_settings(params, root)


def as_nobody(check, *args) -> str:
    """check(*args) run in a child of this process that became the user nobody: the error
    it raised, or "". The child has every module already imported, so it needs nothing
    under the checkout, which nobody may not be allowed to enter (a clone inside a mode-700
    folder, or under /root)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: drop root, run the check, report, exit
        os.close(read)
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            check(*args)
            message = ""
        except BaseException as error:  # everything goes back to the parent
            message = str(error) or repr(error)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(child, 0)
    return message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the check as another user")
def test_an_unwritable_results_folder_is_named():
    """As root every folder is writable, so the check runs as the user nobody, in a folder
    nobody may enter, whatever folder the checkout is in."""
    import tempfile

    root = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (root / "results" / "published-scratch-s0").mkdir(parents=True)
        for folder in (root, root / "results"):
            folder.chmod(0o777)
        (root / "results" / "published-scratch-s0").chmod(0o555)
        params = {"data": {"corpus": "multi30k", "testsets": [], "source_lang": "de",
                           "target_lang": "en"},
                  "pipeline": {"recipes": ["published"]}, "recipes": {"published": {}}}
        (root / "workflow").mkdir(mode=0o755)
        (root / "workflow" / "multi30k.sha256").write_text(
            "".join(f"{'0' * 64}  {s}.{lang}.gz\n" for s in ("train", "val")
                    for lang in ("de", "en")))
        assert as_nobody(preflight.check_settings, params, root) == (
            f"{root}/results/published-scratch-s0: not writable, and the pipeline writes there "
            f"(fix: chmod u+w {root}/results/published-scratch-s0, or run in a copy you may "
            "write)")
        (root / "results" / "published-scratch-s0").chmod(0o777)
        assert as_nobody(preflight.check_settings, params, root) == ""  # writable again
    finally:
        shutil.rmtree(root)


# ---- the pipeline: one tiny copy, one run trained by DVC -------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory, mirror) -> Path:
    root = scratch_copy(tmp_path_factory.mktemp("faults"))
    edit_params(root / "params.yaml", pipeline={"recipes": ["published"], "models": ["baseline"],
                                                "seeds": [0], "export": []},
                bench={"recipe": "published"})
    run(["dvc", "repro", "train@published-baseline-0"], root, env={"OMP_NUM_THREADS": "1"})
    return root


@pytest.fixture
def params_edit(trained):
    """Edit the copy's params.yaml; the original comes back after the test."""
    original = (trained / "params.yaml").read_text()

    def edit(**sections):
        edit_params(trained / "params.yaml", **sections)
    yield edit
    (trained / "params.yaml").write_text(original)


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["dvc", "snakemake"])
def test_a_job_bound_to_fail_deletes_nothing(trained, params_edit, tool):
    """train.device: cuda without a GPU: one line before the trained model is deleted."""
    before = digests(trained, TRAINED)
    params_edit(train={"device": "cuda"})
    cmd = (["dvc", "repro"] if tool == "dvc" else
           ["snakemake", "--cores", "1", "--forcerun", "train", "--", str(TRAINED[0])])
    out = run(cmd, trained, check=False)
    errors = [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")]
    assert len(errors) == 1 and "train.device 'cuda' asked for" in errors[0], out
    assert "Running stage 'train" not in out
    assert digests(trained, TRAINED) == before


@pytest.mark.slow
def test_after_reverting_dvc_does_not_retrain(trained, params_edit):
    params_edit(train={"device": "cuda"})
    run(["dvc", "repro"], trained, check=False)
    (trained / "params.yaml").write_text(
        (trained / "params.yaml").read_text().replace("device: cuda", "device: auto"))
    out = run(["dvc", "repro", "train@published-baseline-0"], trained)
    assert "Running stage 'train" not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["dvc", "snakemake"])
def test_an_unpinned_test_set_stops_before_the_raw_files_go(trained, params_edit, tool):
    raw = sorted(p.relative_to(trained) for p in (trained / "data" / "raw").iterdir())
    before = digests(trained, raw)
    params_edit(data={"testsets": ["test_2016_flickr", "test_2017_flickr", "test_2018_flickr"]})
    out = run(["dvc", "repro"] if tool == "dvc" else ["snakemake", "--cores", "1"], trained,
              check=False)
    errors = [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")]
    assert len(errors) == 1 and "test_2018_flickr.de.gz has no pinned sha256" in errors[0], out
    assert digests(trained, raw) == before


@pytest.mark.slow
def test_snakemake_refuses_while_dvc_runs(trained):
    before = digests(trained, TRAINED)
    holder = start([sys.executable, "-c", HOLD_DVC_LOCK, str(trained)], trained)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = run(["snakemake", "--cores", "1", "--forcerun", "train", "--", str(TRAINED[0])],
                  trained, check=False)
    finally:
        holder.kill()
        holder.wait()
    assert error_lines(out) == [f"snakemake: error: dvc (pid {holder.pid}) is running in this "
                                "folder and snakemake would change files its stages read (fix: "
                                "wait for it to finish, or stop it, then run again)"], out
    assert digests(trained, TRAINED) == before


@pytest.mark.slow
def test_dvc_refuses_while_snakemake_runs(trained, params_edit):
    """A real Snakemake run (re-running verify) holds the folder; `dvc repro` after a params
    edit stops at its first stage, config, with one line; nothing of the run is deleted."""
    before = digests(trained, TRAINED)
    smk = start(["snakemake", "--cores", "1", "--forcerun", "verify", "--",
                 "results/verify/published-baseline.json"], trained)
    markers = trained / orchestrators.MARKERS
    deadline = time.time() + 120
    while not list(markers.glob("nmt-running.*")) and time.time() < deadline:
        assert smk.poll() is None, smk.stdout.read()
        time.sleep(0.05)
    os.kill(smk.pid, signal.SIGSTOP)  # hold it here while DVC tries (its job goes on)
    try:
        params_edit(vocab={"min_freq": 2})
        out = run(["dvc", "repro"], trained, check=False)
    finally:
        os.kill(smk.pid, signal.SIGCONT)
        smk.wait(timeout=300)
    errors = [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")]
    assert errors == [f"nmt config: error: snakemake (pid {smk.pid}) is running in this folder "
                      "and nmt config would change files its jobs read (fix: wait for it to "
                      "finish, or stop it, then run again)"], out
    assert "Running stage 'config@published'" in out and "Running stage 'vocab" not in out
    assert digests(trained, TRAINED) == before and smk.returncode == 0
    assert not list(markers.glob("nmt-running.*"))  # onsuccess removed it


# ---- issue 58, item 1: a name from params.yaml that is no name ------------------------------

# A params.yaml list -> a hostile item, and the path of a file that the pipeline makes of it
# (a declared output, which DVC deletes before it runs the stage's command).
HOSTILE = {
    "recipes": ("../../nmt_canary", "params/{}.yaml"),  # config's output
    "models": ("../../../../nmt_canary", "results/published-{}-s0/best.pt"),  # train's
    "seeds": ("../../../../nmt_canary", "results/published-baseline-s{}/best.pt"),
}


@pytest.fixture(scope="module")
def committed(tmp_path_factory, mirror) -> Path:
    """A tiny copy of the trained copy's pipeline, committed (`dvc exp run` bases its experiment
    on a commit) and not run: an experiment's checkout, before any stage, takes every output
    its pipeline lacks out of the workspace, which would cost the trained copy its run."""
    root = scratch_copy(tmp_path_factory.mktemp("committed"))
    edit_params(root / "params.yaml", pipeline={"recipes": ["published"], "models": ["baseline"],
                                                "seeds": [0], "export": []},
                bench={"recipe": "published"})
    run(["git", "add", "-A"], root)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"], root)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "key"), [("dvc repro", "recipes"), ("dvc exp run", "recipes"),
                                           ("snakemake", "recipes"), ("dvc exp run", "models"),
                                           ("dvc exp run", "seeds")])
def test_a_name_that_is_no_name_deletes_nothing_outside_the_checkout(request, tool, key):
    """`../../x` in pipeline.recipes once had `dvc repro` delete params/../../x.yaml, a file
    outside the checkout, before `nmt config` refused the name. Now the first thing each tool
    runs refuses it, in one line naming the value and the fix: DVC's stage names (whose paths
    hold no name, and on which every other stage depends), Snakemake when it reads the
    workflow. (A hostile model or seed was stopped by config already, which runs before the
    stages whose paths hold them.) `dvc repro` and Snakemake in the trained copy, whose run
    stays; `dvc exp run -S` in a committed one."""
    root = request.getfixturevalue("committed" if tool == "dvc exp run" else "trained")
    value, template = HOSTILE[key]
    canary = Path(os.path.normpath(root / template.format(value)))
    assert not canary.is_relative_to(root)  # the path the pipeline would delete: outside
    canary.parent.mkdir(exist_ok=True)
    canary.write_text("keep\n")
    before = digests(root, TRAINED) if tool != "dvc exp run" else {}  # the trained run
    params = (root / "params.yaml").read_text()
    try:
        if tool == "dvc exp run":
            out = run(["dvc", "exp", "run", "-S", f"pipeline.{key}=[{value}]"], root,
                      check=False)
        else:
            edit_params(root / "params.yaml", pipeline={key: [value]})
            out = run(tool.split() + (["--cores", "1"] if tool == "snakemake" else []), root,
                      check=False)
        kept = canary.read_text() if canary.is_file() else "deleted"
    finally:
        (root / "params.yaml").write_text(params)
        canary.unlink(missing_ok=True)
        if canary.parent != root.parent:
            canary.parent.rmdir()
    assert kept == "keep\n", out
    errors = [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")]
    assert len(errors) == 1 and f"pipeline.{key}.0: {value!r}" in errors[0], out
    assert "(fix: " in errors[0] and "Traceback" not in out, out
    assert re.findall(r"Running stage '([^']+)'", out) == ([] if tool == "snakemake"
                                                          else ["names"]), out
    assert digests(root, before) == before


# ---- issue 58, item 2: a checkout this user may not write ------------------------------------

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]  # as the user nobody


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv, to run commands as another user")
def test_a_read_only_checkout_is_one_line_to_a_writer_and_works_for_a_reader(trained):
    """A copy of the trained checkout, chmod -R a-w, used by a user who is not root (root
    writes anyway): a command that writes stops with one line naming the folder and the fix
    (it was a traceback, PermissionError on .dvc/tmp/lock, which the orchestrator guard opened
    for appending to probe DVC's lock); translate and `nmt stages --check`, which only read,
    work."""
    import tempfile

    box = Path(tempfile.mkdtemp(dir="/tmp"))  # nobody may enter it, unlike pytest's folders
    copy, home = box / "copy", box / "home"
    try:
        box.chmod(0o755)
        shutil.copytree(trained, copy, symlinks=True)
        copy.chmod(0o755)  # pytest's folders are 700: nobody may enter, let alone read
        # The run's data as DVC recorded it: a test before may have rebuilt the vocabulary
        # under Snakemake, with other params (test_dvc_refuses_while_snakemake_runs).
        run(["dvc", "checkout", "--force", "--allow-missing"], copy)
        assert (copy / orchestrators.DVC_LOCK).is_file()  # DVC ran in it
        home.mkdir()
        os.chown(home, 65534, 65534)  # a HOME nobody may write (torch's caches)
        subprocess.run(["chmod", "-R", "a-w", str(copy)], check=True)

        def as_nobody(*cmd: str) -> tuple[int, str]:
            proc = start_as(NOBODY + list(cmd), copy, {"HOME": str(home)})
            out = finish(proc, check=False)
            return proc.returncode, out

        status, out = as_nobody(sys.executable, "-c", "import nmt")
        if status != 0:  # the venv lies where nobody may not enter (under /root, say)
            pytest.skip(f"the user nobody cannot run this Python: {out[-300:]}")
        run_folder = "results/published-baseline-s0"
        for cmd, folder in ((["config", "--recipe", "published"], "params"),
                            (["evaluate", "--recipe", "published", "--model", "baseline",
                              "--seed", "0"], run_folder),
                            (["train", "--recipe", "published", "--model", "baseline",
                              "--seed", "0"], run_folder)):
            status, out = as_nobody("nmt", *cmd)
            assert (status, error_lines(out)) == (2, [
                f"nmt {cmd[0]}: error: {folder}: not writable, and nmt {cmd[0]} writes there "
                f"(fix: chmod u+w {folder}, or run in a copy you may write)"]), out
            assert "Traceback" not in out, out
        status, out = as_nobody("nmt", "translate", "--run", "published-baseline-s0",
                                "Ein Mann fährt mit dem Fahrrad.")
        assert status == 0 and out.strip() and not error_lines(out), out
        status, out = as_nobody("nmt", "stages", "--check")
        assert status == 0 and not error_lines(out), out
        # A write no check before it foresees (a declaration edit to render): still one line.
        declared = copy / "workflow" / "stages.yaml"
        declared.chmod(0o644)
        declared.write_text(declared.read_text().replace("threads: 4", "threads: 3", 1))
        declared.chmod(0o444)
        status, out = as_nobody("nmt", "stages", "--write")
        assert (status, error_lines(out)) == (2, [
            "nmt stages: error: dvc.yaml: not writable, and nmt stages writes there (fix: "
            "chmod u+w dvc.yaml, or run in a copy you may write)"]), out
        # A lock it may not even read: whether DVC runs there is unknown, and it says so.
        (copy / orchestrators.DVC_LOCK).chmod(0o000)
        status, out = as_nobody("nmt", "config", "--recipe", "published")
        assert (status, error_lines(out)) == (2, [
            f"nmt config: error: {orchestrators.DVC_LOCK}: not readable, so whether dvc is "
            f"running in this folder cannot be told (fix: chmod a+r {orchestrators.DVC_LOCK}, "
            "or run in a copy you may write)"]), out
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(box)], check=True)
        shutil.rmtree(box)


def mounted_read_only(root: Path, folder: Path, cmd: list[str]) -> tuple[int, str]:
    """cmd run in root with `folder` read-only to it alone: a read-only bind mount in a private
    mount namespace (unshare -m), which root cannot write through either. The `cd` enters
    the working folder again through the new mount (the one it was started in is below it)."""
    script = ('mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && cd "$(pwd)" '
              '&& exec "$@"')
    proc = start_as(["unshare", "-m", "sh", "-c", script, str(folder), *cmd], root)
    return proc.wait(timeout=300), finish(proc, check=False)


@pytest.mark.slow
def test_a_read_only_checkout_plans_under_snakemake_or_says_why_not(trained):
    """Read-only for real (mounted so). The whole checkout: `snakemake -n` is one line naming
    Snakemake's own .snakemake/, which Snakemake 9 writes even in a dry run (its I/O cache;
    the line was "data: not writable", the pipeline's reason, not the one that stops it), and
    `dvc status` stops in DVC's own error on .dvc/tmp/lock, which docs/troubleshooting.md
    gives the same fix for. Only data/ read-only: the dry run plans, a run is one line."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    status, out = mounted_read_only(trained, trained, ["snakemake", "-n", "--cores", "1"])
    assert status == 1 and "Traceback" not in out, out
    where = rf"({re.escape(str(trained))}|\.snakemake)"  # .snakemake/ once Snakemake ran here
    assert re.fullmatch(
        rf"snakemake: error: {where}: not writable, and Snakemake writes its state there even "
        rf"in a dry run \(fix: run it in a copy you may write, e.g. cp -a "
        rf"{re.escape(str(trained))} /tmp/copy\)",
        "\n".join(line for line in out.splitlines() if "error" in line.lower())), out
    status, out = mounted_read_only(trained, trained, ["dvc", "status"])
    assert status != 0 and "Read-only file system" in out and ".dvc/tmp/lock" in out, out

    # A stale lock stays through a dry run, which locks nothing (the Snakefile asked
    # workflow.dryrun, which is False while it is read: the lock went).
    lock = trained / ".snakemake" / "locks" / "0.output.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("results/x\n")
    status, out = mounted_read_only(trained, trained / "data", ["snakemake", "-n", "--cores", "1"])
    assert status == 0 and "Traceback" not in out and "error" not in out.lower(), out
    assert lock.is_file() and "removed the lock" not in out, out
    lock.unlink()
    # params/ read-only and the corpus's record out of date: the dry run plans and says that
    # its plan leaves the corpus out (it may not write the record that would bring it in).
    record = trained / "params" / "sources.sha256"
    text, times = record.read_text(), record.stat()
    record.write_text(text + "# out of date\n")
    try:
        status, out = mounted_read_only(trained, trained / "params",
                                        ["snakemake", "-n", "--cores", "1"])
    finally:
        record.write_text(text)
        os.utime(record, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert status == 0 and "snakemake: warning: the corpus changed since " \
        "params/sources.sha256 was written, and this dry run may not write it" in out, out
    status, out = mounted_read_only(trained, trained / "data",
                                    ["snakemake", "--cores", "1", "data/raw"])
    assert status == 1 and "snakemake: error: data: not writable, and the pipeline writes " \
        "there (fix: chmod u+w data, or run in a copy you may write)" in out, out


# ---- item 7: a file damaged inside a folder output -------------------------------------------

def cache_object(root: Path, path: Path) -> Path:
    md5 = hashlib.md5((root / path).read_bytes()).hexdigest()
    return root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]


def damage_cached(cached: Path, old: bytes, new: bytes) -> None:
    """One byte changed in a cache object, which stays read-only: DVC then trusts it and never
    hashes it again (a writable one it would check, and drop)."""
    cached.chmod(0o644)
    cached.write_bytes(cached.read_bytes().replace(old, new, 1))
    cached.chmod(0o444)


@pytest.mark.slow
def test_a_damaged_cache_object_is_refused_under_each_tool_and_each_recovers(trained):
    """Issue 49: a byte changed in DVC's cache object of train.en.tok; `dvc checkout` restores
    it as it is (DVC trusts its cache), and `dvc repro -f -s vocab@published` built it into
    the vocabulary. Now the reader checks it against data/tokenized/SHA256SUMS: one line
    under DVC and Snakemake alike. Issue 58 item 2: `nmt check` finds the damaged object
    before any checkout, and the re-run the line names repairs the cache too (the object
    stays read-only, as real damage leaves it, so DVC never checks it itself)."""
    run(["dvc", "repro", "config@published"], trained)  # a test before may leave it deleted
    tok = trained / "data" / "tokenized" / "train.en.tok"
    intact = tok.read_bytes()
    cached = cache_object(trained, tok.relative_to(trained))
    damage_cached(cached, b"Two", b"TwX")
    out = run(["nmt", "check"], trained, check=False)
    assert out.splitlines()[0] == (
        f"data/tokenized/train.en.tok: DVC's cached copy {cached.relative_to(trained)} is "
        "damaged: its md5 is not its name, and `dvc checkout` would restore it as it is (fix: "
        "`dvc repro -f -s tokenize`)"), out
    shutil.rmtree(trained / "data" / "tokenized")
    run(["dvc", "checkout", "data/tokenized"], trained)
    assert b"TwX" in tok.read_bytes()  # restored damaged, as DVC does
    line = ("data/tokenized/train.en.tok: its sha256 differs from the one recorded in "
            "data/tokenized/SHA256SUMS: the file is damaged or not the stage's (fix: `dvc repro "
            "-f -s tokenize`, which replaces DVC's damaged copy too, or `rm -r data/tokenized` "
            "and run snakemake again)")
    out = run(["dvc", "repro", "-f", "-s", "vocab@published"], trained, check=False)
    assert [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")] == [
        f"nmt vocab: error: {line}"], out
    assert error_lines(run(["snakemake", "-n"], trained, check=False)) == [
        f"snakemake: error: {line}"]
    assert line in run(["nmt", "check"], trained, check=False).splitlines()
    run(["dvc", "repro", "-f", "-s", "tokenize"], trained)  # the fix the line names
    assert tok.read_bytes() == intact and cached.read_bytes() == intact  # the cache repaired
    shutil.rmtree(trained / "data" / "tokenized")
    run(["dvc", "checkout", "data/tokenized"], trained)
    assert tok.read_bytes() == intact  # and what DVC restores is intact
    assert "snakemake: error" not in run(["snakemake", "-n"], trained)
    assert run(["nmt", "check"], trained).startswith("nmt.check: 0 damaged")


@pytest.mark.slow
def test_a_damaged_cache_object_of_a_trained_model_is_found_and_its_fix_repairs_it(trained):
    """A stage without a record (train): `nmt check` names the object and, the workspace copy
    being intact, the cheap fix (remove it, commit again), after which DVC restores intact
    bytes."""
    run(["dvc", "repro", "vocab@published"], trained)  # a test before may leave it deleted
    best = trained / RUN / "history.csv"
    intact = best.read_bytes()
    cached = cache_object(trained, RUN / "history.csv")
    damage_cached(cached, b"1", b"7")
    out = run(["nmt", "check"], trained, check=False)
    rm = f"rm -f {cached.relative_to(trained)}"
    assert out.splitlines()[0] == (
        f"{RUN}/history.csv: DVC's cached copy {cached.relative_to(trained)} is damaged: its md5 "
        "is not its name, and `dvc checkout` would restore it as it is (fix: "
        f"`{rm}`, then `dvc commit -f train@published-baseline-0`)"), out
    subprocess.run(rm, shell=True, cwd=trained, check=True)
    run(["dvc", "commit", "-f", "train@published-baseline-0"], trained)
    best.unlink()
    run(["dvc", "checkout", str(RUN / "history.csv")], trained)
    assert best.read_bytes() == intact
    assert run(["nmt", "check"], trained).startswith("nmt.check: 0 damaged")


@pytest.mark.slow
def test_dvcs_cache_gone_or_one_object_gone_is_named(trained):
    """Issue 69 item 3: `nmt check` with DVC's cache gone said "0 damaged"; now one line for
    the cache (`dvc checkout` can restore nothing) or, an object gone, one for its stage, each
    with the fix, and exit status 1. Outputs kept out of the cache (`cache: false`) are none."""
    cache = trained / ".dvc" / "cache"
    aside = trained.parent / "cache-aside"
    shutil.move(cache, aside)
    try:
        out = run(["nmt", "check"], trained, check=False)
    finally:
        shutil.move(aside, cache)
    assert out.splitlines()[0].startswith(".dvc/cache: DVC's cache is gone"), out
    assert "(fix: `dvc commit -f`" in out and "nmt.check: 1 damaged" in out
    history = cache_object(trained, RUN / "history.csv")
    kept = history.read_bytes()
    history.unlink()
    try:
        out = run(["nmt", "check"], trained, check=False)
    finally:
        history.write_bytes(kept)
    assert out.splitlines()[0] == (
        f"{RUN}/history.csv: DVC's cached copy is missing, so `dvc checkout` cannot restore it "
        "(fix: `dvc commit -f train@published-baseline-0`, from the workspace's copy, or "
        "`dvc repro -f -s train@published-baseline-0`)"), out
    assert run(["nmt", "check"], trained).startswith("nmt.check: 0 damaged")


@pytest.mark.slow
def test_a_time_stamp_in_the_future_is_one_line_before_snakemake_deletes_anything(trained):
    """Issue 58 item 7: data/tokenized stamped a day ahead. Snakemake ran vocab (its input is
    newer), then failed the job (its output older than its input) and deleted the vocabulary
    it had just built. Now it refuses when it reads the workflow, in one line whose fix works."""
    run(["dvc", "checkout", "data/vocab/published", "data/tokenized"], trained)
    vocab = trained / "data" / "vocab" / "published"
    tokenized = trained / "data" / "tokenized"
    before = {p.name: p.read_bytes() for p in vocab.iterdir()}
    ahead = time.time() + 86400
    os.utime(tokenized, (ahead, ahead))
    out = run(["snakemake", "--cores", "1", "data/vocab/published"], trained, check=False)
    errors = error_lines(out)
    assert len(errors) == 1 and errors[0].startswith(
        "snakemake: error: data/tokenized: modified in the future ("), out
    assert {p.name: p.read_bytes() for p in vocab.iterdir()} == before
    fix = re.search(r"fix: `([^`]+)`", errors[0]).group(1)
    subprocess.run(fix, shell=True, cwd=trained, check=True)
    assert tokenized.stat().st_mtime <= time.time()
    assert "snakemake: error" not in run(["snakemake", "-n"], trained, check=False)


def test_results_that_is_a_file_is_one_line_under_each_tool(tmp_path, mirror):
    """`results` a plain file: the preflight of both tools names it and the fix (not chmod),
    and a stage run by hand that writes under it says the same."""
    root = scratch_copy(tmp_path)
    (root / "results").write_text("not a folder\n")
    want = "results is a file where the pipeline needs a folder (fix: move the file away, e.g. " \
           "mv results results.moved)"
    assert error_lines(run(["snakemake", "-n"], root, check=False)) == [
        f"snakemake: error: {want}"]
    assert error_lines(run(["nmt", "config", "--recipe", "published"], root, check=False)) == [
        f"nmt config: error: {want}"]
    dvc = run(["dvc", "repro", "config@published"], root, check=False)
    assert f"nmt config: error: {want}" in dvc and "Traceback" not in dvc, dvc
    assert (root / "results").read_text() == "not a folder\n"


# ---- issue 69 item 2: both orchestrators in one checkout, alternately ---------------------
# (the alternation itself runs in the tiny Snakemake copy: tests/test_pipeline.py)

@pytest.mark.slow
def test_adopt_refuses_a_checkout_snakemake_has_not_finished(committed):
    """`nmt adopt` records only what Snakemake finished: in a copy no tool has run, one line
    says how many jobs are left."""
    refused = run(["nmt", "adopt"], committed, check=False)
    assert "job(s) to do: only a finished run can be recorded" in refused, refused
    assert not (committed / "dvc.lock").exists()


def a_process_named(name: str, folder: Path, tmp_path: Path) -> subprocess.Popen:
    """A Python process whose script is called `name` (as `snakemake` and `dvc` are run), its
    working folder `folder`; it waits for the test to end it."""
    script = tmp_path / "bin" / name
    script.parent.mkdir(exist_ok=True)
    script.write_text("import time\ntime.sleep(60)\n")
    return subprocess.Popen([sys.executable, str(script)], cwd=folder)


def test_a_killed_snakemakes_lock_is_removed_unless_a_snakemake_works_in_the_folder(
        tmp_path, capsys):
    """Snakemake's lock with no Snakemake in the folder (one killed with SIGKILL left it, and
    the rerun stopped until `snakemake --unlock`): removed, with one line. With a Snakemake
    working in the folder, it stays (Snakemake refuses the second run itself); a Snakemake
    working elsewhere does not count."""
    root = tmp_path / "checkout"
    locks = root / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    for name in ("0.input.lock", "0.output.lock"):
        (locks / name).write_text("results/x\n")
    elsewhere = a_process_named("snakemake", tmp_path, tmp_path)
    here = a_process_named("snakemake", root, tmp_path)
    try:
        time.sleep(0.5)
        assert orchestrators.orchestrator_name(psutil.Process(here.pid)) == "snakemake"
        orchestrators.clear_stale_lock(root)
        assert sorted(p.name for p in locks.iterdir()) == ["0.input.lock", "0.output.lock"]
        assert capsys.readouterr().err == ""
    finally:
        here.kill()
        here.wait()
    try:
        orchestrators.clear_stale_lock(root)
    finally:
        elsewhere.kill()
        elsewhere.wait()
    assert not list(locks.iterdir())
    assert capsys.readouterr().err == ("snakemake: removed the lock a killed snakemake left (no "
                                       "other snakemake runs in this folder)\n")


def test_a_stage_command_stops_when_the_orchestrator_that_started_it_is_gone(tmp_path):
    """`nmt` stage commands watch the Snakemake or DVC that started them: a process named
    snakemake starts a command that waits (here: Python running the same watch, a progress
    bar drawn as a training's is), and is killed with SIGKILL; the command says so in one
    line, on a row of its own above the bar, and gets SIGTERM (a training then stops at its
    next step and keeps its resume state). Started by hand, nothing watches."""
    child = ("import signal, sys, time\n"
             "from tqdm import tqdm\n"
             "from nmt.pipeline.orchestrators import stop_when_orchestrator_dies\n"
             "stop = lambda *a: sys.exit(tqdm.write('SIGTERM', sys.stderr))\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "stop_when_orchestrator_dies(interval=0.1)\n"
             "print('watching', flush=True)\n"
             "bar = tqdm(total=10)\n"
             "time.sleep(60)\n")
    script = tmp_path / "bin" / "snakemake"
    script.parent.mkdir()
    out = tmp_path / "child.out"
    script.write_text("import subprocess, sys, time\n"
                      f"subprocess.Popen([sys.executable, '-c', {child!r}], "
                      f"stdout=open({str(out)!r}, 'w'), stderr=subprocess.STDOUT)\n"
                      "time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    orchestrator = subprocess.Popen([sys.executable, str(script)], env=env)
    deadline = time.monotonic() + 30
    while "watching" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (watched,) = psutil.Process(orchestrator.pid).children()
    orchestrator.kill()
    orchestrator.wait()
    watched.wait(timeout=10)  # (not our child: its exit status is its parent's to read)
    assert rows_of_lines(out.read_bytes().decode())[:3] == [
        "watching", f"nmt: snakemake (pid {orchestrator.pid}), which started this command, "
        "is gone: stopping", "SIGTERM"]
    by_hand = subprocess.run([sys.executable, "-c", child.replace("time.sleep(60)",
                                                                   "time.sleep(0.5)")],
                             env=env, capture_output=True, text=True, timeout=30)
    assert (by_hand.returncode, by_hand.stdout) == (0, "watching\n")
