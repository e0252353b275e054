"""The code a stage runs, derived from the imports: nothing in workflow/stages.yaml lists it.

A stage's code is the transitive closure of the nmt imports (at a module's top or inside a
function, relative ones included) from its module, nmt.stages.<name> (a package: all its
files), plus every package's __init__ on the way (Python runs it on import) and the code every
command runs (`shared_code`). Each is named as the declaration once named it by hand: a module
by its file under src/nmt (core/files.py, __init__.py for nmt itself), a unit by its folder.
The files are parsed, never imported, so a change to any module re-runs exactly the stages
whose imports reach it. `imports` is also the parser tests/test_layout.py holds the layers
with.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

# Packages that are one unit: one entry by their folder (DVC hashes the folder; Snakemake
# takes its .py files), and a change to any file of it re-runs every stage that imports any.
# Besides these, every stage package (nmt.stages.verify) is one.
UNITS = ("models",)
# Modules of a unit that run none of its other code: torch-free, importing nothing of it but
# each other (the models' registry and config, which core and the pipeline read for the models'
# names and facts). A stage that imports only these runs their files and their package's
# __init__ (Python runs it first; it imports only these at its top), not the unit; one that
# imports the package itself (nmt.models.build_model) runs the whole unit.
LIGHT = frozenset({"nmt.models.config", "nmt.models.registry"})
# Imported by nmt.cli only when NMT_TRACK_READS records what a command reads (a debug feature
# the contract tests use): the recording, no stage's code (tracking.recorded leaves it out too).
NOT_RUN = frozenset({"nmt.pipeline.tracking"})
# What every command runs of nmt.cli: its top-level statements and these functions (main, and
# run, which main calls for every command), whose imports are every command's (a function's
# body: all of it, though an `if` may skip one; an import not every stage needs belongs in a
# function of its own). The imports in cli's other functions are some commands' only, and so
# not every stage's code; the stage's own module cli imports by a computed name (importlib),
# which no parser sees: that module is where `stage_code` starts.
CLI_RUNS = ("main", "run")


def module_name(path: Path, src: Path) -> str:
    """The dotted name of a file under src: src/nmt/core/files.py -> nmt.core.files,
    src/nmt/core/__init__.py -> nmt.core."""
    rel = Path(path).relative_to(src).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def module_file(module: str, src: Path) -> Path:
    """The file of a dotted name: a package's __init__.py, else the module's .py."""
    path = Path(src, *module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported(nodes, module: str, is_package: bool, src: Path) -> set[str]:
    """Every nmt module the syntax trees import (a function's own imports too): `import a.b`
    gives a.b; `from a import b` gives a, and a.b where that is a module; `from . import x`
    counts from the module's package."""
    out = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in (n for tree in nodes for n in ast.walk(tree)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            for a in node.names:
                name = f"{base}.{a.name}"
                path = Path(src, *name.split("."))
                if path.with_suffix(".py").is_file() or path.is_dir():
                    out.add(name)
    return {m for m in out if m == "nmt" or m.startswith("nmt.")}


def imports(path: Path, module: str) -> set[str]:
    """Every nmt module the file `module` (its dotted name) imports, at its top or inside a
    function. The file is parsed, not imported."""
    path = Path(path)
    is_package = path.name == "__init__.py"
    src = path.parents[len(module.split(".")) - (0 if is_package else 1)]
    return imported([ast.parse(path.read_text())], module, is_package, src)


def units(src: Path) -> list[str]:
    """The packages that are one entry (UNITS and every stage package), as folders of nmt."""
    stages = sorted(p.parent.name for p in (src / "nmt" / "stages").glob("*/__init__.py"))
    return list(UNITS) + [f"stages/{s}" for s in stages]


def entry(module: str, src: Path, unit_list: list[str]) -> str:
    """How the declaration names a module: its unit's folder, else its file under nmt/."""
    rel = module_file(module, src).relative_to(src / "nmt").as_posix()
    return next((u for u in unit_list if rel.startswith(u + "/")), rel)


def closure(starts, src: Path) -> list[str]:
    """The entries (as `entry` names them) that importing the modules starts runs: their
    imports' imports, and so on, with every enclosing package; a unit's every file."""
    unit_list, todo, seen, found = units(src), list(starts), set(), set()
    while todo:
        module = todo.pop()
        if module in seen or not module_file(module, src).is_file():
            continue  # a name that is no module of nmt: nothing to run
        seen.add(module)
        parts = module.split(".")
        around = [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages around it
        if module in LIGHT:  # its file, and its package's __init__ as a file: not the unit
            package = around.pop()
            found |= {entry(module, src, []), entry(package, src, [])}
            todo += around + [*file_imports(module_file(module, src), module),
                              *file_imports(module_file(package, src), package)]
            continue
        todo += around
        name = entry(module, src, unit_list)
        if name in found:  # a unit, whose files are all read already
            continue
        files = (sorted((src / "nmt" / name).rglob("*.py")) if name in unit_list
                 else [module_file(module, src)])
        found.add(name)
        for f in files:
            todo += [module_name(f, src), *file_imports(f, module_name(f, src))]
    whole = [name for name in found if name in unit_list]  # their light files are in them
    return sorted(name for name in found if not any(name.startswith(u + "/") for u in whole))


def file_imports(path: Path, module: str) -> frozenset[str]:
    """imports(path, module), parsed once while the file stays as it is (every stage's
    closure reads the shared modules)."""
    st = path.stat()
    return _file_imports(str(path), module, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _file_imports(path: str, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    return frozenset(imports(Path(path), module))


def shared_code(src: Path) -> list[str]:
    """What every `nmt` command runs: nmt/cli.py, and what its top-level statements and its
    CLI_RUNS import (less NOT_RUN), with all they import."""
    tree = ast.parse((src / "nmt" / "cli.py").read_text())
    nodes = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    nodes += [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in CLI_RUNS]
    starts = imported(nodes, "nmt.cli", False, src) - NOT_RUN
    return sorted({"cli.py", *closure(starts, src)})


def stage_code(name: str, src: Path) -> list[str]:
    """What stage `name` runs beyond nmt.cli: its module (or package) first, then all its
    imports reach, shared code included."""
    module = f"nmt.stages.{name}"
    if not module_file(module, src).is_file():
        raise ValueError(f"stage {name}: no module src/nmt/stages/{name}.py nor package "
                         f"src/nmt/stages/{name}/")
    found = closure([module], src)
    own = entry(module, src, units(src))
    return [own] + [c for c in found if c != own]
