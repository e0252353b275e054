"""The report from a small fake results tree: every file of the run contract, written from
real Multi30k lines, for any set of recipes, models, seeds and test sets."""

import gzip
import itertools
import json
import math
import os
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from sacrebleu.metrics import BLEU, CHRF

from nmt.core.errors import NmtError
from nmt.core.files import write_json, write_text
from nmt.core.runs import Run
from nmt.core.text import read_lines, token_lines
from nmt.pipeline.params import load_params
from nmt.stages import report as rp
from nmt.stages.report.figures import plot_losses
from nmt.stages.report.load import load
from nmt.stages.report.markdown import shown

REPO = Path(__file__).resolve().parents[1]
T16, T17 = "test_2016_flickr", "test_2017_flickr"
SENTENCES = 60
DROP = {"baseline": 0.25, "scratch": 0.25, "decoder_only": 0.6}  # share of words left out
LOSS = {"baseline": 2.0, "scratch": 2.0, "decoder_only": 2.4}      # nats a token


def lines_of(mirror: Path, testset: str, lang: str) -> list[str]:
    with gzip.open(mirror / f"{testset}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, SENTENCES)]


def write_lines(path: Path, lines: list[str]) -> None:
    write_text(path, "".join(line + "\n" for line in lines))


def corrupt(refs: list[str], share: float, rng) -> list[str]:
    return [" ".join(w for w in r.split() if rng.random() >= share) for r in refs]


def signatures() -> dict:
    """sacreBLEU's signatures, as evaluate records them (a metric must score once first)."""
    out = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        metric.corpus_score([""], [[""]])
        out[name] = str(metric.get_signature())
    return out


def fake_run(params: dict, run: Run, results: Path, data: dict) -> None:
    """metrics.json, evaluation.json, translations/, attention.json, train.json, history.csv
    of one run, as evaluate and train write them."""
    folder = run.dir(results)
    models, recipes = list(DROP), params["pipeline"]["recipes"]
    metrics, timings, first = {}, {}, params["evaluate"]["testsets"][0]
    for k, testset in enumerate(params["evaluate"]["testsets"]):
        refs = data[testset]["en"]
        rng = np.random.default_rng([run.seed, models.index(run.model), recipes.index(run.recipe),
                                     k])
        beam = corrupt(refs, DROP[run.model], rng)
        greedy = corrupt(refs, DROP[run.model] + 0.05, rng)
        if run.model == "scratch" and run.seed == 0:
            beam[0] = ""  # an empty output, shown as *(empty)*
        tokens = [len(r.split()) + 1 for r in refs]
        losses = [n * (LOSS[run.model] + rng.normal(0, 0.3)) for n in tokens]
        write_lines(folder / "translations" / f"{testset}.beam.txt", beam)
        write_lines(folder / "translations" / f"{testset}.greedy.txt", greedy)
        write_lines(folder / "translations" / f"{testset}.loss.tsv",
                    [f"{x!r}\t{n}" for x, n in zip(losses, tokens, strict=True)])
        loss = sum(losses) / sum(tokens)
        metrics[testset] = {"loss": loss, "ppl": math.exp(loss),
                            "bleu": BLEU().corpus_score(beam, [refs]).score,
                            "bleu_greedy": BLEU().corpus_score(greedy, [refs]).score,
                            "chrf": CHRF().corpus_score(beam, [refs]).score,
                            "chrf_greedy": CHRF().corpus_score(greedy, [refs]).score}
        timings[testset] = {"sentences": len(refs), "seconds_greedy": 1.5, "seconds_beam": 4.2}
        if testset == first:
            source = data[testset]["de"][0].split()
            output = beam[0].split() + ["<eos>"]
            weights = rng.random((len(output), len(source)))
            write_json(folder / "attention.json", {
                "what": "last decoder layer, cross-attention, mean of heads", "source": source,
                "output": output, "translation": beam[0],
                "weights": (weights / weights.sum(1, keepdims=True)).round(4).tolist()})
    write_json(folder / "metrics.json", metrics)
    write_json(folder / "evaluation.json", {
        "run": run.name, "recipe": run.recipe, "model": run.model, "seed": run.seed,
        "params": 1_000_000 + 1000 * models.index(run.model),
        "signature": signatures(),
        "testsets": timings})
    epochs, gap = 5 - run.seed, 0.4 * models.index(run.model)  # seeds stop early, or not
    epoch = np.arange(1, epochs + 1)
    history = pd.DataFrame({"epoch": epoch, "train_loss": 5 / epoch + gap + 0.1 * run.seed,
                            "valid_loss": 4 / epoch + gap + 1,
                            "lr": 1e-4, "seconds": 50.0, "tokens_per_second": 9000.0}
                           # a run trained before grad_norm was logged lacks the column
                           | ({"grad_norm": 2 / epoch + gap} if run.seed == 0 else {}))
    write_text(folder / "history.csv", history.to_csv(index=False))
    write_json(folder / "train.json", {
        "run": run.name, "recipe": run.recipe, "model": run.model, "seed": run.seed,
        "device": "cuda:0", "params": 1_000_000, "epochs": epochs, "best_epoch": epochs,
        "best_valid_loss": 1.8, "averaged_valid_loss": None, "seconds_per_epoch": 50.0 + run.seed,
        "train_minutes": 4.0 + run.seed, "updates": 100 * epochs, "valid_bleu_greedy": 30.0,
        "tokens_per_second": 9000, "train_pairs": 29000, "device_name": "NVIDIA H100 80GB HBM3",
        "precision": "bf16", "precision_reason": "auto: a CUDA GPU with bf16 tensor cores",
        "decode_precision": "bf16", "decode_precision_reason": "auto: a CUDA GPU with bf16 "
        "tensor cores", "compile": True, "compile_seconds": 41.5, "compiled_graphs": 1,
        "cuda_graphs": 0, "peak_memory_mb": 5120.0, "peak_memory_of": "cuda max_memory_allocated",
        "config": {}} | ({"seconds": {"wall": 60.0 * epochs + 9, "epochs": 50.0 * epochs}}
                          if run.seed == 0 else {}))  # runs trained before it lack it


def fake_tree(root: Path, mirror: Path, recipes, models, seeds, testsets) -> tuple[dict, dict]:
    """params and paths of a complete fake pipeline output under root."""
    params = load_params(REPO / "params.yaml")
    params["pipeline"] |= {"recipes": recipes, "models": models, "seeds": seeds}
    params["evaluate"]["testsets"] = testsets
    params["report"]["samples"] = 3
    paths = {k: root / k for k in ("tokenized", "vocab", "results", "reports")}
    data = {t: {lang: lines_of(mirror, t, lang) for lang in ("de", "en")} for t in testsets}
    sizes = {}
    for split in ("train", "val", *testsets):
        for lang in ("de", "en"):
            if split in data:  # as stage tokenize writes them: the raw lines and spaCy's
                write_lines(paths["tokenized"] / f"{split}.{lang}.txt", data[split][lang])
                write_lines(paths["tokenized"] / f"{split}.{lang}.tok",
                            list(token_lines(data[split][lang], lang)))
            sizes[f"{split}.{lang}"] = {"sentences": 1000, "tokens": 12000, "max_len": 40}
    write_json(paths["tokenized"] / "stats.json", sizes)
    for recipe in recipes:
        write_json(paths["vocab"] / recipe / "meta.json",
                   {"kind": "word", "min_freq": 1, "source_lang": "de", "target_lang": "en",
                    "src_size": 7853, "tgt_size": 5893})
        for model in models:
            write_json(paths["results"] / "verify" / f"{recipe}-{model}.json", {
                "passed": True, "checks": [
                    {"name": f"logits (float64, {model})", "passed": True,
                     "max_abs_diff": 1e-12, "tolerance": 1e-9, "seconds": 0.1}]})
        for model, seed in itertools.product(models, seeds):
            fake_run(params, Run(recipe, model, seed), paths["results"], data)
    write_json(paths["results"] / "bench.json", {
        "device": "NVIDIA H100", "recipe": recipes[0], "steps": 20, "sentences": 200,
        **{k: {"baseline": 100.0, "scratch": 95.0, "ratio": 0.95}
           for k in ("train", "greedy", "beam")},
        "peak_memory_mib": {"baseline": 4000, "scratch": 4200},
        "mfu": {"baseline": 0.31, "scratch": 0.29},
        "padding": {"random": 0.4271, "bucketed": 0.0612},
        "ratio_max_spread": 0.2, "ratio_spread": {
            key: {"median": 0.95, "quartiles": [0.9, 0.99 if trusted else 1.3],
                  "spread": 0.095 if trusted else 0.421, "pairs": 5, "trusted": trusted}
            for key, trusted in (("train", True), ("greedy", True), ("beam", False))}})
    return params, paths


def run_metrics(paths: dict, run: Run) -> dict:
    """A run's metrics.json in a fake tree, as evaluate wrote it."""
    return json.loads((run.dir(paths["results"]) / "metrics.json").read_text())


def make_report(tmp_path, mirror, recipes, models, seeds, testsets) -> tuple[str, dict, dict]:
    params, paths = fake_tree(tmp_path, mirror, recipes, models, seeds, testsets)
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                              paths["reports"]))
    return (paths["reports"] / "report.md").read_text("utf-8"), params, paths


