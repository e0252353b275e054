"""What an edit of each module re-runs: the table docs/pipeline.md holds between two marker
lines, rendered (`nmt stages --write`) from the stages' derived code, so it cannot drift from
what DVC and Snakemake are given (tests/test_contract.py edits one module of every row of it
in a completed tiny pipeline and compares both tools' plans with it).

Modules are grouped by the stages whose code holds them; a row names each job set as the
stage runs it (`train` of every run, `vocab` of every recipe), since the table holds for any
params.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from nmt.pipeline.code import corpus_kinds, kind_code
from nmt.pipeline.declaration.declared import (
    CODE,
    DECLARATION,
    DEFAULT_MODELS,
    Stage,
    kind_readers,
    load,
)

TABLE = Path("docs/pipeline.md")
BEGIN = "<!-- reruns: rendered from the derived code by `nmt stages --write`; do not edit -->"
END = "<!-- /reruns -->"


class Jobs(NamedTuple):
    """One job set of a row: a stage; the models whose jobs re-run (None: every job of it);
    the corpus kinds in whose pipelines they re-run (None: whatever data.corpus is)."""

    stage: str
    models: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None


def rerun_by(stages: dict[str, Stage], src: Path) -> dict[str, tuple[Jobs, ...]]:
    """Every module file under src/nmt (as the code lists name it: core/files.py) -> the jobs
    an edit of it re-runs, in the declaration's order: every job of a stage whose code holds
    the file; of a per-model stage, the jobs of the models whose code holds it; of a stage that
    runs the corpus kind in use (through the sources record: declared.kind_readers), where
    data.corpus is a kind whose code holds it."""
    readers = kind_readers(stages)
    kinds = corpus_kinds(src)
    kind_modules = {kind: set(kind_code(kind, src)) for kind in kinds}
    out = {}
    for path in sorted((src / "nmt").rglob("*.py")):
        rel = path.relative_to(src / "nmt").as_posix()
        in_kinds = tuple(k for k in kinds if rel in kind_modules[k])
        found: list[Jobs] = []
        for name, s in stages.items():
            models = tuple(m for m, code in s.model_code.items() if rel in code)
            if rel in s.code or models and set(models) == set(s.model_code):
                found.append(Jobs(name))
            elif models:
                found.append(Jobs(name, models))
            elif name in readers and in_kinds:
                found.append(Jobs(name, kinds=None if in_kinds == kinds else in_kinds))
        out[rel] = tuple(found)
    return out


def rerun_table(path: Path = DECLARATION) -> str:
    """The markdown table, one row a set of jobs: the modules whose edit re-runs them."""
    stages = load(path)
    src = Path(path).parent.parent / Path(CODE).parent
    rows: dict[tuple[Jobs, ...], list[str]] = {}
    for module, found in rerun_by(stages, src).items():
        rows.setdefault(found, []).append(module)
    lines = ["| an edit of | re-runs |", "|---|---|"]
    for found, modules in sorted(rows.items(), key=lambda row: (len(row[0]), str(row[0]))):
        reruns = ", ".join(jobs(stages[j.stage], j.models, j.kinds) for j in found)
        lines.append(f"| {', '.join(f'`{m}`' for m in modules)} | {reruns or '**nothing**'} |")
    return "\n".join(lines) + "\n"


def jobs(stage: Stage, models: tuple[str, ...] | None = None,
         kinds: tuple[str, ...] | None = None) -> str:
    """A stage's jobs as a row names them: bench; vocab (every recipe); train (every run);
    train (the runs of scratch); verify (every recipe/model); verify (the jobs of
    scratch); download (where data.corpus is multi30k)."""
    if kinds is not None:
        return f"{stage.name} (where data.corpus is {' or '.join(kinds)})"
    if models is not None:
        if "seed" not in stage.per:
            return f"{stage.name} (the jobs of {', '.join(models)})"
        return f"{stage.name} (the runs of {', '.join(models)})"
    if not stage.per:
        return stage.name
    if "model" not in stage.per or "seed" not in stage.per:
        return f"{stage.name} (every {'/'.join(stage.per)})"
    if stage.models_from != DEFAULT_MODELS:
        return f"{stage.name} (the runs of {stage.models_from})"
    return f"{stage.name} (every run)"


def with_table(text: str, table: str) -> str:
    """text (docs/pipeline.md) with the lines between BEGIN and END replaced by table."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{TABLE}: no lines {BEGIN!r} and {END!r} to hold the table between")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}"
