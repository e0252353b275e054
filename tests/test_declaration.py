"""One declaration, truly one: what repeats workflow/stages.yaml is derived from it, or checked
against it here, so that adding a stage means a module, one declaration entry and its params.

- `nmt <stage>`: one subcommand a module of nmt.stages (nmt.cli builds them from the modules,
  whose names are the declared stages'), the orchestrator guard over the same names;
- Snakemake's `rule all`: the outputs of the stages declared `target` (rendered);
- the lists that name params sections or output folders agree with the schema and the
  declaration;
- a toy stage added to a copy of the repository (a module, a declaration entry, a params
  key and its schema entry) runs as `nmt toy`, under `dvc repro` and under `snakemake`, and
  reads only what it declares.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, edit_params
from nmt import cli
from nmt.pipeline import declaration, preflight, recipes
from tiny import run, scratch_copy

STAGES = declaration.load(REPO / declaration.DECLARATION)
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "params.schema.yaml").read_text())


def test_the_cli_has_one_subcommand_a_declared_stage_and_guards_them_all():
    assert set(cli.STAGES) == set(STAGES)
    for name, stage in STAGES.items():
        assert stage.cmd.split()[:2] == ["nmt", name], name  # its command is its subcommand
        module = cli.stage_module(name)
        assert module.HELP and callable(module.arguments) and callable(module.command), name
    # Only the named stage's module is imported to build the parser (nmt train's launcher
    # stays torch-free, tests/test_distributed.py); `nmt --help` builds every one.
    assert cli.named_command(["--params", "p.yaml", "-q", "train", "--model", "x"]) == "train"
    actions = cli.build_parser(["vocab"])._subparsers._group_actions[0].choices
    assert set(actions) == {"vocab", *cli.COMMANDS}
    actions = cli.build_parser(["--help"])._subparsers._group_actions[0].choices
    assert set(actions) == set(STAGES) | set(cli.COMMANDS)


def test_rule_all_asks_for_the_outputs_of_the_declared_targets():
    """report and export's runs; config, which nothing consumes, stays un-run under Snakemake."""
    assert {n for n, s in STAGES.items() if s.target} == {"report", "export"}
    rules = declaration.render_snakemake(REPO / declaration.DECLARATION)
    rule_all = rules[rules.index("rule all:"):]
    assert "rules.report.output," in rule_all
    assert re.search(r'expand\(rules\.export\.output,\s+recipe=RECIPES, '
                     r'model=lookup\(config, "pipeline\.export"\), seed=SEEDS\)', rule_all)
    assert "rules.config" not in rule_all
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


HELP = "Write toy.greeting to data/toy.txt."


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data/toy.txt"))


def command(args, params: dict) -> None:
    toy(params, Paths(out=args.out))
'''

TOY_ENTRY = """
  toy:
    cmd: nmt toy --out data/toy.txt
    code: [stages/toy.py, core/files.py]
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
        assert module_names(line["modules"]) <= set(toy.code), line["modules"]
        assert set(line["params"]) <= under(toy.params, params) and line["params"]

    # A change of its param re-runs it under both tools.
    edit_params(root / "params.yaml", toy={"greeting": "hi"})
    assert re.search(r"params.yaml:\s+modified:\s+toy\n", run(["dvc", "status", "toy"], root))
    assert "rule toy:" in run(["snakemake", "-n", "--cores", "1", "data/toy.txt"], root)
