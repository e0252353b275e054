"""The folders of src/nmt are layers, and imports point down only.

    models    the three models                  imports nothing of nmt
    core      what several stages share         models
    training  the loop, the update, resume, ... core, models
    pipeline  declaration, params, recipes, ... core, models
    stages    one module (or package) a stage   pipeline, training, core, models; never
                                                another stage
    commands  nmt commands that are no stage    stages, pipeline, training, core, models
    cli.py    the `nmt` command                 everything

Every import counts, a function's own included (cli and the commands import late, for speed):
nmt.pipeline.declaration.imports parses them, the parser that derives each stage's code.
Each package's __init__ docstring says the same in words.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from nmt.pipeline.declaration import imports, module_name  # the one parser: stages' code too

SRC = REPO / "src"
LAYERS = ("models", "core", "training", "pipeline", "stages", "commands")
MAY_IMPORT = {  # a layer: the layers below it that it may import (itself: see `allowed`)
    "models": set(),
    "core": {"models"},
    "training": {"core", "models"},
    "pipeline": {"core", "models"},
    "stages": {"pipeline", "training", "core", "models"},
    "commands": {"stages", "pipeline", "training", "core", "models"},
}


def place(module: str) -> tuple[str, str]:
    """(layer, unit) of a dotted module name: nmt.stages.verify.measure -> (stages, verify);
    nmt.cli -> (cli, cli); nmt -> (nmt, nmt)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "nmt", "nmt"
    if parts[1] not in LAYERS:
        return parts[1], parts[1]
    return parts[1], parts[2] if len(parts) > 2 else ""


def allowed(importer: str, imported: str) -> bool:
    (layer, unit), (to_layer, to_unit) = place(importer), place(imported)
    if layer in ("cli", "__main__", "nmt"):
        return True
    if to_layer == "nmt":  # the package itself (its version): nothing below may need it
        return False
    if to_layer == layer:  # inside a layer: stages stay within their own stage
        return layer != "stages" or to_unit in (unit, "")
    return to_layer in MAY_IMPORT.get(layer, set())


def violations(src: Path) -> list[str]:
    return [f"{module} imports {m}" for module, imported in import_graph(src).items()
            for m in sorted(imported) if not allowed(module, m)]


def test_imports_point_down_the_layers():
    assert violations(SRC) == []


def test_every_module_lies_in_a_layer():
    loose = sorted(p.name for p in (SRC / "nmt").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py"]
    assert sorted(p.name for p in (SRC / "nmt").iterdir() if p.is_dir()
                  and p.name != "__pycache__") == sorted(LAYERS)
    for layer in LAYERS:  # each says what belongs there and what it may import
        doc = ast.get_docstring(ast.parse((SRC / "nmt" / layer / "__init__.py").read_text()))
        assert doc and "import" in doc, layer


@pytest.mark.parametrize("where, planted", [
    ("models/config.py", "from nmt.core.errors import NmtError"),  # models: nothing of nmt
    ("core/data.py", "from nmt.stages.vocab import build_vocab"),  # core: no stage
    ("core/files.py", "from nmt.pipeline import recipes"),  # core: not the pipeline
    ("core/loss.py", "from nmt.training import step"),  # core: not training
    ("training/loop.py", "from nmt.pipeline import recipes"),  # training: not the pipeline
    ("training/step.py", "from nmt.stages import bench"),  # training: no stage
    ("pipeline/params.py", "from nmt.stages import train"),  # pipeline: no stage
    ("stages/evaluate.py", "from nmt.stages.train import Paths"),  # a stage: no other stage
    ("stages/verify/measure.py", "from nmt.stages import bench"),  # (inside a package too)
    ("stages/report/speed.py", "from nmt.commands import translate"),  # a stage: no command
    ("core/decoding.py", "import nmt.cli"),  # nothing but the top imports cli
])
def test_a_planted_upward_import_is_found(tmp_path, where, planted):
    shutil.copytree(SRC / "nmt", tmp_path / "nmt", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "nmt" / where
    text = target.read_text()
    # Inside a function, as the late imports are: the walk finds those as well.
    target.write_text(text + f"\n\ndef planted():\n    {planted}\n")
    found = violations(tmp_path)
    assert len(found) >= 1 and all(where.split("/")[0] in f for f in found), found


def test_a_stage_may_import_its_own_package():
    assert allowed("nmt.stages.verify", "nmt.stages.verify.measure")
    assert allowed("nmt.stages.verify.equivalence", "nmt.stages.verify.checklist")
    assert allowed("nmt.stages.verify", "nmt.stages")  # the package's own docstring module
    assert not allowed("nmt.stages.verify.equivalence", "nmt.stages.train")


def test_the_readmes_layout_table_names_every_module():
    """README.md's Layout table: a row a folder, naming each of its modules (a package by its
    folder), so the table a newcomer reads is the tree that is there."""
    rows = {line.split("|")[1].strip(" `"): line for line in
            (REPO / "README.md").read_text().splitlines() if line.startswith("| `src/nmt/")}
    for layer in ("models", "core", "training", "pipeline", "stages", "commands"):
        folder = SRC / "nmt" / layer
        row = rows[f"src/nmt/{layer}/"]
        names = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()]
        missing = [n for n in sorted(names) if f"`{n}`" not in row]
        assert not missing, f"README's row for src/nmt/{layer}/ lacks {missing}"


def test_the_file_counts_docs_architecture_gives_are_the_guides_lists():
    """docs/architecture.md's count of the files a new model and a new corpus kind touch is
    the length of the guide's list of them (docs/adding-a-model.md's numbered steps; the table
    of files in docs/parameters-and-corpora.md's "Adding a corpus kind")."""
    text = (REPO / "docs" / "architecture.md").read_text()
    model_files = int(re.search(r"`prenorm`, took (\d+) files", text).group(1))
    kind_files = int(re.search(r"a `tsv` kind took (\d+) files", text).group(1))
    guide = (REPO / "docs" / "adding-a-model.md").read_text()
    steps = re.findall(r"^(\d+)\. ", guide.split("What reads the registry")[0], re.M)
    assert model_files == len(steps) == int(steps[-1]), steps
    corpora = (REPO / "docs" / "parameters-and-corpora.md").read_text()
    header = "\n\n| file | what |\n|---|---|\n"
    section = corpora.split("### Adding a corpus kind")[1].split(header)[1]
    rows = [line for line in section.split("\n\n")[0].splitlines() if line.startswith("| ")]
    assert kind_files == len(rows), rows


def import_graph(src: Path) -> dict[str, set[str]]:
    """Every module of src/nmt -> the modules of nmt it imports (under TYPE_CHECKING and inside
    functions too: a cycle there still ties the two files into one idea)."""
    graph = {}
    for path in sorted((src / "nmt").rglob("*.py")):
        module = module_name(path, src)
        graph[module] = {m for m in imports(path, module) if m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in graph:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_at_any_level():
    """No two modules import each other, however indirectly (issue 56: training.loop, meter
    and outputs imported each other under TYPE_CHECKING)."""
    assert cycles(import_graph(SRC)) == []


def test_a_planted_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


MAX_LINES = 400  # a module a reader holds whole (issue 56)


def test_no_module_is_longer_than_a_reader_holds():
    long = {module_name(p, SRC): n for p in sorted((SRC / "nmt").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