def assert_real_png(path: Path, min_width: int = 300) -> None:
    image = matplotlib.image.imread(path)  # (H, W, channels), floats in [0, 1]
    assert image.shape[0] >= 200 and image.shape[1] >= min_width, image.shape
    assert image[..., :3].std() > 0.05  # drawn on, not a blank canvas


@pytest.fixture(scope="module")
def full(tmp_path_factory, mirror):
    """2 recipes x 3 models x 2 seeds x 2 test sets."""
    return make_report(tmp_path_factory.mktemp("full"), mirror, ["published", "tuned"],
                       ["baseline", "scratch", "decoder_only"], [0, 1], [T16, T17])


def test_tables_hold_every_seed_and_the_seed_aggregates(full):
    text, _, paths = full
    per_seed = pd.read_csv(paths["reports"] / "results.csv")
    assert {"recipe", "model", "testset", "seed", "loss", "ppl", "bleu", "bleu_greedy", "chrf",
            "params", "seconds_per_epoch"} <= set(per_seed.columns)
    assert len(per_seed) == 2 * 3 * 2 * 2
    summary = pd.read_csv(paths["reports"] / "results_summary.csv")
    assert len(summary) == 2 * 3 * 2 and (summary.seeds == 2).all()
    # Hand aggregate of one cell, from the runs' own metrics.json.
    bleu = [run_metrics(paths, Run("tuned", "scratch", s))[T17]["bleu"] for s in (0, 1)]
    row = summary[(summary.recipe == "tuned") & (summary.model == "scratch")
                  & (summary.testset == T17)].iloc[0]
    mean, std = (bleu[0] + bleu[1]) / 2, abs(bleu[0] - bleu[1]) / math.sqrt(2)
    assert row.bleu == pytest.approx(mean, abs=1e-4) and row.bleu_std == pytest.approx(
        std, abs=1e-4)
    assert f"| {mean:.2f} ± {std:.2f} (2) |" in text
    metrics = json.loads((paths["reports"] / "metrics.json").read_text())
    assert set(metrics) == {"published", "tuned"}
    assert set(metrics["tuned"]["decoder_only"][T16]) == {"loss", "bleu", "chrf"}
    assert metrics["tuned"]["scratch"][T17]["bleu"] == pytest.approx(mean)
    assert all(isinstance(v, float) for recipe in metrics.values() for model in recipe.values()
               for t in model.values() for v in t.values())


def test_every_comparison_and_row_holds_the_runs_own_scores(full):
    """An oracle for what the report re-reads: each seed's paired bootstrap re-scores the two
    runs' translations, and must find the BLEU, chrF and test loss their evaluation wrote
    (metrics.json: the beam output against the raw references, not the tokenized ones beside
    them); the seeds' comparison holds the means over seeds; results.csv holds each run's
    numbers under its own seed."""
    _, _, paths = full

    key = {"BLEU": "bleu", "chrF": "chrf", "test loss": "loss"}
    comparisons = json.loads((paths["reports"] / "statistics.json").read_text())["comparisons"]
    assert len(comparisons) == 2 * 2 * 2 * (2 + 1) * 3  # recipes, systems, test sets, seeds
    for c in comparisons:
        seeds = (0, 1) if c["seed"] is None else (c["seed"],)  # Welch: the mean over seeds
        for side in ("system", "baseline"):
            found = [run_metrics(paths, Run(c["recipe"], c[side], s))[c["testset"]]
                     [key[c["metric"]]] for s in seeds]
            assert c[f"{side}_score"] == pytest.approx(sum(found) / len(found), rel=1e-9), c
    per_seed = pd.read_csv(paths["reports"] / "results.csv")
    cells = ["recipe", "model", "testset", "seed"]
    assert not per_seed.duplicated(cells).any()
    for row in per_seed.itertuples():
        found = run_metrics(paths, Run(row.recipe, row.model, row.seed))[row.testset]
        assert [row.loss, row.bleu, row.chrf] == pytest.approx(
            [found["loss"], found["bleu"], found["chrf"]], abs=1e-4), row


