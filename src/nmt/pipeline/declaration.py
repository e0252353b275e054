"""The stage contract: workflow/stages.yaml, the one declaration of every stage, read here.

`nmt stages --write` renders both orchestrators' files from it: dvc.yaml (`render_dvc`) and
Snakemake's rules, workflow/rules/stages.smk (`render_snakemake`); `nmt stages --check` and a
test fail when either is stale. The tests compare what each stage really reads and runs
against it (see the file's header).

The code each stage runs is not declared but derived here from the imports (`stage_code`,
`shared_code`): the files are parsed, never imported, so a change to any module re-runs
exactly the stages whose imports reach it.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from nmt.pipeline.corpora.kinds import KINDS

DECLARATION = Path("workflow/stages.yaml")
CODE = "src/nmt"
DIMENSIONS = ("recipe", "model", "seed")
DEFAULT_MODELS = "pipeline.models"  # the list a per-model stage runs over, unless models_from
# In corpus_params: the settings of every corpus kind, each kind's SETTINGS (data.files,
# data.huggingface; nmt.pipeline.corpora), so that a new kind needs no declaration edit.
KIND_SETTINGS = "data.{kind}"


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
    # DVC runs it every time (it checks files outside DVC's view; Snakemake: at parse time)
    always_changed: bool = False
    report: dict = field(default_factory=dict)  # output -> Snakemake --report category
    # What the pipeline is for: Snakemake's `rule all` asks for its outputs (every job's); the
    # other stages run because a target needs them (DVC runs every stage anyway).
    target: bool = False
    shared_code: list = field(default_factory=list)  # the part of code every command runs

    def code_paths(self, files: bool = False) -> list[str]:
        """The modules it runs as repository paths: a package (models) is a folder for DVC,
        which hashes its content, and its .py files for Snakemake, which compares times."""
        paths = [f"{CODE}/{c}" for c in self.code]
        if not files:
            return paths
        return [str(f) for p in paths for f in
                (sorted(Path(p).rglob("*.py")) if Path(p).is_dir() else [Path(p)])]

    def outputs(self) -> list[str]:
        """Every file or folder it writes: outs, metrics and plots."""
        return self.outs + self.metrics + self.plots

    def list_key(self, dimension: str) -> str:
        """The params.yaml list whose items a per dimension runs over (pipeline.seeds, ...)."""
        return self.models_from if dimension == "model" else f"pipeline.{dimension}s"

    def per_values(self, params: dict) -> dict[str, list]:
        """Each per dimension's items in params: its jobs are every combination of them."""
        return {d: lookup(params, self.list_key(d)) for d in self.per}


def load(path: Path = DECLARATION, src: Path | None = None) -> dict[str, Stage]:
    """The declared stages, each with the code it runs derived from the imports of the source
    tree src (the folder that holds nmt; default: src/ beside the declaration's workflow/)."""
    spec = yaml.safe_load(Path(path).read_text())
    src = Path(path).parent.parent / "src" if src is None else Path(src)
    if "shared_code" in spec:
        raise ValueError(f"{path}: shared_code is derived from nmt.cli's imports; remove it")
    shared = shared_code(src)
    stages = {}
    for name, s in spec["stages"].items():
        if "code" in s:
            raise ValueError(f"{path}: stage {name}: code is derived from its module's "
                             "imports; remove it")
        own = [c for c in stage_code(name, src) if c not in shared]
        corpus = {"corpus_params": corpus_keys(s.get("corpus_params", []))}
        stages[name] = Stage(name=name, **(s | corpus), code=shared + own, shared_code=shared)
    return stages


def corpus_keys(declared: list[str]) -> list[str]:
    """corpus_params as declared, KIND_SETTINGS replaced by every corpus kind's settings."""
    kinds = [key for kind in KINDS.values() for key in kind.SETTINGS]
    return [key for entry in declared for key in (kinds if entry == KIND_SETTINGS else [entry])]


# ---- code: what a stage runs, from the imports ----------------------------------------------
#
# A stage's code is the transitive closure of the nmt imports (at a module's top or inside a
# function, relative ones included) from its module, nmt.stages.<name> (a package: all its
# files), plus every package's __init__ on the way (Python runs it on import) and the code every
# command runs (`shared_code`). Each is named as the declaration named it by hand: a module by
# its file under src/nmt (core/files.py, __init__.py for nmt itself), a unit by its folder.

