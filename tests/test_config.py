"""params.yaml validation: every bad value stops with one line naming the key and the fix."""

import argparse
import os
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import REPO, edit_params
from nmt.cli import build_parser, main
from nmt.core.decoding import MAX_BEAM
from nmt.core.errors import NmtError
from nmt.core.runs import Run
from nmt.models import registry
from nmt.pipeline.commandline import thread_count, usable_cores
from nmt.pipeline.params import SCHEMA_PATH, load_params, read_schema
from nmt.pipeline.recipes import resolve

# The models with rotary positions (the registry's: scratch), which params.yaml trains alone.
ROTARY = [name for name, model in registry.MODELS.items() if "rotary" in model.positions]
DEMO_IS = "demo_d10"  # the search step the demo copies (= demo_s14 + the decoder-only's depth)


def test_repository_params_are_valid():
    params = load_params(REPO / "params.yaml")
    assert params["pipeline"]["recipes"][0] == "published"
    published = resolve(params, "published")
    # The published reference: 6+6 layers, d_model 512, 8 heads, ffn 2048, batch 32, Adam 1e-4.
    assert published["model"]["d_model"] == 512 and published["model"]["nhead"] == 8
    assert published["train"]["batch_size"] == 32 and published["train"]["epochs"] == 15
    assert Run("published", "scratch").name == "published-scratch-s0"
    assert Run.parse("tuned_no_bpe-baseline-s2") == Run("tuned_no_bpe", "baseline", 2)


def test_the_schemas_model_names_are_the_registrys(params_file):
    """pipeline.models and pipeline.export take their names from nmt.models.registry, the one
    list of the models: the schema file lists none, validation adds them."""
    raw = yaml.safe_load((REPO / SCHEMA_PATH).read_text())
    assert "enum" not in raw["$defs"]["model_name"]
    schema = read_schema(REPO / SCHEMA_PATH)
    for key in ("models", "export"):
        assert schema["properties"]["pipeline"]["properties"][key]["items"] == {
            "$ref": "#/$defs/model_name"}
    assert schema["$defs"]["model_name"]["enum"] == list(registry.names())
    edit_params(params_file, pipeline={"models": ["lstm"]})
    choices = ", ".join(map(repr, registry.names()))
    with pytest.raises(NmtError, match=f"pipeline.models.0: 'lstm' is not allowed \\(fix: use "
                                       f"one of {choices}\\)"):
        load_params(params_file)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"train": {"epochs": 0}}, "train.epochs: 0 is less than the minimum of 1"),
        ({"train": {"epochs": "ten"}}, "train.epochs: 'ten' is not of type 'integer'"),
        ({"train": {"epoch": 3}}, "train: unknown key 'epoch'"),
        ({"model": {"d_model": 510}}, "d_model 510 is not divisible by nhead 8"),
        ({"vocab": {"kind": "chars"}}, "vocab.kind: 'chars' is not allowed"),
        ({"pipeline": {"recipes": ["published", "nope"], "models": ["scratch"]}},
         "pipeline.recipes names 'nope'"),
        # The export stage's models: trained by the pipeline, and ones CTranslate2 can run.
        ({"pipeline": {"models": ["scratch"], "export": ["baseline"]}},
         "pipeline.export names baseline, which pipeline.models does not train (fix: add"),
        ({"pipeline": {"export": ["decoder_only"]}},
         "pipeline.export: decoder_only cannot be exported"),
        ({"pipeline": {"export": ["tiny"]}}, "pipeline.export.0: 'tiny' is not allowed"),
        ({"recipes": {"published": {}, "big": {"model": {"nhead": 7}}}},
         "recipes.big: d_model 512 is not divisible by nhead 7"),
        ({"recipes": {"published": {}, "bad": {"train": {"lr": -1}}}},
         "recipes.bad.train.lr: -1 is less than or equal to the minimum of 0"),
        ({"model": {"tie_embeddings": True}}, "tie_embeddings needs one shared vocabulary"),
        # Rotary positions: the scratch model's only, and pairs of features in a head.
        ({"model": {"positions": "rotary"}},
         f"published has model.positions rotary, which only {' and '.join(ROTARY)} "
         f"{'has' if len(ROTARY) == 1 else 'have'}, and pipeline.models also trains baseline, "
         f"decoder_only (fix: pipeline.models: [{', '.join(ROTARY)}]"),
        ({"model": {"positions": "rotary", "d_model": 24, "nhead": 8}},
         "model: rotary positions rotate pairs of features, and a head has 3"),
        ({"model": {"positions": "spiral"}}, "model.positions: 'spiral' is not allowed"),
        ({"model": {"positions": "rotary"}, "pipeline": {"models": ["scratch"],
                                                         "export": ["scratch"]}},
         "pipeline.export: published has model.positions rotary, which the CTranslate2"),
        ({"train": {"epochs": 2, "average_last": 3}},
         "train.average_last 3 exceeds train.epochs 2"),
        # Limits the schema alone owns (ModelConfig no longer repeats them).
        ({"model": {"dropout": 1.0}}, "model.dropout: 1.0 is greater than or equal to the max"),
        ({"model": {"num_encoder_layers": 0}}, "model.num_encoder_layers: 0 is less than the"),
        ({"train": {"schedule": "step"}}, "train.schedule: 'step' is not allowed"),
        ({"train": {"attention_kernels": "cudnn"}},
         "train.attention_kernels: 'cudnn' is not allowed"),
        # pad_multiple: auto or a multiple from 1 to 64.
        ({"train": {"pad_multiple": 0}}, "train.pad_multiple: 0 is less than the minimum of 1"),
        ({"train": {"pad_multiple": "foo"}}, "train.pad_multiple: 'auto' was expected"),
        ({"recipes": {"published": {}, "x": {"step_of": "published"}}},
         "recipes.x: a search step needs both step_of (an existing recipe) and adds"),
        ({"recipes": {"published": {}, "x": {"step_of": "published", "adds": "a",
                                             "ablation_of": "published", "removes": "b"}}},
         "recipes.x: a recipe builds on one other"),
        # The widest beam, nmt.core.decoding.MAX_BEAM (a beam of 10000 was accepted).
        ({"evaluate": {"beam_size": 10000}},
         "evaluate.beam_size: 10000 is greater than the maximum of 100"),
        ({"recipes": {"published": {}, "wide": {"evaluate": {"beam_size": 101}}}},
         "recipes.wide.evaluate.beam_size: 101 is greater than the maximum of 100"),
    ],
)
def test_bad_params_name_the_key_and_the_fix(params_file, edit, expected):
    edit_params(params_file, **edit)
    with pytest.raises(NmtError) as err:
        load_params(params_file)
    message = str(err.value)
    assert expected in message
    assert "fix:" in message and "\n" not in message


