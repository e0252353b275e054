"""make test's own measurement: the CPU-seconds each test took, summed by module, and this
host's speed, printed at the end of the run.

    python tools/cpu_seconds.py -n 3        # pytest -n 3, and the table (make test runs this)

A test's CPU-seconds are its process's and those of the processes it started and waited for
(`nmt` stages, `dvc repro`, `snakemake`, trainings): on 2 cores, make test is bound by CPU, not
by waiting, so these, not the wall seconds of `--durations` (which grow with whatever runs
beside a test on the other workers), say where its minutes go and what a cut would save.
The same suite took twice the CPU-seconds on one host from one hour to the next
(docs/testing.md), so the table ends with this host's speed: the CPU-seconds of `import torch`
in a new process (median of 3), which most test processes pay before their work, measured
after the tests, on a quiet machine: the host at that moment (its speed moves within a run
too, so the figure does not scale a run's minutes; docs/testing.md). Before it, a census of
the Python processes the run started: how many, how many imported torch, and what those
imports cost, measured inside the processes while the tests ran (tools/process_hook.py, which
a .pth file in the checkout's virtual environment runs in each, for the run's length). In a
26.7-minute run on a 2-core Xeon: 504 processes, 203 imports of torch in 466 CPU-seconds
(median 2.15), where the one sample after the tests took 9.77 (docs/testing.md).

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
ROOT = Path(__file__).resolve().parent.parent
ENV = "MAKE_TEST_PROCESSES"  # the census's file, for tools/process_hook.py
HOOK = Path(__file__).resolve().with_name("process_hook.py")


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


def cpu_seconds() -> float:
    """This process's CPU-seconds, user and system, and those of its children waited for."""
    own, children = (resource.getrusage(who)
                     for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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
        controller = not hasattr(config, "workerinput")
        self.pth = start_census() if controller and config.getoption("census") else None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start = cpu_seconds()
        yield
        self.seconds[item.nodeid] = cpu_seconds() - start

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workeroutput"):  # a worker: the figures go to the controller
            self.config.workeroutput[KEY] = self.seconds

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.seconds.update(getattr(node, "workeroutput", {}).get(KEY, {}))

    def pytest_terminal_summary(self, terminalreporter):
        census = end_census(self.pth) if self.pth else None  # before the host's imports
        self.pth = None
        if hasattr(self.config, "workerinput") or not self.seconds:
            return
        repeats = self.config.getoption("host_repeats")
        host = torch_import_seconds(repeats) if repeats else None
        for line in table(self.seconds, census, host, repeats, cpu_name()):
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config):
        if self.pth:  # a run stopped before its summary
            end_census(self.pth)


def table(seconds: dict[str, float], census: Census | None, torch_import: float | None,
          repeats: int, cpu: str) -> list[str]:
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
    if torch_import is not None:
        lines.append(f"this host: import torch takes {torch_import:.2f} CPU-seconds after the "
                     f"tests (median of {repeats}); {cpu}")
    return lines


def pytest_addoption(parser):
    parser.addoption("--host-repeats", type=int, default=3,
                     help="imports of torch that time this host after the tests (0: none)")
    parser.addoption("--no-census", dest="census", action="store_false",
                     help="no census of the Python processes the run starts")


def pytest_configure(config):
    config.pluginmanager.register(Measure(config), "cpu_seconds_measure")


if __name__ == "__main__":
    sys.exit(pytest.main([*sys.argv[1:], "-p", "cpu_seconds"]))
