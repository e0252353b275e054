"""The sections a reader checks the numbers against: each recipe's verification checklist,
sample translations, attention maps, and the setup (data sizes, vocabularies, parameter
counts and settings)."""

from __future__ import annotations

import pandas as pd
import yaml

from nmt.core.files import read_json
from nmt.core.runs import Run
from nmt.core.text import read_lines
from nmt.pipeline.recipes import resolve
from nmt.stages.report.inputs import Inputs, need
from nmt.stages.report.markdown import md_table, shown


def verification_section(inp: Inputs) -> list[str]:
    """Each recipe's checklist, one record a model (results/verify/<recipe>-<model>.json):
    which kinds of check ran (twin: scratch against torch.nn.Transformer; property: every
    model on its own), and each check."""
    lines = ["## Verification", "",
             "`nmt verify`: twin checks compare scratch with torch.nn.Transformer on shared "
             "weights, where the baseline can express the configuration; property checks (cached "
             "= full decoding, fused = math attention, padding, gradients, parameter count) run "
             "for every model.", ""]
    for recipe in inp.recipes:
        records = [read_json(need(inp.results / "verify" / f"{recipe}-{model}.json"))
                   for model in inp.models]
        checks = [c for v in records for c in v["checks"]]
        passed = all(v["passed"] for v in records)
        lines += [f"### {recipe}: {'all checks passed' if passed else 'FAILED'}", ""]
        for v in (v for v in records if v.get("twin") is not None):  # scratch's
            lines += ["Twin checks: ran." if v["twin"] else
                      f"Twin checks: none ({v['twin_reason']}); passed or failed on its "
                      "property checks alone.", ""]
        if checks:
            columns = ["name", "kind", "passed", "max_abs_diff", "tolerance"]
            df = pd.DataFrame(checks)[[c for c in columns if c in checks[0]]]
            lines += [md_table(df, ".3g"), ""]
    return lines


def samples_section(inp: Inputs) -> list[str]:
    """Evenly spaced sentences of the first test set: source, reference, every model's beam."""
    testset, recipe = inp.testsets[0], inp.recipes[0]
    src_lang, tgt_lang = inp.langs
    sources = read_lines(need(inp.tokenized / f"{testset}.{src_lang}.txt"))
    refs = read_lines(need(inp.tokenized / f"{testset}.{tgt_lang}.txt"))
    outputs = {m: read_lines(need(inp.run_files(recipe, m).translations
                                  / f"{testset}.beam.txt")) for m in inp.models}
    count = inp.params["report"]["samples"]
    step = max(1, len(sources) // max(1, count))
    lines = [f"## Sample translations ({testset}, recipe `{recipe}`, seed {inp.seeds[0]}, "
             "beam search)", ""]
    for i in list(range(0, len(sources), step))[:count]:
        lines += [f"- **source:** {sources[i]}", f"  - reference: {refs[i]}"]
        lines += [f"  - {m}: {shown(outputs[m][i])}" for m in inp.models]
    return lines + [""]


def attention_section(inp: Inputs, figures: dict[str, str]) -> list[str]:
    """Each model's attention map of one sentence of the first test set."""
    recipe = inp.recipes[0]
    lines = ["## Attention", "",
             f"One sentence of {inp.testsets[0]} (`evaluate.attention_example`), recipe "
             f"`{recipe}`, seed {inp.seeds[0]}.", ""]
    for model in inp.models:
        attention = read_json(need(inp.run_files(recipe, model).attention))
        translation = attention["translation"]
        lines += [f"### {model}", "", f"Source pieces: `{' '.join(attention['source'])}`", "",
                  f"Output: {f'*{translation}*' if translation.strip() else shown('')}", "",
                  f"![attention map of {model}](figures/{figures[f'attention {model}']})", ""]
    return lines


def setup_section(inp: Inputs) -> list[str]:
    """Data sizes per split, and each recipe's vocabulary, parameter counts and settings."""
    src_lang, tgt_lang = inp.langs
    data = read_json(need(inp.tokenized / "stats.json"))
    lines = ["## Setup", "",
             f"| split | sentences ({src_lang}) | tokens ({src_lang}) | tokens ({tgt_lang}) | "
             "longest |", "|---|---|---|---|---|"]
    for split in ("train", "val", *inp.testsets):
        s, t = data[f"{split}.{src_lang}"], data[f"{split}.{tgt_lang}"]
        if "tokens" not in s:  # tokenize.words: false wrote raw text only
            lines += [f"| {split} | {s['sentences']:,} | - | - | - |"]
            continue
        lines += [f"| {split} | {s['sentences']:,} | {s['tokens']:,} | {t['tokens']:,} | "
                  f"{max(s['max_len'], t['max_len'])} |"]
    lines += [""]
    for recipe in inp.recipes:
        meta = read_json(need(inp.vocab_root / recipe / "meta.json"))
        r = resolve(inp.params, recipe)
        n = {m: inp.runs[Run(recipe, m, inp.seeds[0])]["evaluation"]["params"]
             for m in inp.models}
        lines += [f"### recipe `{recipe}`", "",
                  f"Vocabulary: {meta['kind']}, source {meta['src_size']:,}, target "
                  f"{meta['tgt_size']:,}. Parameters: "
                  + ", ".join(f"{m} {c:,}" for m, c in n.items()) + ".", "", "```yaml",
                  yaml.safe_dump({k: r[k] for k in ("vocab", "model", "train", "evaluate")},
                                 sort_keys=False).rstrip(), "```", ""]
    return lines
