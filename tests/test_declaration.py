"""One declaration, truly one: what repeats workflow/stages.yaml is derived from it, or checked
against it here, so that adding a stage means a module, one declaration entry and its params.

- `nmt <stage>`: one subcommand a module of nmt.stages (nmt.cli builds them from the modules,
  whose names are the declared stages'), the orchestrator guard over the same names;
- Snakemake's `rule all`: the outputs of the stages declared `target` (rendered);
- the lists that name params sections or output folders agree with the schema and the
  declaration;
- the code each stage runs is derived from the imports, not declared: a planted import, an
  added or a moved module changes what it renders, with no edit of the declaration;
- an entry that a tool could not run as declared is refused as the declaration is read,
  before either file is rendered;
- a toy stage added to a copy of the repository (a module, a declaration entry, a params
  key and its schema entry) runs as `nmt toy`, under `dvc repro` and under `snakemake`, and
  reads only what it declares.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import REPO, edit_params
from nmt import cli
from nmt.models import registry
from nmt.pipeline import code, declaration, preflight, recipes
from tiny import run, scratch_copy

STAGES = declaration.load(REPO / declaration.DECLARATION)
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "params.schema.yaml").read_text())


def test_the_cli_has_one_subcommand_a_declared_stage_and_guards_them_all():
    assert set(cli.STAGES) == set(STAGES)
    for name, stage in STAGES.items():
        assert stage.cmd.split()[:2] == ["nmt", name], name  # its command is its subcommand
    for name in cli.STAGES + cli.COMMANDS:  # the commands that are no stage say the same
        module = cli.module(name)
        assert module.HELP and callable(module.arguments) and callable(module.command), name
    # Only the named command's module is imported to build the parser (nmt train's launcher
    # stays torch-free, tests/test_distributed.py); `nmt --help` builds every one.
    assert cli.named_command(["--params", "p.yaml", "-q", "train", "--model", "x"]) == "train"
    actions = cli.build_parser(["vocab"])._subparsers._group_actions[0].choices
    assert set(actions) == {"vocab"}
    actions = cli.build_parser(["--help"])._subparsers._group_actions[0].choices
    assert set(actions) == set(STAGES) | set(cli.COMMANDS)


def test_rule_all_asks_for_the_outputs_of_the_declared_targets():
    """report and export's runs; names and config, which nothing consumes, stay un-run under
    Snakemake."""
    assert {n for n, s in STAGES.items() if s.target} == {"report", "export"}
    rules = declaration.render_snakemake(REPO / declaration.DECLARATION)
    rule_all = rules[rules.index("rule all:"):]
    assert "rules.report.output," in rule_all
    assert re.search(r'expand\(rules\.export\.output,\s+recipe=RECIPES, '
                     r'model=lookup\(config, "pipeline\.export"\), seed=SEEDS\)', rule_all)
    assert "rules.config" not in rule_all and "rules.names" not in rule_all
    assert not re.search(r"^rule all:", (REPO / "workflow/Snakefile").read_text(), re.M)


def test_config_declares_every_section_of_params():
    """The config stage runs first after any params edit and validates it: every section the
    schema knows is among its params (not `params.yaml` whole: it resolves the recipes from
    the sections it declares, tests/test_contract.py)."""
    assert STAGES["config"].params == list(SCHEMA["properties"])


def test_recipe_sections_are_the_sections_the_schema_lets_a_recipe_override():
    recipe = SCHEMA["properties"]["recipes"]["additionalProperties"]["properties"]
    sections = {k for k, v in recipe.items() if "$ref" in v}
    assert set(recipes.RECIPE_SECTIONS) == sections
    assert set(recipes.RECIPE_SECTIONS) | set(recipes.NOT_RESOLVED) | {"report"} == set(
        SCHEMA["required"])


def test_preflight_checks_every_folder_a_stage_writes_into():
    tops = {Path(p).parts[0] for s in STAGES.values() for p in s.outputs()}
    assert set(preflight.OUTPUT_FOLDERS) == tops | {"logs"}  # logs: Snakemake's


# ---- code: derived from the imports ---------------------------------------------------------

def source_copy(tmp_path: Path) -> Path:
    """src/nmt and workflow/stages.yaml copied under tmp_path; the copy's src folder."""
    shutil.copytree(REPO / "src" / "nmt", tmp_path / "src" / "nmt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "workflow").mkdir()
    shutil.copy2(REPO / declaration.DECLARATION, tmp_path / declaration.DECLARATION)
    return tmp_path / "src"


def derived(src: Path) -> dict[str, list[str]]:
    return {n: s.code for n, s in declaration.load(src.parent / declaration.DECLARATION).items()}


def test_every_stage_runs_the_shared_code_and_its_own_module_first():
    shared = STAGES["vocab"].shared_code
    for name, stage in STAGES.items():
        own = stage.code[len(shared):]
        assert stage.code[:len(shared)] == shared and own[0].startswith(f"stages/{name}"), name
        assert not set(own) & set(shared), name
    # params.yaml read into values, what every stage computes from; not its checks
    assert shared == ["__init__.py", "pipeline/__init__.py", "pipeline/params_file.py"]
    assert STAGES["verify"].code[len(shared)] == "stages/verify/__init__.py"  # a package
    assert not [c for c in STAGES["report"].code if c.startswith("models/")]


# Each model's check set of its own (its entry's `checks`): the module a verify job of it runs.
CHECK_SETS = {"scratch": "stages/verify/equivalence.py",
              "decoder_only": "stages/verify/decoder_only.py"}


def test_a_job_of_one_model_runs_that_models_code_and_no_others():
    """train, evaluate, export and verify run per model: their code reaches the registry but
    no model, and each job adds its model's (its entry and what that names; a verify job:
    its check sets too, and scratch's twin check set the reference's code); bench, which
    builds every model, holds them all."""
    train = STAGES["train"]
    assert "models/registry.py" in train.code
    assert not [c for c in train.code if c.startswith(("models/scratch", "models/baseline"))]
    scratch, baseline, decoder_only = (set(train.model_code[m]) for m in
                                       ("scratch", "baseline", "decoder_only"))
    assert {"models/scratch/encoder.py", "models/scratch/transformer.py",
            "models/entries/scratch.py"} <= scratch
    assert not [c for c in scratch if c.startswith(("models/baseline", "models/entries/b"))]
    assert {"models/baseline.py", "models/mapping.py"} <= baseline
    assert not [c for c in baseline if c.startswith("models/scratch")]
    # the decoder-only model takes scratch's attention block, not its encoder
    assert "models/scratch/attention.py" in decoder_only
    assert "models/scratch/encoder.py" not in decoder_only
    assert not STAGES["bench"].model_code
    assert scratch | baseline | decoder_only <= set(STAGES["bench"].code)
    verify = STAGES["verify"]
    assert not [c for c in verify.code if c.startswith(("models/scratch", "models/baseline",
                                                         "models/entries/", "models/decoder_"))]
    assert not [c for c in verify.code if c in CHECK_SETS.values()]  # loaded by name
    for model, checks in CHECK_SETS.items():
        own = set(train.model_code[model]) - set(verify.code)
        assert own | {checks} <= set(verify.model_code[model]), model
    # the twin check set builds the reference: scratch's job runs the baseline's code, and
    # no other job does but the baseline's own
    assert baseline | {"models/entries/baseline.py"} <= set(verify.model_code["scratch"])
    assert not set(verify.model_code["decoder_only"]) & (baseline - set(decoder_only))
    assert not [c for c in verify.model_code["baseline"] if c.startswith("stages/verify/")]
    # the decoder-only model's own modules reach no other model's verify job
    others = set(verify.code) | set(verify.model_code["baseline"]) | \
        set(verify.model_code["scratch"])
    assert not others & {"models/decoder_only/layer_norm.py", "stages/verify/decoder_only.py"}
    assert STAGES["evaluate"].model_code.keys() == STAGES["export"].model_code.keys() == \
        verify.model_code.keys() == set(registry.names())


def test_an_entrys_check_sets_are_read_or_refused(tmp_path):
    """check_code reads an entry's `checks=` (strings, or the registry's constants); anything
    else no parser can follow is refused, naming the file."""
    src = source_copy(tmp_path)
    assert code.entry_checks("scratch", src, code.registry_constants(src)) == (
        "equivalence", "properties")
    entry = src / "nmt" / "models" / "entries" / "decoder_only.py"
    entry.write_text(entry.read_text().replace('checks=("decoder_only",)',
                                               "checks=tuple(['decoder_only'])"))
    with pytest.raises(ValueError, match="decoder_only.py: checks= is no tuple"):
        code.check_code("decoder_only", src)


def test_registering_a_model_changes_no_data_stage_and_no_existing_runs_code(tmp_path):
    """A fourth model (its module and its entry module): the data stages' code and every
    existing model's jobs stay as they were; bench, which builds every model, and the new
    model's own jobs gain it."""
    src = source_copy(tmp_path)
    before = declaration.load(src.parent / declaration.DECLARATION)
    (src / "nmt" / "models" / "toy.py").write_text('"""A toy model."""\n\nimport torch.nn as nn\n'
                                                  "\n\nclass Toy(nn.Module):\n    pass\n")
    (src / "nmt" / "models" / "entries" / "toy.py").write_text(
        "from nmt.models.registry import ModelEntry\n\n"
        'ENTRY = ModelEntry("toy", order=3, model="nmt.models.toy:Toy", encoder_decoder=True, '
        'reads_bos=False, exports=False, param_count="nmt.models.toy:Toy", checks=())\n')
    after = declaration.load(src.parent / declaration.DECLARATION)
    for name, stage in before.items():
        grew = set(after[name].code) - set(stage.code)
        if name == "bench":
            assert grew == {"models/toy.py", "models/entries/toy.py"}, name
            continue
        assert not grew, name
        for model, modules in stage.model_code.items():
            assert after[name].model_code[model] == modules, (name, model)
    assert set(after["train"].model_code["toy"]) == {"models/entries/__init__.py",
                                                      "models/entries/toy.py", "models/toy.py"}


# The command line around the computation: what an edit of it can change is what a command
# says or refuses, never what a stage writes (issue 67).
COMMAND_LINE_MODULES = ["cli.py", "pipeline/commandline.py", "pipeline/params.py",
                        "pipeline/preflight.py", "pipeline/orchestrators.py",
                        "pipeline/tracking.py", "core/errors.py"]


def test_the_command_line_around_a_stage_is_no_stages_code():
    commands = sorted(p.relative_to(REPO / "src" / "nmt").as_posix()
                      for p in (REPO / "src" / "nmt" / "commands").glob("*.py"))
    for name, stage in STAGES.items():
        assert not set(stage.code) & set(COMMAND_LINE_MODULES + commands), name
        assert "cli.py" in declaration.command_code(name, REPO / "src"), name
    # The data stages compute with no model and no registry: registering a model is no edit
    # of theirs.
    for name in ("names", "config", "sources", "download", "tokenize", "vocab"):
        assert not [c for c in STAGES[name].code if c.startswith(("models", "training")) or
                    c == "core/checkpoint.py"], name


def test_a_stage_modules_command_line_is_what_the_cli_reads_of_it():
    """COMMAND_LINE, which the derivation leaves out, names every attribute nmt.cli asks of
    a stage's module; each stage module starts its command line with one marked line, and
    nothing of COMMAND_LINE sits above it."""
    cli = (REPO / "src" / "nmt" / "cli.py").read_text()
    names = {*re.findall(r"\bcode\.(\w+)", cli),
             *re.findall(r'said\(\s*(?:args\.stage|name),\s*"(\w+)"', cli), "command"}
    assert names == set(code.COMMAND_LINE), names ^ set(code.COMMAND_LINE)
    for name in STAGES:
        path = code.module_file(f"nmt.stages.{name}", REPO / "src")
        lines = path.read_text().splitlines()
        assert sum(bool(code.COMMAND_LINE_STARTS.match(line)) for line in lines) == 1, name
        code.computation(path)  # raises for a COMMAND_LINE name above that line


def test_a_command_line_name_above_the_marked_line_is_refused(tmp_path):
    src = source_copy(tmp_path)
    path = src / "nmt" / "stages" / "vocab.py"
    path.write_text(path.read_text().replace("def build_vocab(",
                                             "HELP = 'x'\n\n\ndef build_vocab(", 1))
    with pytest.raises(ValueError, match="HELP above the command line"):
        declaration.load(src.parent / declaration.DECLARATION)


def test_modules_that_change_no_output_import_nothing_of_nmt():
    """The derivation stops at NO_OUTPUT's modules: behind them would hide nothing."""
    for module in code.NO_OUTPUT:
        path = code.module_file(module, REPO / "src")
        assert not code.imports(path, module), module


@pytest.mark.parametrize("where, planted, stage, found", [
    ("stages/vocab.py", "from nmt.core import stats", "vocab", "core/stats.py"),
    # relative, inside a stage package
    ("stages/verify/measure.py", "from ...core import unknowns", "verify", "core/unknowns.py"),
    # the closure: core/text.py is imported by the data stages, so they all gain engine.py
    ("core/text.py", "import nmt.core.engine", "tokenize", "core/engine.py"),
])
def test_a_planted_import_is_in_the_stages_derived_code(tmp_path, where, planted, stage, found):
    src = source_copy(tmp_path)
    assert found not in derived(src)[stage]
    target = src / "nmt" / where
    # Inside a function, as a late import is: the parser finds those as well. In a stage's
    # module, above its command line (a top-level import its computation uses counts too).
    function = f"def planted():\n    {planted}\n\n\n"
    text, marker = target.read_text(), "# ---- `nmt "
    target.write_text(text.replace(marker, function + marker, 1) if marker in text
                      else text + "\n\n" + function)
    code = derived(src)
    assert found in code[stage]
    assert found not in code["config"]  # no stage that does not reach the file gains it


def test_a_planted_import_in_the_command_line_is_no_stages_and_in_the_reader_every_stages(
        tmp_path):
    """An import in nmt.cli's main(), which every command runs, or in a stage's `command`,
    adds nothing to any stage's code (the command line's); one in what reads params.yaml
    (SHARED) adds to every stage's."""
    src = source_copy(tmp_path)
    cli_file = src / "nmt" / "cli.py"
    main = "    keep_freed_memory()\n"  # the first line of main(), which every command runs
    cli_file.write_text(cli_file.read_text().replace(
        main, main + "    from nmt.core import stats\n", 1))
    vocab = src / "nmt" / "stages" / "vocab.py"
    vocab.write_text(vocab.read_text().replace(
        "def command(args, params: dict) -> None:\n",
        "def command(args, params: dict) -> None:\n    from nmt.core import engine\n", 1))
    stages = declaration.load(src.parent / declaration.DECLARATION)
    assert "core/engine.py" not in stages["vocab"].code
    assert "core/stats.py" not in stages["vocab"].code
    reader = src / "nmt" / "pipeline" / "params_file.py"
    reader.write_text(reader.read_text() + "\n\ndef planted():\n    from nmt.core import stats\n")
    stages = declaration.load(src.parent / declaration.DECLARATION)
    assert all("core/stats.py" in s.shared_code for s in stages.values())


def test_an_added_or_moved_module_needs_no_declaration_edit(tmp_path):
    src = source_copy(tmp_path)
    declared = (tmp_path / declaration.DECLARATION).read_text()
    before = declaration.rendered(tmp_path / declaration.DECLARATION)
    # Added: core/words.py, which core/text.py imports at its top.
    core = src / "nmt" / "core"
    (core / "words.py").write_text('"""Words."""\n')
    text = (core / "text.py").read_text()
    first = "from nmt.core.errors import"
    (core / "text.py").write_text(text.replace(first, "from nmt.core import words\n" + first, 1))
    # Moved: core/stats.py is core/statistics.py, and report imports it by that name.
    (core / "stats.py").rename(core / "statistics.py")
    importers = [path for path in sorted((src / "nmt" / "stages" / "report").glob("*.py"))
                 if "from nmt.core import stats\n" in path.read_text()]
    assert importers  # the report package's modules that compute statistics
    for path in importers:
        path.write_text(path.read_text().replace("from nmt.core import stats\n",
                                                 "from nmt.core import statistics as stats\n"))
    code = derived(src)
    for name, stage_code in code.items():
        assert ("core/words.py" in stage_code) == ("core/text.py" in stage_code), name
    assert "core/statistics.py" in code["report"] and "core/stats.py" not in code["report"]
    after = declaration.rendered(tmp_path / declaration.DECLARATION)
    assert (tmp_path / declaration.DECLARATION).read_text() == declared
    for path in after:
        assert after[path] != before[path] and "src/nmt/core/words.py" in after[path], path
        assert "src/nmt/core/statistics.py" in after[path], path


def test_a_declared_code_list_is_refused(tmp_path):
    """The code is derived: a hand-kept list, which would go stale, is an error."""
    src = source_copy(tmp_path)
    path = src.parent / declaration.DECLARATION
    path.write_text(path.read_text().replace("    cmd: nmt sources --out",
                                             "    code: [stages/sources.py]\n"
                                             "    cmd: nmt sources --out", 1))
    with pytest.raises(ValueError, match="sources: code is derived"):
        declaration.load(path)


@pytest.mark.parametrize("old, new, refusal", [
    ("--threads {threads}", "--threads {jobs}", r"tokenize: \{jobs\} in its cmd is none of"),
    ("    outs: [data/raw]", '    outs: ["data/raw/{recipe}"]',
     "download: output data/raw/{recipe} is a folder"),
    ("    outs: [data/raw]", "    outs: [data/raw]\n    recipe_params: [train.lr]",
     "download: recipe_params, but it does not run per recipe"),
    ("    outs: [data/raw]", "    outs: [data/raw]\n    gpu: train.devices",
     "download: gpu train.devices is a recipe key"),
])
def test_an_entry_no_tool_could_run_is_refused_as_it_is_read(tmp_path, old, new, refusal):
    """Every check is the reading's (load), before either file is rendered: DVC's as well as
    Snakemake's, which would otherwise render a rule that cannot run."""
    src = source_copy(tmp_path)
    path = src.parent / declaration.DECLARATION
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(ValueError, match=refusal):
        declaration.load(path)
    with pytest.raises(ValueError, match=refusal):
        declaration.render_dvc(path)


# ---- a toy stage, added as docs/adding-a-stage.md says ------------------------------------

TOY_MODULE = '''\
"""Stage toy (tests/test_declaration.py): writes toy.greeting to data/toy.txt."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from nmt.core.files import write_text


@dataclass(frozen=True)
class Paths:
    out: Path  # data/toy.txt


def toy(settings: dict, paths: Paths) -> None:
    write_text(paths.out, settings["toy"]["greeting"] + "\\n")


# ---- `nmt toy`: nmt.cli builds the subcommand from HELP, arguments and command ----

HELP = "Write toy.greeting to data/toy.txt."


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data/toy.txt"))


def command(args, params: dict) -> None:
    toy(params, Paths(out=args.out))
'''

TOY_ENTRY = """
  toy:
    cmd: nmt toy --out data/toy.txt
    params: [toy]
    outs: [data/toy.txt]
"""


def add_toy_stage(root: Path) -> list[str]:
    """The toy stage in the copy at root; the files a person edits for it."""
    (root / "src/nmt/stages/toy.py").write_text(TOY_MODULE)
    with open(root / "workflow/stages.yaml", "a") as f:
        f.write(TOY_ENTRY)
    edit_params(root / "params.yaml", toy={"greeting": "hello"})
    schema_file = root / "workflow/schemas/params.schema.yaml"
    schema = yaml.safe_load(schema_file.read_text())
    schema["properties"]["toy"] = {"type": "object", "additionalProperties": False,
                                   "properties": {"greeting": {"type": "string"}}}
    # (and the config stage, which validates every section, declares it)
    declared = (root / "workflow/stages.yaml").read_text()
    (root / "workflow/stages.yaml").write_text(declared.replace("pipeline, recipes]",
                                                                "pipeline, recipes, toy]", 1))
    schema_file.write_text(yaml.safe_dump(schema, sort_keys=False))
    return ["src/nmt/stages/toy.py", "workflow/stages.yaml", "params.yaml",
            "workflow/schemas/params.schema.yaml"]


def reads_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.slow
def test_a_new_stage_needs_a_module_a_declaration_entry_and_its_params(tmp_path, mirror):
    from test_contract import module_names, under

    root = scratch_copy(tmp_path)
    edited = add_toy_stage(root)
    run(["nmt", "stages", "--write"], root)
    assert len(edited) == 4  # docs/adding-a-stage.md counts the same files
    toy = declaration.load(root / declaration.DECLARATION)["toy"]
    assert "rule toy:" in (root / "workflow/rules/stages.smk").read_text()

    # From the command line, with no edit of nmt/cli.py: its help, and the stage itself.
    assert "Write toy.greeting" in run(["nmt", "toy", "--help"], root)
    run(["nmt", "toy", "--out", "cli.txt"], root)
    assert (root / "cli.txt").read_text() == "hello\n"

    # Each tool runs it, and it reads only what it declares (nmt.cli records the reads).
    reads = tmp_path / "reads.jsonl"
    env = {"NMT_TRACK_READS": str(reads)}
    run(["dvc", "repro", "toy"], root, env)
    assert (root / "data/toy.txt").read_text() == "hello\n"
    (root / "data/toy.txt").unlink()
    out = run(["snakemake", "--cores", "1", "data/toy.txt"], root, env)
    assert "rule toy:" in out and (root / "data/toy.txt").read_text() == "hello\n"
    params = yaml.safe_load((root / "params.yaml").read_text())
    lines = reads_of(reads)
    assert [line["stage"] for line in lines] == ["toy", "toy"]
    for line in lines:
        around = declaration.command_code("toy", root / "src")  # nmt.cli, the checks
        assert module_names(line["modules"]) <= set(toy.code) | set(around), line["modules"]
        assert set(line["params"]) <= under(toy.params, params) and line["params"]

    # A change of its param re-runs it under both tools.
    edit_params(root / "params.yaml", toy={"greeting": "hi"})
    assert re.search(r"params.yaml:\s+modified:\s+toy\n", run(["dvc", "status", "toy"], root))
    assert "rule toy:" in run(["snakemake", "-n", "--cores", "1", "data/toy.txt"], root)