def test_every_recipe_table_ends_with_its_verdicts(full):
    text, _, paths = full
    published = text[text.index("### recipe `published`"):text.index("### recipe `tuned`")]
    for system in ("scratch", "decoder_only"):
        for testset in (T16, T17):
            for seed in (0, 1):  # every seed's pair, not only the first seed's
                for metric in ("BLEU", "test loss"):
                    assert re.search(rf"- {testset} \(bootstrap, seed {seed}\): {system} - "
                                     rf"baseline: [+-][\d.]+ {metric} ", published)
            for metric in ("BLEU", "test loss"):  # Welch over seeds on both
                assert re.search(rf"- {testset} \(seeds\): {system} - baseline: [+-][\d.]+ "
                                 rf"{metric} ", published)
    # decoder_only drops 60% of the words against the baseline's 25%: clearly worse.
    worse = [line for line in published.splitlines()
             if "(bootstrap, seed" in line and ": decoder_only - baseline:" in line
             and " BLEU " in line]
    assert len(worse) == 4 and all("baseline is better" in line for line in worse)
    stats_rows = json.loads((paths["reports"] / "statistics.json").read_text())["comparisons"]
    assert {(r["metric"], r["system"]) for r in stats_rows} >= {
        ("BLEU", "scratch"), ("chrF", "decoder_only"), ("test loss", "scratch")}
    # Each seed's pair has its own bootstraps, each computed on that seed's files.
    loss = {(r["recipe"], r["system"], r["testset"], r["seed"]): r for r in stats_rows
            if r["metric"] == "test loss"}
    assert {s for (*_, s) in loss} == {0, 1, None}
    for seed in (0, 1):
        got = loss["tuned", "scratch", T17, seed]
        want = [json.loads((Run("tuned", m, seed).dir(paths["results"]) / "metrics.json")
                           .read_text())[T17]["loss"] for m in ("scratch", "baseline")]
        assert (got["system_score"], got["baseline_score"]) == pytest.approx(want)
        assert got["method"].startswith("paired bootstrap")
    welch = loss["tuned", "scratch", T17, None]
    assert welch["method"].startswith("Welch") and welch["system_score"] == pytest.approx(
        np.mean([loss["tuned", "scratch", T17, s]["system_score"] for s in (0, 1)]))
    assert "## Statistics" in text and "bs:1000|seed:12345" in text
    assert "sacreBLEU signatures: BLEU `nrefs:1|case:mixed" in text


def test_head_answers_with_numbers(full):
    text, _, paths = full
    head = text.split("## Results")[0]
    summary = pd.read_csv(paths["reports"] / "results_summary.csv")
    s = summary[(summary.recipe == "published") & (summary.model == "scratch")
                & (summary.testset == T16)].iloc[0]
    b = summary[(summary.recipe == "published") & (summary.model == "baseline")
                & (summary.testset == T16)].iloc[0]
    verdict = next(v for v in json.loads((paths["reports"] / "statistics.json").read_text())[
        "verdicts"] if v["recipe"] == "published" and v["system"] == "scratch")
    # the first words: the verdict at the margin, plainly, then the sentence with its numbers
    assert head.startswith(f"# Transformer from scratch vs torch.nn.Transformer: Multi30k de→en"
                           f"\n\n**Verdict on {T16}, `published` recipe, 2 seeds a model: the "
                           "from-scratch Transformer and torch.nn.Transformer "
                           + rp.answer.PLAIN[verdict["outcome"]].format(m=0.02) + ".** "
                           + verdict["sentence"]), head[:400]
    assert f"BLEU (beam): {s.bleu:.2f} against {b.bleu:.2f}; Welch t-test over the seeds: " \
        "scratch - baseline:" in head
    assert "The best system on" in head


SNAPSHOT = Path(__file__).parent / "snapshots" / "report_answer.md"


def test_the_answer_and_its_tables_read_word_for_word_as_the_snapshot(tmp_path, mirror):
    """The answer, the results tables and the statistics (stages/report/answer.py) of two
    recipes, three models, two seeds, whole: a word, a digit, a blank line or an order that
    changes fails here. After a change meant to alter the report, read the diff and rewrite
    the snapshot with NMT_UPDATE_SNAPSHOTS=1 pytest tests/test_report.py -k snapshot.
    The sections are written in the test itself (about a second), not taken from the `full`
    fixture: mutmut credits what a module fixture calls to the first test that set it up, and
    runs only a mutant's credited tests, quickest first."""
    params, paths = fake_tree(tmp_path, mirror, ["published", "tuned"],
                              ["baseline", "scratch", "decoder_only"], [0, 1], [T16])
    inp = load(params, paths["tokenized"], paths["vocab"], paths["results"])
    answer = rp.answer
    text = "\n".join(answer.head_section(inp) + answer.results_section(inp)
                     + answer.statistics_section(inp))
    # sacreBLEU's version is in its signatures: the pin's, not what the snapshot tests
    text = re.sub(r"version:[\d.]+", "version:*", text)
    if os.environ.get("NMT_UPDATE_SNAPSHOTS") == "1":
        write_text(SNAPSHOT, text)
    assert text == SNAPSHOT.read_text("utf-8")


def test_the_headline_is_the_published_recipe_wherever_it_is_listed(tmp_path, mirror):
    """One seed a model: the headline's BLEU test is the paired bootstrap of seed 0, and the
    title names the corpus the params give (here a Hugging Face dataset's path)."""
    params, paths = fake_tree(tmp_path, mirror, ["tuned", "published"], ["baseline", "scratch"],
                              [0], [T16])
    params["data"] |= {"corpus": "huggingface", "huggingface": {"path": "wmt/wmt14"}}
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    title, _, first = (paths["reports"] / "report.md").read_text("utf-8").split("\n")[:3]
    assert title == "# Transformer from scratch vs torch.nn.Transformer: wmt/wmt14 de→en"
    assert first.startswith(f"**Verdict on {T16}, `published` recipe, 1 seed a model:"), first
    assert "; paired bootstrap of seed 0's outputs: scratch - baseline: " in first, first


