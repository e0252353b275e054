"""The stage contract is kept: workflow/stages.yaml declares what every stage reads and runs,
and both orchestrators re-run exactly the stages a change touches.

- dvc.yaml and Snakemake's rules (workflow/rules/stages.smk) are the rendering of the
  declaration (no hand edits drift from it);
- every stage, run at tiny size under both tools, read no params key it does not declare and
  loaded no module beyond the code derived from its imports (NMT_TRACK_READS records them;
  see nmt.cli);
- changing any one params key (or any one module) in a completed tiny pipeline makes
  `dvc status` name exactly the stages that declare it, and `snakemake -n` exactly those and
  what depends on them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO, edit_params
from forkserver import ForkServer, Pending
from nmt.cli import main
from nmt.core.errors import NmtError
from nmt.pipeline import declaration
from nmt.pipeline.code import kind_code
from nmt.pipeline.corpora.kinds import KINDS
from nmt.pipeline.corpus import corpus_settings
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from nmt.stages import sources
from tiny import BIN, run, scratch_copy

pytestmark = pytest.mark.slow
STAGES = declaration.load(REPO / declaration.DECLARATION)


@pytest.mark.parametrize("path", ["dvc.yaml", "workflow/rules/stages.smk", "docs/pipeline.md"])
def test_dvc_yaml_and_snakemake_rules_are_rendered_from_the_declaration(path):
    rendered = declaration.rendered(REPO / declaration.DECLARATION)
    assert (REPO / path).read_text() == rendered[Path(path)], \
        f"{path} is stale: run `nmt stages --write`"


def test_a_snakemake_rule_reads_as_its_stage(tmp_path):
    """{recipe} is the job's wildcard, {bench} a param, Snakemake's own names ({threads})
    stay; a placeholder neither tool fills is refused, not rendered into a broken rule."""
    declared = tmp_path / "workflow" / "stages.yaml"
    declared.parent.mkdir()
    declared.write_text(yaml.safe_dump({"stages": {
        "job": {"per": ["recipe"], "cmd": "nmt x --recipe {recipe} --bench {bench} -j {threads}",
                "recipe_params": ["train.devices"], "deps": ["results"],
                "outs": ["out/{recipe}.json"], "threads": 4, "gpu": "train.devices"},
        "all": {"cmd": "nmt y", "deps": ["out"], "outs": ["y.txt"]}}}))
    # Their code, from a source tree of their own: job's computation uses nmt.x.
    nmt = tmp_path / "src" / "nmt"
    job = "from nmt import x\n\nNAME = x.__name__\n"
    for rel, text in {"__init__.py": "", "cli.py": "", "x.py": "", "stages/__init__.py": "",
                      "stages/job.py": job, "stages/all.py": ""}.items():
        (nmt / rel).parent.mkdir(parents=True, exist_ok=True)
        (nmt / rel).write_text(text)
    text = declaration.render_snakemake(declared)
    for line in ['rule job:', '"results",', '"src/nmt/stages/job.py",', '"src/nmt/x.py",',
                 '"out/{recipe}.json",',
                 'values=declared(recipe_params=["train.devices"]),', "bench=BENCH,",
                 "threads: 4", 'gpu=from_recipe("train.devices"),',
                 '"nmt x --recipe {wildcards.recipe} --bench {params.bench} -j {threads} 2> {log}"',
                 'expand("out/{recipe}.json", recipe=RECIPES),']:
        assert line in text, line
    declared.write_text(declared.read_text().replace("-j {threads}", "-j {jobs}"))
    with pytest.raises(ValueError, match="jobs"):
        declaration.render_snakemake(declared)


def test_a_stage_of_some_models_runs_over_their_list():
    """export (models_from: pipeline.export): DVC's matrix and Snakemake's wildcard take the
    models from that list, so only its runs have a job."""
    export = STAGES["export"]
    dvc = yaml.safe_load(declaration.render_dvc(REPO / declaration.DECLARATION))["stages"]["export"]
    assert dvc["matrix"] == {"recipe": "${pipeline.recipes}", "model": "${pipeline.export}",
                             "seed": "${pipeline.seeds}"}
    assert '        model=listed("pipeline.export"),' in declaration.smk_rule(export, STAGES)
    params = {"pipeline": {"recipes": ["a"], "models": ["baseline", "scratch"], "seeds": [0],
                           "export": ["scratch"]}}
    assert export.per_values(params) == {"recipe": ["a"], "model": ["scratch"], "seed": [0]}


def test_with_no_models_to_export_neither_tool_has_an_export_job(tmp_path, mirror):
    """pipeline.export: [] (the default): DVC renders no export stage and Snakemake plans no
    export job; the tiny pipeline of the tests below exports scratch."""
    root = scratch_copy(tmp_path)
    edit_params(root / "params.yaml", pipeline={"export": []})
    assert "export@" not in run(["dvc", "stage", "list"], root)
    plan = run(["snakemake", "-n", "--cores", "2"], root)
    assert "rule train:" in plan and "rule export:" not in plan


# ---- reads: what each stage used against what it declares ---------------------------------

def leaves(tree, prefix="") -> set[str]:
    """Dotted paths of every value in a nested mapping."""
    if not isinstance(tree, dict):
        return {prefix.rstrip(".")}
    return set().union(*(leaves(v, f"{prefix}{k}.") for k, v in tree.items()))


def under(keys: list[str], tree: dict) -> set[str]:
    """Declared keys as leaf paths: a section stands for every key under it."""
    out = set()
    for k in keys:
        out |= leaves(tree) if k == "params.yaml" else leaves(declaration.lookup(tree, k), f"{k}.")
    return out


def module_names(modules: list[str]) -> set[str]:
    """As a stage's derived code names modules: by file (nmt.stages.vocab -> stages/vocab.py),
    a package's own __init__ by that file (nmt -> __init__.py, nmt.core ->
    core/__init__.py)."""
    out = set()
    for m in modules:
        path = "/".join(m.split(".")[1:])
        if not path or (REPO / declaration.CODE / path).is_dir():
            out.add(f"{path}/__init__.py".lstrip("/"))
        else:
            out.add(path + ".py")
    return out


# The registry imports every model's entry to find the names (nmt.models.registry.discovered):
# a job of one model loads the others' entries, which declare and run nothing of theirs.
ENTRIES = {f"models/entries/{m}.py" for m in declaration.registered(REPO / "src")}
# The corpus kind in use (the tiny pipeline's: multi30k) runs in the stages that read it by its
# name, which no derived code follows: sources records its code and settings, and the stages
# that run it depend on that record (declaration.kind_readers), which stands for them.
KIND = KINDS[load_params(REPO / "params.yaml")["data"]["corpus"]]
KIND_CODE = set(kind_code(KIND.__name__.rpartition(".")[2], REPO / "src"))
RECORD = Path(sources.OUT)
ALWAYS = "sources"  # records the corpus; DVC runs it every time, Snakemake as it reads the workflow
RECORD_READERS = {ALWAYS, *declaration.kind_readers(STAGES)}


@pytest.mark.parametrize("tool", ["dvc_run", "snakemake_run"])
def test_every_stage_declares_what_it_reads(tool, request):
    root = request.getfixturevalue(tool)
    params = load_params(root / "params.yaml")
    seen, unused = set(), []
    for line in map(json.loads, (root / "reads.jsonl").read_text().splitlines()):
        stage = STAGES[line["stage"]]
        seen.add(stage.name)
        resolved = resolve(params, params["pipeline"]["recipes"][0])
        # Its code is derived from the imports it spells (nmt.pipeline.declaration): what it
        # really loaded must be within that and its command line's (nmt.cli, the checks), or a
        # change could miss it (an import by a computed name, say, which the parser cannot see).
        around = declaration.command_code(stage.name, (REPO / declaration.CODE).parent)
        model = stage.model_code.get(line.get("model"), [])  # a job of one model: its code
        kind = KIND_CODE if stage.name in RECORD_READERS else set()  # through the record
        allowed = set(stage.code) | set(model) | set(around) | ENTRIES | kind
        extra = module_names(line["modules"]) - allowed
        assert not extra, f"{stage.name} loads modules its derived code lacks: {sorted(extra)}"
        # A stage with corpus_params reads pipeline.recipes[0], the {corpus} of its declared
        # params file (params/{corpus}.yaml): declared by that file's name.
        kind_keys = list(KIND.SETTINGS) if stage.name in RECORD_READERS else []  # recorded
        keys = stage.params + (["pipeline.recipes"] if stage.corpus_params else []) + kind_keys
        extra = set(line["params"]) - under(keys, params)
        assert not extra, f"{stage.name} reads params.yaml keys it does not declare: {extra}"
        recipe_keys = stage.recipe_params + stage.bench_params + stage.corpus_params + kind_keys
        if "recipes" in stage.params:  # it resolves recipes itself from the sections it declares
            recipe_keys = recipe_keys + [k for k in stage.params if k in resolved]
        extra = set(line["recipe_params"]) - under(recipe_keys, resolved)
        assert not extra, f"{stage.name} reads recipe keys it does not declare: {extra}"
        unused += [f"{stage.name}: {k}" for k in sorted(
            under(stage.params, params) - set(line["params"]) if "params.yaml"
            not in stage.params else ())]
    # Under Snakemake nothing consumes the files of names and config, so they never run
    # there; the Snakefile writes params/sources.sha256 itself, when it reads the workflow.
    assert seen == set(STAGES) - ({"names", "config", "sources"} if tool == "snakemake_run"
                                  else set())
    print("declared, never read:", *sorted(set(unused)), sep="\n  ")


# ---- re-runs: one change at a time in a completed pipeline ---------------------------------

def jobs(params: dict) -> dict[str, tuple[declaration.Stage, dict]]:
    """Every job of the pipeline by DVC's name (train@published-scratch-0)."""
    out = {}
    for s in STAGES.values():
        for combo in itertools.product(*s.per_values(params).values()):
            values = dict(zip(s.per, combo, strict=True))
            name = s.name + ("@" + "-".join(map(str, combo)) if combo else "")
            out[name] = (s, values)
    return out


