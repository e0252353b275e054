"""The stage contract: workflow/stages.yaml, the one declaration of every stage, and the files
rendered from it.

`nmt stages --write` renders both orchestrators' files from it (`rendered`): dvc.yaml
(`render_dvc`) and Snakemake's rules, workflow/rules/stages.smk (`render_snakemake`); `nmt
stages --check` and a test fail when either is stale. The tests compare what each stage really
reads and runs against it (see the file's header). Each stage's code is derived from the
imports (nmt.pipeline.code: `stage_code`, `shared_code`; `command_code`, what its command loads
around it; `imports`, the parser tests/test_layout.py uses too). One idea a module, each
importing only the ones before it:

    declared   the declaration read into `Stage`s (`load`) and checked: every refusal is here
    dvc        dvc.yaml
    snakemake  the rules, and `declared_values`, which they call at run time (rules/common.smk)
    reruns     docs/pipeline.md's table of what an edit of each module re-runs

Here are the names other modules, the rules and the tests import.
"""

from __future__ import annotations

from pathlib import Path

from nmt.pipeline.code import (
    command_code,
    imports,
    model_code,
    module_name,
    registered,
    shared_code,
    stage_code,
)
from nmt.pipeline.declaration.declared import (
    CODE,
    DECLARATION,
    DIMENSIONS,
    KIND_SETTINGS,
    PLACEHOLDER,
    Stage,
    kind_readers,
    load,
    lookup,
)
from nmt.pipeline.declaration.dvc import render_dvc
from nmt.pipeline.declaration.reruns import TABLE, rerun_by, rerun_table, with_table
from nmt.pipeline.declaration.snakemake import (
    SNAKEMAKE_RULES,
    declared_values,
    input_templates,
    render_snakemake,
    smk_rule,
)

__all__ = ["CODE", "DECLARATION", "command_code", "DIMENSIONS", "KIND_SETTINGS", "PLACEHOLDER",
           "SNAKEMAKE_RULES", "Stage", "declared_values", "imports", "input_templates",
           "kind_readers", "load", "lookup", "module_name", "model_code", "registered",
           "render_dvc", "render_snakemake", "rendered", "rerun_by", "rerun_table", "shared_code",
           "smk_rule", "stage_code"]


def rendered(path: Path = DECLARATION) -> dict[Path, str]:
    """Every file rendered from the declaration (`nmt stages --write`), by its path: and
    docs/pipeline.md with its table of what each module's edit re-runs, where the checkout
    has the file (a copy of src/ and workflow/ alone has none)."""
    files = {Path("dvc.yaml"): render_dvc(path), SNAKEMAKE_RULES: render_snakemake(path)}
    docs = Path(path).parent.parent / TABLE
    if docs.is_file():
        files[TABLE] = with_table(docs.read_text(), rerun_table(path))
    return files
