"""Smoke: the whole pipeline on tiny settings, in a scratch copy, with DVC and with Snakemake.

Each orchestrator runs everything (download ... report) once (the session fixtures in
conftest.py); a second run must do nothing, and both must give the same numbers.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
import shutil

import pytest
import yaml
from sacrebleu.metrics import BLEU, CHRF

from nmt.core.runs import Run
from test_orchestrators import TRAINED, digests, error_lines
from tiny import check_report, run

pytestmark = pytest.mark.slow


def test_dvc_repro(dvc_run):
    check_report(dvc_run)
    second = run(["dvc", "repro"], dvc_run)
    # Only the stage that checks the corpus's files (always run) runs; they did not change.
    assert re.findall(r"Running stage '([^']+)'", second) == ["sources"], second
    shown = run(["dvc", "metrics", "show"], dvc_run)
    assert "bleu" in shown and "…" not in shown  # numbers only: the table fits


def test_snakemake(snakemake_run):
    check_report(snakemake_run)
    second = run(["snakemake", "--cores", "2", "--resources", "gpu=2"], snakemake_run)
    assert "Nothing to be done" in second, second


def test_both_orchestrators_train_with_two_processes(dvc_run, snakemake_run):
    """train.devices: 2 (the tiny tuned recipe) makes `nmt train` launch torchrun with two
    Gloo processes, under either tool."""
    assert "tuned-scratch-s0: " in (dvc_run / "repro.log").read_text()
    assert "on 2 processes (cpu)" in (dvc_run / "repro.log").read_text()
    log = (snakemake_run / "logs" / "train-tuned-scratch-0.log").read_text()
    assert "on 2 processes (cpu)" in log


def test_both_orchestrators_give_the_same_numbers(dvc_run, snakemake_run):
    """Same commands, same thread count: the same losses, BLEU and translations, exactly."""
    runs = sorted(p.parent.name for p in (dvc_run / "results").glob("*/metrics.json"))
    assert runs
    for name in runs:
        a, b = (json.loads((root / "results" / name / "metrics.json").read_text())
                for root in (dvc_run, snakemake_run))
        assert a == b, name
        for path in (dvc_run / "results" / name / "translations").iterdir():
            twin = snakemake_run / "results" / name / "translations" / path.name
            assert path.read_text() == twin.read_text(), path


def raw_lines(mirror, testset: str, cut: int) -> list[bytes]:
    """The first `cut` lines of the mirror's <testset>.en.gz, as written (no newlines)."""
    return gzip.decompress((mirror / f"{testset}.en.gz").read_bytes()).split(b"\n")[:cut]


def test_every_run_is_scored_against_the_raw_test_set_lines(dvc_run, mirror):
    """What each evaluation scored against (evaluation.json: lines and sha256) is the first
    data.max_test_pairs lines of the mirror's <testset>.en.gz, byte for byte, after download
    and tokenize (tests/test_headline.py scores an oracle against them)."""
    params = yaml.safe_load((dvc_run / "params.yaml").read_text())
    cut = params["data"]["max_test_pairs"]
    expected = {}
    for testset in params["evaluate"]["testsets"]:
        lines = raw_lines(mirror, testset, cut)
        expected[testset] = {"lines": cut, "sha256": hashlib.sha256(
            b"".join(line + b"\n" for line in lines)).hexdigest()}
    evaluations = list((dvc_run / "results").glob("*/evaluation.json"))
    assert len(evaluations) == 6  # 2 recipes x 3 models
    for path in evaluations:
        testsets = json.loads(path.read_text())["testsets"]
        assert {t: testsets[t]["references"] for t in expected} == expected, path


def test_every_score_is_sacrebleus_of_the_written_translations(dvc_run, mirror):
    """Each run's BLEU and chrF, beam and greedy, in metrics.json and in the report's
    results.csv, are sacreBLEU's defaults (13a, cased; chrF of characters alone) of the
    translations the run wrote against the raw test-set lines, recomputed here from the files:
    a score taken with other settings, of other lines or of the other decoding differs from
    them. The tiny models are all but untrained (BLEU 0-0.1), so the test also checks that
    their translations tell the settings apart: lowercased BLEU differs from cased on some of
    them, chrF++ from chrF on every one (were it not so, the equalities would prove less)."""
    params = yaml.safe_load((dvc_run / "params.yaml").read_text())
    references = {testset: [line.decode() for line in raw_lines(
        mirror, testset, params["data"]["max_test_pairs"])]
        for testset in params["evaluate"]["testsets"]}
    with open(dvc_run / "reports" / "results.csv") as f:
        table = {(r["recipe"], r["model"], int(r["seed"]), r["testset"]): r
                 for r in csv.DictReader(f)}
    scored, told_apart = [], {"lowercased BLEU": [], "chrF++": []}
    for path in sorted((dvc_run / "results").glob("*/metrics.json")):
        run_, metrics = Run.parse(path.parent.name), json.loads(path.read_text())
        for testset, lines in references.items():
            row = table[(run_.recipe, run_.model, run_.seed, testset)]
            for method, suffix in (("beam", ""), ("greedy", "_greedy")):
                written = (path.parent / "translations" / f"{testset}.{method}.txt").read_text()
                hypotheses = written.splitlines()
                for name, metric, other, label in (
                        ("bleu", BLEU(), BLEU(lowercase=True), "lowercased BLEU"),
                        ("chrf", CHRF(), CHRF(word_order=2), "chrF++")):
                    want = metric.corpus_score(hypotheses, [lines]).score
                    assert metrics[testset][name + suffix] == want, (path, testset, name, method)
                    assert float(row[name + suffix]) == pytest.approx(want, abs=5e-5)  # 4 places
                    scored.append(want)
                    told_apart[label].append(other.corpus_score(hypotheses, [lines]).score != want)
    assert len(scored) == 6 * len(references) * 2 * 2  # runs, test sets, decodings, metrics
    assert any(told_apart["lowercased BLEU"]) and all(told_apart["chrF++"]), told_apart