def expand(path: str, names: list[str], lists: dict, bench: str) -> list[str]:
    """path for every combination of the values of names; other placeholders stay."""
    out = []
    for combo in itertools.product(*([bench] if n == "bench" else lists[n] for n in names)):
        value = dict(zip(names, map(str, combo), strict=True))
        out.append(declaration.PLACEHOLDER.sub(
            lambda m, v=value: v.get(m.group(1), m.group(0)), path))
    return out


def snakemake_inputs(stage: declaration.Stage, lists: dict, bench: str,
                     model: str | None = None) -> list[str]:
    """The inputs of the stage's rule in stages.smk, expanded (its wildcards left in): its
    code files (a job of one model: its model's too) and deps, the way Snakemake reads them."""
    return stage.code_paths(model=model) + [
        q for p, names in declaration.input_templates(stage, STAGES)
        for q in expand(p, names, lists, bench)]


def downstream(direct: set[str], params: dict) -> set[str]:
    """direct and every job that reads what they write (Snakemake's view of a change)."""
    bench, lists = params["bench"]["recipe"], {d: params["pipeline"][f"{d}s"]
                                               for d in declaration.DIMENSIONS}
    all_jobs = jobs(params)

    def files(job, kind):
        s, v = all_jobs[job]
        if kind == "outs":
            paths = [o.replace("{bench}", bench) for o in s.outputs()]
        else:
            paths = snakemake_inputs(s, lists, bench, v.get("model"))
        return {p.format(**v) for p in paths}

    deps = {job: files(job, "deps") for job in all_jobs}
    found, todo = set(direct), list(direct)
    while todo:
        made = files(todo.pop(), "outs")
        for job in all_jobs:
            if job not in found and deps[job] & made:
                found.add(job)
                todo.append(job)
    return found