def test_the_schema_bounds_the_beam_where_decoding_does():
    """evaluate.beam_size's maximum is MAX_BEAM, which nmt translate --beam is held to too."""
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "params.schema.yaml").read_text())
    assert schema["$defs"]["evaluate"]["properties"]["beam_size"]["maximum"] == MAX_BEAM


def test_missing_key_and_broken_yaml(params_file):
    params = yaml.safe_load(params_file.read_text())
    del params["train"]["lr"]
    params_file.write_text(yaml.safe_dump(params))
    with pytest.raises(NmtError, match="train: 'lr' is a required property"):
        load_params(params_file)
    params["train"]["lr"] = 1.0e-4
    del params["pipeline"]["export"]  # DVC's export stage reads it: no default
    params_file.write_text(yaml.safe_dump(params))
    with pytest.raises(NmtError, match="pipeline: 'export' is a required property"):
        load_params(params_file)
    params_file.write_text("train: [unclosed\n")
    with pytest.raises(NmtError, match="not valid YAML at line"):
        load_params(params_file)


# ---- what a YAML parser lets through: anchors and aliases, a key written twice ---------------
# Small on purpose: were the refusal lost, this bomb expands to 3**4 strings, not to gigabytes.
BOMB = ("  testsets: [&l0 [lol, lol, lol], &l1 [*l0, *l0, *l0], &l2 [*l1, *l1, *l1], "
        "&l3 [*l2, *l2, *l2], *l3]")
TESTSETS = "  testsets: [test_2016_flickr, test_2017_flickr]"
LR = "  lr: 1.0e-4\n"