def test_the_unknown_words_line_names_each_mode_and_each_runs_count(tmp_path, mirror):
    """Runs evaluated under either evaluate.unknown_words, and one evaluated before it was
    recorded: each way named once, and the <unk> count of every run that kept one."""
    params, paths = fake_tree(tmp_path, mirror, ["tuned"], ["baseline", "scratch"], [0, 1],
                              [T16])
    kept = {("baseline", 0): ("copy", 3), ("scratch", 0): ("mark", 5), ("scratch", 1): ("copy", 0)}
    for (model, seed), (mode, unknowns) in kept.items():
        path = Run("tuned", model, seed).dir(paths["results"]) / "evaluation.json"
        evaluation = json.loads(path.read_text())
        evaluation["unknown_words"] = mode
        evaluation["testsets"][T16]["unknowns_beam"] = unknowns
        write_json(path, evaluation)
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    line = next(x for x in text.split("\n") if x.startswith("Words the vocabulary lacks"))
    ways = rp.answer.UNKNOWN_WORDS
    assert line == ("Words the vocabulary lacks (`<unk>` in an output): "
                    f"{ways[None]}; {ways['copy']}; {ways['mark']}. The beam outputs of {T16} "
                    "held, by run: tuned-baseline-s0 3, tuned-scratch-s0 5, tuned-scratch-s1 0.")


@pytest.mark.parametrize("outcome", ["equivalent", "different", "undecided", "one seed"])
def test_the_first_sentence_is_the_verdict_at_the_margin(tmp_path, mirror, outcome):
    """Planted test losses (three seeds, or one) decide the report's first words."""
    seeds = [0] if outcome == "one seed" else [0, 1, 2]
    params, paths = fake_tree(tmp_path, mirror, ["demo"], ["baseline", "scratch"], seeds, [T16])
    if outcome != "one seed":
        plant_losses(paths["results"], "demo", PLANTED[outcome])
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    first = (paths["reports"] / "report.md").read_text("utf-8").split("\n")[2]
    plain = {"equivalent": "train alike: their test losses are equivalent within 0.02",
             "different": "do not train alike: their test losses differ by more than 0.02",
             "undecided": "may or may not train alike: the seeds cannot yet tell",
             "one seed": "have one seed each, so whether they train alike"}[outcome]
    n = len(seeds)
    assert first.startswith(f"**Verdict on {T16}, `demo` recipe, {n} seed{'s' * (n > 1)} a "
                            f"model: the from-scratch Transformer and torch.nn.Transformer "
                            f"{plain}"), first


def test_figures_exist_and_are_linked_relatively(full):
    text, _, paths = full
    figures = paths["reports"] / "figures"
    assert sorted(p.name for p in figures.iterdir()) == [
        "attention_baseline.png", "attention_decoder_only.png", "attention_scratch.png",
        "loss.png", "training.png"]
    assert_real_png(figures / "loss.png", min_width=1000)  # two panels side by side
    # lr, grad_norm, seconds, tokens_per_second side by side: every column but the losses
    assert_real_png(figures / "training.png", min_width=1600)
    for name in ("attention_baseline.png", "attention_decoder_only.png", "training.png"):
        assert_real_png(figures / name)
        assert f"](figures/{name})" in text
    assert "](figures/loss.png)" in text and "](/" not in text


def test_empty_output_reads_empty(full):
    text, _, _ = full
    assert "  - scratch: *(empty)*" in text  # sample 0 of scratch seed 0 is empty
    assert "Output: *(empty)*" in text       # and so is its attention example
    assert "Output: **" not in text and "scratch: \n" not in text


def test_each_sample_is_one_sentence_its_reference_and_every_models_beam_output(full):
    """The sample translations: each is sentence i of the first test set, its English
    reference line i, and line i of each model's beam output (recipe published, seed 0),
    as written; evenly spaced, report.samples of them."""
    text, params, paths = full
    section = text[text.index("## Sample translations"):]
    section = section[:section.index("\n## ")]
    assert section.startswith(f"## Sample translations ({T16}, recipe `published`, seed 0, "
                              "beam search)")
    sources, references = (read_lines(paths["tokenized"] / f"{T16}.{lang}.txt")
                           for lang in ("de", "en"))
    beams = {m: read_lines(Run("published", m, 0).dir(paths["results"]) / "translations"
                           / f"{T16}.beam.txt") for m in params["pipeline"]["models"]}
    found = re.findall(r"- \*\*source:\*\* (.*)\n  - reference: (.*)\n((?:  - \w+: .*\n?)+)",
                       section)
    step = len(sources) // params["report"]["samples"]
    lines = [sources.index(source) for source, _, _ in found]
    assert lines == [0, step, 2 * step]
    for i, (_, reference, outputs) in zip(lines, found, strict=True):
        assert reference == references[i]
        assert outputs.rstrip("\n").split("\n") == [f"  - {m}: {shown(beams[m][i])}"
                                                    for m in beams]