def expected(old: dict, new: dict) -> set[str]:
    """The jobs that declare a value the edit changed: a params.yaml key, or a key of their
    recipe's resolved settings (params/<recipe>.yaml)."""
    hits = set()
    for name, (s, v) in jobs(new).items():
        if any(leaf_or_none(old, k) != leaf_or_none(new, k) for k in under(s.params, old)):
            hits.add(name)
        for keys, recipe in ((s.recipe_params, v.get("recipe")),
                             (s.bench_params, new["bench"]["recipe"]),
                             (s.corpus_params, new["pipeline"]["recipes"][0])):
            if recipe and keys:
                before, after = resolve(old, recipe), resolve(new, recipe)
                if any(leaf_or_none(before, k) != leaf_or_none(after, k)
                       for k in under(keys, before)):
                    hits.add(name)
    # sources: DVC runs it always (left out of dvc_changed), Snakemake at parse time; what
    # reads its record re-runs when the record changes (the kind's settings, the files' names).
    if record_text(old) != record_text(new):
        hits |= {name for name, (s, _) in jobs(new).items() if s.name in RECORD_READERS}
    return {h for h in hits if not h.startswith("config@") and h != ALWAYS}


def record_text(params: dict) -> str:
    """params/sources.sha256's text for a pipeline's params (the repository's code)."""
    return sources.describe(corpus_settings(params)["data"], REPO, REPO / "src")


