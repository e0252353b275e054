"""The code a stage runs, derived from the imports: nothing in workflow/stages.yaml lists it.

A stage's code is what its computation runs: the transitive closure of the nmt imports (at a
module's top or inside a function, relative ones included) from its module, nmt.stages.<name>
(a package: its __init__), less that module's command line (COMMAND_LINE: what nmt.cli calls to
run it as a command, and the helpers only those use), plus every package's __init__ on the way
(Python runs it on import) and what every stage computes from (SHARED: params.yaml read into
values). The command line around the computation (nmt.cli, its option groups, the params
checks, preflight, the orchestrator guard, the commands that are no stage) is no stage's code:
an edit of it can change what a command says or refuses, not what a stage writes, and so
re-runs nothing. Each is named by its file under src/nmt (core/files.py, __init__.py for nmt
itself, stages/verify/suite.py), a module of a stage package too: an edit of one re-runs the
stages that import it, not every stage of the package. The files are parsed, never imported, so
a change to any module re-runs exactly the stages whose computation reaches it. `imports` is
also the parser tests/test_layout.py holds the layers with. A corpus kind's code (`kind_code`)
is derived the same way, for the record the sources stage keeps of the kind in use
(nmt.stages.sources).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from types import ModuleType

from nmt.pipeline.corpora.kinds import HELPERS

# The registry finds the models' entries by module name (nmt.models.registry.discovered),
# which no parser sees: a stage whose computation reaches it runs every entry module and the
# modules its "module:attribute" strings name (the model's class, its parameter count, its
# renaming); a job of one model (per: model) runs that model's only (`model_code`), so an edit
# of one model's code re-runs that model's runs and no other's.
REGISTRY, ENTRIES = "nmt.models.registry", "nmt.models.entries"
# nmt verify finds an entry's check sets (its `checks`: names of modules of this package, or
# constants of the registry that hold one) by name too (nmt.stages.verify.suite.check_set): a
# verify job runs its model's check sets (`check_code`), and those of the twin check set build
# the reference as well.
CHECK_SETS, TWIN_CHECKS, REFERENCE = "nmt.stages.verify", "TWIN_CHECKS", "REFERENCE"
# The corpus kinds, found the same way by nmt.pipeline.corpora.kinds: no stage's code holds one
# (`kind_code`: the sources stage records the code of the kind data.corpus names).
CORPORA, KINDS_TABLE = "nmt.pipeline.corpora", "nmt.pipeline.corpora.kinds"
NAMED = re.compile(r"^(nmt(?:\.\w+)+):\w+$")  # "nmt.models.baseline:BaselineTransformer"
# What nmt.cli reads of a stage's module to run it as a command (nmt.cli: build_parser, run,
# said): its command line. It sits below COMMAND_LINE_STARTS with the helpers only it calls
# (train's train_argv), and is left out of the stage's computation, as are the imports only it
# uses (nmt.pipeline.commandline; the recipe resolution, for which params/<recipe>.yaml, the
# config stage's output, stands).
COMMAND_LINE = frozenset({"HELP", "MEMORY_FIX", "SETS_OWN_THREADS", "arguments", "command",
                          "interrupted_note"})
# The line every stage module starts its command line with: what follows it (COMMAND_LINE and
# the helpers they call) is the command's, what precedes it the computation.
COMMAND_LINE_STARTS = re.compile(r"^# ---- `nmt [a-z_]+`: ")
# What every stage computes from besides its own imports: nmt.cli reads params.yaml with it and
# hands the values to the stage.
SHARED = ("nmt.pipeline.params_file",)
# Modules that stages import yet that change no output, with why; the closure stops at them
# (tests/test_declaration.py holds each to importing nothing of nmt, so nothing is lost
# behind it).
NO_OUTPUT = {
    "nmt.core.errors": "the error types, their one-line messages and exit statuses, and when "
                       "a SIGTERM may end a stage: what a failure says, never what is written",
}

def module_name(path: Path, src: Path) -> str:
    """The dotted name of a file under src: src/nmt/core/files.py -> nmt.core.files,
    src/nmt/core/__init__.py -> nmt.core."""
    rel = Path(path).relative_to(src).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def source_root(module: ModuleType) -> Path:
    """The folder that holds nmt, where a loaded module of it was found."""
    path = Path(module.__file__).resolve()
    return package_and_src(path, module.__name__)[1]


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
    return imported([ast.parse(path.read_text())], module, *package_and_src(path, module))


def package_and_src(path: Path, module: str) -> tuple[bool, Path]:
    """Whether the file `module` is a package's __init__, and the folder that holds nmt."""
    is_package = Path(path).name == "__init__.py"
    return is_package, Path(path).parents[len(module.split(".")) - (0 if is_package else 1)]


