"""dvc.yaml rendered from the declared stages: one DVC stage each, a matrix over its per
dimensions, its code as dependencies (one file a module).

A job of one model depends on that model's code alone, which differs from model to model; a
DVC matrix cannot pick a list by the item (`${code.${item.model}}` is refused), so each model's
code is a folder of links, workflow/code/<model>/, one to each module the model runs, and a
per-model stage depends on `workflow/code/${item.model}` (DVC hashes what the links point to);
verify's jobs run the model's check sets as well, `workflow/code/verify-${item.model}`.
`nmt stages --write` makes the links with the rest, and `--check` fails where they differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from nmt.pipeline.code import registered, shared_code
from nmt.pipeline.declaration.declared import (
    CODE,
    DECLARATION,
    DIMENSIONS,
    Stage,
    job_code,
    load,
)

MODEL_LINKS = Path("workflow/code")  # <model>/<module path, / as .>: a link to the module


def dvc_text(text: str) -> str:
    """{recipe} -> ${item.recipe}, {bench} -> ${bench.recipe}, {corpus} ->
    ${pipeline.recipes[0]}: DVC's templating."""
    for d in DIMENSIONS:
        text = text.replace("{" + d + "}", "${item." + d + "}")
    return text.replace("{bench}", "${bench.recipe}").replace("{corpus}",
                                                              "${pipeline.recipes[0]}")


def dvc_stage(s: Stage) -> dict:
    """One stage of dvc.yaml."""
    out: dict = {}
    if s.per:
        out["matrix"] = {d: f"${{{s.list_key(d)}}}" for d in s.per}
    out["cmd"] = dvc_text(s.cmd).replace("{threads}", str(s.threads))
    if s.gpu_mem_mb is not None:  # DVC has no resources: the declared bound (the variable)
        out["cmd"] = out["cmd"].replace("{gpu_mem_mb}", str(s.gpu_mem_mb))
    models = [f"{MODEL_LINKS}/{links_prefix(s)}${{item.model}}"] if s.model_code else []
    out["deps"] = s.code_paths() + models + [dvc_text(d) for d in s.deps]
    params = [{"params.yaml": None} if k == "params.yaml" else k for k in s.params]
    if s.recipe_params:
        params.append({dvc_text("params/{recipe}.yaml"): s.recipe_params})
    if s.bench_params:
        params.append({dvc_text("params/{bench}.yaml"): s.bench_params})
    if s.corpus_params:
        params.append({dvc_text("params/{corpus}.yaml"): s.corpus_params})
    if params:
        out["params"] = params
    opts = ({} if s.cache else {"cache": False}) | ({"persist": True} if s.persist else {})
    out["outs"] = [{dvc_text(o): dict(opts)} if opts else dvc_text(o) for o in s.outs]
    if s.metrics:
        out["metrics"] = [{dvc_text(m): dict(opts)} if opts else dvc_text(m) for m in s.metrics]
    if s.always_changed:
        out["always_changed"] = True
    if s.plots:
        out["plots"] = [{dvc_text(p): {"x": "epoch", "y": "valid_loss"}} for p in s.plots]
    return out


HEADER = """\
# GENERATED from workflow/stages.yaml by `nmt stages --write`: edit that file, not this one.
# Snakemake's rules, workflow/rules/stages.smk, are rendered from the same declaration.
"""


# `dvc plots show` / `dvc plots diff`: the loss curves of every run on one chart each, from
# the report's tidy reports/curves.csv, coloured by run (template .dvc/plots/by_run.json).
PLOTS = [{f"{split} loss": {"x": "epoch", "y": {"reports/curves.csv": f"{split}_loss"},
                            "template": "by_run"}} for split in ("valid", "train")]


def render_dvc(path: Path = DECLARATION) -> str:
    """dvc.yaml's text for the declaration at path."""
    stages = {name: dvc_stage(s) for name, s in load(path).items()}
    body = yaml.safe_dump({"stages": stages, "plots": PLOTS}, sort_keys=False, width=100)
    return HEADER + body


def links_prefix(stage: Stage) -> str:
    """The prefix of the link folder its jobs depend on: none for a model's code
    (workflow/code/scratch), `<stage>-` where its jobs run the model's check sets too
    (workflow/code/verify-scratch)."""
    return f"{stage.name}-" if stage.runs_checks else ""


def model_modules(stages: dict[str, Stage], path: Path = DECLARATION) -> dict[str, list[str]]:
    """Each folder of links -> the modules a job of its model runs beyond the shared code:
    <model> (nmt.pipeline.code.model_code), and <stage>-<model> for a stage of `stages` (the
    declaration at path, loaded) whose jobs run the model's check sets too (job_code):
    workflow/code/'s folders, and Snakemake's MODEL_CODE."""
    src = Path(path).parent.parent / Path(CODE).parent
    shared = set(shared_code(src))
    out = {}
    for prefix, checks in [("", False)] + [(links_prefix(s), True) for s in stages.values()
                                          if s.runs_checks]:
        out |= {f"{prefix}{model}": sorted(set(job_code(model, src, checks)) - shared)
                for model in registered(src)}
    return out


def model_links(path: Path = DECLARATION) -> dict[Path, str]:
    """Every link of workflow/code/ (relative to the repository) -> what it points to,
    relative to its folder: one a module of each model (model_modules)."""
    return {MODEL_LINKS / model / module.replace("/", "."): f"../../../{CODE}/{module}"
            for model, modules in model_modules(load(path), path).items() for module in modules}
