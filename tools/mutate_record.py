"""make mutate's record, docs/mutation-record.json: mutmut's verdicts and make mutate's logs,
committed, so that a whole run spread over several machines goes on where the last one stopped.

mutmut keeps its verdicts in mutants/, which git ignores: a new clone starts from none, and on
2 cores a whole run takes longer than a session holds one machine. So after each mutmut run,
tools/mutate.py writes the profile's verdicts and its logs into the record, with the tree they
are of; a whole run in a clone whose mutants/ holds no verdicts yet starts from the record
when the record is of this tree, and afresh otherwise. The tree is what the verdicts depend on:
the source files, the tests the profile runs and the files they read, the profile's settings,
and the versions of Python, mutmut and torch. Commit the record after a run to carry it on.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "mutation-record.json"
# Files that no test of a profile reads: the exclusions' list (read by the summary, after
# mutmut), make mutate's own code, which runs mutmut and reads its results, and make test's
# measurement (a pytest plugin that only make test loads, and the hook it puts in the processes
# of make test's run). An edit of them changes no verdict, so it keeps the record (test_*.py
# files that a profile's selection does not name are left out of its tree too: they never run).
NOT_READ = ("tests/mutation_equivalent.yaml", "tools/mutate.py", "tools/mutate_record.py",
            "tools/mutmut_results.py", "tools/cpu_seconds.py", "tools/process_hook.py")


def tree_of(config: dict, root: Path = ROOT) -> str:
    """A hash (16 hex digits) of what a profile's verdicts depend on: the files under src/,
    those under tests/ that its tests can read, what its also_copy names, its settings
    (`config`: its [tool.mutmut]), and the versions of Python, mutmut and torch."""
    selection = config.get("pytest_add_cli_args_test_selection", [])
    # a file named whole (tests/test_x.py) or by some of its tests (tests/test_x.py::test_y)
    named = {Path(arg).name for arg in (a.split("::")[0] for a in selection)
             if arg.endswith(".py")}

    def read(path: Path) -> bool:
        return str(path.relative_to(root)) not in NOT_READ and not (
            path.parent == root / "tests" and named and path.name.startswith("test_")
            and path.name not in named)

    files = filter(read, [*files_under(root / "src"), *files_under(root / "tests"), *(
        file for name in config.get("also_copy", []) for file in files_under(root / name))])
    digest = hashlib.sha256(json.dumps(
        [config, sys.version_info[:2], version("mutmut"), version("torch")],
        sort_keys=True).encode())
    for file in files:
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def files_under(path: Path) -> list[Path]:
    """The file `path`, or the files under the folder `path` (no __pycache__), in order."""
    if path.is_file():
        return [path]
    return sorted(file for file in path.rglob("*")
                  if file.is_file() and "__pycache__" not in file.parts)


def verdicts(mutants: Path, paths: list[Path]) -> dict:
    """mutmut's results in `mutants` for each of `paths` that has them: per source file, each
    function's hash (mutmut keeps a function's verdicts while its hash holds) and the exit
    codes of its mutants, in their order (mutmut numbers a function's mutants from 1)."""
    found = {}
    for path in paths:
        meta = mutants / f"{path}.meta"
        if not meta.exists():
            continue
        held = json.loads(meta.read_text())
        codes: dict[str, list] = {}
        for (function, number), code in sorted(
                (number_of(name), code) for name, code in held["exit_code_by_key"].items()):
            codes.setdefault(function, []).append(code)
            if len(codes[function]) != number:
                sys.exit(f"mutate: {meta} numbers {function}'s mutants with gaps "
                         f"({function}__mutmut_{number}): not mutmut 3's results")
        found[str(path)] = {"hashes": held["hash_by_function_name"], "codes": codes}
    return found


def number_of(name: str) -> tuple[str, int]:
    """nmt.core.stats.x_f__mutmut_3 -> ("nmt.core.stats.x_f", 3)."""
    function, number = name.rsplit("__mutmut_", 1)
    return function, int(number)


def restore(entry: dict, mutants: Path, logs: tuple[str, ...]) -> int:
    """Write a profile's record (`entry`) into a `mutants` that holds no results: each source
    file's .meta, as mutmut writes it, and `logs`, make mutate's logs. Returns the verdicts."""
    for path, held in entry["verdicts"].items():
        meta = mutants / f"{path}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        codes = {f"{function}__mutmut_{n}": code for function, each in held["codes"].items()
                 for n, code in enumerate(each, start=1)}
        meta.write_text(json.dumps({
            "exit_code_by_key": codes, "hash_by_function_name": held["hashes"],
            "type_check_error_by_key": {}, "durations_by_key": {},
            "estimated_durations_by_key": {}}, indent=4))
    for log in logs:
        rows = entry["logs"].get(log, [])
        if rows:
            (mutants / log).write_text("".join("\t".join(row) + "\n" for row in rows))
    return sum(code is not None for held in entry["verdicts"].values()
               for each in held["codes"].values() for code in each)


def entry_of(mutants: Path, paths: list[Path], logs: tuple[str, ...], tree: str) -> dict:
    """A profile's record: its tree, the verdicts in `mutants` and the rows of its `logs`."""
    held = {log: rows(mutants / log) for log in logs if (mutants / log).exists()}
    return {"tree": tree, "logs": held, "verdicts": verdicts(mutants, paths)}


def rows(log: Path) -> list[list[str]]:
    """The tab-separated rows of one of make mutate's logs."""
    return [line.split("\t") for line in log.read_text().splitlines()]


def load() -> dict:
    """The record by profile ({} where there is none); one clear line if it is damaged."""
    if not RECORD.exists():
        return {}
    try:
        return json.loads(RECORD.read_text())
    except json.JSONDecodeError as error:
        sys.exit(f"mutate: {RECORD} is not JSON ({error}): restore it with git checkout, or "
                 f"delete it to start a whole run afresh")


def save(name: str, entry: dict) -> None:
    """Replace one profile's record, keeping the others'."""
    held = load()
    held[name] = entry
    RECORD.write_text(json.dumps(held, indent=1, sort_keys=True) + "\n")
