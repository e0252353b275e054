"""`make mutate`: mutation testing of the models, the numeric core, the stage code behind the
report and the training loop, and its summary.

    python tools/mutate.py                                   # every module of every profile
    python tools/mutate.py --module src/nmt/core/stats.py    # one module's mutants
    python tools/mutate.py --profile training                # one profile's whole run
    python tools/mutate.py --summary                         # the summary of what has run

Two profiles, each a mutmut run with its own modules and tests: "core" ([tool.mutmut] in
pyproject.toml: the models and the numeric core, with unit-level tests; mutmut runs it here,
results in mutants/) and "training" ([tool.mutate.training] over [tool.mutmut]: the training
loop and its resume state, with the tests that train in-process; mutmut runs it in
.mutate/training/, whose pyproject.toml this script writes and whose src/ and tests/ are links
to this checkout's). Apart, because mutmut runs every test that calls a mutant's function: in
one profile, each of the models' equivalent mutants would pay the trainings too.

mutmut (pinned in requirements.txt; configured in pyproject.toml's [tool.mutmut]) copies src/
to mutants/, writes every mutant of every function into the copy behind a switch, runs the
selected tests once to learn which tests call which function, then runs each mutant against
only those tests. Its results stay in mutants/ (ignored by git), so a second run tests only
what changed; after each run they are also written into docs/mutation-record.json
(tools/mutate_record.py), from which a whole run in a new clone goes on, where the record is
of the same tree. This script then writes docs/mutation.md: per module, the mutants killed,
survived, timed out and untested, the score killed / (mutants - equivalent), and every
survivor with its file:line and the mutation, less those that tests/mutation_equivalent.yaml
lists, each with its reason: equivalent (a mutation that cannot change what the code does),
GPU only (a change on a path that a CPU never takes, such as a tensor's device or dropout
inside the fused attention kernel) or DDP only (what only several processes tell apart); the
last two are listed in the summary, as no test here can kill them. docs/testing.md says how to
read it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import mutate_record as record
import yaml
from mutmut_results import ALIVE, Mutant, module_of, mutants_of

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "mutation.md"
EQUIVALENT = ROOT / "tests" / "mutation_equivalent.yaml"
COLUMNS = ("mutants", "killed", "survived", "untested", "timeout", "equivalent", "GPU only",
           "DDP only", "not run")
# an entry's kind -> its column: a mutation that cannot change behaviour; one on a path that
# only a GPU takes; one that only several processes tell apart (DistributedDataParallel)
KINDS = {"equivalent": "equivalent", "gpu": "GPU only", "ddp": "DDP only"}
APART = tuple(column for column in KINDS.values() if column != "equivalent")  # listed apart
SECTION = "## GPU or DDP only"
STALE = "## Exclusions no mutant needs"
WATCHED = "## Kills by the watchdog"
# In each profile's mutants/: the mutants tests/conftest.py's watchdog failed (its
# WATCHDOG_LOG: mutant, test, seconds a line), and each mutmut run's minutes (RUNS_LOG).
WATCHDOG_LOG = "mutmut-watchdog.log"
RUNS_LOG = "make-mutate.log"
LOGS = (RUNS_LOG, WATCHDOG_LOG)  # what the record (tools/mutate_record.py) carries beside them


@dataclass(frozen=True)
class Profile:
    name: str
    root: Path  # where mutmut runs and keeps its mutants/ (ROOT for the core profile)
    config: dict  # its [tool.mutmut] settings

    def paths(self) -> list[Path]:
        """The source files its only_mutate names and do_not_mutate does not, in order."""
        files = sorted(p.relative_to(ROOT) for p in (ROOT / "src").rglob("*.py"))
        return [f for f in files
                if any(fnmatch(str(f), pattern) for pattern in self.config["only_mutate"])
                and not any(fnmatch(str(f), pattern)
                            for pattern in self.config.get("do_not_mutate", []))]


def profiles() -> list[Profile]:
    """core ([tool.mutmut]), then each [tool.mutate.<name>]: its keys over [tool.mutmut]'s."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    core = tool["mutmut"]
    return [Profile("core", ROOT, core),
            *(Profile(name, ROOT / ".mutate" / name, {**core, **keys})
              for name, keys in tool.get("mutate", {}).items())]