def entry(module: str, src: Path) -> str:
    """How the declaration names a module: its file under nmt/ (core/files.py)."""
    return module_file(module, src).relative_to(src / "nmt").as_posix()


def closure(starts, src: Path, computations=frozenset(), skip=NO_OUTPUT,
            models: tuple[str, ...] | None = None, kinds: bool = False) -> list[str]:
    """The entries (as `entry` names them) that importing the modules starts runs: their
    imports' imports, and so on, with every enclosing package. Of the
    modules in `computations` (a stage's own), only what their computation imports
    (`computation_imports`); those in `skip` are left out. Reaching the registry runs the
    entries of `models` (None: every registered model) and what they name; reaching the table
    of corpus kinds loads every kind, which `kinds` asks to follow (a stage's code leaves them
    to the sources record: `kind_code`)."""
    todo, seen, found = list(starts), set(), set()

    def imports_of(path: Path, module: str):
        return (computation_imports(path, module) if module in computations
                else file_imports(path, module))

    while todo:
        module = todo.pop()
        if module in seen or module in skip or not module_file(module, src).is_file():
            continue  # no module of nmt (nothing to run), or one that changes no output
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages around it
        if module == REGISTRY:
            todo += [m for name in (registered(src) if models is None else models)
                     for m in entry_starts(name, src)]
        if module == KINDS_TABLE and kinds:
            todo += [f"{CORPORA}.{kind}" for kind in corpus_kinds(src)]
        found.add(entry(module, src))
        todo += imports_of(module_file(module, src), module)
    return sorted(found)