# Packages that are one unit: one entry by their folder (DVC hashes the folder; Snakemake
# takes its .py files), and a change to any file of it re-runs every stage that imports any.
# Besides these, every stage package (nmt.stages.verify) is one.
UNITS = ("models",)
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
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages around it
        name = entry(module, src, unit_list)
        if name in found:  # a unit, whose files are all read already
            continue
        files = (sorted((src / "nmt" / name).rglob("*.py")) if name in unit_list
                 else [module_file(module, src)])
        found.add(name)
        for f in files:
            todo += [module_name(f, src), *file_imports(f, module_name(f, src))]
    return sorted(found)


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


def is_dir(path: str) -> bool:
    """Outputs without a file suffix are folders (data/raw, translations, figures)."""
    return "." not in Path(path).name


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
    out["deps"] = s.code_paths() + [dvc_text(d) for d in s.deps]
    params = [{"params.yaml": None} if k == "params.yaml" else k for k in s.params]
    if s.recipe_params:
        params.append({dvc_text("params/{recipe}.yaml"): s.recipe_params})
    if s.bench_params:
        params.append({dvc_text("params/{bench}.yaml"): s.bench_params})
    if s.corpus_params:
        params.append({dvc_text("params/{corpus}.yaml"): s.corpus_params})
    if params:
        out["params"] = params
    opts = {} if s.cache else {"cache": False}
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
    stages = {name: dvc_stage(s) for name, s in load(path).items()}
    body = yaml.safe_dump({"stages": stages, "plots": PLOTS}, sort_keys=False, width=100)
    return HEADER + body


# ---- Snakemake: workflow/rules/stages.smk, one plain rule per stage -------------------------