def mutated_paths() -> list[Path]:
    """Every profile's source files, in order."""
    return [path for profile in profiles() for path in profile.paths()]


def workspace(profile: Profile) -> None:
    """A profile other than core gets a folder of its own for mutmut (which reads
    pyproject.toml and writes mutants/ in the folder it runs in): links to src/, tests/ and
    what also_copy names, and this checkout's pyproject.toml with the profile's [tool.mutmut]."""
    if profile.root == ROOT:
        return
    profile.root.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests", *profile.config.get("also_copy", [])):
        link = profile.root / name
        link.parent.mkdir(parents=True, exist_ok=True)  # a name inside a folder: tools/gpu/x.py
        if not link.is_symlink():
            link.symlink_to(ROOT / name)
    text = (ROOT / "pyproject.toml").read_text()
    (profile.root / "pyproject.toml").write_text(with_mutmut_table(text, profile.config))


def copy_folders(profile: Profile) -> None:
    """The folder in mutants/ of each name also_copy lists: mutmut copies a file inside a
    folder (tools/gpu/check_graphs.py) without making the folder, and fails."""
    for name in profile.config.get("also_copy", []):
        (profile.root / "mutants" / name).parent.mkdir(parents=True, exist_ok=True)


def with_mutmut_table(pyproject: str, config: dict) -> str:
    """pyproject.toml's text, its [tool.mutmut] table's keys replaced by `config` (strings,
    booleans and lists of strings, which JSON writes as TOML reads them)."""
    lines = pyproject.splitlines()
    start = lines.index("[tool.mutmut]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")),
               len(lines))
    table = ["[tool.mutmut]", *(f"{key} = {json.dumps(value)}" for key, value in config.items())]
    return "\n".join([*lines[:start], *table, "", *lines[end:]]) + "\n"


def forget_unmutated_copies(paths: list[Path], mutants: Path) -> list[Path]:
    """Remove the copy in `mutants` of each of `paths` that mutmut copied without mutating it
    (no .meta beside it): a module added to only_mutate since. mutmut copies every source file
    into mutants/, and mutates a copy again only when its source is newer than the copy, so
    without this such a module would stay unmutated, 0 mutants, until its source changed.
    Returns the paths removed; mutmut copies and mutates them afresh."""
    gone = []
    for path in paths:
        copy = mutants / path
        if copy.is_file() and not copy.with_name(copy.name + ".meta").exists():
            copy.unlink()
            gone.append(path)
    return gone


def profile_of(module: str) -> Profile:
    """The profile that mutates `module` (a source file's path)."""
    found = [profile for profile in profiles() if Path(module) in profile.paths()]
    if not found:
        sys.exit(f"mutate: {module} is not a module that pyproject.toml's [tool.mutmut] or "
                 f"[tool.mutate.*] only_mutate names: {', '.join(map(str, mutated_paths()))}")
    return found[0]


def run_mutmut(profile: Profile, module: str | None = None) -> float:
    """mutmut run, over every module of the profile or one; the minutes it took."""
    workspace(profile)
    tree = record.tree_of(profile.config)
    if module is None:
        resume(profile, tree)
    for path in forget_unmutated_copies(profile.paths(), profile.root / "mutants"):
        print(f"mutate: {path} was copied into mutants/ unmutated; mutmut mutates it now")
    names = []
    if module:
        names = names_to_run(Path(module), profile.root)
        if not names:
            print(f"mutate: every mutant of {module} is killed, or listed as equivalent")
            return 0.0
    copy_folders(profile)
    print(f"mutate: profile {profile.name}, in {profile.root.relative_to(ROOT)}",
          flush=True)
    start = time.monotonic()
    try:
        subprocess.run([sys.executable, "-m", "mutmut", "run", *names], cwd=profile.root,
                       check=True)
    finally:  # an interrupted run's minutes count too: the next one goes on from there
        minutes = (time.monotonic() - start) / 60
        mutants = profile.root / "mutants"
        mutants.mkdir(parents=True, exist_ok=True)
        with open(mutants / RUNS_LOG, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M')}\t{module or 'all'}\t{minutes:.1f}"
                      f"\t{tree}\t{cpu()}\n")
        record.save(profile.name, record.entry_of(mutants, profile.paths(), LOGS, tree))
    return minutes