def registered(src: Path) -> tuple[str, ...]:
    """The models the registry finds: the modules of nmt.models.entries."""
    folder = module_file(ENTRIES, src).parent
    return tuple(sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"))


def entry_starts(name: str, src: Path) -> list[str]:
    """What model `name`'s entry runs: its module, and the modules its "module:attribute"
    strings name (imported when the registry is asked for the class or a function)."""
    module = f"{ENTRIES}.{name}"
    tree = ast.parse(module_file(module, src).read_text())
    named = [NAMED.match(n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [module, *sorted({m.group(1) for m in named if m})]


def corpus_kinds(src: Path) -> tuple[str, ...]:
    """The corpus kinds nmt.pipeline.corpora.kinds finds: the modules of nmt.pipeline.corpora
    but its helpers."""
    folder = module_file(CORPORA, src)
    return tuple(sorted(p.stem for p in folder.parent.glob("*.py")
                        if p.stem not in ("__init__", *HELPERS)))


def kind_code(name: str, src: Path) -> list[str]:
    """What corpus kind `name` runs: its module and all it imports. kinds finds the kind by
    name, which no parser sees, so no stage's derived code holds it: the sources stage records
    the sha256 of these files for the kind data.corpus names (nmt.stages.sources), and the
    stages that read a corpus through a kind depend on that record."""
    return closure([f"{CORPORA}.{name}"], src)


def model_code(name: str, src: Path) -> list[str]:
    """What a job of model `name` runs of the models beyond what its stage's computation
    reaches without one (`stage_code(..., models=())`): its entry and all it names."""
    return closure(entry_starts(name, src), src, models=())


def check_code(name: str, src: Path) -> list[str]:
    """What a verify job of model `name` runs beyond its stage's computation and the model's
    code: its entry's check sets (modules of CHECK_SETS), and, where one is the twin check set,
    the reference they build and compare it with (nmt.stages.verify.suite.run_checks)."""
    constants = registry_constants(src)
    checks = entry_checks(name, src, constants)
    built = (name, constants[REFERENCE]) if constants[TWIN_CHECKS] in checks else (name,)
    return closure([f"{CHECK_SETS}.{check}" for check in checks], src,
                   computations={CHECK_SETS}, models=built)  # its package: the stage's module


def registry_constants(src: Path) -> dict[str, str]:
    """The registry's module-level names bound to strings (TWIN_CHECKS: "equivalence")."""
    tree = ast.parse(module_file(REGISTRY, src).read_text())
    out = {}
    for node in (n for n in tree.body if isinstance(n, ast.Assign)):
        for target in node.targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            out |= {n.id: v.value for n, v in zip(names, values, strict=False)
                    if isinstance(n, ast.Name) and isinstance(v, ast.Constant)
                    and isinstance(v.value, str)}
    return out


def entry_checks(name: str, src: Path, constants: dict[str, str]) -> tuple[str, ...]:
    """The check sets model `name`'s entry names (its ENTRY's `checks=`: strings, or names of
    the registry's constants); refused where it is neither, as no parser could follow it."""
    path = module_file(f"{ENTRIES}.{name}", src)
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    given = [k.value for c in calls for k in c.keywords if k.arg == "checks"]
    if not given:
        return ()
    if not isinstance(given[0], (ast.Tuple, ast.List)):
        raise ValueError(f"{path}: checks= is no tuple of check set names")
    out = []
    for item in given[0].elts:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            out.append(item.value)
        elif isinstance(item, ast.Name) and item.id in constants:
            out.append(constants[item.id])
        else:
            raise ValueError(f"{path}: checks= holds {ast.unparse(item)}, neither a string nor "
                             "a constant of nmt/models/registry.py")
    return tuple(out)


def file_imports(path: Path, module: str) -> frozenset[str]:
    """imports(path, module), parsed once while the file stays as it is (every stage's
    closure reads the shared modules)."""
    st = path.stat()
    return _file_imports(str(path), module, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=1024)
def _file_imports(path: str, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    return frozenset(imports(Path(path), module))


def computation(path: Path) -> list[ast.stmt]:
    """A stage module's top-level statements above its command line (COMMAND_LINE_STARTS;
    a module without that line is computation whole), its imports included. Refused: two
    such lines, or a COMMAND_LINE name above it."""
    text = Path(path).read_text()
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if COMMAND_LINE_STARTS.match(line)]
    if len(lines) > 1:
        raise ValueError(f"{path}: {len(lines)} lines start a command line "
                         "(`# ---- `nmt <stage>`: ...`); a stage module has one")
    top = ast.parse(text).body
    above = [s for s in top if s.lineno < lines[0]] if lines else top
    misplaced = sorted(COMMAND_LINE & set().union(*map(bound, above)))
    if misplaced and lines:
        raise ValueError(f"{path}: {', '.join(misplaced)} above the command line's first line")
    return above


def bound(statement: ast.stmt) -> set[str]:
    """The names a top-level definition or assignment binds."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    targets = (statement.targets if isinstance(statement, ast.Assign) else
               [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else [])
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


def used(statement: ast.stmt) -> set[str]:
    """Every name a statement reads (in its body, defaults, decorators, annotations)."""
    return {n.id for n in ast.walk(statement)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def computation_imports(path: Path, module: str) -> set[str]:
    """The nmt modules a stage module's computation imports: the imports inside it, and the
    top-level ones whose names it uses. The command line's own are left out."""
    above = computation(path)
    kept = [s for s in above if not isinstance(s, (ast.Import, ast.ImportFrom))]
    names = set().union(*map(used, kept))
    aliases = [ast.ImportFrom(module=s.module, names=[a], level=s.level)
               if isinstance(s, ast.ImportFrom) else ast.Import(names=[a])
               for s in above if isinstance(s, (ast.Import, ast.ImportFrom))
               for a in s.names if (a.asname or a.name.split(".")[0]) in names]
    return imported(kept + aliases, module, *package_and_src(path, module))


def shared_code(src: Path) -> list[str]:
    """What every stage computes from: SHARED, with all it imports."""
    return closure(SHARED, src)


def stage_code(name: str, src: Path, models: tuple[str, ...] | None = None) -> list[str]:
    """What stage `name` computes with: its module (or package) first, then all its
    computation's imports reach, shared code included; of the models, those of `models`
    (None: every one; () for a stage that runs per model, whose jobs add `model_code`)."""
    module = f"nmt.stages.{name}"
    if not module_file(module, src).is_file():
        raise ValueError(f"stage {name}: no module src/nmt/stages/{name}.py nor package "
                         f"src/nmt/stages/{name}/")
    found = closure([module, *SHARED], src, computations={module}, models=models)
    own = entry(module, src)
    return [own] + [c for c in found if c != own]


def command_code(name: str, src: Path) -> list[str]:
    """What `nmt <name>` loads around the computation as well (nmt.cli, the stage module's
    command line and all they import): where tests/test_contract.py looks for a module a stage
    loaded that its code lacks."""
    return closure(["nmt.cli", f"nmt.stages.{name}"], src, skip=(), kinds=True)