def test_the_orchestrators_own_reports(dvc_run, snakemake_run, tmp_path):
    """Snakemake's HTML report holds the results table; dvc plots draws every run's curves."""
    run(["snakemake", "--report", str(tmp_path / "snakemake.html")], snakemake_run)
    html = (tmp_path / "snakemake.html").read_text(errors="replace")
    assert "results_summary.csv" in html and "loss.png" in html
    run(["dvc", "plots", "show", "-o", str(tmp_path / "plots")], dvc_run)
    page = (tmp_path / "plots" / "index.html").read_text()
    assert "valid loss" in page and "published-scratch-s0" in page


def test_dvc_experiments(dvc_run):
    """`dvc exp run -S` and `dvc exp show` work on the pipeline. The experiment reaches one
    run's evaluation (a target, as `make demo-search` names one): every run would train again
    for the same check. Runs after the contract tests (tests/test_contract.py,
    earlier in the session): it changes the DVC copy they read."""
    run(["git", "add", "-A"], dvc_run)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny run"],
        dvc_run)
    out = run(["dvc", "exp", "run", "-S", "train.lr=0.0002", "evaluate@published-scratch-0"],
              dvc_run)  # (the learning rate: a training of the same epoch, where epochs=2 took two)
    assert "Running stage 'train@published-scratch-0'" in out
    assert "Running stage 'vocab@published'" not in out  # the rate reaches training, not data
    shown = run(["dvc", "exp", "show", "--csv"], dvc_run)
    assert "train.lr" in shown and "bleu" in shown
    # Issue 58 item 7: the resolved recipe (params/, git-ignored) comes back with the rest,
    # going back to the commit and applying the experiment again; DVC had left it as the last
    # run wrote it, and called config changed until the next `dvc repro`.
    resolved = dvc_run / "params" / "published.yaml"
    experiment = resolved.read_text()
    run(["git", "checkout", "params.yaml", "dvc.lock"], dvc_run)
    run(["dvc", "checkout"], dvc_run)
    assert resolved.read_text() != experiment
    assert "up to date" in run(["dvc", "status", "config@published"], dvc_run)
    run(["dvc", "exp", "apply", run(["dvc", "exp", "ls", "--name-only"], dvc_run).split()[-1]],
        dvc_run)
    assert resolved.read_text() == experiment
    assert "up to date" in run(["dvc", "status", "config@published"], dvc_run)


def test_either_orchestrator_after_the_other_runs_nothing_again(snakemake_run):
    """Issue 69 item 2, in the checkout Snakemake ran whole: `dvc repro` refuses in one line
    before it deletes a training (dvc.lock knows none of them), `nmt adopt` records the runs,
    and from then on each tool, run after the other, twice each way and once more without
    Snakemake's records, re-runs nothing (DVC: only its always-run sources stage, which keeps
    params/sources.sha256 and its time as they were). (`nmt adopt` in a checkout Snakemake
    has not finished: tests/test_orchestrators.py.) Runs last of the tiny pipelines' tests: it
    writes dvc.lock there and deletes .snakemake/metadata, which the contract's dry runs and
    Snakemake's report read."""
    root = snakemake_run
    files = [path.relative_to(root) for path in sorted((root / "results").glob("*/*"))
             if path.name in {f.name for f in TRAINED}]
    assert len(files) == len(TRAINED) * 6  # 2 recipes x 3 models
    trained = digests(root, files)
    sources = (root / "params/sources.sha256").stat().st_mtime_ns
    out = run(["dvc", "repro"], root, check=False)
    errors = [e for e in error_lines(out) if not e.startswith("ERROR: failed to reproduce")]
    assert len(errors) == 1 and "not in dvc.lock" in errors[0] and "nmt adopt" in errors[0], out
    assert "Running stage 'train" not in out and digests(root, files) == trained
    assert "dvc.lock records" in run(["nmt", "adopt"], root)
    for _ in range(2):
        out = run(["dvc", "repro"], root)
        assert re.findall(r"Running stage '([^']+)'", out) == ["sources"], out
        assert "Nothing to be done" in run(["snakemake", "--cores", "2", "--resources", "gpu=2"],
                                           root)
    # As DVC had made every output: Snakemake without its records of them compares times only
    # (where a rewritten sources record re-ran download and all after it). Once: the loop
    # above showed that a tool's run after the other's leaves nothing for the next.
    shutil.rmtree(root / ".snakemake" / "metadata")
    assert re.findall(r"Running stage '([^']+)'", run(["dvc", "repro"], root)) == ["sources"]
    assert "Nothing to be done" in run(["snakemake", "-n", "--cores", "2"], root)
    assert digests(root, files) == trained
    assert (root / "params/sources.sha256").stat().st_mtime_ns == sources
