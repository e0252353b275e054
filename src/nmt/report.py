"""Stage report: reports/report.md, results.csv, metrics.json and figures from results/."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from nmt.config import NmtError, Run, resolve  # noqa: E402
from nmt.files import atomic_dir, atomic_path, read_json, write_json, write_text  # noqa: E402
from nmt.text import read_lines  # noqa: E402

log = logging.getLogger("nmt.report")

# The published comparison this project reproduces (test loss after 15 epochs, its GPU).
PUBLISHED = {"baseline": {"loss": 2.0176, "seconds_per_epoch": "52-53"},
             "scratch": {"loss": 2.0239, "seconds_per_epoch": "55-56"}}
COLUMNS = ["recipe", "model", "testset", "loss", "ppl", "bleu", "bleu_greedy", "chrf", "params",
           "seconds_per_epoch"]


def need(path: Path) -> Path:
    if not path.exists():
        raise NmtError(f"{path} is missing (fix: run the stage that writes it, or `dvc repro`)")
    return path


def collect(params: dict, results: Path) -> tuple[pd.DataFrame, dict]:
    """The tidy results table (one row per recipe, model, testset) and the runs' summaries."""
    rows, runs = [], {}
    for recipe in params["pipeline"]["recipes"]:
        for model in params["pipeline"]["models"]:
            run = Run(recipe, model, params["pipeline"]["seeds"][0]).dir(results)
            metrics = read_json(need(run / "metrics.json"))
            summary = read_json(need(run / "train.json"))
            history = pd.read_csv(need(run / "history.csv"))
            runs[run.name] = {"metrics": metrics, "train": summary, "history": history,
                              "recipe": recipe, "model": model}
            for testset, m in metrics["testsets"].items():
                rows.append({"recipe": recipe, "model": model, "testset": testset,
                             "loss": m["loss"], "ppl": m["ppl"], "bleu": m["bleu"],
                             "bleu_greedy": m["bleu_greedy"], "chrf": m["chrf"],
                             "params": summary["params"],
                             "seconds_per_epoch": summary["seconds_per_epoch"]})
    return pd.DataFrame(rows, columns=COLUMNS), runs


def plot_losses(runs: dict, recipes: list[str], path: Path) -> None:
    """Train and validation loss of both models, one panel a recipe."""
    fig, axes = plt.subplots(1, len(recipes), figsize=(6 * len(recipes), 4), squeeze=False)
    for ax, recipe in zip(axes[0], recipes, strict=True):
        for run in (r for r in runs.values() if r["recipe"] == recipe):
            h = run["history"]
            line, = ax.plot(h["epoch"], h["train_loss"], "--", label=f"{run['model']} train")
            ax.plot(h["epoch"], h["valid_loss"], "-", color=line.get_color(),
                    label=f"{run['model']} valid")
        ax.set(title=f"recipe: {recipe}", xlabel="epoch", ylabel="loss per token")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def plot_attention(attention: dict, title: str, path: Path) -> None:
    """A heat map of one sentence's attention weights, as evaluate recorded them."""
    src, out = attention["source"], attention["output"]
    fig, ax = plt.subplots(figsize=(0.45 * len(src) + 2, 0.45 * len(out) + 1.5))
    ax.imshow(attention["weights"], cmap="viridis", aspect="auto", vmin=0)
    ax.set_xticks(range(len(src)), src, rotation=90)
    ax.set_yticks(range(len(out)), out)
    ax.set(xlabel="source", ylabel="output", title=f"{title}: {attention['what']}")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def ablation_section(params: dict, table: pd.DataFrame) -> list[str]:
    """BLEU of the scratch model for a recipe and each of its ablations in the pipeline."""
    recipes = params["recipes"]
    ablations = [r for r in params["pipeline"]["recipes"] if "ablation_of" in recipes[r]]
    bleu = table[table.model == "scratch"].pivot(index="recipe", columns="testset", values="bleu")
    lines = []
    for full in dict.fromkeys(recipes[r]["ablation_of"] for r in ablations):
        if full not in bleu.index:
            continue
        rows = [{"recipe": full, "removed": "(nothing)", **bleu.loc[full].to_dict()}]
        for r in (r for r in ablations if recipes[r]["ablation_of"] == full):
            delta = {f"Δ {t}": bleu.loc[r, t] - bleu.loc[full, t] for t in bleu.columns}
            rows.append({"recipe": r, "removed": recipes[r]["removes"],
                         **bleu.loc[r].to_dict(), **delta})
        lines += [f"## Ablation of `{full}` (scratch model, beam BLEU)", "",
                  md_table(pd.DataFrame(rows)), ""]
    return lines