def resume(profile: Profile, tree: str) -> None:
    """A whole run whose mutants/ holds no verdicts yet (a new clone) starts from those of
    docs/mutation-record.json, where they are of this tree (tools/mutate_record.py)."""
    mutants = profile.root / "mutants"
    if any((mutants / f"{path}.meta").exists() for path in profile.paths()):
        return
    entry, held = record.load().get(profile.name), os.path.relpath(record.RECORD, ROOT)
    if entry is None:
        return
    if entry["tree"] != tree:
        print(f"mutate: {held} holds verdicts of profile "
              f"{profile.name} for another tree ({entry['tree']}; this one is {tree}): src/, "
              f"the tests or the settings changed since, so this run starts afresh")
        return
    count = record.restore(entry, mutants, LOGS)
    print(f"mutate: profile {profile.name} goes on from the {count} verdicts of {held} "
          f"(tree {tree})")


def cpu() -> str:
    """This machine's CPU and its cores, for the runs' log: minutes differ between CPUs."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
             if line.startswith("model name")] if info.exists() else []
    return f"{names[0] if names else platform.processor() or 'a CPU'}, {os.cpu_count()} cores"


def logged(name: str) -> list[list[str]]:
    """The tab-separated rows of one log (WATCHDOG_LOG, RUNS_LOG) in every profile's mutants/."""
    logs = [profile.root / "mutants" / name for profile in profiles()]
    return [row for log in logs if log.exists() for row in record.rows(log)]


def watchdog_kills() -> dict[str, str]:
    """Each mutant the tests' watchdog failed (tests/conftest.py: a test past 5 times its
    duration and 30 s): mutant -> what it said."""
    return {mutant: f"{test} ran past {seconds} s"
            for mutant, test, seconds in logged(WATCHDOG_LOG)}


def runs_minutes() -> tuple[int, float, list[str]]:
    """How many mutmut runs every profile's mutants/ holds results of, their minutes, and the
    trees and CPUs they ran ("tree <hash> on <CPU>", each once)."""
    rows = logged(RUNS_LOG)
    where = sorted({f"tree {row[3]} on {row[4]}" for row in rows if len(row) == 5})
    return len(rows), sum(float(row[2]) for row in rows), where


def names_to_run(path: Path, root: Path) -> list[str]:
    """mutmut's names of the mutants of `path` to run (in root/mutants/): each not killed yet
    (not run, survived, untested, timed out) and not listed in tests/mutation_equivalent.yaml,
    so that a module's run stopped half-way goes on where it stopped and a survivor meets the
    tests written since (mutmut runs every mutant named, results or not, and without names
    skips the survivors); the module's every mutant where mutmut has not mutated this version
    of it (no results, or the source is newer). A whole run from a fresh clone runs them all."""
    copy = root / "mutants" / path
    meta = copy.with_name(copy.name + ".meta")
    if not meta.exists() or (ROOT / path).stat().st_mtime > copy.stat().st_mtime:
        return [module_of(path) + ".*"]
    known = explained()
    return [m.name for m in mutants_of(path, root)
            if m.verdict != "killed" and m.change not in known]


def explained() -> dict[tuple[str, str, str], tuple[str, str]]:
    """(function, before, after) -> (its column: equivalent, GPU only or DDP only; why)."""
    entries = yaml.safe_load(EQUIVALENT.read_text()) or []
    return {(e["function"], e["before"], e["after"]): (KINDS[e.get("kind", "equivalent")],
                                                       e["why"]) for e in entries}


