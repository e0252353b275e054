"""Shared fixtures: real Multi30k data prepared once per test session in a temp folder."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

# Threads that wait at a barrier sleep instead of spinning (libgomp's default spins first): a
# 2-thread torch step waiting for a core the other test worker holds burned ~2.5x the CPU and
# took ~2.5x as long. Set before torch loads, here and in every process the tests start; the
# thread counts, and so the numbers, stay as they are.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch.compile's inductor compiles its C++ kernels in this process, not in a pool of worker
# processes (by default one per core, each importing torch and inductor first): on 2 cores the
# pool cost more than it saved. The compiled run-and-resume test took 45 CPU-seconds with a
# warm kernel cache and 95 with a cold one (a fresh clone's), against 35 and 75 without the
# pool. The kernels are the same either way.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# train.precision auto's measurements (nmt.training.precision) go to a folder of the session's, not
# to the user's cache: a test's stand-in figures must never decide a real run's precision.
# Removed when the session's process ends (164 of them were left in /tmp before).
os.environ["NMT_CACHE_DIR"] = tempfile.mkdtemp(prefix="nmt-cache-")
atexit.register(shutil.rmtree, os.environ["NMT_CACHE_DIR"], ignore_errors=True)

import torch  # noqa: E402
import yaml  # noqa: E402

from mutmut_seconds import pytest_fixture_setup, pytest_runtest_makereport  # noqa: E402, F401
from nmt.core.process import keep_freed_memory  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402

# The tests train in their own processes too, not only through `nmt` (whose main() does this).
keep_freed_memory()

REPO = Path(__file__).resolve().parents[1]


# ---- the checkout is left as the tests found it ----------------------------------------------
# What a later `dvc repro`, `snakemake` or `nmt` run in this checkout reads of earlier runs. A
# test that wrote here (an in-process call that writes under the current folder, the checkout)
# would hand a real run its stand-in figures: test_precision's estimate wrote
# results/precision/<recipe>.json, a precision chosen on a planted clock, which every later
# run of that recipe here would have taken as decided. A test writes under its tmp_path.
# Of .snakemake/, what decides a later run (its records of each output's code, params and
# inputs; the outputs it left incomplete), not the logs and I/O cache that test_lint's dry
# runs of the checkout's own workflow write. Nor params/sources.sha256: the Snakefile writes
# it whenever it reads the workflow (a dry run too), this checkout's own record, rewritten
# only when its text changes (nmt.stages.sources).
WATCHED = ("data", "results", "reports", "params", ".snakemake/metadata",
           ".snakemake/incomplete", "dvc.lock", "params.yaml")
SELF_WRITTEN = ("params/sources.sha256",)
CHECKOUT = pytest.StashKey[dict]()  # the session's pipeline_files at its start


def pipeline_files(root: Path) -> dict[str, tuple[int, int]]:
    """Each file of `root`'s WATCHED paths: its size and modification time (ns)."""
    found = {}
    for name in WATCHED:
        top = root / name
        for file in [top] if top.is_file() else sorted(top.rglob("*")):
            if file.is_file() and str(file.relative_to(root)) not in SELF_WRITTEN:
                stat = file.stat()
                found[str(file.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def changed(before: dict, after: dict) -> list[str]:
    """The files added, changed or removed between two pipeline_files of one checkout."""
    def how(path: str) -> str:
        return "new" if path not in before else "removed" if path not in after else "changed"

    return sorted(f"{path} ({how(path)})" for path in before.keys() | after.keys()
                  if before.get(path) != after.get(path))


def guards_the_checkout(config) -> bool:
    """pytest's own process (not an xdist worker) in a git checkout, outside make mutate (whose
    mutmut runs the tests in copies beside its own files)."""
    return (not hasattr(config, "workerinput") and "MUTANT_UNDER_TEST" not in os.environ
            and (REPO / ".git").exists())


def pytest_sessionstart(session):
    if guards_the_checkout(session.config):
        session.config.stash[CHECKOUT] = pipeline_files(REPO)


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(CHECKOUT, None)
    if before is None:
        return
    written = changed(before, pipeline_files(REPO))
    if written:
        print(f"\nthe tests changed this checkout's pipeline files (a test writes under its "
              f"tmp_path; a later run here would read these): {', '.join(written)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---- running the tests on every core (pytest-xdist: make test runs pytest -n 2) --------------
# A worker runs whole modules, so that a module's fixtures are built once; the modules that
# share the session's tiny pipelines run on one worker together, so that those are built once
# (and run in this order: test_pipeline's last test changes the DVC copy). Modules with slow
# tests start first, the tiny pipelines' first of all: the longest work starts before the
# short, and the workers end close together.
TINY_RUNS = "tiny_runs"
TINY_RUNS_MODULES = ("test_contract.py", "test_pipeline.py")


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """LoadScopeScheduling whose scope is the module, or TINY_RUNS for its modules."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return TINY_RUNS if Path(module).name in TINY_RUNS_MODULES else module

    return ModuleScheduling(config, log)


def under_mutant() -> bool:
    """Whether this pytest runs a mutant of make mutate (tools/mutate.py)."""
    return os.environ.get("MUTANT_UNDER_TEST", "").startswith("nmt.")


@functools.cache
def mutmut_durations() -> dict[str, float]:
    """Each test's seconds as mutmut timed them (mutmut-stats.json, in mutants/ where it runs
    the tests), read once a process."""
    return json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]


def pytest_collection_modifyitems(config, items):
    """Tiny pipelines first, then the other modules with slow tests, then the rest."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path.name not in TINY_RUNS_MODULES, item.path not in slow))
    if under_mutant():
        # A mutant of make mutate (tools/mutate.py), whose tests stop at the first failure: the
        # quickest first (mutmut's timings, in mutants/, where it runs them), so that a mutant
        # dies on its quickest test, and only a survivor pays for them all.
        items.sort(key=lambda item: mutmut_durations().get(item.nodeid, 0.0))
        # A mutant that keeps a training from ending (an epoch that never advances) fails at
        # update 1,000, which no training of the selection reaches (test_patience's longest
        # takes 98), instead of holding its quickest test until mutmut's timeout, which is no
        # kill. A test that plants its own stop replaces this one while it runs.
        from nmt.training import faults

        os.environ.setdefault(faults.ENV, "step:1000:TERM")


# Where the watchdog below names each mutant it failed, beside mutmut-stats.json in mutants/:
# tools/mutate.py lists them in docs/mutation.md, as kills to check by hand (a mutant that is
# only slow, not wrong, would be one).
WATCHDOG_LOG = "mutmut-watchdog.log"


def hung(nodeid: str, limit: float) -> None:
    """The watchdog's verdict on a test past its limit: its line in WATCHDOG_LOG (mutant,
    test, seconds; pytest captures stderr, and the process ends before it shows it), then
    exit 1, which mutmut counts as a kill."""
    line = f"{os.environ.get('MUTANT_UNDER_TEST', '')}\t{nodeid}\t{limit:.0f}\n"
    with open(WATCHDOG_LOG, "a") as log:
        log.write(line)
    os.write(2, f"{nodeid} ran past {limit:.0f} s: failed\n".encode())
    os._exit(1)


@pytest.fixture(autouse=True)
def a_mutant_that_hangs_fails(request):
    """Under a mutant of make mutate, a test that runs past 5 times its own duration
    (mutmut's timings) and 30 s fails (`hung`: exit 1, which mutmut counts as a kill, and a
    line in WATCHDOG_LOG). A loop that never ends and reaches no planted stop (an epoch whose
    batches are used up but that never ends, so that nothing is counted) would otherwise hold
    its test until mutmut's timeout for the whole selection, which is no kill. Generous, so
    that a busy machine is no kill either. (faulthandler's watchdog, which dumps every
    thread's stack first, crashed the process mid-training.)"""
    if not under_mutant():
        yield
        return
    limit = 5 * mutmut_durations().get(request.node.nodeid, 0.0) + 30
    watchdog = threading.Timer(limit, hung, (request.node.nodeid, limit))
    watchdog.daemon = True
    watchdog.start()
    yield
    watchdog.cancel()


@pytest.fixture(autouse=True)
def a_mutant_that_leaves_sigterm_unhandled_fails(request):
    """Under a mutant of make mutate, a SIGTERM that reaches a test's process with no handler
    of nmt's in place (one a test sends itself, or the stop planted at update 1,000) ends it
    with exit 1, which mutmut counts as a kill. mutmut's fork server answers SIGTERM with
    exit 0, and the processes it forks to run the tests inherit its handler: a mutant of
    StopSignals.__enter__ that never put nmt's handler in place passed (docs/testing.md).
    Outside make mutate such a SIGTERM ends the process, which pytest or xdist report."""
    if not under_mutant() or threading.current_thread() is not threading.main_thread():
        yield
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def unhandled(signum, frame):
        capture.suspend_global_capture()  # pytest's capture would keep the line from showing
        os.write(2, f"{request.node.nodeid}: a SIGTERM reached the test's process with no "
                    "handler of nmt's: failed\n".encode())
        os._exit(1)

    before = signal.signal(signal.SIGTERM, unhandled)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and spinning threads crawl on a busy machine."""
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"  # torch in the nmt processes tests start follows it
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(scope="session")
def mirror() -> Path:
    """The local Multi30k mirror (CI sets MULTI30K_MIRROR; else ../shared/multi30k)."""
    path = Path(os.environ.get("MULTI30K_MIRROR") or REPO.parent / "shared" / "multi30k")
    assert (path / "train.de.gz").is_file(), f"no Multi30k mirror at {path}: set MULTI30K_MIRROR"
    os.environ["MULTI30K_MIRROR"] = str(path)  # for the stages the tests start as processes
    return path


@pytest.fixture
def params_file(tmp_path) -> Path:
    """A copy of the repository's params.yaml (and its schema) that a test may edit."""
    shutil.copytree(REPO / "workflow" / "schemas", tmp_path / "workflow" / "schemas")
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def edit_params(path: Path, **sections) -> Path:
    """Merge {section: {key: value}} into a params.yaml file."""
    params = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(params.get(section), dict):
            params[section].update(values)
        else:
            params[section] = values
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, mirror) -> dict:
    """download -> tokenize (2,000 train pairs, 100 test pairs) -> word and bpe vocabularies."""
    from nmt.stages import download, tokenize, vocab

    root = tmp_path_factory.mktemp("data")
    params = load_params(REPO / "params.yaml")
    download.download(params, download.Paths(root / "raw", REPO / "workflow" / "multi30k.sha256"),
                      retries=1)
    data = params["data"] | {"max_train_pairs": 2000, "max_test_pairs": 100}
    tokenize.tokenize({"data": data, "tokenize": {"batch_size": 1000, "words": True}},
                      tokenize.Paths(root / "raw", root / "tokenized"))
    word = vocab.build(params, vocab.Paths(root / "tokenized", root / "vocab" / "word"))
    bpe = vocab.build(params | {"vocab": {**params["vocab"], "kind": "bpe", "bpe_size": 1000}},
                      vocab.Paths(root / "tokenized", root / "vocab" / "bpe"))
    return {"root": root, "raw": root / "raw", "tokenized": root / "tokenized",
            "word": root / "vocab" / "word", "bpe": root / "vocab" / "bpe",
            "word_meta": word, "bpe_meta": bpe}


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, mirror) -> dict[str, Path]:
    """Two tiny copies of the repository, after one whole `dvc repro` and one whole
    `snakemake` (outputs in repro.log), every stage recording the params keys and modules it
    used in reads.jsonl. The two run at once, each on its own half of the cores: their stages
    take the same thread count (the cores they may use), so both give the same numbers."""
    from tiny import halves, run_at_once, scratch_copy

    roots = {tool: scratch_copy(tmp_path_factory.mktemp(tool)) for tool in ("dvc", "snakemake")}
    commands = {"dvc": ["dvc", "repro"],
                # gpu=2: the tiny tuned recipe trains with train.devices 2 (two Gloo processes)
                "snakemake": ["snakemake", "--cores", str(len(halves()[1])),
                              "--resources", "gpu=2"]}
    outputs = run_at_once([(commands[tool], root, {"NMT_TRACK_READS": str(root / "reads.jsonl")})
                           for tool, root in roots.items()])
    for root, output in zip(roots.values(), outputs, strict=True):
        (root / "repro.log").write_text(output)
    return roots