def test_sections_and_setup_follow_params(full):
    text, _, _ = full
    for section in ("## Results", "## Statistics", "## Against the published reference",
                    "## Training", "### Speed benchmark", "## Verification", "## Sample",
                    "## Attention", "## Setup"):
        assert section in text, section
    assert f"| {T17} | 1,000 |" in text and "| val | 1,000 |" in text
    assert "MFU" in text or "FLOPs utilisation" in text
    # The published runs' first validation losses beside ours, epoch by epoch
    assert re.search(r"\| epoch +\| baseline \(ours\) +\| baseline \(published\) +\| scratch "
                     r"\(ours\) +\| scratch \(published\) +\|", text)
    assert re.search(r"\| 1 +\| \d\.\d{3} +\| 3\.80 +\| \d\.\d{3} +\| 3\.84 +\|", text)
    assert "training batches: random 42.7%, bucketed 6.1%." in text  # bench.json's padding
    # each ratio's spread, and the one too wide to trust said so
    assert re.search(r"\| train tokens/s +\| .*\| +0\.95 \| 0\.90-0\.99 \(10%\) +\|", text)
    assert re.search(r"\| beam sentences/s +\| .*\| +0\.95 \| 0\.90-1\.30 \(42%, NOT TRUSTED\) \|",
                     text)
    assert "over 20% a ratio is NOT TRUSTED" in text
    # The device report: what trained, in which precision, compiled how fast, in how much memory
    assert "Trained on: NVIDIA H100 80GB HBM3 (peak memory: cuda max_memory_allocated)" in text
    assert re.search(r"\| wall s +\| +epochs s +\| precision +\| +compile s +\| +CUDA graphs "
                     r"+\| +peak MB +\|", text)
    timed = re.findall(r"\| ([\d.]+) +\| ([\d.]+) +\| bf16 +\| +41\.500 +\| +0 +\| +5120\.000 +\|",
                       text)  # the seed-0 runs: their wall time beside their epochs'
    assert timed and all(float(wall) == float(epochs) / 50 * 60 + 9 for wall, epochs in timed)
    assert re.search(r"\| - +\| - +\| bf16 +\| +41\.500 +\|", text)  # runs without them
    assert ("Precision: decoding in bf16 (auto: a CUDA GPU with bf16 tensor cores); training in "
            "bf16 (auto: a CUDA GPU with bf16 tensor cores).") in text


def test_one_test_set_two_models(tmp_path, mirror):
    text, _, paths = make_report(tmp_path, mirror, ["tuned"], ["baseline", "decoder_only"],
                                 [0], [T17])
    assert T16 not in text
    assert f"- {T17} (bootstrap, seed 0): decoder_only - baseline: " in text
    assert "(seeds)" not in text  # one seed: no seed test
    # The recipe's answer says plainly that one seed leaves training noise unmeasured.
    tuned = text[text.index("### recipe `tuned`"):]
    assert tuned.index("**decoder_only vs baseline, test loss on test_2017_flickr:** One seed "
                       "(0), so training noise is unmeasured and only the paired bootstrap over "
                       "test sentences speaks: decoder_only's test loss is ") < tuned.index("|")
    assert "needs two or more seeds a side." in tuned
    verdicts = json.loads((paths["reports"] / "statistics.json").read_text())["verdicts"]
    assert [(v["recipe"], v["system"], v["outcome"], v["seeds"]) for v in verdicts] == [
        ("tuned", "decoder_only", "one seed", 1)]
    assert text.split("\n")[2].startswith(
        "Models run: baseline, decoder_only; without both `scratch` and `baseline` there is no "
        f"from-scratch vs torch.nn.Transformer comparison. The best system on {T17} is `")
    assert f"## Sample translations ({T17}" in text
    assert "± - (1)" in text
    assert len(pd.read_csv(paths["reports"] / "results.csv")) == 2
    assert sorted(p.name for p in (paths["reports"] / "figures").iterdir()) == [
        "attention_baseline.png", "attention_decoder_only.png", "loss.png", "training.png"]


def test_one_model_and_its_ablation(tmp_path, mirror):
    text, _, _ = make_report(tmp_path, mirror, ["tuned", "tuned_no_tying"], ["scratch"], [0],
                             [T16])
    assert " - baseline:" not in text  # nothing to compare with
    assert "\n\n\n" not in text  # no verdicts, and no blank line left where they would be
    assert "no from-scratch vs torch.nn.Transformer comparison" in text
    assert "## Ablation of `tuned`" in text and "| tuned_no_tying | tied embeddings |" in text
    assert f"Δ scratch {T16}" in text
    assert "The `published` recipe is not in `pipeline.recipes`." in text


def test_verification_says_which_kind_of_check_ran(tmp_path, mirror):
    """A recipe with no twin (here as if with rotary positions) is reported as passed on its
    property checks, one with a twin as having run them; a verify file older than the two
    kinds reads as before. Each model's record (results/verify/<recipe>-<model>.json) adds
    its checks; the baseline's has none of its own, and one that failed fails the recipe."""
    params, paths = fake_tree(tmp_path, mirror, ["published", "tuned", "tuned_no_tying"],
                              ["baseline", "scratch"], [0], [T16])
    check = {"name": "kv-cache decoding (scratch)", "passed": True, "max_abs_diff": 1e-7,
             "tolerance": 1e-5, "seconds": 0.1}
    reason = "the baseline (torch.nn.Transformer) has sinusoidal positions only"
    write_json(paths["results"] / "verify" / "tuned-scratch.json", {
        "passed": True, "twin": True, "twin_reason": "expressed", "checks": [
            {**check, "name": "logits (float64)", "kind": "twin"},
            {**check, "kind": "property"}]})
    write_json(paths["results"] / "verify" / "tuned_no_tying-scratch.json", {
        "passed": True, "twin": False, "twin_reason": reason,
        "checks": [{**check, "kind": "property"}]})
    for recipe in ("tuned", "tuned_no_tying"):
        write_json(paths["results"] / "verify" / f"{recipe}-baseline.json", {
            "passed": recipe == "tuned", "twin": None, "twin_reason": "baseline: no twin "
            "check set", "checks": []})
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = re.sub(" +", " ", (paths["reports"] / "report.md").read_text("utf-8"))  # table pads
    old = text[text.index("### published: all checks passed"):text.index("### tuned:")]
    assert "Twin checks" not in old and "| logits (float64, baseline) | True |" in old
    assert "| logits (float64, scratch) | True |" in old
    tuned = text[text.index("### tuned: all checks passed"):text.index("### tuned_no_tying")]
    assert "Twin checks: ran." in tuned and "| logits (float64) | twin |" in tuned
    assert tuned.count("Twin checks") == 1  # the baseline's record has none to speak of
    no_twin = text[text.index("### tuned_no_tying: FAILED"):text.index("## Sample")]
    assert f"Twin checks: none ({reason}); passed or failed on its property checks" in no_twin
    assert "| kv-cache decoding (scratch) | property |" in no_twin


