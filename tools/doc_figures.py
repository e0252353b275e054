"""The figures README.md and docs/ quote from committed files, rendered from those files.

A figure copied by hand goes stale when the file it came from is committed again (the
README's speed said 1.04 for a report that says 1.22). So each quoted figure stands in a
block that names its kind and its source:

    <!-- figures summary reports/demo -->
    | test set | model | ... |
    <!-- end figures -->

and this script renders every block from its source. `python tools/doc_figures.py` exits 1
naming each block that differs from what its source gives now (tests/test_doc_figures.py
runs it in `make test`); `--write` rewrites them. Prose around a block is a person's; the
numbers inside are the files'.

Kinds (KINDS): summary (a report folder's results_summary.csv and results.csv: the mean ±
std table), answer (its statistics.json's verdicts at the margin, the report's first words),
verdict (its statistics.json: scratch and the decoder-only model against the
baseline), speed (its report.md's speed benchmark), verify (an `nmt verify` JSON, or a
recipe's records one a model, joined by commas).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- figures (\S+) (\S+) -->\n)(.*?)(<!-- end figures -->)", re.S)


def rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def in_order(values) -> list:
    """The distinct values, in the order they first appear."""
    return list(dict.fromkeys(values))


def spread(mean: str, std: str, digits: int) -> str:
    """'1.6928 ± 0.0107' over several seeds, '1.9215' for one (std is empty)."""
    return f"{float(mean):.{digits}f}" + (f" ± {float(std):.{digits}f}" if std else "")


def summary(root: Path, source: str) -> str:
    """The report's mean ± sample std table: a row per test set and model, each model's
    training minutes (one per seed) on its first test set's row."""
    folder = root / source
    summaries, per_seed = rows(folder / "results_summary.csv"), rows(folder / "results.csv")
    testsets = in_order(r["testset"] for r in summaries)
    lines = ["| test set | model | seeds | test loss | BLEU (beam) | BLEU greedy | chrF | "
             "train minutes |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(summaries, key=lambda r: testsets.index(r["testset"])):
        minutes = ", ".join(f"{float(s['train_minutes']):.1f}" for s in per_seed
                            if s["model"] == r["model"] and s["testset"] == r["testset"])
        lines.append(
            f"| {r['testset']} | {r['model']} | {r['seeds']} "
            f"| {spread(r['loss'], r['loss_std'], 4)} | {spread(r['bleu'], r['bleu_std'], 2)} "
            f"| {spread(r['bleu_greedy'], r['bleu_greedy_std'], 2)} "
            f"| {spread(r['chrf'], r['chrf_std'], 2)} "
            f"| {minutes if r['testset'] == testsets[0] else ''} |")
    return "\n".join(lines) + "\n"


def statistics(root: Path, source: str) -> dict:
    """A report folder's statistics.json as {"verdicts", "comparisons"}; reports written
    before the verdicts hold the comparisons' list alone."""
    recorded = json.loads((root / source / "statistics.json").read_text())
    return recorded if isinstance(recorded, dict) else {"verdicts": [], "comparisons": recorded}


def answer(root: Path, source: str) -> str:
    """The report's verdict at the margin, each challenger against the baseline on the test
    loss (statistics.json's verdicts: outcome and sentence), as the report's first words say
    it for scratch."""
    verdicts = statistics(root, source)["verdicts"]
    if not verdicts:
        raise SystemExit(f"{source}/statistics.json: no verdicts (a report written before them)")
    return "".join(f"- **{v['system']} vs {v['baseline']}, `{v['recipe']}`, test loss on "
                   f"{v['testset']}: {v['outcome']}** at ±{v['margin']:g}. {v['sentence']}\n"
                   for v in verdicts)


def verdict(root: Path, source: str) -> str:
    """Each model against the baseline on the first test set: over seeds (Welch) and over
    test sentences (paired bootstrap), BLEU and test loss."""
    entries = statistics(root, source)["comparisons"]
    testset = entries[0]["testset"]

    def find(system, metric, welch):
        return next(e for e in entries if e["testset"] == testset and e["system"] == system
                    and e["metric"] == metric and e["method"].startswith("Welch") == welch)

    lines = [f"On {testset}, against the baseline (`{source}/statistics.json`):", ""]
    for system in in_order(e["system"] for e in entries):
        seeds, sentences = find(system, "BLEU", True), find(system, "BLEU", False)
        loss = find(system, "test loss", False)
        lines.append(
            f"- {system}: {seeds['difference']:+.2f} BLEU over seeds ({seeds['method']}; 95% "
            f"CI {seeds['low']:+.2f} .. {seeds['high']:+.2f}, p = {seeds['p']:.3f}); over test "
            f"sentences {sentences['difference']:+.2f} BLEU (CI {sentences['low']:+.2f} .. "
            f"{sentences['high']:+.2f}, p = {sentences['p']:.3f}) and test loss "
            f"{loss['difference']:+.4f} (p = {loss['p']:.3f})")
    return "\n".join(lines) + "\n"


def speed(root: Path, source: str) -> str:
    """The report's speed benchmark: its heading and table, and the machine it names."""
    report = (root / source / "report.md").read_text()
    section = re.search(r"^### (Speed benchmark.*?)\n\n(\|.*?)\n\n", report, re.S | re.M)
    machine = re.search(r"^Trained on: (.*?) \(peak", report, re.M)
    if not section:
        raise SystemExit(f"{source}/report.md: no speed benchmark section")
    table = [[c.strip() for c in line.strip("|").split("|")]
             for line in section.group(2).splitlines()[2:]]
    names = [c.strip() for c in section.group(2).splitlines()[0].strip("|").split("|")][1:]
    parts = [f"{what}: " + ", ".join(f"{n} {v}" for n, v in zip(names, values, strict=True))
             for what, *values in table]
    where = f" on {machine.group(1).strip()}" if machine else ""
    return f"{section.group(1)}{where}: " + "; ".join(parts) + "\n"


def verify(root: Path, source: str) -> str:
    """An `nmt verify` record: the twin checks by precision, then the decoder-only checks.
    `source` is one record (every model's, as verify wrote before it ran a job a model) or
    the records of one recipe's models joined by commas (results/verify/<recipe>-<model>.json:
    scratch's holds the twin checks, the decoder-only model's its own)."""
    records = [json.loads((root / part).read_text()) for part in source.split(",")]
    record = next((r for r in records if r.get("twin")), records[0])  # its config and sizes
    record = {**record, "passed": all(r["passed"] for r in records),
              "checks": [c for r in records for c in r["checks"]],
              "config": {**record["config"], "seconds": sum(r["config"]["seconds"]
                                                             for r in records)}}
    diffs = {c["name"]: c["max_abs_diff"] for c in record["checks"]}
    groups = [("embeddings, encoder memory, decoder output, logits",
               ["embeddings", "encoder memory", "decoder output", "logits"]),
              ("attention weights", ["attention weights"]), ("gradients", ["gradients"]),
              ("cached decoding vs full decoding", ["kv-cache decoding"]),
              ("fused vs math attention", ["fused vs math attention"])]
    kinds = [k for k in ("float64", "float32", "bfloat16") if f"logits ({k})" in diffs]
    lines = ["| check | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for label, names in groups:
        cells = [number(max(diffs[f"{n} ({k})"] for n in names)) for k in kinds]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "training trajectory (float64)" in diffs:
        steps, small = record["config"]["trajectory_steps"], record["config"]["trajectory_model"]
        lines.append(f"| {steps} Adam steps: loss curves ({small['num_encoder_layers']}+"
                     f"{small['num_decoder_layers']} layers, d_model {small['d_model']}) | "
                     + " | ".join(number(diffs["training trajectory (float64)"])
                                  if k == "float64" else "" for k in kinds) + " |")
    cfg = record["config"]
    decoder_only = [f"{name.split(': ', 1)[1].removesuffix(' (float64)')} {number(d)}"
                    for name, d in diffs.items() if name.startswith("decoder_only: ")
                    and name.endswith("(float64)")]
    lines += ["", f"All {len(diffs)} checks {'pass' if record['passed'] else 'DO NOT pass'} "
              f"(`{source}`: {cfg['model']['num_encoder_layers']}+"
              f"{cfg['model']['num_decoder_layers']} layers, d_model {cfg['model']['d_model']}, "
              f"vocabularies {cfg['src_vocab_size']:,}/{cfg['tgt_vocab_size']:,}, torch "
              f"{cfg['torch']}, {cfg['seconds']:.0f} s). The decoder-only model's (float64): "
              + ", ".join(decoder_only) + "."]
    return "\n".join(lines) + "\n"


def number(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}"


KINDS = {"summary": summary, "answer": answer, "verdict": verdict, "speed": speed,
         "verify": verify}


def documents(root: Path) -> list[Path]:
    return sorted(p for pattern in DOCUMENTS for p in root.glob(pattern))


def render(text: str, root: Path) -> str:
    """text with every block rendered from its source (paths relative to root)."""
    def block(match: re.Match) -> str:
        kind, source = match.group(2), match.group(3)
        if kind not in KINDS:
            raise SystemExit(f"unknown figures kind {kind!r} (known: {', '.join(KINDS)})")
        return match.group(1) + KINDS[kind](root, source) + match.group(5)
    return BLOCK.sub(block, text)


def stale(root: Path) -> list[str]:
    """The blocks that differ from what their sources give, as 'file: kind source'."""
    found = []
    for doc in documents(root):
        text = doc.read_text()
        for old, new in zip(BLOCK.finditer(text), BLOCK.finditer(render(text, root)),
                            strict=True):
            if old.group(0) != new.group(0):
                found.append(f"{doc.relative_to(root)}: figures {old.group(2)} {old.group(3)}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stale blocks")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args()
    if args.write:
        for doc in documents(args.root):
            doc.write_text(render(doc.read_text(), args.root))
        return 0
    found = stale(args.root)
    for line in found:
        print(f"{line}: differs from its source (fix: python tools/doc_figures.py --write)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