class Record:
    """The corpus record of the two copies. DVC runs the sources stage first in every `dvc
    repro` and Snakemake when it reads the workflow, but `dvc status` runs nothing: `refresh`
    does for DVC's copy what its repro would first (Snakemake's dry run does it itself, in its
    own copy). `restore` puts both records back as they were, time included, so that a
    case's edit, once undone, leaves Snakemake no newer input than data/raw."""

    def __init__(self, dvc_root: Path, snakemake_root: Path):
        self.dvc_root = dvc_root
        self.saved = {root: ((root / RECORD).read_bytes(), (root / RECORD).stat())
                      for root in (dvc_root, snakemake_root)}

    def refresh(self) -> None:
        params = load_params(self.dvc_root / "params.yaml")
        sources.refresh(corpus_settings(params), self.dvc_root / RECORD, self.dvc_root,
                        self.dvc_root / "src")

    def restore(self) -> None:
        for root, (data, st) in self.saved.items():
            (root / RECORD).write_bytes(data)
            os.utime(root / RECORD, ns=(st.st_atime_ns, st.st_mtime_ns))


def leaf_or_none(tree, key):
    try:
        return declaration.lookup(tree, key)
    except KeyError:
        return None


# Keys that cannot change alone and stay valid, and the partner that changes with them
# (under the same prefix: the top level or recipes.<name>).
PARTNERS = {"data.source_lang": ("data.target_lang", "de"),
            "data.target_lang": ("data.source_lang", "en"),
            "model.tie_embeddings": ("vocab.kind", "bpe"),
            "vocab.kind": ("model.tie_embeddings", False)}
TOGGLE = {"vocab.kind": {"word": "bpe", "bpe": "word"},
          "train.batch_by": {"sentences": "tokens", "tokens": "sentences"},
          "train.device": {"auto": "cpu", "cpu": "auto"},
          "train.precision": {"auto": "fp32", "fp32": "bf16", "bf16": "fp32"},
          "train.compile": {"auto": False},
          "train.cuda_graphs": {"auto": False},
          "train.pad_multiple": {"auto": 8},
          "train.attention_kernels": {"route": "any", "any": "route"},
          "model.attention": {"prefix": "causal", "causal": "prefix"},
          "evaluate.unknown_words": {"copy": "mark", "mark": "copy"},
          "train.schedule": {"inverse_sqrt": "linear", "linear": "cosine",
                             "cosine": "inverse_sqrt"}}