def test_search_table_lists_every_step_trained_after_the_step_it_builds_on(tmp_path, mirror):
    """Steps outside pipeline.recipes count too (make demo-search trains them), each after the
    step it builds on, with the validation figures only; a step's Δ BLEU is against that
    step (same model and seed), not against the row above it."""
    params, paths = fake_tree(tmp_path, mirror, ["tuned"], ["scratch"], [0], [T16])
    recipes = params["recipes"]
    steps = rp.search_steps(recipes)
    assert steps[0] == "demo_s0" and "step_of" not in recipes["demo_s0"]
    assert all(steps.index(recipes[s]["step_of"]) < steps.index(s) for s in steps[1:])
    assert sorted(steps) == sorted(["demo_s0", *(r for r in recipes if "step_of" in recipes[r])])
    branch = next(s for s in steps[2:] if recipes[s]["step_of"] == "demo_s0")  # a 2nd branch
    runs = {"demo_s0": ("scratch", 27), "demo_s1": ("scratch", 26), branch: ("scratch", 29.5),
            "demo_d1": ("decoder_only", 20), "demo_d2": ("decoder_only", 21)}
    for step, (model, bleu) in reversed(runs.items()):  # written out of order on purpose
        write_json(paths["results"] / f"{step}-{model}-s0" / "train.json", {
            "model": model, "seed": 0, "params": 1000, "updates": 900, "epochs": 9,
            "train_minutes": 9.5, "best_valid_loss": 2.3, "valid_bleu_greedy": bleu})
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    section = text.split("## Recipe search (validation set only)")[1].split("\n## ")[0]
    rows = {cells[0]: cells for line in section.splitlines() if line.startswith("| demo_")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert list(rows) == [s for s in steps if s in runs]
    assert rows["demo_s0"][1:3] == ["-", "(the start)"]
    assert rows["demo_s1"][1:3] == ["demo_s0", recipes["demo_s1"]["adds"]]
    assert rows["demo_s0"][-4:] == ["9.5", "2.3000", "27.00", "-"]  # minutes, loss, BLEU
    assert rows["demo_s1"][-1] == "-1.00" and rows[branch][-1] == "+2.50"  # both against s0
    assert rows["demo_d1"][-1] == "-"  # its parent has no decoder_only run
    assert rows["demo_d2"][-1] == "+1.00"


def test_no_search_table_without_search_runs(full):
    assert "## Recipe search" not in full[0]


def test_a_missing_run_file_is_one_clear_error(tmp_path, mirror):
    params, paths = fake_tree(tmp_path, mirror, ["tuned"], ["baseline", "scratch"], [0], [T16])
    (Run("tuned", "scratch", 0).dir(paths["results"]) / "translations"
     / f"{T16}.loss.tsv").unlink()
    with pytest.raises(NmtError, match=r"loss.tsv is missing \(fix: "):
        rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                  paths["reports"]))
    assert not (paths["reports"] / "report.md").exists()  # nothing half-written


# Test losses planted in three seeds' metrics.json: (scratch, baseline), and where the 95%
# Welch interval of their difference lies against the goal, scratch - baseline within 0.02.
PLANTED = {
    # -0.005, CI about -0.010 .. -0.000: inside ±0.02
    "equivalent": ([1.900, 1.902, 1.898], [1.905, 1.903, 1.907]),
    # -0.041, CI about -0.046 .. -0.037: wholly below -0.02
    "different": ([1.880, 1.882, 1.878], [1.921, 1.923, 1.919]),
    # -0.023, CI about -0.036 .. -0.010: across -0.02
    "undecided": ([1.898, 1.894, 1.902], [1.921, 1.927, 1.915]),
}


def plant_losses(results: Path, recipe: str, losses: tuple[list, list]) -> None:
    """Each seed's test loss on T16 in metrics.json: scratch's, then the baseline's."""
    for model, planted in zip(("scratch", "baseline"), losses, strict=True):
        for seed, loss in enumerate(planted):
            path = Run(recipe, model, seed).dir(results) / "metrics.json"
            metrics = json.loads(path.read_text())
            metrics[T16]["loss"] = loss
            write_json(path, metrics)


@pytest.mark.parametrize("outcome", list(PLANTED))
def test_the_verdict_over_three_seeds_says_where_the_interval_lies(tmp_path, mirror, outcome):
    params, paths = fake_tree(tmp_path, mirror, ["published"], ["baseline", "scratch"],
                              [0, 1, 2], [T16])
    plant_losses(paths["results"], "published", PLANTED[outcome])
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    scratch, baseline = (np.array(x) for x in PLANTED[outcome])
    words = {"equivalent": "the interval lies within ±0.02: equivalent within 0.02.",
             "different": "the interval lies outside ±0.02: different by more than 0.02.",
             "undecided": "the interval straddles ±0.02: undecided at 0.02."}[outcome]
    published = text[text.index("### recipe `published`"):]
    sentence = published.splitlines()[2]  # first under the heading, above the table
    assert sentence.startswith(f"**scratch vs baseline, test loss on {T16}:** Over 3 seeds, "
                               f"scratch's test loss is {scratch.mean():.3f} ± "
                               f"{scratch.std(ddof=1):.3f} against baseline's "
                               f"{baseline.mean():.3f} ± {baseline.std(ddof=1):.3f} "
                               f"(difference {scratch.mean() - baseline.mean():+.3f}, 95% CI ")
    assert sentence.endswith(words), sentence
    better = "scratch is better" if outcome != "equivalent" else ""
    assert better in sentence
    verdict = json.loads((paths["reports"] / "statistics.json").read_text())["verdicts"][0]
    assert (verdict["outcome"], verdict["seeds"], verdict["margin"]) == (outcome, 3, 0.02)
    assert verdict["basis"].startswith("Welch") and verdict["sentence"] in sentence
    inside = -0.02 <= verdict["low"] and verdict["high"] <= 0.02
    outside = verdict["high"] < -0.02 or verdict["low"] > 0.02
    assert (inside, outside) == {"equivalent": (True, False), "different": (False, True),
                                 "undecided": (False, False)}[outcome]