def line_of(text: str, line: str, after: int = 0) -> int:
    """The number of the first line of text that is `line`, past line `after`."""
    return next(n for n, x in enumerate(text.splitlines(), 1) if x == line and n > after)


def written_twice(text: str) -> tuple[str, int, int]:
    """text with train.lr written again below train.eps; (text, both lines)."""
    eps = "  eps: 1.0e-9\n"
    edited = text.replace(eps, eps + "  lr: 5.0e-4\n", 1)
    first = line_of(text, LR.rstrip())
    return edited, first, line_of(edited, "  lr: 5.0e-4")


def test_anchors_and_aliases_are_refused_before_anything_expands_them(params_file):
    text = params_file.read_text()
    params_file.write_text(text.replace(TESTSETS, BOMB, 1))
    with pytest.raises(NmtError) as e:
        load_params(params_file)
    assert str(e.value) == (f"{params_file}: line {line_of(text, TESTSETS)}: a YAML anchor or "
                            "alias (&l0); params.yaml uses none, and an alias can expand to "
                            "gigabytes (fix: write the values out)")
    params_file.write_text(text.replace(TESTSETS, "  testsets: *elsewhere", 1))  # an alias alone
    with pytest.raises(NmtError, match=r"a YAML anchor or alias \(\*elsewhere\)"):
        load_params(params_file)


def test_a_key_written_twice_is_refused_with_both_lines(params_file):
    text = params_file.read_text()
    edited, first, second = written_twice(text)
    params_file.write_text(edited)
    with pytest.raises(NmtError) as e:
        load_params(params_file)
    assert str(e.value) == (f"{params_file}: train.lr is written twice, at lines {first} and "
                            f"{second} (fix: keep one)")
    # Deeper, and in a flow mapping; the same key in two mappings is no repeat.
    tuned = "    train: {epochs: 80, "  # recipes.tuned.train, whose lr comes later on the line
    params_file.write_text(text.replace(tuned, tuned + "lr: 2.0e-4, ", 1))
    with pytest.raises(NmtError, match=r"recipes.tuned.train.lr is written twice, at lines "
                                       r"(\d+) and \1 \(fix: keep one\)"):
        load_params(params_file)


