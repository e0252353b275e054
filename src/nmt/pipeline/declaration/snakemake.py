"""Snakemake's rules, workflow/rules/stages.smk, rendered from the declared stages: one plain
rule a stage (its wildcards the per dimensions, its code as inputs, the values of the keys it
declares as a param) and `rule all` over the stages declared `target`. The rules call the
helpers of workflow/rules/common.smk, and `declared_values` here at run time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nmt.pipeline.declaration.declared import (
    CODE,
    DECLARATION,
    DEFAULT_MODELS,
    PLACEHOLDER,
    Stage,
    is_dir,
    load,
    lookup,
    placeholders,
)
from nmt.pipeline.declaration.dvc import links_prefix, model_modules

SNAKEMAKE_RULES = Path("workflow/rules/stages.smk")
CONDA_ENV = "../envs/nmt.yaml"  # workflow/envs/nmt.yaml, relative to the rules file
# What workflow/Snakefile names before it includes the rules: the lists a placeholder that is
# not one of the job's wildcards expands over ({bench}: bench.recipe).
LIST_NAMES = {"recipe": "RECIPES", "model": "MODELS", "seed": "SEEDS", "bench": "BENCH"}
WIDTH = 100


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
    """Its cmd with Snakemake's names: {recipe} is {wildcards.recipe}, {bench} {params.bench},
    {gpu_mem_mb} {resources.gpu_mem_mb}; Snakemake's own ({threads}, ...) stay (`check` let
    no other through); stderr goes to the rule's log."""
    def name(m):
        n = m.group(1)
        if n in stage.per:
            return f"{{wildcards.{n}}}"
        if n == "bench":
            return "{params.bench}"
        if n == "gpu_mem_mb":
            return "{resources.gpu_mem_mb}"
        return m.group(0)
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
    """Modules as input items: their files."""
    return [quote(f"{CODE}/{c}") for c in modules]


def output_expr(stage: Stage, path: str) -> str:
    names = [n for n in placeholders(path) if n not in stage.per]
    category = stage.report.get(path)
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
    conda, shell. A stage DVC runs every time (always_changed) the Snakefile runs when it reads
    the workflow, and its output changes only when its text does: its rule has no input and no
    params, so that an edit of its code or a touched dependency (which would make Snakemake run
    it, and after it everything that reads its output) plans nothing; it runs only where the
    file is missing."""
    lines = [f"rule {stage.name}:"]
    if not stage.always_changed:
        lines += ["    input:"] + [f"        {path_expr(p, names)},"
                                   for p, names in input_templates(stage, stages)]
        own = [c for c in stage.code if c not in stage.shared_code]
        # a job of one model: that model's code too (MODEL_CODE, by the job's wildcard)
        lines += ["        code=lambda wildcards: [" if stage.model_code else "        code=[",
                  "            *SHARED_CODE,"]
        lines += [f"            {item}," for item in code_items(own)]
        key = (f'f"{links_prefix(stage)}{{wildcards.model}}"' if stage.runs_checks
               else "wildcards.model")
        lines += [f"            *MODEL_CODE[{key}],"] if stage.model_code else []
        lines += ["        ],"]
    lines += ["    output:"] + [f"        {output_expr(stage, p)}," for p in stage.outputs()]
    lines += constraint_lines(stage)
    declared = {k: v for k, v in (("params", stage.params), ("recipe_params",
                stage.recipe_params), ("bench_params", stage.bench_params),
                ("corpus_params", stage.corpus_params)) if v and not stage.always_changed}
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
    """workflow/rules/stages.smk's text for the declaration at path."""
    stages = load(path)
    shared = next(iter(stages.values())).shared_code
    head = ["# The modules every stage computes from (params.yaml read into values:",
            "# nmt.pipeline.code.SHARED); each rule adds those its stage's",
            "# computation imports. The command line around it (nmt.cli, the checks) is none.",
            "SHARED_CODE = ["] + [f"    {item}," for item in code_items(shared)] + ["]", "",
            "# Each model's modules (its registry entry and what that names): a job of one",
            "# model (train, evaluate, export) runs its own model's only; verify-<model>: and",
            "# its check sets (verify's jobs).",
            "MODEL_CODE = {"]
    for model, modules in model_modules(stages, path).items():
        head += [f"    {quote(model)}: ["] + [f"        {item}," for item in code_items(modules)]
        head += ["    ],"]
    head += ["}"]
    return "\n\n".join([SMK_HEADER + "\n" + "\n".join(head) + "\n"]
                       + [smk_rule(s, stages) for s in stages.values()] + [all_rule(stages)])
