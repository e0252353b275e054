"""make test's own measurement: the CPU-seconds each test took, summed by module, and this
host's speed, printed at the end of the run.

    python tools/cpu_seconds.py -n 3        # pytest -n 3, and the table (make test runs this)

A test's CPU-seconds are its process's and those of the processes it started and waited for
(`nmt` stages, `dvc repro`, `snakemake`, trainings): on 2 cores, make test is bound by CPU, not
by waiting, so these, not the wall seconds of `--durations` (which grow with whatever runs
beside a test on the other workers), say where its minutes go and what a cut would save.
The same suite took twice the CPU-seconds on one host from one hour to the next
(docs/testing.md), so the table ends with the host: a census of the Python processes the run
started (how many, how many imported torch, and what those imports cost, timed inside them
while the tests ran: tools/process_hook.py, which a .pth file in the checkout's virtual
environment runs in each, for the run's length); the host's speed during the run (`probe`:
a Python loop and writing fresh memory, on each worker before each module's first test);
`import torch` in a new process after the run (median of 3; one moment's figure: in a
26.7-minute run on a 2-core Xeon, 9.77 CPU-seconds after it, where the run's 203 imports took
a median of 2.15); and the CPU's name.

Run as a script, it is pytest with one more plugin (this module, `-p cpu_seconds`): with
pytest-xdist, each worker measures its tests and hands the figures to the controller, which
prints them. Nothing is left behind: the .pth file and the census's file are removed after
the run (the census is skipped where the Python running pytest is not the checkout's own).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

MODULES = 12  # the heaviest modules the table names
TESTS = 10  # and the heaviest tests
KEY = "cpu_seconds"  # in a worker's workeroutput
PROBES = "host_probes"  # and its samples of the host's speed
LOOP_STEPS = 3_000_000  # the probe's Python loop (a tenth of a second)
FRESH_MB = 64  # and the fresh memory it writes
ROOT = Path(__file__).resolve().parent.parent
ENV = "MAKE_TEST_PROCESSES"  # the census's file, for tools/process_hook.py
HOOK = Path(__file__).resolve().with_name("process_hook.py")


class Host(NamedTuple):
    """This host: its CPU, its speed sampled during the run (probe, on each worker before each
    module's first test), and `import torch` in a new process after the run."""
    cpu: str
    probes: list[tuple[float, float]]  # (loop, fresh memory) CPU-seconds, one a sample
    torch_import: float | None  # median CPU-seconds of `repeats` imports; None: not measured
    repeats: int


class Census(NamedTuple):
    """The Python processes a run started, and what `import torch` took in those that did."""
    processes: int
    torch_imports: list[float]  # CPU-seconds, one a process that imported torch


def start_census() -> Path | None:
    """The .pth file that runs tools/process_hook.py in each new Python process of this
    environment while $MAKE_TEST_PROCESSES names a file (set here, for the workers and every
    process they start); None where the environment is not the checkout's (nothing outside
    the checkout is written)."""
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    if not site.is_relative_to(ROOT):
        return None
    fd, census = tempfile.mkstemp(prefix="make-test-processes-", suffix=".tsv")
    os.close(fd)
    os.environ[ENV] = census
    pth = site / f"_make_test_processes_{os.getpid()}.pth"
    hook = f"__import__('pathlib').Path({str(HOOK)!r}).read_text()"
    pth.write_text(f"import os; os.environ.get({ENV!r}) and exec(compile({hook}, "
                   f"{str(HOOK)!r}, 'exec'), {{'__name__': 'process_hook'}})\n")
    return pth


def end_census(pth: Path) -> Census:
    """The census's lines, read; the .pth file and the census's file removed."""
    pth.unlink(missing_ok=True)
    census = Path(os.environ.pop(ENV))
    lines = [line.split("\t") for line in census.read_text().splitlines()]
    census.unlink()
    return Census(processes=sum(fields[0] == "start" for fields in lines),
                  torch_imports=[float(fields[2]) for fields in lines if fields[0] == "torch"])


def own_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """This process's CPU-seconds, user and system (RUSAGE_CHILDREN: its children's waited for)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds() -> float:
    """This process's CPU-seconds, user and system, and those of its children waited for."""
    return own_seconds() + own_seconds(resource.RUSAGE_CHILDREN)


def probe() -> tuple[float, float]:
    """The host's speed now, in CPU-seconds: a Python loop of LOOP_STEPS steps, and writing
    FRESH_MB of memory the process did not have (its page faults: what each new process and
    each new tensor's memory pays)."""
    start = own_seconds()
    total = 0
    for step in range(LOOP_STEPS):
        total += step
    loop = own_seconds() - start
    start = own_seconds()
    block = b"\1" * (FRESH_MB << 20)
    del block
    return loop, own_seconds() - start


def torch_import_seconds(repeats: int) -> float:
    """The median CPU-seconds of `import torch` in a new Python process."""
    spent = []
    for _ in range(repeats):
        before = cpu_seconds()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        spent.append(cpu_seconds() - before)
    return statistics.median(spent)


def cpu_name() -> str:
    """The CPU's model name and the bf16 instructions it has (they change torch's speed)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    bf16 = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name}, {', '.join(bf16) if bf16 else 'no native bf16'}"


class Measure:
    """Each test's CPU-seconds (setup, call and teardown) in the process that runs it; the
    controller's table at the end."""

    def __init__(self, config):
        self.config = config
        self.seconds: dict[str, float] = {}
        self.probes: list[tuple[float, float]] = []
        self.module = None  # the module of the last test this process ran
        controller = not hasattr(config, "workerinput")
        self.pth = start_census() if controller and config.getoption("census") else None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        module = item.nodeid.split("::")[0]
        if module != self.module:  # a probe before its first test, outside the test's seconds
            self.module = module
            self.probes.append(probe())
        start = cpu_seconds()
        yield
        self.seconds[item.nodeid] = cpu_seconds() - start

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workeroutput"):  # a worker: the figures go to the controller
            self.config.workeroutput[KEY] = self.seconds
            self.config.workeroutput[PROBES] = self.probes

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {})
        self.seconds.update(output.get(KEY, {}))
        self.probes.extend(tuple(sample) for sample in output.get(PROBES, []))

    def pytest_terminal_summary(self, terminalreporter):
        census = end_census(self.pth) if self.pth else None  # before the host's imports
        self.pth = None
        if hasattr(self.config, "workerinput") or not self.seconds:
            return
        repeats = self.config.getoption("host_repeats")
        host = Host(cpu_name(), self.probes, torch_import_seconds(repeats) if repeats else None,
                    repeats)
        for line in table(self.seconds, census, host):
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config):
        if self.pth:  # a run stopped before its summary
            end_census(self.pth)


