"""`make mutate-stop`: stop this checkout's running `make mutate` so that its record keeps only
verdicts that the tests gave, and no process of the run is left.

    python tools/mutate_stop.py            # the run of whichever profile is running
    python tools/mutate_stop.py --wait 60  # seconds to wait for each process to end (120)

A whole run takes longer than a session holds a machine, so it is stopped, and goes on in a
new clone from docs/mutation-record.json (tools/mutate_record.py). How it is stopped can
decide verdicts: a SIGINT to the process group reaches the tests, whose handlers (StopSignals)
or their absence make it a pass or a failure; mutmut's fork server ignores SIGINT and answers
SIGTERM by killing the mutants it runs and exiting 0. So this script:

1. takes a snapshot of mutmut's verdicts (each source file's mutants/...py.meta, which mutmut
   writes again after each mutant);
2. sends SIGTERM to `mutmut run` alone (its default action ends it, so it writes no verdict
   after), then to the processes it started (the fork server SIGKILLs the mutants it runs),
   and SIGKILLs any still there after --wait seconds;
3. waits for tools/mutate.py, which logs the run's minutes and tree when mutmut ends;
4. sets back to not run each verdict that is not in the snapshot (given between the snapshot
   and the stop: kept out, as one the stop may have given), puts back from the snapshot a .meta
   that the stop cut short mid-write, and writes the record from mutants/ again.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import mutate
import mutate_record as record
import psutil


def running_run() -> tuple[psutil.Process, psutil.Process, mutate.Profile]:
    """This checkout's tools/mutate.py, the `mutmut run` it started and that run's profile;
    one clear line where none runs."""
    script = mutate.ROOT / "tools" / "mutate.py"
    for process in psutil.process_iter(["cmdline", "cwd"]):
        cmdline, cwd = process.info["cmdline"] or [], process.info["cwd"]
        if cwd is None or len(cmdline) < 2 or (Path(cwd) / cmdline[1]).resolve() != script:
            continue
        with_cwd = {p.root.resolve(): p for p in mutate.profiles()}
        for child in process.children():
            try:
                if child.cmdline()[1:4] == ["-m", "mutmut", "run"]:
                    return process, child, with_cwd[Path(child.cwd()).resolve()]
            except (psutil.Error, KeyError):
                continue
    sys.exit(f"mutate-stop: no make mutate of {mutate.ROOT} is running mutmut (nothing stopped)")


def read_meta(meta: Path, tries: int = 50) -> dict | None:
    """A .meta's contents; None where it stays cut short (mutmut rewrites it in place, so a
    read can meet a write: read again)."""
    for _ in range(tries):
        try:
            return json.loads(meta.read_text())
        except json.JSONDecodeError:
            time.sleep(0.02)
    return None


def snapshot_of(mutants: Path, paths: list[Path]) -> dict[Path, dict]:
    """Each source file's .meta in `mutants`, whole."""
    metas = [mutants / f"{path}.meta" for path in paths]
    held = {meta: read_meta(meta) for meta in metas if meta.exists()}
    torn = [str(meta) for meta, value in held.items() if value is None]
    if torn:
        sys.exit(f"mutate-stop: cannot read {', '.join(torn)} (nothing stopped)")
    return held


def given_after(before: dict, now: dict) -> list[str]:
    """The mutants that `now` (a .meta's exit codes by mutant) holds a verdict of and `before`
    (the same, at the snapshot) holds none of or another."""
    return [name for name, code in now.items() if code is not None and before.get(name) != code]


def set_back(snapshot: dict[Path, dict]) -> list[str]:
    """Each .meta as the snapshot holds it and no further: a verdict given since is not run
    again; one cut short by the stop is the snapshot's. Returns the mutants set back."""
    late = []
    for meta, before in snapshot.items():
        now = read_meta(meta, tries=1) or before
        names = given_after(before["exit_code_by_key"], now["exit_code_by_key"])
        for name in names:
            now["exit_code_by_key"][name] = None
        if names or now is before:
            meta.write_text(json.dumps(now, indent=4))
        late += names
    return late


def alive(process: psutil.Process) -> bool:
    """Running, and not a zombie that its parent has yet to reap."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ended(processes: list[psutil.Process], wait: float) -> bool:
    """Whether each of `processes` ends within `wait` seconds (a zombie has ended: it is not
    always this script's child to reap, so psutil's wait would wait on it to the end)."""
    deadline = time.monotonic() + wait
    while any(alive(process) for process in processes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop(wait: float) -> None:
    script, runner, profile = running_run()
    helpers = runner.children(recursive=True)
    mutants = profile.root / "mutants"
    snapshot = snapshot_of(mutants, profile.paths())
    runner.send_signal(signal.SIGTERM)
    ended([runner], wait)
    for helper in helpers:  # the fork server first: it SIGKILLs the mutants it runs
        if alive(helper):
            helper.send_signal(signal.SIGTERM)
            ended([helper], wait)
    left = [process for process in [runner, *helpers] if alive(process)]
    for process in left:
        process.kill()
    if not ended([script], wait):
        sys.exit(f"mutate-stop: tools/mutate.py (pid {script.pid}) is still running {wait:.0f} s "
                 f"after mutmut's stop: the record is not written again")
    late = set_back(snapshot)
    tree = record.rows(mutants / mutate.RUNS_LOG)[-1][3]  # the tree of the run just stopped
    entry = record.entry_of(mutants, profile.paths(), mutate.LOGS, tree)
    record.save(profile.name, entry)
    codes = [code for held in entry["verdicts"].values()
             for each in held["codes"].values() for code in each]
    print(f"mutate-stop: profile {profile.name} stopped at "
          f"{sum(code is not None for code in codes):,} of {len(codes):,} verdicts (tree {tree});"
          f" {len(late)} given after the snapshot set back to not run"
          f"{': ' + ', '.join(late) if late else ''}; {len(left)} process(es) killed; commit "
          f"{record.RECORD.relative_to(mutate.ROOT)} to go on from it in a new clone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to wait for each process to end (120)")
    stop(parser.parse_args().wait)


if __name__ == "__main__":
    main()
