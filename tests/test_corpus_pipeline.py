"""Smoke: the new recipes on their own corpora, end to end at tiny size: iwslt14 on local
text files under `dvc repro`, wmt14 on a local Hugging Face (parquet) dataset under
Snakemake. A second run does nothing; an edited corpus file re-runs download and what
follows it (as far as tokenize; Snakemake's dry run shows the rest, up to the report), and
nothing before it."""

from __future__ import annotations

import csv
import gzip
import re
import stat

import pandas as pd
import pytest
import yaml

from corpora import corpus_data, write_files, write_parquet
from tiny import halves, run, run_at_once, scratch_copy

pytestmark = pytest.mark.slow


def corpus_copy(dest, recipe: str, data: dict):
    """A tiny copy of the repository whose pipeline is `recipe` alone (scratch, seed 0), on
    the corpus `data`, trained for one epoch on one process."""
    root = scratch_copy(dest)
    params = yaml.safe_load((root / "params.yaml").read_text())
    r = params["recipes"][recipe]
    r["data"] |= data
    r["train"].update(max_updates=0, epochs=1, devices=1, average_last=1)
    r["evaluate"]["testsets"] = ["news_test"]
    params["pipeline"] = {"recipes": [recipe], "models": ["scratch"], "seeds": [0], "export": []}
    params["bench"]["recipe"] = recipe
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory, mirror) -> dict[str, dict]:
    """Both pipelines after their first run, run at once (each on half the cores): iwslt14 on
    local text files under `dvc repro`, wmt14 on a local parquet dataset under Snakemake."""
    base = tmp_path_factory.mktemp("corpora")
    files = write_files(mirror, base / "corpus")
    hf = write_parquet(mirror, base / "wmt_like")
    pipelines = {
        "iwslt14": {"root": corpus_copy(base / "iwslt14", "iwslt14", corpus_data("files", files)),
                    "corpus": base / "corpus", "cmd": ["dvc", "repro"]},
        "wmt14": {"root": corpus_copy(base / "wmt14", "wmt14", corpus_data("huggingface", hf)),
                  "corpus": base / "wmt_like",
                  "cmd": ["snakemake", "--cores", str(len(halves()[1]))]}}
    run_at_once([(p["cmd"], p["root"], None) for p in pipelines.values()])
    return pipelines


def results(root) -> list[tuple]:
    with open(root / "reports" / "results.csv") as f:
        return [(r["recipe"], r["model"], r["testset"]) for r in csv.DictReader(f)]


def test_iwslt14_on_local_files_under_dvc(first_runs):
    root, corpus = first_runs["iwslt14"]["root"], first_runs["iwslt14"]["corpus"]
    assert results(root) == [("iwslt14", "scratch", "news_test")]
    assert re.findall(r"Running stage '([^']+)'", run(["dvc", "repro"], root)) == ["sources"]

    edited = corpus / "news_test.en.gz"  # one test sentence changes
    lines = gzip.decompress(edited.read_bytes()).decode().splitlines()
    edited.write_bytes(gzip.compress(("An edited sentence.\n" + "\n".join(lines[1:]) + "\n")
                                     .encode()))
    # As far as tokenize (what follows it re-runs as after any edit of its outputs; the
    # Snakemake test below shows the plan that reaches the report).
    ran = re.findall(r"Running stage '([^']+)'", run(["dvc", "repro", "tokenize"], root))
    assert ran[:3] == ["sources", "download", "tokenize"] and not any(
        s.startswith("config") for s in ran), ran
    assert "An edited sentence." in (root / "data/tokenized/news_test.en.txt").read_text()

    # A file saved as Latin-1: sources, which download depends on, refuses it in one line
    # before DVC deletes data/raw for a download bound to fail (it did).
    raw = raw_files(root)
    good = (corpus / "train.en").read_bytes()
    (corpus / "train.en").write_bytes(good + "Ein Fußgänger.\n".encode("latin-1"))
    out = run(["dvc", "repro", "download"], root, check=False)
    assert "data.files.train.en" in out and "line 1001 is not UTF-8" in out, out
    assert raw_files(root) == raw and "Running stage 'download'" not in out, out

    # data/raw a link to a folder outside the checkout: refused before DVC deletes it, which
    # made that folder writable to everyone (mode 777) before download replaced the link.
    (corpus / "train.en").write_bytes(good)
    outside = corpus.parent / "raw_elsewhere"
    (root / "data/raw").rename(outside)
    outside.chmod(0o755)
    (root / "data/raw").symlink_to(outside)
    out = run(["dvc", "repro", "download"], root, check=False)
    assert f"data/raw is a link to {outside}, outside the checkout" in out, out
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755 and (root / "data/raw").is_symlink()
    (root / "data/raw").unlink()  # the fix the line gives: the link goes, the folder stays
    ran = re.findall(r"Running stage '([^']+)'", run(["dvc", "repro", "download"], root))
    assert set(ran) <= {"sources", "download"} and raw_files(root) == raw, ran
    assert not (root / "data/raw").is_symlink() and sorted(outside.iterdir())


def raw_files(root) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "data/raw").iterdir())}


def test_wmt14_on_a_local_huggingface_dataset_under_snakemake(first_runs):
    root, dataset = first_runs["wmt14"]["root"], first_runs["wmt14"]["corpus"]
    assert results(root) == [("wmt14", "scratch", "news_test")]
    assert "Nothing to be done" in run(["snakemake", "--cores", "2"], root)

    test = dataset / "data" / "test-00000.parquet"
    frame = pd.read_parquet(test)
    frame["translation"] = [{"de": "Ein geänderter Satz.", "en": "An edited sentence."},
                            *frame["translation"][1:]]
    frame.to_parquet(test)
    # The edit reaches the report, and nothing before download: Snakemake's plan says so. Run,
    # as far as tokenize (every job after it only re-ran, as after any edit: a minute here).
    planned = run(["snakemake", "-n", "--cores", "2"], root)
    jobs = set(re.findall(r"^(?:local)?rule (\w+):$", planned, re.M))
    assert {"download", "tokenize", "train", "evaluate", "report"} <= jobs, planned
    assert "config" not in jobs and "sources" not in jobs, planned
    out = run(["snakemake", "--cores", "2", "--until", "tokenize"], root)
    ran = set(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", out))
    assert ran == {"download", "tokenize"}, out
    assert "An edited sentence." in (root / "data/tokenized/news_test.en.txt").read_text()

    # A dataset path that does not resolve: one line when Snakemake reads the workflow, and
    # data/raw as it was (Snakemake deleted it, then download failed).
    raw = raw_files(root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["recipes"]["wmt14"]["data"]["huggingface"]["path"] = str(dataset) + "_moved"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = run(["snakemake", "--cores", "2"], root, check=False)
    assert "snakemake: error: params.yaml: data.huggingface.path: cannot load" in out, out
    assert raw_files(root) == raw