def table(seconds: dict[str, float], census: Census | None, host: Host) -> list[str]:
    """The lines make test ends with: the total, the heaviest modules and tests, the census of
    processes, the host."""
    modules: dict[str, float] = defaultdict(float)
    for nodeid, spent in seconds.items():
        modules[nodeid.split("::", 1)[0]] += spent
    total = sum(seconds.values())
    lines = [f"CPU-seconds in the tests (their processes and those they waited for): "
             f"{total:,.0f} over {len(seconds)} tests", "by module:"]
    for module, spent in sorted(modules.items(), key=lambda kv: -kv[1])[:MODULES]:
        lines.append(f"  {spent:7.1f}  {100 * spent / total:4.1f} %  {module}")
    lines.append("by test:")
    for nodeid, spent in sorted(seconds.items(), key=lambda kv: -kv[1])[:TESTS]:
        lines.append(f"  {spent:7.1f}  {nodeid}")
    if census is not None:
        imports = census.torch_imports
        lines.append(f"Python processes the run started: {census.processes:,}; "
                     f"{len(imports):,} imported torch, in {sum(imports):,.0f} CPU-seconds"
                     + (f" (median {statistics.median(imports):.2f} each)" if imports else ""))
    if host.probes:
        loops, writes = [loop for loop, _ in host.probes], [write for _, write in host.probes]
        lines.append(f"this host during the run ({len(host.probes)} samples, median and range, "
                     f"CPU-seconds): a Python loop of {LOOP_STEPS:,} steps {spread(loops)}, "
                     f"{FRESH_MB} MB of fresh memory written {spread(writes)}")
    if host.torch_import is not None:
        lines.append(f"this host after the run: import torch takes {host.torch_import:.2f} "
                     f"CPU-seconds (median of {host.repeats})")
    lines.append(f"this host: {host.cpu}")
    return lines


def spread(values) -> str:
    """A median and the range of `values`: "0.12 (0.10-0.30)"."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def pytest_addoption(parser):
    parser.addoption("--host-repeats", type=int, default=3,
                     help="imports of torch that time this host after the tests (0: none)")
    parser.addoption("--no-census", dest="census", action="store_false",
                     help="no census of the Python processes the run starts")


def pytest_configure(config):
    config.pluginmanager.register(Measure(config), "cpu_seconds_measure")


if __name__ == "__main__":
    sys.exit(pytest.main([*sys.argv[1:], "-p", "cpu_seconds"]))
