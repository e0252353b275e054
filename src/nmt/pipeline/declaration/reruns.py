"""What an edit of each module re-runs: the table docs/pipeline.md holds between two marker
lines, rendered (`nmt stages --write`) from the stages' derived code, so it cannot drift from
what DVC and Snakemake are given (tests/test_contract.py edits one module of every row of it
in a completed tiny pipeline and compares both tools' plans with it).

Modules are grouped by the stages whose code holds them; a row names each job set as the
stage runs it (`train` of every run, `verify` of every recipe), since the table holds for any
params.yaml.
"""

from __future__ import annotations

from pathlib import Path

from nmt.pipeline.declaration.code import units
from nmt.pipeline.declaration.declared import CODE, DECLARATION, DEFAULT_MODELS, Stage, load

TABLE = Path("docs/pipeline.md")
BEGIN = "<!-- reruns: rendered from the derived code by `nmt stages --write`; do not edit -->"
END = "<!-- /reruns -->"


def rerun_by(stages: dict[str, Stage], src: Path) -> dict[str, tuple[str, ...]]:
    """Every module file under src/nmt (as the code lists name it: core/files.py) -> the
    stages an edit of it re-runs, in the declaration's order: those whose code holds the file
    or the unit folder it lies in (models, stages/verify)."""
    unit_list = units(src)
    out = {}
    for path in sorted((src / "nmt").rglob("*.py")):
        rel = path.relative_to(src / "nmt").as_posix()
        unit = next((u for u in unit_list if rel.startswith(u + "/")), None)
        out[rel] = tuple(name for name, s in stages.items() if rel in s.code or unit in s.code)
    return out


def rerun_table(path: Path = DECLARATION) -> str:
    """The markdown table, one row a set of stages: the modules whose edit re-runs them."""
    stages = load(path)
    src = Path(path).parent.parent / Path(CODE).parent
    rows: dict[tuple[str, ...], list[str]] = {}
    for module, names in rerun_by(stages, src).items():
        rows.setdefault(names, []).append(module)
    lines = ["| an edit of | re-runs |", "|---|---|"]
    for names, modules in sorted(rows.items(), key=lambda row: (len(row[0]), row[0])):
        reruns = ", ".join(jobs(stages[n]) for n in names) or "**nothing**"
        lines.append(f"| {', '.join(f'`{m}`' for m in modules)} | {reruns} |")
    return "\n".join(lines) + "\n"


def jobs(stage: Stage) -> str:
    """A stage's jobs as a row names them: bench; verify (every recipe); train (every run)."""
    if not stage.per:
        return stage.name
    if "model" not in stage.per:
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