def test_cli_prints_one_error_line_before_any_work(params_file, tmp_path, capsys):
    edit_params(params_file, model={"d_model": 100, "nhead": 3})
    code = main(["--params", str(params_file), "download", "--out", str(tmp_path / "raw")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [err[0]] and err[0].startswith("nmt download: error: params.yaml: model:")
    assert not (tmp_path / "raw").exists()


def test_an_update_budget_lets_average_last_exceed_the_unused_epochs(params_file):
    """With max_updates the run's length is its update budget, so a top-level epochs below a
    recipe's average_last is no error (the tests' tiny params set epochs 2 under demo_s7)."""
    budget = {"train": {"max_updates": 50, "average_last": 3}}
    edit_params(params_file, train={"epochs": 2, "max_updates": 0},
                recipes={"published": {}, "budget": budget})
    assert resolve(load_params(params_file), "budget")["train"]["average_last"] == 3


@pytest.mark.parametrize("multiple", ["auto", 1, 8, 64])
def test_pad_multiple_is_auto_or_a_multiple(params_file, multiple):
    edit_params(params_file, train={"pad_multiple": multiple})
    assert load_params(params_file)["train"]["pad_multiple"] == multiple


def test_recipe_overrides_merge_over_the_defaults(params_file):
    """A recipe's keys replace those they name, at any depth, and no others: a recipe built on
    wmt14 that names only its dataset's splits keeps wmt14's dataset path and name."""
    wmt14 = load_params(params_file)["recipes"]["wmt14"]
    splits = {"train": "train[:1000]", "val": "validation", "newstest2014": "test"}
    edit_params(params_file, recipes={"published": {}, "small": {"model": {"d_model": 64}},
                                      "wmt14": wmt14, "wmt14_small": {
                                          "ablation_of": "wmt14", "removes": "data",
                                          "data": {"huggingface": {"splits": splits}}}})
    params = load_params(params_file)
    small = resolve(params, "small")
    assert small["model"]["d_model"] == 64 and small["model"]["nhead"] == 8
    assert resolve(params, "published")["model"]["d_model"] == 512
    assert resolve(params, "wmt14_small")["data"]["huggingface"] == {
        **wmt14["data"]["huggingface"], "splits": splits}
    with pytest.raises(NmtError, match="unknown recipe 'large'"):
        resolve(params, "large")


def test_search_steps_add_to_the_step_they_name_and_demo_is_the_chosen_one():
    params = load_params(REPO / "params.yaml")
    s0, s1, s2 = (resolve(params, f"demo_s{k}") for k in range(3))
    assert s1["train"]["schedule"] == "linear" and s0["train"]["schedule"] == "inverse_sqrt"
    assert s2["train"]["schedule"] == "linear" and s2["vocab"]["kind"] == "bpe"  # inherited
    assert s2["model"]["d_model"] == s0["model"]["d_model"] == 128
    # A branch builds on the step it names, not on the one above it in params.yaml.
    s3, d2 = resolve(params, "demo_s3"), resolve(params, "demo_d2")
    assert s3["vocab"] == s0["vocab"] and s3["train"]["schedule"] == "inverse_sqrt"
    assert d2["model"]["decoder_only_layers"] == 2 and d2["train"] == s0["train"]
    # The demo recipe is the search step chosen on the validation set
    # (docs/demo-recipe-search.md), but for its precision: the step pins bf16, which it trained
    # in, and the demo takes `auto`, the faster one measured on each machine
    # (nmt.training.precision).
    demo, chosen = resolve(params, "demo"), resolve(params, DEMO_IS)
    assert all(demo[k] == chosen[k] for k in ("vocab", "model", "evaluate"))
    assert demo["train"] | {"precision": "bf16"} == chosen["train"]
    assert demo["train"]["precision"] == "auto"


@pytest.mark.parametrize("case", ["unknown key", "alias", "written twice"])
def test_every_entry_point_gives_the_same_one_line(tmp_path, case):
    """nmt, Snakemake and DVC (whose config stage re-runs on any edit) name a bad key alike.
    An alias or a repeated key is refused before Snakemake's `configfile:` reads the file
    (it would build the aliases, and keep the last of two keys)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel, follow_symlinks=False)
    params = tmp_path / "params.yaml"
    text = params.read_text()
    if case == "unknown key":
        edit_params(params, train={"epohcs": 3})
        want = "params.yaml: train: unknown key 'epohcs' (fix: remove it;"
    elif case == "alias":
        params.write_text(text.replace(TESTSETS, BOMB, 1))
        want = f"params.yaml: line {line_of(text, TESTSETS)}: a YAML anchor or alias (&l0);"
    else:
        edited, first, second = written_twice(text)
        params.write_text(edited)
        want = f"params.yaml: train.lr is written twice, at lines {first} and {second} (fix:"
    bin_ = Path(sys.executable).parent
    for cmd in (["nmt", "download"], ["snakemake", "-n"], ["nmt", "config", "--recipe", "tuned"],
                ["nmt", "train", "--model", "scratch"]):
        proc = subprocess.run([str(bin_ / cmd[0]), *cmd[1:]], cwd=tmp_path, capture_output=True,
                              text=True)
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode != 0 and len(errors) == 1 and want in errors[0], proc.stderr


def test_threads_are_at_most_the_cores_the_process_may_use():
    """--threads 8 in a process bound to one core (taskset, a Slurm binding, a cpuset) gives
    torch one thread: more would only take turns on that core. Unbound: 8, at most the
    machine's cores."""
    code = ("import torch; from nmt.pipeline.commandline import set_threads; set_threads(8); "
            "print(torch.get_num_threads())")
    cores = os.sched_getaffinity(0)
    for bound, expected in (({min(cores)}, 1), (cores, min(8, len(cores)))):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, preexec_fn=lambda b=bound: os.sched_setaffinity(0, b))
        assert proc.stdout.split() == [str(expected)], proc.stderr


def commands_with_threads() -> dict:
    """Every `nmt` subcommand that takes --threads, with the options it requires."""
    parser = build_parser([])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, sub in commands.choices.items():
        options = {o for a in sub._actions for o in a.option_strings}
        if "--threads" in options:
            out[name] = ["--model", "scratch"] if "--model" in options else []
    return out


def test_every_command_with_threads_refuses_fewer_than_one_in_one_line(tmp_path, monkeypatch,
                                                                       capsys):
    """--threads -3 or 0 quietly became one thread (or one tokenize process); now every command
    that takes it says so before it reads anything."""
    commands = commands_with_threads()
    assert {"tokenize", "verify", "train", "evaluate", "export", "bench", "translate"} <= set(
        commands)
    monkeypatch.chdir(tmp_path)
    fix = f"(fix: --threads 1 to {usable_cores()}, the cores this process may use)"
    for name, required in commands.items():
        for threads in ("-3", "0"):
            argv = ["--params", str(REPO / "params.yaml"), name, *required, "--threads", threads]
            assert main(argv) == 2, name
            assert capsys.readouterr().err == (f"nmt {name}: error: --threads {threads}: a count "
                                               f"of threads is 1 or more {fix}\n")
    assert main(["--params", str(REPO / "params.yaml"), "bench", "--data", "--threads", "-1"]) == 2
    assert "--threads -1: a count of threads is 1 or more" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["abc", "", "0", "-3", "2.5", "4,x", "٣"])