def in_tiny_group(test: pytest.Item) -> None:
    """A test of the tiny pipelines runs on their worker; on another, it would build them
    again."""
    assert test.path.name in TINY_RUNS_MODULES, \
        f"{test.nodeid} uses the tiny pipelines: add its module to TINY_RUNS_MODULES"


@pytest.fixture
def dvc_run(tiny_runs, request) -> Path:
    """The tiny copy after one whole `dvc repro` (its output in repro.log)."""
    in_tiny_group(request.node)
    return tiny_runs["dvc"]


@pytest.fixture
def snakemake_run(tiny_runs, request) -> Path:
    """The same tiny copy after one whole `snakemake`, run beside it."""
    in_tiny_group(request.node)
    return tiny_runs["snakemake"]


def screen(stderr: str) -> list[str]:
    """The rows a terminal shows once stderr is written to it, trailing blanks dropped: \\r
    goes back to the row's start (what follows overwrites), \\n starts the next row, ESC[A
    goes up a row (tqdm's bars under another bar). Text read with newlines translated
    (subprocess's text=True, Path.read_text) has each \\r as \\n: every redraw of a bar is
    then a row of its own, and a line written after a bar still shares its row."""
    rows, row, col = [""], 0, 0
    for part in re.split(r"(\r|\n|\x1b\[A)", stderr):
        if part == "\r":
            col = 0
        elif part == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif part == "\x1b[A":
            row = max(row - 1, 0)
        elif part:
            text = rows[row].ljust(col)
            rows[row], col = text[:col] + part + text[col + len(part):], col + len(part)
    return [row.rstrip() for row in rows]


def rows_of_lines(stderr: str) -> list[str]:
    """The terminal's rows that are not blank (screen), once a check that a progress bar's
    row holds the bar alone: a line written while a bar was drawn starts a row of its own."""
    rows = [row for row in screen(stderr) if row]
    for row in rows:
        assert "%|" not in row or row.endswith("]"), f"a line shares the bar's row: {row!r}"
    return rows