def base(key: str) -> tuple[str, str]:
    """(prefix, section key): recipes.tuned.model.d_model -> (recipes.tuned., model.d_model)."""
    if key.startswith("recipes."):
        name, rest = key.removeprefix("recipes.").split(".", 1)
        return f"recipes.{name}.", rest
    return "", key


def candidates(key: str, value):
    """New values to try for a key, first valid wins."""
    if key in ("data.source_lang", "data.target_lang"):
        return ["en" if value == "de" else "de"]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, value - 1]
    if isinstance(value, float):
        return [value * 0.5, round(value + 0.1, 6)]
    if isinstance(value, list):
        return [list(reversed(value)), [v * 1.01 if isinstance(v, float) else v for v in value]]
    return [TOGGLE.get(base(key)[1], {}).get(value, value + "x")]


def with_value(params: dict, key: str, value) -> dict:
    out = json.loads(json.dumps(params))
    prefix, rest = base(key)
    partner = [(prefix + PARTNERS[rest][0], PARTNERS[rest][1])] if rest in PARTNERS else []
    for k, v in [(key, value)] + partner:
        *path, last = k.split(".")
        declaration.lookup(out, ".".join(path))[last] = v
    return out


# ALWAYS (above) is always_changed, so `dvc status` lists it whatever changed; Snakemake's rule
# of it has no input and never runs where the Snakefile wrote its record.


def dvc_changed(root: Path, config: bool = False) -> set[str]:
    """Stages `dvc status` names; the config stages (re-run after every params edit by the
    test itself) only when asked for."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        names = {name.rpartition("dvc.yaml:")[2] for name in repo.status()}
    return {name for name in names if (config or not name.startswith("config@"))
            and name != ALWAYS}


@pytest.fixture
def snakemake(snakemake_run):
    """Snakemake, imported once (forkserver): each `snakemake -n` of the tests below is a fork
    of it, not a new process paying the imports again (~1.4 s of CPU, ~100 dry runs)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}",
           "PYTHONPATH": str(snakemake_run / "src")}
    with ForkServer("snakemake.cli:main", snakemake_run, env) as server:
        yield server


def start_dry_run(snakemake: ForkServer) -> Pending:
    """`snakemake -n` started in the Snakemake copy; snakemake_jobs reads it. It runs while
    the test asks DVC in this process: the two take about as long, and CI has two cores."""
    return snakemake.start(["-n", "--cores", "2"])


def snakemake_jobs(snakemake: ForkServer, dry_run: Pending) -> set[str]:
    """The jobs a started dry run would run, named as DVC names them."""
    out = snakemake.finish(dry_run)
    found, rule = set(), None
    for line in out.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m.group(1)
            found.add(rule)
        elif (m := re.match(r"^\s+wildcards: (.*)$", line)) and rule:
            values = dict(kv.split("=") for kv in m.group(1).split(", "))
            found.discard(rule)
            found.add(rule + "@" + "-".join(values[d] for d in STAGES[rule].per))
    return found - {"all", "default"}