def test_an_omp_num_threads_openmp_cannot_read_is_one_line(value, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert main(["--params", str(REPO / "params.yaml"), "evaluate", "--model", "scratch"]) == 2
    assert capsys.readouterr().err == (
        f"nmt: error: OMP_NUM_THREADS={value!r} is not a count of threads (fix: a whole number "
        "of 1 or more, e.g. OMP_NUM_THREADS=4, or unset it)\n")


def test_omp_num_threads_is_read_as_openmp_reads_it(monkeypatch):
    """A list (a count for each level of nesting): torch runs on the first; spaces and a plus
    sign are OpenMP's too."""
    for value, wanted in (("4,2", 4), (" 3 ", 3), ("+2", 2), ("1", 1)):
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert thread_count(None) == min(wanted, usable_cores())
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert thread_count(None) is None and thread_count(1) == 1


def test_a_bad_omp_num_threads_is_refused_before_torch_is_imported(tmp_path):
    """libgomp reads OMP_NUM_THREADS when torch is imported; a value it cannot read gets its own
    warning and is ignored. nmt checks first, so its line is the only one."""
    env = {**os.environ, "OMP_NUM_THREADS": "abc", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "nmt", "--params", str(REPO / "params.yaml"),
                           "evaluate", "--model", "scratch"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "nmt: error: OMP_NUM_THREADS='abc' is not a count of threads (fix: a whole number of 1 or "
        "more, e.g. OMP_NUM_THREADS=4, or unset it)"], proc.stderr


def test_nmt_stages_checks_writes_and_names_each_stale_file(tmp_path, monkeypatch, capsys):
    """`nmt stages --check` names each rendered file that differs from the declaration, with
    the fix; `--write` renders them as the repository has them; then the check passes."""
    declaration = REPO / "workflow" / "stages.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workflow" / "rules").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    argv = ["-q", "--params", str(REPO / "params.yaml"), "stages", "--declaration",
            str(declaration)]
    assert main([*argv, "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        "nmt stages: error: dvc.yaml, workflow/rules/stages.smk, docs/pipeline.md and "
        f"workflow/code differ from {declaration} (fix: nmt stages --write)")
    assert main([*argv, "--write"]) == 0
    for rendered in ("dvc.yaml", "workflow/rules/stages.smk", "docs/pipeline.md"):
        assert (tmp_path / rendered).read_text() == (REPO / rendered).read_text()
    links = sorted(p.relative_to(tmp_path) for p in (tmp_path / "workflow/code").rglob("*"))
    assert links == sorted(p.relative_to(REPO) for p in (REPO / "workflow/code").rglob("*"))
    assert main([*argv, "--check"]) == 0
    with open(tmp_path / "dvc.yaml", "a") as dvc_yaml:
        dvc_yaml.write("# a hand edit\n")
    assert main([*argv, "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"nmt stages: error: dvc.yaml differs from {declaration} (fix: nmt stages --write)")
    # A checkout without symlinks (git's core.symlinks=false) holds each link as a file of
    # its target's path, whose text DVC would hash instead of the module: refused.
    assert main([*argv, "--write"]) == 0
    link = next(p for p in sorted((tmp_path / "workflow/code").rglob("*")) if p.is_symlink())
    target = str(link.readlink())
    link.unlink()
    link.write_text(target)
    assert main([*argv, "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"nmt stages: error: workflow/code differs from {declaration} (fix: nmt stages --write)")
    assert main([*argv, "--write"]) == 0 and link.is_symlink()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_without_a_gpu_is_one_line():
    """What `nmt translate --device cuda` or `nmt bench --device cuda` meets on a CPU machine."""
    from nmt.core.runtime import pick_device

    assert pick_device("auto").type == "cpu"
    with pytest.raises(NmtError) as error:
        pick_device("cuda:1")
    assert str(error.value) == ("device 'cuda:1' asked for, but no CUDA GPU is visible (fix: "
                                "device: auto)")


def test_nmt_keeps_freed_memory_for_the_next_step():
    """A 64 MB tensor allocated and freed again and again, as a step's largest activations are
    (a demo batch's logits: 4,096 tokens x 6,190 words x 4 bytes): glibc on its own settings
    maps any block over 32 MB for itself and hands it back when freed, so each step faults all
    its pages in again (16,384); after keep_freed_memory (which `nmt` calls first) the heap
    keeps it. It settles within a few allocations (torch's aligned blocks leave gaps that
    take a few frees to merge): the last 10 of 20 fault nothing, or next to it. Where the
    kernel pages out memory a process holds but has not touched for a while (DAMON's pageout
    scheme, on the AMD EPYC machine CI ran on in issue 55), a kept block can fault in again: 2
    or 3 of those 10 allocations did under load there (32,768 and 49,153 faults). So the kept
    heap must fault at most a third as often as glibc's own settings, which fault every time."""
    code = ("import resource, sys, torch; from nmt.core.process import keep_freed_memory\n"
            "kept = sys.argv[1] == 'kept' and keep_freed_memory()\n"
            "for step in range(20):\n"
            "    if step == 10:\n"
            "        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    torch.ones(16 << 20)\n"
            "print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    faults = {}
    for how in ("default", "kept"):
        out = subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True,
                             check=True).stdout.split()
        if how == "kept" and out[0] == "False":
            pytest.skip("the C library is not glibc: it has no mallopt")
        faults[how] = int(out[1])  # of the last 10 allocations
    assert faults["default"] >= 10 * 16384 and faults["kept"] <= faults["default"] / 3, faults


def test_the_study_recipes_differ_from_published_only_where_they_say():
    """published_cudnn (the attention kernels' A/B), published_random and published_faithful
    (the departures from the reference, docs/results.md) each change only their own keys."""
    params = load_params(REPO / "params.yaml")
    published = resolve(params, "published")

    def changed(recipe: str) -> dict:
        resolved = resolve(params, recipe)
        return {f"{section}.{key}": value for section in published
                for key, value in (resolved[section].items()
                                   if isinstance(resolved[section], dict) else [])
                if value != published[section][key]}

    assert changed("published_cudnn") == {"train.attention_kernels": "any", "train.epochs": 7}
    assert changed("published_random") == {"train.bucket": False}
    assert changed("published_faithful") == {"train.bucket": False, "train.precision": "fp32"}
    assert published["train"]["bucket"] is True and published["train"]["attention_kernels"] == (
        "route")


def test_a_params_file_of_megabytes_is_refused_before_it_is_parsed(tmp_path):
    """A 2.7 M-item list under a recipe no stage uses made a 46 MB params.yaml that ran `nmt
    config` past 180 s and 1.24 GB with no line: over 1 MB, one line before parsing."""
    text = (REPO / "params.yaml").read_text()
    big = text + "\n".join(["  unused:", "    values:"] + ["      - 1"] * 200_000) + "\n"
    path = tmp_path / "params.yaml"
    path.write_text(big)
    assert path.stat().st_size > 1 << 20
    with pytest.raises(NmtError) as refused:
        load_params(path)
    assert str(refused.value) == (f"{path}: {path.stat().st_size / 1e6:.1f} MB, and a params "
                                  "file is tens of KB (at most 1 MB here) (fix: remove the "
                                  "values no recipe needs, or keep data in files a stage reads)")
    assert len(text.encode()) < (1 << 20) / 10  # the repository's own: far inside the bound
