"""A test's seconds as mutmut should count them: what the test's process pays when it runs alone.

mutmut times each test in its stats run and sums the times of a mutant's tests. That sum sets
the mutant's limits: a wall-clock limit and a CPU limit, each a multiple of the sum. But
mutmut times only the test's call. The setup of its fixtures is left out: a module's
evaluation, or the session's tokenized data (seconds). A module- or session-scoped fixture is
also set up only once, for the first test that asks for it. The process that runs a mutant's
tests, though, builds every fixture that they ask for. So a mutant whose tests only read a
fixture's results, and which no test kills, ran past a limit set for milliseconds. mutmut
then called it a timeout, not a survivor (collate's equivalent mutants, whose tests read
test_headline's evaluation).

In mutmut's stats run (MUTANT_UNDER_TEST=stats), these hooks add to each test's time the
setup seconds of every fixture that the test uses, whichever test set the fixture up. The sum
over a mutant's tests counts a shared fixture once per test, so it is an upper bound, and
the limits are generous. A mutant that hangs is still failed by conftest's watchdog.
tests/conftest.py imports these hooks; mutmut is pinned in requirements.txt, and
test_tools runs it for real on a fixture it must time.
"""

from __future__ import annotations

import os
import time

import pytest

# (fixture, index of its parameter) -> seconds its last setup took, the fixture's own body
# only (pytest sets up what it asks for before it)
setup_seconds: dict[tuple[str, int], float] = {}


def stats_run() -> bool:
    """Whether this pytest is mutmut's stats run, which times the tests for the limits."""
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        setup_seconds[fixturedef.argname, getattr(request, "param_index", 0)] = (
            time.perf_counter() - start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call" and stats_run():
        from mutmut.state import state

        indices = getattr(getattr(item, "callspec", None), "indices", {})
        state().duration_by_test[item.nodeid] += sum(
            setup_seconds.get((name, indices.get(name, 0)), 0.0) for name in item.fixturenames)
    return report
