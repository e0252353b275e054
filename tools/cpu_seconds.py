"""make test's own measurement: the CPU-seconds each test took, summed by module, and this
host's speed, printed at the end of the run.

    python tools/cpu_seconds.py -n 3        # pytest -n 3, and the table (make test runs this)

A test's CPU-seconds are its process's and those of the processes it started and waited for
(`nmt` stages, `dvc repro`, `snakemake`, trainings): on 2 cores, make test is bound by CPU, not
by waiting, so these, not the wall seconds of `--durations` (which grow with whatever runs
beside a test on the other workers), say where its minutes go and what a cut would save.
The same suite takes up to 1.6 times the CPU-seconds on one host from one day to the next
(docs/testing.md), so the table ends with this host's speed: the CPU-seconds of `import torch`
in a new process (median of 3), which most test processes pay before their work, measured
after the tests, on a quiet machine: the host at that moment (its speed moves within a run
too, so the figure does not scale a run's minutes; docs/testing.md).

Run as a script, it is pytest with one more plugin (this module, `-p cpu_seconds`): with
pytest-xdist, each worker measures its tests and hands the figures to the controller, which
prints them. No file is written.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

MODULES = 12  # the heaviest modules the table names
TESTS = 10  # and the heaviest tests
KEY = "cpu_seconds"  # in a worker's workeroutput


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
        if hasattr(self.config, "workerinput") or not self.seconds:
            return
        repeats = self.config.getoption("host_repeats")
        host = torch_import_seconds(repeats) if repeats else None
        for line in table(self.seconds, host, repeats, cpu_name()):
            terminalreporter.write_line(line)


def table(seconds: dict[str, float], torch_import: float | None, repeats: int,
          cpu: str) -> list[str]:
    """The lines make test ends with: the total, the heaviest modules and tests, the host."""
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
    if torch_import is not None:
        lines.append(f"this host: import torch takes {torch_import:.2f} CPU-seconds (median of "
                     f"{repeats}); {cpu}")
    return lines


def pytest_addoption(parser):
    parser.addoption("--host-repeats", type=int, default=3,
                     help="imports of torch that time this host after the tests (0: none)")


def pytest_configure(config):
    config.pluginmanager.register(Measure(config), "cpu_seconds_measure")


if __name__ == "__main__":
    sys.exit(pytest.main([*sys.argv[1:], "-p", "cpu_seconds"]))
