"""mutmut's results, read: each mutant of a source file with its verdict and, where a test
could still kill it, its line and the mutation (tools/mutate.py's summary lists those).

mutmut writes, per source file in mutants/, a .meta of exit codes by mutant name and the
mutated copy of the file, each function followed by its mutants; its diff of one mutant is
counted from the function's `def`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# mutmut's verdicts, by the exit code of the tests a mutant ran (mutmut.stats): 1 and 3 are a
# failed test, 0 all passed, 33 and 5 no test called the function; the rest timed out or died.
VERDICTS = {1: "killed", 3: "killed", 0: "survived", 33: "untested", 5: "untested",
            36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout"}
ALIVE = ("survived", "untested")  # what a test could kill, or an equivalent mutant explain


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's, e.g. nmt.core.stats.x_bootstrap__mutmut_3
    path: Path  # the source file, relative to ROOT
    verdict: str
    line: int = 0  # of the first line the mutation changes, in the source file (alive ones)
    before: str = ""  # the changed lines, stripped and joined (alive ones)
    after: str = ""

    @property
    def key(self) -> str:
        """mutmut's name of the function: x_name, or xǁClassǁname for a method."""
        return self.name.rsplit(".", 1)[1].split("__mutmut_")[0]

    @property
    def change(self) -> tuple[str, str, str]:
        """(function, before, after): how tests/mutation_equivalent.yaml names the mutation."""
        return self.function, self.before, self.after

    @property
    def function(self) -> str:
        """module.function or module.Class.method, as tests/mutation_equivalent.yaml names it."""
        module = self.name.rsplit(".", 1)[0]
        return f"{module}.{self.key[2:]}" if self.key.startswith("x_") else \
            f"{module}.{'.'.join(self.key.split('ǁ')[1:])}"




def mutants_of(path: Path, root: Path = ROOT, named: Container[str] = ()) -> list[Mutant]:
    """Every mutant of one source file with its verdict, from mutmut's results in
    root/mutants/; where a test could still kill it (ALIVE) or its name is in `named`, also its
    line and mutation, from mutmut's diff (mutmut reads both relative to the folder it ran
    in)."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    if not root.is_dir():  # a profile's folder, made by its first run (--summary before it)
        return []
    starts, mutants = function_starts(ROOT / path), []
    with contextlib.chdir(root):
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in sorted(data.exit_code_by_key.items()):
            verdict = VERDICTS.get(code, "not run" if code is None else "timeout")
            mutant = Mutant(name, path, verdict)
            if verdict in ALIVE or name in named:
                diff = get_diff_for_mutant(name, path=path).splitlines()[2:]  # no ---/+++
                offset, before, after = changed_lines(diff)
                mutant = dataclasses.replace(mutant, line=starts[mutant.key] + offset,
                                             before=before, after=after)
            mutants.append(mutant)
    return mutants


def function_starts(path: Path) -> dict[str, int]:
    """The line of each function's `def`, by mutmut's key (x_name, xǁClassǁname)."""
    tree = ast.parse(path.read_text())
    starts = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            starts[f"x_{node.name}"] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    starts[f"xǁ{node.name}ǁ{item.name}"] = item.lineno
    return starts


def changed_lines(diff: list[str]) -> tuple[int, str, str]:
    """A function's unified diff (its lines counted from the `def`, which mutmut's diff starts
    with) -> (the first changed line's distance from the `def`, the lines before, after)."""
    line, first = 0, None
    before, after = [], []
    for text in diff:
        if text.startswith("@@"):
            line = int(text.split()[1].split(",")[0][1:]) - 1
        elif text.startswith("-"):
            first = line if first is None else first
            before.append(text[1:].strip())
            line += 1
        elif text.startswith("+"):
            first = line if first is None else first
            after.append(text[1:].strip())
        else:
            line += 1
    return first or 0, " ".join(before), " ".join(after)




def module_of(path: Path) -> str:
    """src/nmt/core/stats.py -> nmt.core.stats (a package's __init__.py: the package)."""
    parts = path.relative_to("src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


