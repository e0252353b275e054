"""One command run many times without paying its imports each time (tests only).

The contract tests dry-run `snakemake -n` about 100 times; each new process spent about 1.4 s
of CPU importing Snakemake and its plugins before it read the Snakefile. A fork server
imports the command's main function once, then forks a child for each run: the child starts
from that state, as a new process would after the imports, writes its output to a file and
exits with the command's exit code. Every run is in the folder the server started in.
Nothing a run does reaches the next one (each is a child of the server, never the server
itself).

    with ForkServer("snakemake.cli:main", root, env) as snakemake:
        dry_run = snakemake.start(["-n", "--cores", "2"])
        ...                              # something else, while it runs
        output = snakemake.finish(dry_run)

Run as a program (`python forkserver.py MODULE:FUNCTION`), this file is the server: one JSON
request a line on stdin ({"args", "output"}), one JSON reply a line on stdout
({"returncode"}), in order.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Pending:
    """A run the server was asked for: what it runs and where it writes its output."""

    args: list[str]
    output: Path


class ForkServer:
    """The server process for one entry point (`module:function`), started with env."""

    def __init__(self, entry: str, cwd: Path, env: dict[str, str], timeout: float = 600):
        """cwd: where every run is, from the imports on (Snakemake records its run directory
        when it is imported)."""
        self.entry, self.timeout = entry, timeout
        self.folder = Path(tempfile.mkdtemp(prefix="forkserver-"))
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), entry],
                                        cwd=cwd, env=env, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        self.runs = 0

    def start(self, args: list[str]) -> Pending:
        """Ask for one run of the command with args; finish() waits for it. Runs are served
        one at a time, in the order asked."""
        self.runs += 1
        pending = Pending(args, self.folder / f"run-{self.runs}.log")
        request = {"args": args, "output": str(pending.output)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return pending

    def finish(self, pending: Pending, check: bool = True) -> str:
        """What the run printed (stdout and stderr); with check, it must have exited 0."""
        reply = self.process.stdout.readline()
        assert reply, f"the fork server for {self.entry} died"
        returncode = json.loads(reply)["returncode"]
        output = pending.output.read_text(errors="replace")
        assert returncode == 0 or not check, \
            f"{self.entry} {' '.join(pending.args)} failed ({returncode}):\n{output[-4000:]}"
        return output

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=self.timeout)
        for log in self.folder.iterdir():
            log.unlink()
        self.folder.rmdir()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_child(main, program: str, request: dict) -> None:
    """In the forked child: the command as its own process would run, then exit."""
    output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    sys.argv = [program, *request["args"]]
    code = 0
    try:
        main(request["args"])
    except SystemExit as stop:  # what the interpreter does with sys.exit(code)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the interpreter runs at exit, before flushing
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def serve(entry: str) -> None:
    if sys.path[0] == str(Path(__file__).resolve().parent):
        del sys.path[0]  # as the command's own process: the tests' folder is not on its path
    module, _, function = entry.partition(":")
    main = getattr(importlib.import_module(module), function)
    for line in sys.stdin:
        child = os.fork()
        if child == 0:
            run_child(main, module.partition(".")[0], json.loads(line))
        _, status = os.waitpid(child, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