def summary(minutes: float | None) -> str:
    known, watched = explained(), watchdog_kills()
    written = SUMMARY.read_text().splitlines() if SUMMARY.exists() else []  # for earlier()
    rows, survivors, apart, hung = [], [], [], []
    totals: Counter = Counter()
    ran, used = set(), set()  # the modules this checkout's mutants/ ran; the entries they used
    pending = set()  # the functions with a mutant not run yet (a run stopped on its way)
    for path, root in ((path, profile.root) for profile in profiles()
                       for path in profile.paths()):
        mutants = mutants_of(path, root, watched)
        status = {m: known.get(m.change, (m.verdict, ""))[0]
                  if m.verdict in ALIVE else m.verdict for m in mutants}
        # an entry is used by a mutant still alive, or by one the watchdog killed (only slow,
        # as the entry says, on this machine: a faster one may let it survive)
        used |= {m.change for m in mutants if m.verdict in ALIVE or m.name in watched}
        if any(m.verdict != "not run" for m in mutants):
            ran.add(module_of(path))
        pending |= {m.function for m in mutants if m.verdict == "not run"}
        count = Counter(status.values()) + Counter(mutants=len(mutants))
        found = [survivor_line(m) for m in mutants if status[m] in ALIVE]
        unreachable = [survivor_line(m, f"{status[m]}: " + known[m.change][1])
                       for m in mutants if status[m] in APART]
        slow = [survivor_line(m, watched[m.name] + (
                    f"; listed as {known[m.change][0]}: {known[m.change][1]}"
                    if m.change in known else ""))
                for m in mutants if m.name in watched and m.verdict == "killed"]
        if count["not run"] == len(mutants):  # none ran here (none: no mutants/ at all)
            count, found, unreachable, slow = earlier(path, written) or (
                count, found, unreachable, slow)
        survivors += found
        apart += unreachable
        hung += slow
        totals.update(count)
        rows.append(table_row(str(path), count))
    lines = ["# Mutation testing: the summary", "",
             "Written by `make mutate` (tools/mutate.py; docs/testing.md says how to read it). "
             "Score: killed / (mutants - equivalent - GPU only - DDP only - not run); a timeout "
             "counts as not killed. "
             "A module that this checkout's mutants/ has not run keeps the row and survivors "
             "that this file held before.", ""]
    if minutes is not None:
        runs, total, where = runs_minutes()
        lines += [f"The run that wrote it took {minutes:.1f} minutes; the {runs} mutmut runs "
                  f"whose results mutants/ holds (carried between clones by "
                  f"docs/mutation-record.json), {total:.0f} minutes in all: "
                  f"{'; '.join(where) or 'where, not logged'}.", ""]
    lines += ["| module | " + " | ".join(COLUMNS) + " | score |",
              "|---|" + "---|" * (len(COLUMNS) + 1), *rows, table_row("**all**", totals), "",
              f"## Survivors ({len(survivors)})", "",
              "Each is a change to the code that no test notices (untested: no test of "
              "[tool.mutmut]'s selection calls its function): a test to write, or an "
              "equivalent mutation to list in tests/mutation_equivalent.yaml with its reason.",
              "", *survivors, "", f"{SECTION} ({len(apart)})", "",
              "Changes on a path that a CPU never takes (kind gpu in "
              "tests/mutation_equivalent.yaml), or that only several processes tell apart "
              "(kind ddp: DistributedDataParallel's ranks, which tests/test_distributed.py "
              "runs as processes that no mutant reaches). No test here can kill them.", "",
              *apart, "", f"{WATCHED} ({len(hung)})", "",
              "Kills by tests/conftest.py's watchdog: a test of the mutant ran past 5 times its "
              "own duration and 30 s (a loop that never ends). A mutant that is only slow, not "
              "wrong, would be one: each is to check by hand.", "", *hung]
    stale = unneeded(known, used, ran, pending)
    if stale:
        lines += ["", f"{STALE} ({len(stale)})", "",
                  "Entries of tests/mutation_equivalent.yaml that no surviving mutant of a "
                  "module this run tested matches: a test kills the mutant now, or the code no "
                  "longer makes it. Delete them.", "",
                  *(f"- {function}: `{before}` -> `{after}`" for function, before, after in stale)]
    return "\n".join(lines) + "\n"