def test_attention_kernels_section_routes_and_the_ab_curves(tmp_path, mirror):
    """Each run's route from train.json; the published_cudnn runs found in results/ (outside
    pipeline.recipes, as the study trains them) against the published runs, epoch by epoch."""
    params, paths = fake_tree(tmp_path, mirror, ["published"], ["baseline", "scratch"], [0, 1],
                              [T16])
    for model, seed in itertools.product(("baseline", "scratch"), (0, 1)):
        path = Run("published", model, seed).dir(paths["results"]) / "train.json"
        write_json(path, json.loads(path.read_text()) | {"attention_kernels": "efficient,math"})
    planted = {"baseline": [3.9, 3.6, 3.4, 3.2, 3.0, 2.8, 2.6],  # 7 epochs, cuDNN allowed
               "scratch": [4.0, 3.8, 3.7, 3.6, 3.5, 3.4, 3.3]}
    for model, losses in planted.items():
        folder = paths["results"] / f"published_cudnn-{model}-s0"
        write_text(folder / "history.csv", pd.DataFrame(
            {"epoch": range(1, 8), "train_loss": losses, "valid_loss": losses}).to_csv(index=False))
        write_json(folder / "train.json", {"attention_kernels": "any"})
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    section = text.split("## Attention kernels")[1].split("\n## ")[0]
    assert ("efficient,math: published-baseline-s0, published-baseline-s1, published-scratch-s0, "
            "published-scratch-s1.") in section
    assert "runs: published_cudnn-baseline-s0 (any), published_cudnn-scratch-s0 (any)" in section
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if re.match(r"\| +\d", line)]
    assert len(rows) == 4  # the published runs' seeds reached 5 and 4 epochs: the common 4
    for row in rows:
        epoch = int(row[0])
        # fake_run's valid_loss: 4 / epoch + 1 (+ 0.4 a model index), the same for each seed
        for k, (model, gap) in enumerate((("baseline", 0.0), ("scratch", 0.4))):
            ours, published, difference = (float(x) for x in row[1 + 3 * k: 4 + 3 * k])
            assert ours == pytest.approx(planted[model][epoch - 1], abs=5e-4)
            assert published == pytest.approx(4 / epoch + 1 + gap, abs=5e-4)
            assert difference == pytest.approx(ours - published, abs=1e-3)


def test_no_ab_runs_say_so(full):
    section = full[0].split("## Attention kernels")[1].split("\n## ")[0]
    assert "not recorded: published-baseline-s0" in section  # fake runs predate the record
    assert "No A/B runs: results/ holds no `published_cudnn` run" in section


def test_the_recipes_that_take_a_departure_back_sit_beside_the_reference(tmp_path, mirror):
    """published_faithful (random batches, fp32) in the pipeline: its validation curve, the
    mean over seeds, between ours and the published runs'."""
    params, paths = fake_tree(tmp_path, mirror, ["published", "published_faithful"],
                              ["baseline", "scratch"], [0, 1], [T16])
    for seed in (0, 1):  # the faithful scratch runs' curves, planted per seed
        path = Run("published_faithful", "scratch", seed).dir(paths["results"]) / "history.csv"
        history = pd.read_csv(path)
        history["valid_loss"] = [3.7 + 0.2 * seed - 0.1 * e for e in range(len(history))]
        write_text(path, history.to_csv(index=False))
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = re.sub(" +", " ", (paths["reports"] / "report.md").read_text("utf-8"))
    assert ("| epoch | baseline (ours) | baseline (random batches, fp32) | baseline (published) "
            "| scratch (ours) | scratch (random batches, fp32) | scratch (published) |") in text
    # seed 0 reached 5 epochs, seed 1 four: the mean over the common four
    assert "| 1 | 5.000 | 5.000 | 3.80 | 5.400 | 3.800 | 3.84 |" in text
    assert "| 4 | 2.000 | 2.000 | 3.11 | 2.400 | 3.500 | 3.15 |" in text
    assert "| 5 |" not in text.split("beside the published runs'")[1].split("##")[0]
    assert "ours (mean of seeds [0, 1]) beside the published runs'" in text


def plant_test_losses(results: Path, run: Run, per_token: float, batch_mean: float) -> None:
    """A run's per-sentence losses on T16 whose token mean is per_token and whose mean of
    32-sentence batch means is batch_mean: the first batch's sentences long (20 tokens), the
    rest short (5), each batch's token mean solved for; metrics.json's loss agrees."""
    n = SENTENCES
    tokens = [20] * 32 + [5] * (n - 32)
    long, short = sum(tokens[:32]), sum(tokens[32:])
    first = (per_token * (long + short) - 2 * batch_mean * short) / (long - short)
    second = 2 * batch_mean - first
    losses = [t * (first if i < 32 else second) for i, t in enumerate(tokens)]
    folder = run.dir(results)
    write_lines(folder / "translations" / f"{T16}.loss.tsv",
                [f"{x!r}\t{t}" for x, t in zip(losses, tokens, strict=True)])
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics[T16]["loss"] = per_token
    write_json(folder / "metrics.json", metrics)


@pytest.mark.parametrize("case", ["ruled out", "accounts for it", "part of it"])
def test_the_reference_gap_and_the_averaging_follow_the_losses(tmp_path, mirror, case):
    """The reference section's gap and its verdict on the loss averaging come from the runs'
    per-sentence losses: planted so that the reference's averaging moves ours by nothing, by
    the whole gap or by half of it, the sentence says so (and never 'small differences are
    expected', the explanation the H200 run's losses contradicted)."""
    params, paths = fake_tree(tmp_path, mirror, ["published"], ["baseline", "scratch"], [0, 1],
                              [T16])
    published = {"baseline": 2.0176, "scratch": 2.0239}
    for model, seed in itertools.product(published, (0, 1)):
        ours = 1.92
        averaged = {"ruled out": ours, "accounts for it": published[model],
                    "part of it": (ours + published[model]) / 2}[case]
        plant_test_losses(paths["results"], Run("published", model, seed), ours, averaged)
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    section = text.split("## Against the published reference")[1].split("\n## ")[0]
    assert (f"The gap on {T16}, ours minus published (mean over seeds [0, 1]): baseline 1.9200 "
            "against 2.0176 (-0.098), scratch 1.9200 against 2.0239 (-0.104).") in section
    share = {"ruled out": "0%", "accounts for it": "100%", "part of it": "50%"}[case]
    assert "ours would read baseline " in section and f"{share} of its gap)" in section
    cause = {"ruled out": "so the averaging is ruled out as the cause",
             "accounts for it": "so the averaging accounts for the gap.",
             "part of it": "so the averaging accounts for part of the gap, not all."}[case]
    assert cause in section, section
    assert "small differences are expected" not in text
    assert ("`published_random` (random batches) has not run; `published_faithful` (random "
            "batches, fp32) has not run.") in section


