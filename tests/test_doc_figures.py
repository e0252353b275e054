"""The figures README.md and docs/ quote from committed files (issue 56 item 4: the README's
speed said 1.04 for a report that says 1.22): every `figures` block equals what
tools/doc_figures.py renders from its file, and a block edited by hand or a source committed
again is caught."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "tools" / "doc_figures.py"


def check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True)


def test_every_quoted_figure_equals_its_file():
    done = check(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    blocks = sum(p.read_text().count("<!-- figures ") for p in
                 [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert blocks >= 5  # the README's two tables; the demo, its verdict, verify and speed


def test_a_figure_edited_by_hand_or_a_source_committed_again_is_named(tmp_path):
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    for report in ("demo", "h200-published", "h200-study"):  # the README's sources
        shutil.copytree(REPO / "reports" / report, tmp_path / "reports" / report)
    assert check(tmp_path).returncode == 0
    readme = tmp_path / "README.md"
    text = readme.read_text()
    start = text.index("<!-- figures summary reports/demo -->")
    cell = re.search(r"\| (\d\.\d{4}) ± ", text[start:]).group(1)  # the demo's first loss
    edited = cell[:-1] + str((int(cell[-1]) + 1) % 10)
    readme.write_text(text[:start] + text[start:].replace(f"| {cell} ± ", f"| {edited} ± ", 1))
    done = check(tmp_path)
    assert (done.returncode, done.stdout.splitlines()) == (1, [
        "README.md: figures summary reports/demo: differs from its source (fix: python "
        "tools/doc_figures.py --write)"])
    subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--write"], check=True)
    assert check(tmp_path).returncode == 0
    summary = tmp_path / "reports" / "h200-published" / "results_summary.csv"
    summary.write_text(summary.read_text().replace("36.2174", "36.9174", 1))
    assert check(tmp_path).stdout.startswith("README.md: figures summary reports/h200-published")


def test_the_readmes_verdict_follows_the_reports_statistics(tmp_path):
    """The README quotes the demo's verdict at the margin (kind `answer`): a verdict of
    reports/demo/statistics.json committed again with another outcome is named."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "reports", tmp_path / "reports")
    assert "<!-- figures answer reports/demo -->" in (tmp_path / "README.md").read_text()
    assert check(tmp_path).returncode == 0
    path = tmp_path / "reports" / "demo" / "statistics.json"
    recorded = json.loads(path.read_text())
    verdict = recorded["verdicts"][0]
    verdict["outcome"] = "different" if verdict["outcome"] != "different" else "equivalent"
    path.write_text(json.dumps(recorded))
    assert check(tmp_path).stdout.splitlines() == [
        "README.md: figures answer reports/demo: differs from its source (fix: python "
        "tools/doc_figures.py --write)"]


def test_a_verify_block_reads_a_recipes_records_one_a_model(tmp_path):
    """verify writes a record a model now: the committed record of every model, split as the
    jobs write it (the baseline's empty, scratch's twin and own checks, the decoder-only
    model's), renders the same block from the records joined by commas."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_figures", SCRIPT)
    doc_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_figures)
    source = "reports/gpu-second-run/verify-published.json"
    whole = json.loads((REPO / source).read_text())
    ours = [c for c in whole["checks"] if c["name"].startswith("decoder_only: ")]
    seconds = whole["config"]["seconds"]
    records = {
        "baseline": {**whole, "checks": [], "twin": None, "config": {**whole["config"],
                                                                     "seconds": 0.0}},
        "scratch": {**whole, "checks": [c for c in whole["checks"] if c not in ours],
                    "config": {**whole["config"], "seconds": seconds - 3.0}},
        "decoder_only": {**whole, "checks": ours, "twin": None,
                         "config": {**whole["config"], "seconds": 3.0}}}
    for model, record in records.items():
        (tmp_path / f"published-{model}.json").write_text(json.dumps(record))
    joined = ",".join(f"published-{model}.json" for model in records)
    assert doc_figures.verify(tmp_path, joined).replace(joined, source) == \
        doc_figures.verify(REPO, source)
    records["decoder_only"]["passed"] = False
    (tmp_path / "published-decoder_only.json").write_text(json.dumps(records["decoder_only"]))
    assert "DO NOT pass" in doc_figures.verify(tmp_path, joined)