def unneeded(known: dict, used: set, ran: set[str],
             pending: set[str] = frozenset()) -> list[tuple[str, str, str]]:
    """The entries (function, before, after) of tests/mutation_equivalent.yaml that no alive
    mutant matched (`used`), among the modules this run tested (`ran`), less those of a
    function with mutants not run yet (`pending`: a stopped run has no verdict on them):
    each one's mutant is killed now, or no longer made."""
    return [key for key in known if key not in used and key[0] not in pending
            and any(key[0].startswith(module + ".") for module in ran)]


def survivor_line(m: Mutant, why: str = "") -> str:
    return (f"- `{m.path}:{m.line}` ({m.function}{', untested' * (m.verdict == 'untested')}): "
            f"`{m.before}` -> `{m.after}`" + (f": {why}" if why else ""))


def earlier(path: Path, text: list[str]) -> tuple[Counter, list[str], list[str], list[str]] | None:
    """A module's row, survivor, GPU-or-DDP-only and watchdog lines as docs/mutation.md (its
    lines: text) holds them: an earlier run's, kept while mutants/ here has not run the module (a
    fresh clone; MODULE= another)."""
    row = next((line for line in text if line.startswith(f"| {path} |")), None)
    if row is None:
        return None
    header = next(line for line in text if line.startswith("| module |"))

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip("|").split("|")]

    # by the header's names: a summary written before a column was added lacks it (0)
    held = dict(zip(cells(header), cells(row), strict=True))
    section, watched = (next((i for i, line in enumerate(text) if line.startswith(heading)),
                             len(text)) for heading in (SECTION, WATCHED))
    lines = [(i, line) for i, line in enumerate(text) if line.startswith(f"- `{path}:")]
    return (Counter({column: int(held.get(column, 0)) for column in COLUMNS}),
            [line for i, line in lines if i < section],
            [line for i, line in lines if section < i < watched],
            [line for i, line in lines if i > watched])


def table_row(module: str, count: Counter) -> str:
    """One row of the table; the score counts the mutants that ran (not run: a module that
    `make mutate MODULE=...` has not reached yet)."""
    scored = count["mutants"] - count["not run"] - sum(count[c] for c in KINDS.values())
    score = f"{100 * count['killed'] / scored:.1f} %" if scored else "-"
    return f"| {module} | " + " | ".join(str(count[c]) for c in COLUMNS) + f" | {score} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", help="one source file, e.g. src/nmt/core/stats.py")
    parser.add_argument("--profile", choices=[p.name for p in profiles()],
                        help="one profile's whole run (a whole run spread over sessions)")
    parser.add_argument("--summary", action="store_true", help="only write the summary")
    args = parser.parse_args()
    os.chdir(ROOT)  # mutmut reads pyproject.toml and writes mutants/ in the current folder
    if args.summary:
        minutes = None
    elif args.module:
        minutes = run_mutmut(profile_of(args.module), args.module)
    else:
        try:
            minutes = sum(run_mutmut(profile) for profile in profiles()
                          if args.profile in (None, profile.name))
        except subprocess.CalledProcessError as stopped:  # make mutate-stop, or mutmut failed
            code = stopped.returncode
            how = signal.Signals(-code).name if code < 0 else f"exit {code}"
            print(flush=True)  # off the row of mutmut's counter
            sys.exit(f"mutate: mutmut run ended by {how}; its verdicts so far are in "
                     f"{record.RECORD.relative_to(ROOT)}, where the next run goes on")
    SUMMARY.write_text(summary(minutes))
    text = SUMMARY.read_text()
    print(text.split("## Survivors")[0].rstrip())
    for heading in (line for line in text.splitlines() if line.startswith(STALE)):
        print(f"\nmutate: {EQUIVALENT.relative_to(ROOT)} holds entries no surviving mutant "
              f"needs, listed in {SUMMARY.relative_to(ROOT)} under '{heading[3:]}'")
    print(f"\nmutate: the summary and the survivors are in {SUMMARY.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