def test_the_loss_figure_draws_the_published_curves_beside_ours(tmp_path, mirror):
    """The published recipe's panel holds the reference's validation curves, labelled; a
    recipe of another size has none; the report says what the dotted lines are."""
    params, paths = fake_tree(tmp_path, mirror, ["published", "demo"],
                              ["baseline", "scratch", "decoder_only"], [0], [T16])
    inp = load(params, paths["tokenized"], paths["vocab"], paths["results"])
    legends = plot_losses(inp, tmp_path / "loss.png")
    assert_real_png(tmp_path / "loss.png", min_width=1000)
    assert [x for x in legends["published"] if "published" in x] == [
        "baseline valid (published)", "scratch valid (published)"]
    assert not [x for x in legends["demo"] if "published" in x]
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    assert ("Dotted, on the panel of `published`: the published runs' validation loss, the "
            "epochs the reference reports.") in text


def planted_full_size(folder: Path, p: float, difference: float) -> Path:
    """A copy of the published full-size run's two files with decoder_only's BLEU difference
    and p on T16 planted."""
    published = REPO / "reports" / "h200-published"
    summary = pd.read_csv(published / "results_summary.csv")
    row = (summary.model == "decoder_only") & (summary.testset == T16)
    baseline = summary[(summary.model == "baseline") & (summary.testset == T16)].bleu.iloc[0]
    summary.loc[row, "bleu"] = baseline + difference
    write_text(folder / "results_summary.csv", summary.to_csv(index=False))
    rows = json.loads((published / "statistics.json").read_text())
    for c in rows:
        if (c["system"], c["metric"], c["testset"]) == ("decoder_only", "BLEU", T16):
            c |= {"p": p, "difference": difference}
    write_json(folder / "statistics.json", rows)
    return folder


@pytest.mark.parametrize("full_size", ["published", "level", "behind", "none"])
def test_a_recipe_whose_verdict_differs_from_full_size_says_so(tmp_path, mirror, full_size):
    """The demo-size decoder-only model trails (fake_run drops 60 % of its words, against 25 %
    for the baseline); at full size (reports/h200-published) it is ahead: a paragraph gives
    both sides' BLEU, p and parameters. Planted level, the paragraph says level; planted
    behind as well, or no full-size run, there is none. Scratch, level on both sides, has none."""
    params, paths = fake_tree(tmp_path, mirror, ["demo"], ["baseline", "scratch", "decoder_only"],
                              [0, 1, 2], [T16])
    folder = {"published": REPO / "reports" / "h200-published",
              "level": planted_full_size(tmp_path / "level", 0.47, 0.4),
              "behind": planted_full_size(tmp_path / "behind", 0.001, -3.0),
              "none": tmp_path / "nothing"}[full_size]
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"], full_size=folder))
    text = (paths["reports"] / "report.md").read_text("utf-8")
    if full_size in ("behind", "none"):
        assert "## Against full size" not in text
        return
    section = text.split("## Against full size")[1].split("\n## ")[0]
    assert "scratch" not in section
    summary = pd.read_csv(paths["reports"] / "results_summary.csv").query("testset == @T16")
    d, b = (summary[summary.model == m].iloc[0] for m in ("decoder_only", "baseline"))
    assert (f"**decoder_only, `demo` against full size.** On {T16}, in the `demo` recipe "
            f"(3 seeds), decoder_only is behind the baseline: {d.bleu:.2f} against "
            f"{b.bleu:.2f} BLEU ({d.bleu - b.bleu:+.2f}; Welch t-test over seeds, n = 3 vs 3, "
            f"p ") in section
    assert f"with {int(d.params):,} parameters against {int(b.params):,}" in section
    assert "100 updates each" not in section  # fake seeds trained different updates
    if full_size == "published":
        assert (f"At full size, in {folder}, the `published` recipe (1 seed), decoder_only is "
                "ahead of the baseline: 37.59 against 36.22 BLEU (+1.38; sacreBLEU paired "
                "bootstrap, 1000 resamples, seed 12345, p = 0.01), with 65,823,744 parameters "
                "against 65,083,476 (1.01x).") in section
    else:
        assert ("decoder_only is level with the baseline: 36.62 against 36.22 BLEU (+0.40;"
                in section)
    assert section.strip().endswith("So the `demo` recipe's verdict on decoder_only holds at its "
                                    "size, not at full size.")


def test_a_full_size_recipe_is_not_set_against_full_size(tmp_path, mirror):
    """The study's `tuned` beside `published`: both full size (fake runs: as many parameters),
    so whatever their standings, no paragraph blames a size."""
    params, paths = fake_tree(tmp_path, mirror, ["published", "tuned"],
                              ["baseline", "decoder_only"], [0, 1], [T16])
    for seed in (0, 1):  # published's decoder-only planted far ahead; tuned's stays behind
        baseline = json.loads((Run("published", "baseline", seed).dir(paths["results"])
                               / "metrics.json").read_text())[T16]["bleu"]
        path = Run("published", "decoder_only", seed).dir(paths["results"]) / "metrics.json"
        metrics = json.loads(path.read_text())
        metrics[T16]["bleu"] = baseline + 20 + seed
        write_json(path, metrics)
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"], full_size=REPO / "reports" / "h200-published"))
    assert "## Against full size" not in (paths["reports"] / "report.md").read_text("utf-8")


def test_a_verdict_over_runs_of_different_precisions_says_so(tmp_path, mirror):
    """The baseline's seed 0 trained in fp32, every other run in bf16 (a busy machine's
    calibration): the verdict sentence, in the report's first words and statistics.json,
    names each side's precisions; runs of one precision have no such words."""
    params, paths = fake_tree(tmp_path, mirror, ["demo"], ["baseline", "scratch"], [0, 1], [T16])
    path = Run("demo", "baseline", 0).dir(paths["results"]) / "train.json"
    write_json(path, json.loads(path.read_text()) | {"precision": "fp32"})
    rp.report(params, rp.Paths(paths["tokenized"], paths["vocab"], paths["results"],
                               paths["reports"]))
    verdict = json.loads((paths["reports"] / "statistics.json").read_text())["verdicts"][0]
    caution = ("Caution: the runs compared trained in different precisions (scratch bf16, "
               "baseline bf16 and fp32), so the difference holds the precision's effect as well "
               "as the architectures'.")
    assert verdict["sentence"].endswith(caution)
    assert verdict["precisions"] == {"scratch": ["bf16"], "baseline": ["bf16", "fp32"]}
    head = (paths["reports"] / "report.md").read_text("utf-8").split("## Results")[0]
    assert caution in head
    assert "Caution" not in make_report(tmp_path / "one", mirror, ["demo"],
                                        ["baseline", "scratch"], [0, 1], [T16])[0]