SNAKEMAKE_RULES = Path("workflow/rules/stages.smk")
CONDA_ENV = "../envs/nmt.yaml"  # workflow/envs/nmt.yaml, relative to the rules file
# What workflow/Snakefile names before it includes the rules: the lists a placeholder that is
# not one of the job's wildcards expands over ({bench}: bench.recipe).
LIST_NAMES = {"recipe": "RECIPES", "model": "MODELS", "seed": "SEEDS", "bench": "BENCH"}
SNAKEMAKE_NAMES = {"threads", "input", "output", "log", "params", "wildcards", "resources"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")
WIDTH = 100


def placeholders(text: str) -> list[str]:
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def input_templates(stage: Stage, stages: dict) -> list[tuple[str, list[str]]]:
    """Its deps as Snakemake inputs: each a path, and its placeholders that are not the job's
    wildcards, to expand over every value. A folder that other stages write into (results,
    data/vocab) stands for every file they write there, over all their runs, as Snakemake
    needs files, not a folder, as inputs."""
    found = []
    for dep in stage.deps:
        own = any(o == dep for s in stages.values() for o in s.outs)
        inside = [p for s in stages.values() if s is not stage for p in s.outputs()
                  if p.startswith(f"{dep}/")]
        if own or not inside:
            found.append((dep, [n for n in placeholders(dep) if n not in stage.per]))
        else:
            found += [(p, placeholders(p)) for p in inside]
    return found


def lookup(section: dict, key: str):
    for part in key.split("."):
        section = section[part]
    return section


def declared_values(config: dict, params=(), recipe_params=(), bench_params=(),
                    corpus_params=(), recipe: str | None = None) -> str:
    """The values of the keys a stage declares, as JSON: the `values` param of its rule, so
    Snakemake re-runs a job when one changes. params: keys of params.yaml (`params.yaml`: all
    of it); recipe_params: of the job's resolved recipe; bench_params: of bench.recipe's;
    corpus_params: of pipeline.recipes[0]'s."""
    from nmt.pipeline.recipes import resolve

    out = {k: lookup(config, k) for k in params if k != "params.yaml"}
    if "params.yaml" in params:
        out["params.yaml"] = config
    for keys, name in ((recipe_params, recipe), (bench_params, config["bench"]["recipe"]),
                       (corpus_params, config["pipeline"]["recipes"][0])):
        if keys:
            resolved = resolve(config, name)
            out |= {f"{name}:{k}": lookup(resolved, k) for k in keys}
    return json.dumps(out, sort_keys=True)


def log_path(stage: Stage) -> str:
    return "logs/" + "-".join([stage.name] + [f"{{{d}}}" for d in stage.per]) + ".log"


def quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Python string literal, double-quoted


def call(name: str, args: list[str], indent: int) -> str:
    """name(args...) on one line if it fits; else the first argument, then the others on one
    line under it, or one a line."""
    one = f"{name}({', '.join(args)})"
    if "\n" not in one and indent + len(one) < WIDTH:
        return one
    pad = "\n" + " " * (indent + len(name) + 1)
    rest = ", ".join(args[1:])
    if len(args) > 2 and "\n" not in rest and len(pad) - 1 + len(rest) + 2 < WIDTH:
        return f"{name}({args[0]},{pad}{rest})"
    return f"{name}(" + f",{pad}".join(args) + ")"


def path_expr(path: str, names: list[str], indent: int = 8) -> str:
    """A literal path, or expand() over the lists of names ({{kept}}: the job's wildcards)."""
    if not names:
        return quote(path)
    kept = PLACEHOLDER.sub(lambda m: m.group(0) if m.group(1) in names else "{" + m.group(0)
                           + "}", path)
    return call("expand", [quote(kept)] + [f"{n}={LIST_NAMES[n]}" for n in names], indent)


def key_list(keys: list[str], indent: int) -> str:
    """["a", "b", ...], wrapped under its opening bracket; the last line leaves room for the
    `),` that closes the rule's call after it."""
    lines, line = [], "["
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        item = quote(k) + ("]" if last else ", ")
        if len(line) > 1 and indent + len(line) + len(item.rstrip()) + 2 * last >= WIDTH:
            lines.append(line.rstrip())
            line = " "
        line += item
    return "\n".join(lines + [line]).replace("\n", "\n" + " " * indent)


def shell_command(stage: Stage) -> str:
    """Its cmd with Snakemake's names: {recipe} is {wildcards.recipe}, {bench} {params.bench};
    Snakemake's own ({threads}, ...) stay; stderr goes to the rule's log."""
    def name(m):
        n = m.group(1)
        if n in stage.per:
            return f"{{wildcards.{n}}}"
        if n == "bench":
            return "{params.bench}"
        if n == "gpu_mem_mb" and stage.gpu_mem_mb is not None:
            return "{resources.gpu_mem_mb}"
        if n in SNAKEMAKE_NAMES:
            return m.group(0)
        raise ValueError(f"stage {stage.name}: {m.group(0)} in its cmd is none of its "
                         f"wildcards {stage.per}, {{bench}}, a declared {{gpu_mem_mb}} or "
                         f"{sorted(SNAKEMAKE_NAMES)}")
    return PLACEHOLDER.sub(name, stage.cmd) + " 2> {log}"


def shell_lines(command: str, indent: int = 8) -> list[str]:
    """The command as string literals (Python joins them) of at most WIDTH columns, broken
    before an option (--name and its value) or the redirection, not inside one."""
    parts, lines, line = re.split(r" (?=--|2> )", command), [], ""
    for part in parts:
        if line and indent + len(quote(line + " " + part)) >= WIDTH:
            lines.append(line)
            line = " " + part
        else:
            line = f"{line} {part}" if line else part
    return [" " * indent + quote(x) for x in lines + [line]]


def code_items(modules: list[str]) -> list[str]:
    """Modules as input items: a file, or a package's .py files (package() in common.smk)."""
    return [f"*package({quote(f'{CODE}/{c}')})" if is_dir(c) else quote(f"{CODE}/{c}")
            for c in modules]


def output_expr(stage: Stage, path: str) -> str:
    names = [n for n in placeholders(path) if n not in stage.per]
    category = stage.report.get(path)
    if names and (is_dir(path) or category):
        raise ValueError(f"stage {stage.name}: output {path} is a folder or a report item "
                         "and holds placeholders that are not its wildcards")
    out = path_expr(path, names)
    if is_dir(path):
        out = f"directory({out})"
        if category:
            return f'report({out}, patterns=["{{name}}.png"], category={quote(category)})'
    return f"report({out}, category={quote(category)})" if category else out


def constraint_lines(stage: Stage) -> list[str]:
    """A stage whose models come from another list (models_from) matches only its names, so
    that Snakemake, like DVC, has no job for the models outside it (listed(): common.smk)."""
    if "model" not in stage.per or stage.models_from == DEFAULT_MODELS:
        return []
    return ["    wildcard_constraints:", f"        model=listed({quote(stage.models_from)}),"]


def smk_rule(stage: Stage, stages: dict) -> str:
    """One plain rule: input (deps, then code=), output, params, threads, resources, log,
    conda, shell."""
    lines = [f"rule {stage.name}:", "    input:"]
    lines += [f"        {path_expr(p, names)}," for p, names in input_templates(stage, stages)]
    own = [c for c in stage.code if c not in stage.shared_code]
    lines += ["        code=[", "            *SHARED_CODE,"]
    lines += [f"            {item}," for item in code_items(own)] + ["        ],"]
    lines += ["    output:"] + [f"        {output_expr(stage, p)}," for p in stage.outputs()]
    lines += constraint_lines(stage)
    declared = {k: v for k, v in (("params", stage.params), ("recipe_params",
                stage.recipe_params), ("bench_params", stage.bench_params),
                ("corpus_params", stage.corpus_params)) if v}
    if "recipe_params" in declared and "recipe" not in stage.per:
        raise ValueError(f"stage {stage.name}: recipe_params, but it does not run per recipe")
    uses_bench = "bench" in placeholders(stage.cmd)
    if declared or uses_bench:
        lines.append("    params:")
    if declared:
        args = [f"{k}={key_list(v, 8 + len('values=declared(') + len(k) + 1)}"
                for k, v in declared.items()]
        lines.append(f"        values={call('declared', args, 8 + len('values='))},")
    if uses_bench:
        lines.append("        bench=BENCH,")
    if stage.threads != 1:
        lines.append(f"    threads: {stage.threads}")
    if stage.gpu:
        if isinstance(stage.gpu, str) and "recipe" not in stage.per:
            raise ValueError(f"stage {stage.name}: gpu {stage.gpu} is a recipe key, but it "
                             "does not run per recipe")
        gpu = stage.gpu if isinstance(stage.gpu, int) else f"from_recipe({quote(stage.gpu)})"
        lines += ["    resources:", f"        gpu={gpu},"]
    if stage.gpu_mem_mb is not None:
        lines += [] if stage.gpu else ["    resources:"]
        lines.append(f"        gpu_mem_mb={stage.gpu_mem_mb},")
    lines += ["    log:", f"        {quote(log_path(stage))},", "    conda:",
              f"        {quote(CONDA_ENV)}", "    shell:"] + shell_lines(shell_command(stage))
    return "\n".join(lines) + "\n"


SMK_HEADER = """\
# GENERATED from workflow/stages.yaml by `nmt stages --write`: edit that file, not this one.
# Snakemake's rules, one a stage: the commands dvc.yaml runs, on the same files.
# workflow/Snakefile names RECIPES, MODELS, SEEDS (pipeline.*) and BENCH (bench.recipe) before
# it includes this file; declared(), from_recipe(), listed() and lookup() are in
# rules/common.smk. `rule all`, last, asks for the outputs of the stages declared `target`.
# params.values holds the values of the keys the stage declares (params.yaml, its recipe's):
# Snakemake re-runs a job when its params change, so an edit re-runs exactly what reads it.
"""


def all_rule(stages: dict) -> str:
    """`rule all`: the outputs of the stages declared `target`, every job's (a per-model stage:
    the models of its list, models_from)."""
    lines = ["# What `snakemake` makes when no target is named: the outputs of the stages declared",
             "# `target` (a list with no items, such as pipeline.export: [], expands to none).",
             "rule all:", "    input:"]
    for s in (s for s in stages.values() if s.target):
        lists = [f"{d}={LIST_NAMES[d]}" if s.list_key(d) == f"pipeline.{d}s"
                 else f"{d}=lookup(config, {quote(s.list_key(d))})" for d in s.per]
        output = f"rules.{s.name}.output"
        lines.append(f"        {call('expand', [output] + lists, 8) if lists else output},")
    return "\n".join(lines) + "\n"


def render_snakemake(path: Path = DECLARATION) -> str:
    stages = load(path)
    shared = next(iter(stages.values())).shared_code
    head = ["# The modules every `nmt` command runs (derived from nmt.cli's imports); each rule",
            "# adds those its stage's imports reach.",
            "SHARED_CODE = ["] + [f"    {item}," for item in code_items(shared)] + ["]"]
    return "\n\n".join([SMK_HEADER + "\n" + "\n".join(head) + "\n"]
                       + [smk_rule(s, stages) for s in stages.values()] + [all_rule(stages)])


# ---- both ---------------------------------------------------------------------------------

def rendered(path: Path = DECLARATION) -> dict[Path, str]:
    """Every file rendered from the declaration (`nmt stages --write`), by its path."""
    return {Path("dvc.yaml"): render_dvc(path), SNAKEMAKE_RULES: render_snakemake(path)}