def resolve_recipes(root: Path, params_file: Path, recipes: list[str]) -> None:
    """What `dvc repro config` does, in process: params/<recipe>.yaml of every recipe."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for r in recipes:
            assert main(["-q", "--params", str(params_file), "config", "--recipe", r]) == 0
    finally:
        os.chdir(cwd)


SKIP = {"pipeline.recipes", "pipeline.models", "pipeline.seeds", "bench.recipe",  # add runs
        # adds or removes export jobs as pipeline.models does runs: an edit changes which
        # jobs exist, not a value a job declares (config declares the pipeline section)
        "pipeline.export",
        # another corpus needs its files or dataset too: tests/test_corpus_pipeline.py
        "data.corpus",
        # false is valid only where no recipe of params.yaml reads word vocabularies (every
        # recipe is checked, the ablation tuned_no_bpe too); tokenize declares it, and
        # tests/test_corpus_pipeline.py runs pipelines with words: false
        "tokenize.words",
        # rotary is valid only in a pipeline that trains scratch alone (params.check_positions),
        # and this one trains every model; the stages that read it declare the whole model
        # section, whose other keys this test changes one by one
        "model.positions"}


def keys_to_change(params: dict) -> list[str]:
    """Every key of params.yaml but those that add or remove runs; of the recipes, those the
    pipeline runs (an override of a recipe outside pipeline.recipes changes no stage)."""
    keys = leaves(params) - SKIP
    run = tuple(f"recipes.{r}." for r in params["pipeline"]["recipes"])
    return sorted(k for k in keys if not k.startswith("recipes.") or k.startswith(run))


def declared_by(key: str) -> tuple[str, frozenset]:
    """What a key reaches the tools through: its prefix (the top level or recipes.<name>.) and
    every (stage, list, declared entry) that holds it (train.lr: each stage's `train`). Keys
    alike here are alike to DVC and Snakemake, which see the rendered entries, not the key."""
    prefix, rest = base(key)
    return prefix, frozenset(
        (name, kind, entry) for name, stage in STAGES.items()
        for kind in ("params", "recipe_params", "bench_params", "corpus_params")
        for entry in getattr(stage, kind)
        if (key if kind == "params" else rest) in (entry,) or
        (key if kind == "params" else rest).startswith(f"{entry}."))


def key_cases(params: dict) -> list[list[str]]:
    """The keys to change, grouped by declared_by: one case a group (at tiny size 80 keys,
    27 cases), as the changed-module test takes one module of each set of stages that run it."""
    groups: dict[tuple, list[str]] = {}
    for key in keys_to_change(params):
        groups.setdefault(declared_by(key), []).append(key)
    return list(groups.values())


def test_a_changed_key_reruns_exactly_the_stages_that_declare_it(dvc_run, snakemake_run,
                                                                  snakemake):
    original = {root: (root / "params.yaml").read_text() for root in (dvc_run, snakemake_run)}
    old = load_params(dvc_run / "params.yaml")
    recipes, problems, tried = old["pipeline"]["recipes"], [], []
    record = Record(dvc_run, snakemake_run)
    for case in key_cases(old):
        change = valid_change(old, case, dvc_run / "params.yaml")
        if change is None:
            problems.append(f"{', '.join(case)}: no valid change found")
            continue
        key, new = change
        tried.append(key)
        (snakemake_run / "params.yaml").write_text(yaml.safe_dump(new, sort_keys=False))
        dry_run = start_dry_run(snakemake)
        resolve_recipes(dvc_run, dvc_run / "params.yaml", recipes)
        record.refresh()
        want = expected(old, new)
        got_dvc, got_smk = dvc_changed(dvc_run), snakemake_jobs(snakemake, dry_run)
        record.restore()
        if got_dvc != want:
            problems.append(f"{key}: dvc status {sorted(got_dvc ^ want)} differ")
        if got_smk != (want_smk := downstream(want, new)):
            problems.append(f"{key}: snakemake -n {sorted(got_smk ^ want_smk)}")
    # Each key's edit is made to the original and its recipes resolved afresh (above), so the
    # copies go back to the original once, at the end.
    for root, text in original.items():
        (root / "params.yaml").write_text(text)
    resolve_recipes(dvc_run, dvc_run / "params.yaml", recipes)
    assert not problems, "\n".join(problems)
    assert len(tried) >= 20


def valid_change(old: dict, case: list[str], params_file: Path) -> tuple[str, dict] | None:
    """(key, params) for the first key of a case that takes a new value params.yaml accepts
    (written to params_file); None if none does."""
    for key in case:
        for value in candidates(key, declaration.lookup(old, key)):
            if value == declaration.lookup(old, key):
                continue
            new = with_value(old, key, value)
            try:
                params_file.write_text(yaml.safe_dump(new, sort_keys=False))
                load_params(params_file)
                return key, new
            except NmtError:
                continue
    return None


# Issue 67's goals: an edit of the command line, of a command that is no stage, of the messages,
# preflight or the orchestrator guard re-runs no stage; each is tried besides the table's rows.
NO_STAGE = ["cli.py", "commands/translate.py", "core/errors.py", "pipeline/preflight.py",
            "pipeline/orchestrators.py", "pipeline/params.py"]


def test_a_changed_module_reruns_exactly_the_stages_that_run_it(dvc_run, snakemake_run,
                                                                snakemake):
    """A changed module re-runs the stages of its row of docs/pipeline.md's table (the stages
    whose derived code holds it), under both tools, and nothing where the
    row says nothing. One module of each row is changed (the same rendered lists carry a
    row's modules to DVC and Snakemake; which stages run a module is the derivation's, tested
    in test_declaration.py); the modules the goals name as re-running nothing are changed
    together with that row's, as one case (each costs a `dvc status` and a `snakemake -n`:
    apart, six more cases showed the same empty plans)."""
    params = load_params(dvc_run / "params.yaml")
    problems = []
    rerun = declaration.rerun_by(STAGES, REPO / "src")
    cases: dict[tuple, list[str]] = {}
    for module, names in rerun.items():
        cases.setdefault(names, [module])
    assert len(cases) >= 20 and () in cases  # every row; one re-runs nothing
    assert not [m for m in NO_STAGE if rerun[m]], "a module of the command line re-runs stages"
    cases[()] = sorted({*cases[()], *NO_STAGE})
    record, corpus = Record(dvc_run, snakemake_run), params["data"]["corpus"]
    for codes in sorted(cases.values()):
        rels = [f"src/nmt/{code}" for code in codes]
        saved = {(root, rel): ((root / rel).read_bytes(), (root / rel).stat())
                 for root in (dvc_run, snakemake_run) for rel in rels}
        for root, rel in saved:
            with open(root / rel, "a") as f:
                f.write("\n# a change\n")
        want = {name for name, (s, v) in jobs(params).items() for code in codes
                for j in rerun[code] if s.name == j.stage
                and (j.models is None or v["model"] in j.models)
                and (j.kinds is None or corpus in j.kinds)}
        dry_run = start_dry_run(snakemake)
        record.refresh()
        got_dvc = dvc_changed(dvc_run, config=True)
        got_smk = snakemake_jobs(snakemake, dry_run)
        record.restore()
        changed = ", ".join(codes)
        if got_dvc != want - {ALWAYS}:
            problems.append(f"{changed}: dvc status {sorted(got_dvc ^ want)}")
        # Under Snakemake nothing consumes the files of names and config, so they never run,
        # and the Snakefile runs sources itself.
        want_smk = downstream({w for w in want if w not in ("names", ALWAYS)
                               and not w.startswith("config@")}, params)
        if got_smk != want_smk:
            problems.append(f"{changed}: snakemake -n {sorted(got_smk ^ want_smk)}")
        trainings = sorted(j.removeprefix("train@") for j in got_dvc if j.startswith("train@"))
        print(f"{changed}: dvc status {len(got_dvc)} jobs (train: {', '.join(trainings) or '-'}),"
              f" snakemake -n {len(got_smk)}")  # the measured table (pytest -s)
        for (root, rel), (data, st) in saved.items():
            (root / rel).write_bytes(data)
            os.utime(root / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not problems, "\n".join(problems)
    shutil.rmtree(dvc_run / ".dvc" / "tmp", ignore_errors=True)


# What the next test registers: a corpus kind (the files kind under another name, with its
# schema and params.yaml default) and a model (an entry and a module; the schema's model names
# come from the registry), each in the files a person adds or edits for it.
TSV_KIND = '''"""A corpus kind: the files kind under another name."""

from nmt.pipeline.corpora import files

SETTINGS = ("data.tsv",)
check, preflight, describe, vet, download, title = (
    files.check, files.preflight, files.describe, files.vet, files.download, files.title)
'''
SCHEMA_EDITS = [("corpus: {enum: [multi30k, files, huggingface]}\n",
                 "corpus: {enum: [multi30k, files, huggingface, tsv]}\n"
                 "      tsv: {type: object}\n"),
                ("required: [corpus, files, huggingface,",
                 "required: [corpus, files, huggingface, tsv,")]
TOY_MODEL = {"src/nmt/models/toy.py": '"""A toy model."""\n\nimport torch.nn as nn\n\n\n'
                                      "class Toy(nn.Module):\n    pass\n",
             "src/nmt/models/entries/toy.py": (
                 "from nmt.models.registry import ModelEntry\n\n"
                 'ENTRY = ModelEntry("toy", order=3, model="nmt.models.toy:Toy", '
                 'encoder_decoder=True, reads_bos=False, exports=False, '
                 'param_count="nmt.models.toy:Toy", checks=())\n')}


def add_corpus_kind(root: Path) -> None:
    (root / "src/nmt/pipeline/corpora/tsv.py").write_text(TSV_KIND)
    schema = (root / "workflow/schemas/params.schema.yaml").read_text()
    for old, new in SCHEMA_EDITS:
        assert old in schema, old
        schema = schema.replace(old, new)
    (root / "workflow/schemas/params.schema.yaml").write_text(schema)
    edit_params(root / "params.yaml", data={"tsv": {}})


def add_model(root: Path) -> None:
    for rel, text in TOY_MODEL.items():
        (root / rel).write_text(text)


# (what is added, dvc status, snakemake -n): the config stages validate every section (the new
# corpus default too), the report declares the whole data section, bench times every model
# of the registry that pipeline.models lists but builds them all, and the report reads it.
REGISTERED = [(add_corpus_kind, {"config@published", "config@tuned", "report"}, {"report"}),
              (add_model, {"bench"}, {"bench", "report"})]


@pytest.mark.parametrize("add, want_dvc, want_smk", REGISTERED, ids=["corpus kind", "model"])
def test_registering_a_corpus_kind_or_model_reruns_no_data_stage_and_no_training(
        dvc_run, snakemake_run, snakemake, add, want_dvc, want_smk):
    """Issue 67's goal, in a completed pipeline that reads another kind and trains other
    models: a new kind or model (its files, then `nmt stages --write`) re-runs no data stage,
    no verify, training, evaluation or export."""
    roots = (dvc_run, snakemake_run)
    edited = ["workflow/schemas/params.schema.yaml", "params.yaml", "dvc.yaml",
              "workflow/rules/stages.smk", "docs/pipeline.md"]
    saved = {(root, rel): ((root / rel).read_bytes(), (root / rel).stat())
             for root in roots for rel in edited if (root / rel).is_file()}
    recipes = load_params(dvc_run / "params.yaml")["pipeline"]["recipes"]
    added = [Path("src/nmt/pipeline/corpora/tsv.py"), *map(Path, TOY_MODEL)]
    record = Record(dvc_run, snakemake_run)
    try:
        for root in roots:
            add(root)
            run(["nmt", "stages", "--write"], root)
        dry_run = start_dry_run(snakemake)
        resolve_recipes(dvc_run, dvc_run / "params.yaml", recipes)
        record.refresh()
        got_dvc = dvc_changed(dvc_run, config=True)
        got_smk = snakemake_jobs(snakemake, dry_run)
        print(f"{add.__name__}: dvc status {sorted(got_dvc)}, snakemake -n {sorted(got_smk)}")
        assert (got_dvc, got_smk) == (want_dvc, want_smk)
    finally:
        for root in roots:
            for path in added:
                (root / path).unlink(missing_ok=True)
                for cached in (root / path.parent / "__pycache__").glob(f"{path.stem}.*"):
                    cached.unlink()
            shutil.rmtree(root / "workflow" / "code" / "toy", ignore_errors=True)
            shutil.rmtree(root / "workflow" / "code" / "verify-toy", ignore_errors=True)
        for (root, rel), (data, st) in saved.items():
            (root / rel).write_bytes(data)
            os.utime(root / rel, ns=(st.st_atime_ns, st.st_mtime_ns))
        resolve_recipes(dvc_run, dvc_run / "params.yaml", recipes)
        record.restore()
