"""The declared stages: workflow/stages.yaml read into `Stage`s and checked.

`load` reads the declaration, adds each stage's code (derived from the imports,
nmt.pipeline.code) and refuses, with the stage and the fix, what neither tool
could run as declared (`check`): a renderer takes a loaded stage as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nmt.pipeline.code import check_code, model_code, registered, shared_code, stage_code
from nmt.pipeline.corpora.kinds import KINDS

DECLARATION = Path("workflow/stages.yaml")
CODE = "src/nmt"
DIMENSIONS = ("recipe", "model", "seed")
DEFAULT_MODELS = "pipeline.models"  # the list a per-model stage runs over, unless models_from
PLACEHOLDER = re.compile(r"\{(\w+)\}")
# In corpus_params: the settings of every corpus kind, each kind's SETTINGS (data.files,
# data.huggingface; nmt.pipeline.corpora), so that a new kind needs no declaration edit
# (sources: it records those of the kind in use for the stages that run it).
KIND_SETTINGS = "data.{kind}"
# Snakemake's own names that a cmd may hold besides the job's wildcards, {bench} and a declared
# {gpu_mem_mb}: its shell command fills them ({threads}: the job's; DVC fills that one too).
SNAKEMAKE_NAMES = {"threads", "input", "output", "log", "params", "wildcards", "resources"}


@dataclass
class Stage:
    """One stage as declared; paths and cmd hold {recipe}, {model}, {seed}, {bench}, {corpus}."""

    name: str
    cmd: str
    per: list = field(default_factory=list)
    # With per model: the params.yaml list its models come from (pipeline.export: the runs to
    # export); an empty list gives no job under either tool.
    models_from: str = DEFAULT_MODELS
    code: list = field(default_factory=list)  # derived (load): shared_code, then its own
    params: list = field(default_factory=list)
    recipe_params: list = field(default_factory=list)
    bench_params: list = field(default_factory=list)
    corpus_params: list = field(default_factory=list)  # of pipeline.recipes[0] (pipeline.corpus)
    deps: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    metrics: list = field(default_factory=list)
    plots: list = field(default_factory=list)
    threads: int = 1
    gpu: int | str = 0  # GPUs a job holds: a number, or a key of its recipe (train.devices)
    # CUDA memory a job may take, MB ({gpu_mem_mb} in cmd); 0: unbounded, or NMT_GPU_MEM_MB.
    # Snakemake: the rule's resource, which a profile sets (workflow/profiles/gpu).
    gpu_mem_mb: int | None = None
    cache: bool = True
    persist: bool = False  # DVC keeps its outputs when it runs again (sources: their times)
    # DVC runs it every time (it checks files outside DVC's view; Snakemake: at parse time)
    always_changed: bool = False
    report: dict = field(default_factory=dict)  # output -> Snakemake --report category
    # What the pipeline is for: Snakemake's `rule all` asks for its outputs (every job's); the
    # other stages run because a target needs them (DVC runs every stage anyway).
    target: bool = False
    # per model: each job runs its model's check sets too (verify: the registry entry's
    # `checks`, and the reference where one is the twin check set; code.check_code)
    runs_checks: bool = False
    shared_code: list = field(default_factory=list)  # the part every stage computes from
    # per model: what a job of each model runs beyond `code` (its model's modules; derived)
    model_code: dict = field(default_factory=dict)
    # It declares KIND_SETTINGS: its output records the corpus kind in use, its settings and
    # its code (nmt.stages.sources), for the stages that run the kind (`kind_readers`)
    records_kind: bool = False

    def code_paths(self, model: str | None = None) -> list[str]:
        """The modules it runs as repository paths (a job of `model`: its model's too)."""
        return [f"{CODE}/{c}" for c in self.code + self.model_code.get(model, [])]

    def outputs(self) -> list[str]:
        """Every file or folder it writes: outs, metrics and plots."""
        return self.outs + self.metrics + self.plots

    def list_key(self, dimension: str) -> str:
        """The params.yaml list whose items a per dimension runs over (pipeline.seeds, ...)."""
        return self.models_from if dimension == "model" else f"pipeline.{dimension}s"

    def per_values(self, params: dict) -> dict[str, list]:
        """Each per dimension's items in params: its jobs are every combination of them."""
        return {d: lookup(params, self.list_key(d)) for d in self.per}


def lookup(section: dict, key: str):
    """The value of a dotted key (train.devices) in a params tree."""
    for part in key.split("."):
        section = section[part]
    return section


def is_dir(path: str) -> bool:
    """Outputs without a file suffix are folders (data/raw, translations, figures)."""
    return "." not in Path(path).name


def placeholders(text: str) -> list[str]:
    """The names of text's placeholders ({recipe}), each once, in order."""
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def load(path: Path = DECLARATION, src: Path | None = None) -> dict[str, Stage]:
    """The declared stages, each with the code it runs derived from the imports of the source
    tree src (the folder that holds nmt; default: src/ beside the declaration's workflow/),
    each checked."""
    spec = yaml.safe_load(Path(path).read_text())
    src = Path(path).parent.parent / "src" if src is None else Path(src)
    if "shared_code" in spec:
        raise ValueError(f"{path}: shared_code is derived (nmt.pipeline.code."
                         "SHARED); remove it")
    shared = shared_code(src)
    stages = {}
    for name, s in spec["stages"].items():
        if "code" in s:
            raise ValueError(f"{path}: stage {name}: code is derived from its module's "
                             "imports; remove it")
        per_model = "model" in s.get("per", [])
        if s.get("runs_checks") and not per_model:
            raise ValueError(f"{path}: stage {name}: runs_checks, but it does not run per "
                             "model (a job runs one model's check sets)")
        own = [c for c in stage_code(name, src, models=() if per_model else None)
               if c not in shared]
        models = {m: sorted(set(job_code(m, src, s.get("runs_checks", False)))
                            - set(shared + own))
                  for m in registered(src)} if per_model else {}
        corpus = {"corpus_params": corpus_keys(s.get("corpus_params", [])),
                  "records_kind": KIND_SETTINGS in s.get("corpus_params", [])}
        stages[name] = Stage(name=name, **(s | corpus), code=shared + own, shared_code=shared,
                             model_code=models)
    for stage in stages.values():
        check(stage)
    return stages


def job_code(model: str, src: Path, runs_checks: bool) -> list[str]:
    """What a job of `model` runs beyond its stage's computation: the model's code, and its
    check sets' where the stage runs them."""
    return model_code(model, src) + (check_code(model, src) if runs_checks else [])


def corpus_keys(declared: list[str]) -> list[str]:
    """corpus_params as declared, KIND_SETTINGS replaced by every corpus kind's settings."""
    kinds = [key for kind in KINDS.values() for key in kind.SETTINGS]
    return [key for entry in declared for key in (kinds if entry == KIND_SETTINGS else [entry])]


def kind_readers(stages: dict[str, Stage]) -> list[str]:
    """The stages that run the corpus kind in use (by its name, which no derived code follows):
    those whose deps hold the record of a stage that records it (`records_kind`)."""
    records = {o for s in stages.values() if s.records_kind for o in s.outputs()}
    return [name for name, s in stages.items() if records & set(s.deps)]


def check(stage: Stage) -> None:
    """Refuse what a tool cannot run as declared: a folder or report output that holds a
    placeholder other than its wildcards, recipe keys (recipe_params, a gpu key) of a stage
    that does not run per recipe, and a cmd placeholder that neither tool fills."""
    for path in stage.outputs():
        loose = [n for n in placeholders(path) if n not in stage.per]
        if loose and (is_dir(path) or stage.report.get(path)):
            raise ValueError(f"stage {stage.name}: output {path} is a folder or a report item "
                             "and holds placeholders that are not its wildcards")
    if stage.recipe_params and "recipe" not in stage.per:
        raise ValueError(f"stage {stage.name}: recipe_params, but it does not run per recipe")
    if isinstance(stage.gpu, str) and stage.gpu and "recipe" not in stage.per:
        raise ValueError(f"stage {stage.name}: gpu {stage.gpu} is a recipe key, but it "
                         "does not run per recipe")
    filled = {*stage.per, "bench", *SNAKEMAKE_NAMES}
    filled |= {"gpu_mem_mb"} if stage.gpu_mem_mb is not None else set()
    for name in placeholders(stage.cmd):
        if name not in filled:
            raise ValueError(f"stage {stage.name}: {{{name}}} in its cmd is none of its "
                             f"wildcards {stage.per}, {{bench}}, a declared {{gpu_mem_mb}} or "
                             f"{sorted(SNAKEMAKE_NAMES)}")