def md_table(df: pd.DataFrame, floatfmt=".2f") -> str:
    return df.to_markdown(index=False, floatfmt=floatfmt)


def report(params: dict, tokenized: Path, vocab_root: Path, results: Path, out: Path) -> None:
    recipes, models = params["pipeline"]["recipes"], params["pipeline"]["models"]
    src_lang, tgt_lang = params["data"]["source_lang"], params["data"]["target_lang"]
    seed = params["pipeline"]["seeds"][0]  # one seed for now
    table, runs = collect(params, results)
    stats = read_json(need(tokenized / "stats.json"))

    with atomic_dir(out / "figures") as figures:
        plot_losses(runs, recipes, figures / "loss.png")
        attention = None
        if "scratch" in models:
            run = Run(recipes[0], "scratch", params["pipeline"]["seeds"][0]).name
            attention = read_json(need(results / run / "attention.json"))
            plot_attention(attention, run, figures / "attention.png")

    lines = ["# Transformer from scratch vs torch.nn.Transformer: Multi30k de→en", "",
             "Generated by `nmt report` from `results/`; re-run with `dvc repro` or "
             "`snakemake --cores 8`. Do not edit by hand.", ""]

    lines += ["## Results", ""]
    for testset in params["evaluate"]["testsets"]:
        sub = table[table.testset == testset].drop(columns="testset")
        lines += [f"### {testset}", "", md_table(sub), ""]
    lines += ["`loss` is the per-token cross-entropy on the test set, `ppl` its exponential; "
              "`bleu` is beam search, `bleu_greedy` greedy decoding, both detokenized cased "
              "sacreBLEU; `chrf` uses the beam output.", ""]
    first = next(iter(runs.values()))["metrics"]["signature"]
    lines += [f"sacreBLEU signatures: BLEU `{first['bleu']}`, chrF `{first['chrf']}`.", ""]

    lines += ablation_section(params, table)

    lines += ["## Against the published reference", ""]
    pub = table[(table.recipe == "published") & (table.testset == "test_2016_flickr")]
    ref_rows = [{"model": r.model, "test loss (ours)": r.loss,
                 "test loss (published)": PUBLISHED[r.model]["loss"],
                 "s/epoch (ours)": r.seconds_per_epoch,
                 "s/epoch (published)": PUBLISHED[r.model]["seconds_per_epoch"],
                 "device (ours)": runs[Run("published", r.model, seed).name]["train"]["device"]}
                for r in pub.itertuples()]
    if ref_rows:
        lines += [md_table(pd.DataFrame(ref_rows), ".4f"), "",
                  "The published losses average the batch-mean loss over batches; ours are per "
                  "token over the whole test set, so small differences are expected.", ""]
    else:
        lines += ["The `published` recipe is not in `pipeline.recipes`.", ""]

    lines += ["## Training", "", "![loss curves](figures/loss.png)", ""]
    speed = pd.DataFrame([{"run": name, "device": r["train"]["device"],
                           "epochs": r["train"]["epochs"], "best epoch": r["train"]["best_epoch"],
                           "best valid loss": r["train"]["best_valid_loss"],
                           "s/epoch": r["train"]["seconds_per_epoch"],
                           "train tokens/s": r["train"]["tokens_per_second"]}
                          for name, r in runs.items()])
    lines += [md_table(speed, ".3f"), ""]
    bench = read_json(need(results / "bench.json"))
    units = {"train": "train tokens/s", "greedy": "greedy sentences/s",
             "beam": "beam sentences/s"}
    rows = [{"what": label, "baseline": bench[k]["baseline"], "scratch": bench[k]["scratch"],
             "scratch/baseline": bench[k]["ratio"]} for k, label in units.items()]
    lines += [f"### Speed benchmark (`nmt bench`, {bench['device']}, recipe {bench['recipe']})",
              "", md_table(pd.DataFrame(rows), ".2f"), ""]
    if bench["mfu"]:
        lines += [f"Model FLOPs utilisation in training: baseline {bench['mfu']['baseline']:.1%},"
                  f" scratch {bench['mfu']['scratch']:.1%} of the bf16 peak.", ""]

    lines += ["## Verification: scratch computes what torch.nn.Transformer computes", ""]
    for recipe in recipes:
        v = read_json(need(results / "verify" / f"{recipe}.json"))
        df = pd.DataFrame(v["checks"])[["name", "passed", "max_abs_diff", "tolerance"]]
        lines += [f"### {recipe}: {'all checks passed' if v['passed'] else 'FAILED'}", "",
                  df.to_markdown(index=False, floatfmt=".3g"), ""]

    lines += ["## Sample translations (test_2016_flickr, beam search)", ""]
    sources = read_lines(tokenized / f"test_2016_flickr.{src_lang}.txt")
    refs = read_lines(tokenized / f"test_2016_flickr.{tgt_lang}.txt")
    outputs = {m: read_lines(Run(recipes[0], m, seed).dir(results) / "translations"
                             / "test_2016_flickr.beam.txt") for m in models}
    step = max(1, len(sources) // max(1, params["report"]["samples"]))
    for i in list(range(0, len(sources), step))[: params["report"]["samples"]]:
        lines += [f"- **source:** {sources[i]}", f"  - reference: {refs[i]}"]
        lines += [f"  - {m}: {outputs[m][i]}" for m in models]
    lines += [""]
    if attention is not None:
        lines += ["## Attention", "", f"Source pieces: `{' '.join(attention['source'])}`", "",
                  f"Output: *{attention['translation']}*", "",
                  "![attention map](figures/attention.png)", ""]

    lines += ["## Setup", "", "| split | sentences (de) | tokens (de) | tokens (en) | longest |",
              "|---|---|---|---|---|"]
    for split in ("train", "val", "test_2016_flickr", "test_2017_flickr"):
        s, t = stats[f"{split}.{src_lang}"], stats[f"{split}.{tgt_lang}"]
        lines += [f"| {split} | {s['sentences']:,} | {s['tokens']:,} | {t['tokens']:,} | "
                  f"{max(s['max_len'], t['max_len'])} |"]
    lines += [""]
    for recipe in recipes:
        meta = read_json(need(vocab_root / recipe / "meta.json"))
        r = resolve(params, recipe)
        n = {m: runs[Run(recipe, m, seed).name]["train"]["params"] for m in models}
        lines += [f"### recipe `{recipe}`", "",
                  f"Vocabulary: {meta['kind']}, source {meta['src_size']:,}, target "
                  f"{meta['tgt_size']:,}. Parameters: "
                  + ", ".join(f"{m} {c:,}" for m, c in n.items()) + ".", "", "```yaml",
                  yaml.safe_dump({k: r[k] for k in ("vocab", "model", "train", "evaluate")},
                                 sort_keys=False).rstrip(), "```", ""]

    with atomic_path(out / "results.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.4f")
    # `dvc metrics show` reads this: {recipe: {model: {testset: {loss, bleu, chrf}}}}.
    metrics = {}
    for r in table.itertuples():
        metrics.setdefault(r.recipe, {}).setdefault(r.model, {})[r.testset] = {
            "loss": r.loss, "bleu": r.bleu, "chrf": r.chrf}
    write_json(out / "metrics.json", metrics)
    write_text(out / "report.md", "\n".join(lines))
    log.info("wrote %s, results.csv (%d rows), metrics.json, figures/", out / "report.md",
             len(table))
