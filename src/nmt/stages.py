"""The stage contract: workflow/stages.yaml, the one declaration of every stage, read here.

`render_dvc` writes dvc.yaml from it; workflow/Snakefile builds its rules from `load`; the
tests compare what each stage really reads and runs against it (see the file's header).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DECLARATION = Path("workflow/stages.yaml")
CODE = "src/nmt"
DIMENSIONS = ("recipe", "model", "seed")


@dataclass
class Stage:
    """One stage as declared; paths and cmd hold {recipe}, {model}, {seed}, {bench}."""

    name: str
    cmd: str
    per: list = field(default_factory=list)
    code: list = field(default_factory=list)
    params: list = field(default_factory=list)
    recipe_params: list = field(default_factory=list)
    bench_params: list = field(default_factory=list)
    deps: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    metrics: list = field(default_factory=list)
    plots: list = field(default_factory=list)
    threads: int = 1
    gpu: int | str = 0  # GPUs a job holds: a number, or a key of its recipe (train.devices)
    cache: bool = True
    report: dict = field(default_factory=dict)  # output -> Snakemake --report category

    def code_paths(self, files: bool = False) -> list[str]:
        """The modules it runs as repository paths: a package (models) is a folder for DVC,
        which hashes its content, and its .py files for Snakemake, which compares times."""
        paths = [f"{CODE}/{c}" for c in self.code]
        if not files:
            return paths
        return [str(f) for p in paths for f in
                (sorted(Path(p).rglob("*.py")) if Path(p).is_dir() else [Path(p)])]


def load(path: Path = DECLARATION) -> dict[str, Stage]:
    spec = yaml.safe_load(Path(path).read_text())
    shared = spec.get("shared_code", [])
    stages = {}
    for name, s in spec["stages"].items():
        stages[name] = Stage(name=name, **{**s, "code": shared + s.get("code", [])})
    return stages


def is_dir(path: str) -> bool:
    """Outputs without a file suffix are folders (data/raw, translations, figures)."""
    return "." not in Path(path).name


def dvc_text(text: str) -> str:
    """{recipe} -> ${item.recipe}, {bench} -> ${bench.recipe}: DVC's templating."""
    for d in DIMENSIONS:
        text = text.replace("{" + d + "}", "${item." + d + "}")
    return text.replace("{bench}", "${bench.recipe}")


def dvc_stage(s: Stage) -> dict:
    """One stage of dvc.yaml."""
    out: dict = {}
    if s.per:
        out["matrix"] = {d: f"${{pipeline.{d}s}}" for d in s.per}
    out["cmd"] = dvc_text(s.cmd).replace("{threads}", str(s.threads))
    out["deps"] = s.code_paths() + [dvc_text(d) for d in s.deps]
    params = [{"params.yaml": None} if k == "params.yaml" else k for k in s.params]
    if s.recipe_params:
        params.append({dvc_text("params/{recipe}.yaml"): s.recipe_params})
    if s.bench_params:
        params.append({dvc_text("params/{bench}.yaml"): s.bench_params})
    if params:
        out["params"] = params
    opts = {} if s.cache else {"cache": False}
    out["outs"] = [{dvc_text(o): dict(opts)} if opts else dvc_text(o) for o in s.outs]
    if s.metrics:
        out["metrics"] = [{dvc_text(m): dict(opts)} if opts else dvc_text(m) for m in s.metrics]
    if s.plots:
        out["plots"] = [{dvc_text(p): {"x": "epoch", "y": "valid_loss"}} for p in s.plots]
    return out


HEADER = """\
# GENERATED from workflow/stages.yaml by `nmt stages --write`: edit that file, not this one.
# Snakemake (workflow/Snakefile) builds its rules from the same declaration.
"""


# `dvc plots show` / `dvc plots diff`: the loss curves of every run on one chart each, from
# the report's tidy reports/curves.csv, coloured by run (template .dvc/plots/by_run.json).
PLOTS = [{f"{split} loss": {"x": "epoch", "y": {"reports/curves.csv": f"{split}_loss"},
                            "template": "by_run"}} for split in ("valid", "train")]


def render_dvc(path: Path = DECLARATION) -> str:
    stages = {name: dvc_stage(s) for name, s in load(path).items()}
    body = yaml.safe_dump({"stages": stages, "plots": PLOTS}, sort_keys=False, width=100)
    return HEADER + body


# Snakemake's view of the declaration (workflow/Snakefile calls these at parse time).
def fill(text: str, bench: str) -> str:
    """{bench} is bench.recipe."""
    return text.replace("{bench}", bench)


def expand_runs(path: str, per: list, lists: dict) -> list[str]:
    """path for every combination of the pipeline lists of its dimensions."""
    combos = itertools.product(*(lists[d] for d in per))
    return [path.format(**dict(zip(per, c, strict=True))) for c in combos] if per else [path]


def produced(stage: Stage, lists: dict, bench: str) -> list[str]:
    """Every file or folder a stage writes, over all its runs."""
    return [q for p in stage.outs + stage.metrics + stage.plots
            for q in expand_runs(fill(p, bench), stage.per, lists)]


def snakemake_inputs(stage: Stage, stages: dict, lists: dict, bench: str) -> list[str]:
    """Its code and deps; a folder that other stages write into (results, data/vocab) stands
    for every file they write there, as Snakemake needs files, not a folder, as inputs."""
    found = []
    for dep in (fill(d, bench) for d in stage.deps):
        own = any(fill(o, bench) == dep for s in stages.values() for o in s.outs)
        inside = [p for s in stages.values() if s is not stage
                  for p in produced(s, lists, bench) if p.startswith(f"{dep}/")]
        found += [dep] if own or not inside else inside
    return stage.code_paths(files=True) + found


def lookup(section: dict, key: str):
    for part in key.split("."):
        section = section[part]
    return section


def declared_values(stage: Stage, config: dict, recipe: str | None, bench: str) -> str:
    """The values of the keys it declares, as JSON: Snakemake re-runs a job when they change."""
    from nmt.recipes import resolve

    out = {k: lookup(config, k) for k in stage.params if k != "params.yaml"}
    if "params.yaml" in stage.params:
        out["params.yaml"] = config
    for keys, name in ((stage.recipe_params, recipe), (stage.bench_params, bench)):
        if keys:
            resolved = resolve(config, name)
            out |= {f"{name}:{k}": lookup(resolved, k) for k in keys}
    return json.dumps(out, sort_keys=True)


def gpus(stage: Stage, config: dict, recipe: str | None) -> int:
    """The GPUs one job of the stage holds (Snakemake's gpu resource)."""
    from nmt.recipes import resolve

    if isinstance(stage.gpu, int):
        return stage.gpu
    return lookup(resolve(config, recipe), stage.gpu)


def log_path(stage: Stage) -> str:
    return "logs/" + "-".join([stage.name] + [f"{{{d}}}" for d in stage.per]) + ".log"
