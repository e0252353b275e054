"""Run at the start of every Python process of a `make test` run: tools/cpu_seconds.py puts a
.pth file that executes this one into the virtual environment for the run's length. Each
process adds one line to the file $MAKE_TEST_PROCESSES when it starts, and one with the
CPU-seconds its `import torch` took (everything torch imports included) if it imports torch.
Their sum is the census at the end of make test's table: how many Python processes the tests
started and what torch's import cost them, on this host, during this run."""

import importlib.machinery
import os
import resource
import sys


def cpu() -> float:
    """This process's CPU-seconds so far, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def note(*fields) -> None:
    """One line of tab-separated fields, appended in one write (the processes share the file).
    Silent where the file is gone (a process that outlived the run): a process's output is
    what tests read, and this must add nothing to it."""
    try:
        fd = os.open(os.environ["MAKE_TEST_PROCESSES"], os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, ("\t".join(map(str, fields)) + "\n").encode())
    finally:
        os.close(fd)


class TimeTorch:
    """A finder of `torch` alone, first on sys.meta_path: the module it finds is torch's own
    (the path finder's), whose execution is timed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                start = cpu()
                run(module)
                note("torch", os.getpid(), f"{cpu() - start:.3f}")

            spec.loader.exec_module = exec_module
        return spec


# Once a process, even where two runs' .pth files both name this file.
if not any(type(finder).__name__ == "TimeTorch" for finder in sys.meta_path):
    note("start", os.getpid())
    sys.meta_path.insert(0, TimeTorch())
