"""Stage report: reports/report.md, results.csv, results_summary.csv, metrics.json,
statistics.json and figures/ from the small files the runs left in results/.

One builder function a report section, each returning markdown lines; `report` loads the
inputs once, draws the figures and joins the sections. Nothing here reads a checkpoint, so
results produced on another machine can be reported here.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from nmt.core import stats  # noqa: E402
from nmt.core.errors import NmtError  # noqa: E402
from nmt.core.files import atomic_dir, atomic_path, read_json, write_json, write_text  # noqa: E402
from nmt.core.runs import Run, RunFiles, runs  # noqa: E402
from nmt.core.text import read_lines  # noqa: E402
from nmt.pipeline import commandline  # noqa: E402
from nmt.pipeline.corpora.kinds import kind_of  # noqa: E402
from nmt.pipeline.corpus import corpus_settings  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402

log = logging.getLogger("nmt.report")

# The published comparison this project reproduces (test loss after 15 epochs, its GPU, and
# the validation loss of its first 7 epochs, fp32, as issue 46 quotes them).
PUBLISHED = {"baseline": {"loss": 2.0176, "seconds_per_epoch": "52-53",
                          "valid_loss": [3.80, 3.49, 3.29, 3.11, 2.96, 2.75, 2.49]},
             "scratch": {"loss": 2.0239, "seconds_per_epoch": "55-56",
                         "valid_loss": [3.84, 3.50, 3.29, 3.15, 2.93, 2.72, 2.46]}}
METRICS = ["loss", "ppl", "bleu", "bleu_greedy", "chrf", "chrf_greedy"]
COLUMNS = ["recipe", "model", "testset", "seed", *METRICS, "params", "seconds_per_epoch",
           "train_minutes"]
LABELS = {"loss": "test loss", "ppl": "ppl", "bleu": "BLEU", "bleu_greedy": "BLEU greedy",
          "chrf": "chrF"}
DIGITS = {"loss": 4, "ppl": 2, "bleu": 2, "bleu_greedy": 2, "chrf": 2}
BASELINE = "baseline"


@dataclass
class Inputs:
    """What the report reads, loaded once: metrics, summaries, histories, comparisons."""

    params: dict
    tokenized: Path
    vocab_root: Path
    results: Path
    table: pd.DataFrame    # one row per (recipe, model, testset, seed)
    summary: pd.DataFrame  # one row per (recipe, model, testset): seed means, stds and n
    runs: dict             # Run -> {"train", "evaluation", "history"}
    comparisons: dict      # (recipe, system, testset) -> [stats.Comparison] vs the baseline
    verdicts: dict         # (recipe, system) -> stats.loss_verdict on the first test set

    @property
    def recipes(self) -> list[str]:
        return self.params["pipeline"]["recipes"]

    @property
    def models(self) -> list[str]:
        return self.params["pipeline"]["models"]

    @property
    def seeds(self) -> list[int]:
        return self.params["pipeline"]["seeds"]

    @property
    def testsets(self) -> list[str]:
        return corpus_settings(self.params)["evaluate"]["testsets"]

    @property
    def langs(self) -> tuple[str, str]:
        data = corpus_settings(self.params)["data"]
        return data["source_lang"], data["target_lang"]

    def run_files(self, recipe: str, model: str, seed: int | None = None) -> RunFiles:
        """A run's files; seed None is the first seed (the one samples and tests use)."""
        return Run(recipe, model, self.seeds[0] if seed is None else seed).files(self.results)

    def cell(self, recipe: str, model: str, testset: str) -> pd.Series:
        s = self.summary
        return s[(s.recipe == recipe) & (s.model == model) & (s.testset == testset)].iloc[0]


def need(path: Path) -> Path:
    if not path.exists():
        raise NmtError(f"{path} is missing (fix: run the stage that writes it, or `dvc repro`)")
    return path


def challengers(models: list[str]) -> list[str]:
    """The models compared with the baseline: every other one, when the baseline ran."""
    return [m for m in models if m != BASELINE] if BASELINE in models else []


def read_losses(path: Path) -> tuple[list[float], list[int]]:
    """translations/<testset>.loss.tsv: per sentence summed loss (nats) and target tokens."""
    rows = [line.split("\t") for line in read_lines(need(path))]
    try:
        return [float(r[0]) for r in rows], [int(r[1]) for r in rows]
    except (IndexError, ValueError):
        raise NmtError(f"{path}: expected '<loss>\\t<tokens>' lines "
                       "(fix: re-run `nmt evaluate`)") from None


# --- loading ---------------------------------------------------------------------------------

def collect(params: dict, results: Path) -> tuple[pd.DataFrame, dict]:
    """The per-seed results table and each run's train.json, evaluation.json and history."""
    rows, found = [], {}
    for run in runs(params):  # pipeline.recipes x models x seeds
        files = run.files(results)
        metrics = read_json(need(files.metrics))
        found[run] = {"train": read_json(need(files.summary)),
                      "evaluation": read_json(need(files.evaluation)),
                      "history": pd.read_csv(need(files.history))}
        for testset in corpus_settings(params)["evaluate"]["testsets"]:
            if testset not in metrics:
                raise NmtError(f"{files.metrics} has no {testset} "
                               "(fix: re-run `nmt evaluate` with the current params.yaml)")
            rows.append({"recipe": run.recipe, "model": run.model, "testset": testset,
                         "seed": run.seed, **{m: metrics[testset][m] for m in METRICS},
                         "params": found[run]["evaluation"]["params"],
                         "seconds_per_epoch": found[run]["train"]["seconds_per_epoch"],
                         "train_minutes": found[run]["train"]["train_minutes"]})
    return pd.DataFrame(rows, columns=COLUMNS), found


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Seed aggregates: n, mean and sample std of each metric per (recipe, model, testset)."""
    rows = stats.aggregate(table.to_dict("records"), ["recipe", "model", "testset"],
                           [*METRICS, "params", "seconds_per_epoch", "train_minutes"])
    df = pd.DataFrame(rows).rename(columns={"n": "seeds"})
    return df.drop(columns=["params_std", "seconds_per_epoch_std", "train_minutes_std"])


def seed_bootstraps(inp: Inputs, recipe: str, names: tuple[str, str], testset: str,
                    seed: int) -> list[stats.Comparison]:
    """The paired bootstraps (BLEU, chrF, test loss) of one seed's pair of runs."""
    refs = read_lines(need(inp.tokenized / f"{testset}.{inp.langs[1]}.txt"))
    out = [read_lines(need(inp.run_files(recipe, m, seed).translations / f"{testset}.beam.txt"))
           for m in names]
    found = list(stats.paired_bootstrap(out[0], out[1], refs, names).values())
    losses = [read_losses(inp.run_files(recipe, m, seed).translations / f"{testset}.loss.tsv")
              for m in names]
    found.append(stats.loss_bootstrap(losses[0], losses[1], names))
    return [replace(c, seed=seed) for c in found]


def compare(inp: Inputs, recipe: str, system: str, testset: str) -> list[stats.Comparison]:
    """system vs baseline on one test set: the bootstraps of each seed's pair, and a Welch
    test over the seeds where each side has two or more."""
    names = (system, BASELINE)
    found = [c for seed in inp.seeds for c in seed_bootstraps(inp, recipe, names, testset, seed)]
    t = inp.table[(inp.table.recipe == recipe) & (inp.table.testset == testset)]
    for metric, higher in (("bleu", True), ("chrf", True), ("loss", False)):
        c = stats.welch(t[t.model == system][metric].tolist(),
                        t[t.model == BASELINE][metric].tolist(), LABELS[metric], names, higher)
        found += [c] if c else []
    return found


def load(params: dict, tokenized: Path, vocab_root: Path, results: Path) -> Inputs:
    table, runs = collect(params, Path(results))
    inp = Inputs(params, Path(tokenized), Path(vocab_root), Path(results), table,
                 summarize(table), runs, {}, {})
    for recipe in inp.recipes:
        for system in challengers(inp.models):
            for testset in inp.testsets:
                inp.comparisons[recipe, system, testset] = compare(inp, recipe, system, testset)
            inp.verdicts[recipe, system] = verdict_of(inp, recipe, system)
    return inp


def verdict_of(inp: Inputs, recipe: str, system: str) -> dict:
    """stats.loss_verdict of system - baseline on the first test set: from the Welch test
    over seeds where it ran, else from the first seed's loss bootstrap."""
    testset = inp.testsets[0]
    found = inp.comparisons[recipe, system, testset]
    loss = {(c.kind, c.seed): c for c in found if c.metric == LABELS["loss"]}
    t = inp.table[(inp.table.recipe == recipe) & (inp.table.testset == testset)]
    return {"recipe": recipe, "testset": testset} | stats.loss_verdict(
        loss.get(("seeds", None)), loss["bootstrap", inp.seeds[0]],
        stats.summarize(t[t.model == system].loss.tolist()),
        stats.summarize(t[t.model == BASELINE].loss.tolist()))


# --- figures ---------------------------------------------------------------------------------

# history.csv's columns that the loss figure draws; every other one gets its own panel in the
# training figure (lr, grad_norm, seconds, tokens_per_second, and any number a run logs later)
LOSS_COLUMNS = ("epoch", "train_loss", "valid_loss")


def plot_losses(inp: Inputs, path: Path) -> None:
    """Train (dashed) and validation (solid) loss per epoch, one panel a recipe: each seed a
    thin line, the mean over seeds bold, one colour a model."""
    n = len(inp.recipes)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.2), squeeze=False)
    for ax, recipe in zip(axes[0], inp.recipes, strict=True):
        for column, style, what in (("train_loss", "--", "train"), ("valid_loss", "-", "valid")):
            plot_seeds(ax, inp, recipe, column, style, what)
        seeds = f", mean of {len(inp.seeds)} seeds (thin: each seed)" if len(inp.seeds) > 1 else ""
        ax.set(title=f"recipe: {recipe}{seeds}", xlabel="epoch", ylabel="loss per token")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)


def plot_training(inp: Inputs, path: Path) -> None:
    """Every other history.csv column per epoch (LOSS_COLUMNS: what the loss figure draws), a
    panel each, one row a recipe: lr, the mean gradient norm of the epoch's updates (before
    clipping), the epoch's seconds and tokens/s. Runs trained before a column existed lack it."""
    columns = list(dict.fromkeys(c for r in inp.runs.values() for c in r["history"].columns
                                 if c not in LOSS_COLUMNS))
    rows, cols = len(inp.recipes), len(columns)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for row, recipe in zip(axes, inp.recipes, strict=True):
        for ax, column in zip(row, columns, strict=True):
            plot_seeds(ax, inp, recipe, column, "-", "")
            ax.set(title=f"{recipe}: {column}", xlabel="epoch")
        row[0].legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)


def plot_seeds(ax, inp: Inputs, recipe: str, column: str, style: str, what: str) -> None:
    """One history.csv column of the recipe's runs: each model's mean over seeds bold (over
    the epochs every seed reached), each seed thin where there are several."""
    for i, model in enumerate(inp.models):
        histories = [h for s in inp.seeds
                     if column in (h := inp.runs[Run(recipe, model, s)]["history"])]
        if not histories:
            continue
        for h in histories if len(histories) > 1 else []:
            ax.plot(h["epoch"], h[column], style, color=f"C{i}", lw=0.8, alpha=0.35)
        common = min(len(h) for h in histories)
        mean = np.mean([h[column].to_numpy()[:common] for h in histories], axis=0)
        ax.plot(histories[0]["epoch"][:common], mean, style, color=f"C{i}", lw=2,
                label=f"{model} {what}".strip())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def plot_attention(attention: dict, title: str, path: Path) -> None:
    """A heat map of one sentence's attention weights, as evaluate recorded them."""
    src, out = attention["source"], attention["output"]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.38 * len(src) + 2.5),
                                    max(3.0, 0.32 * len(out) + 2.0)))
    image = ax.imshow(attention["weights"], cmap="viridis", aspect="auto", vmin=0)
    ax.set_xticks(range(len(src)), src, rotation=90, fontsize=9)
    ax.set_yticks(range(len(out)), out, fontsize=9)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    ax.set_title(f"{title}\n{attention['what']}", fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    save(fig, path)


def save(fig, path: Path) -> None:
    # bbox_inches="tight" grows the canvas to the rotated tick labels instead of cutting them.
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def draw_figures(inp: Inputs, folder: Path) -> dict[str, str]:
    """Every figure, into folder; returns {what: file name} for the sections to link."""
    names = {"loss": "loss.png", "training": "training.png"}
    plot_losses(inp, folder / names["loss"])
    plot_training(inp, folder / names["training"])
    recipe, seed = inp.recipes[0], inp.seeds[0]
    for model in inp.models:
        attention = read_json(need(inp.run_files(recipe, model).attention))
        names[f"attention {model}"] = f"attention_{model}.png"
        plot_attention(attention, Run(recipe, model, seed).name, folder / f"attention_{model}.png")
    return names


# --- sections --------------------------------------------------------------------------------

def md_table(df: pd.DataFrame, floatfmt=".2f", text: bool = False) -> str:
    """A markdown table; text=True keeps cells as written (no re-formatting of numbers)."""
    return df.to_markdown(index=False, floatfmt=floatfmt, disable_numparse=text)


def shown(text: str) -> str:
    """A model output as markdown: an empty one reads *(empty)*, not as bare emphasis marks."""
    return text if text.strip() else "*(empty)*"


def headline_recipe(inp: Inputs) -> str:
    return "published" if "published" in inp.recipes else inp.recipes[0]


def head_section(inp: Inputs) -> list[str]:
    """The title and the answer in two sentences, with the numbers."""
    testset, recipe = inp.testsets[0], headline_recipe(inp)
    n = len(inp.seeds)
    means = f"mean of {n} seeds" if n > 1 else "one seed"
    if "scratch" in inp.models and BASELINE in inp.models:
        s, b = inp.cell(recipe, "scratch", testset), inp.cell(recipe, BASELINE, testset)
        # Several seeds: the test over seeds (training noise included); else the bootstrap.
        bleu = {(c.kind, c.seed): c for c in inp.comparisons[recipe, "scratch", testset]
                if c.metric == "BLEU"}
        test = bleu.get(("seeds", None)) or bleu["bootstrap", inp.seeds[0]]
        how = ("Welch t-test over the seeds" if test.kind == "seeds"
               else f"paired bootstrap of seed {inp.seeds[0]}'s outputs")
        first = (f"On {testset} with the `{recipe}` recipe ({means}), the from-scratch "
                 f"Transformer reaches test loss {s.loss:.4f} and {s.bleu:.2f} BLEU against "
                 f"{b.loss:.4f} and {b.bleu:.2f} for torch.nn.Transformer; {how}: "
                 f"{stats.verdict(test)}.")
    else:
        first = (f"Models run: {', '.join(inp.models)}; without both `scratch` and `baseline` "
                 "there is no from-scratch vs torch.nn.Transformer comparison.")
    t = inp.summary[inp.summary.testset == testset]
    best = t.loc[t.bleu.idxmax()]
    second = (f"The best system on {testset} is `{best.model}` with the `{best.recipe}` recipe "
              f"at {best.bleu:.2f} BLEU (chrF {best.chrf:.2f}, test loss {best.loss:.4f}).")
    data, (src, tgt) = corpus_settings(inp.params)["data"], inp.langs
    corpus = kind_of(data).title(data)
    return [f"# Transformer from scratch vs torch.nn.Transformer: {corpus} {src}→{tgt}", "",
            first + " " + second, "",
            "Generated by `nmt report` from `results/`; re-run with `dvc repro` or "
            "`snakemake --cores 8`. Do not edit by hand.", ""]


def verdict_lines(inp: Inputs, recipe: str) -> list[str]:
    """The seed tests and each seed's bootstrap verdicts, on BLEU and test loss."""
    shown_here = {"BLEU", "test loss"}
    lines = [f"- {testset} ({'seeds' if c.seed is None else f'bootstrap, seed {c.seed}'}): "
             f"{stats.verdict(c, digits=4 if c.metric == 'test loss' else 2)}"
             for system in challengers(inp.models) for testset in inp.testsets
             for c in sorted(inp.comparisons[recipe, system, testset],
                             key=lambda c: c.seed is not None)  # the seed test first
             if c.metric in shown_here]
    return lines + [""] if lines else []


def verdict_sentences(inp: Inputs, recipe: str) -> list[str]:
    """The recipe's answer first: each challenger's test-loss verdict (stats.loss_verdict)."""
    return [f"**{system} vs {BASELINE}, test loss on {v['testset']}:** {v['sentence']}\n"
            for (r, system), v in inp.verdicts.items() if r == recipe]


def results_section(inp: Inputs) -> list[str]:
    """Per recipe: mean ± std (n seeds) per model and test set, then the verdict lines."""
    lines = ["## Results", "",
             "Each cell: mean ± sample std (number of seeds) over the training seeds "
             f"{inp.seeds}; per-seed rows are in `results.csv`, these aggregates in "
             "`results_summary.csv`.", ""]
    for recipe in inp.recipes:
        rows = []
        for r in inp.summary[inp.summary.recipe == recipe].itertuples():
            cells = {LABELS[m]: stats.Summary(getattr(r, m), getattr(r, f"{m}_std"),
                                              r.seeds).format(DIGITS[m]) for m in LABELS}
            rows.append({"model": r.model, "testset": r.testset, **cells,
                         "params": f"{int(r.params):,}", "s/epoch": f"{r.seconds_per_epoch:.1f}",
                         "train min": f"{r.train_minutes:.1f}"})
        lines += [f"### recipe `{recipe}`", "", *verdict_sentences(inp, recipe),
                  md_table(pd.DataFrame(rows), text=True), ""]
        lines += verdict_lines(inp, recipe)
    lines += ["`test loss` is the per-token cross-entropy on the test set, `ppl` its "
              "exponential; `BLEU` is beam search, `BLEU greedy` greedy decoding, both "
              "detokenized cased sacreBLEU; `chrF` uses the beam output.", ""]
    sig = next(iter(inp.runs.values()))["evaluation"]["signature"]
    lines += [f"sacreBLEU signatures: BLEU `{sig['bleu']}`, chrF `{sig['chrf']}`.", ""]
    return lines + unknown_words_lines(inp)


UNKNOWN_WORDS = {
    "copy": "copied from the source token the cross-attention weighted most when it was "
            "produced (`evaluate.unknown_words: copy`, `nmt.core.unknowns`)",
    "mark": "kept as a visible `<unk>` (`evaluate.unknown_words: mark`)",
    None: "dropped (these runs were evaluated before `nmt.core.unknowns` existed)"}


def unknown_words_lines(inp: Inputs) -> list[str]:
    """What the translations did with the words their vocabulary lacks, and how many <unk>
    each run's beam output of the first test set held."""
    testset = inp.testsets[0]
    modes = sorted({r["evaluation"].get("unknown_words") for r in inp.runs.values()},
                   key=str)
    counts = ", ".join(f"{run.name} {r['evaluation']['testsets'][testset]['unknowns_beam']}"
                       for run, r in inp.runs.items()
                       if "unknowns_beam" in r["evaluation"]["testsets"][testset])
    held = f" The beam outputs of {testset} held, by run: {counts}." if counts else ""
    return [f"Words the vocabulary lacks (`<unk>` in an output): "
            f"{'; '.join(UNKNOWN_WORDS[m] for m in modes)}.{held}", ""]


def statistics_section(inp: Inputs) -> list[str]:
    """Every comparison with the baseline: difference, 95% CI, p and how it was computed."""
    if not inp.comparisons:
        return []
    digits = {"test loss": 4}
    rows = [{"recipe": recipe, "testset": testset, "comparison": f"{c.system} - {c.baseline}",
             "seed": "all" if c.seed is None else c.seed, "metric": c.metric,
             "difference": f"{c.difference:+.{digits.get(c.metric, 2)}f}",
             "95% CI": f"{c.low:+.{digits.get(c.metric, 2)}f} .. "
                       f"{c.high:+.{digits.get(c.metric, 2)}f}",
             "p": stats.format_p(c.p), "method": c.method}
            for (recipe, _, testset), found in inp.comparisons.items() for c in found]
    signatures = {c.metric: c.signature for found in inp.comparisons.values() for c in found
                  if c.signature}
    lines = ["## Statistics", "", md_table(pd.DataFrame(rows), text=True), "",
             f"Significance level {stats.ALPHA}. The paired bootstraps resample test sentences "
             "of one pair of trained models, each seed's pair on its own (`seed`): they measure "
             "how much the test set's sample of sentences moves the difference, not training "
             "noise. BLEU and chrF use sacreBLEU's own paired bootstrap (its p-value); the "
             "95% interval of the difference comes from the same resamples. The test loss is "
             "resampled the same way (summed nats / tokens per system). With two or more "
             "seeds a side, the Welch t-test over the seed scores covers training noise; it is "
             "the test for 'do the architectures train alike'.", ""]
    lines += [f"- sacreBLEU bootstrap signature, {k}: `{v}`" for k, v in signatures.items()]
    return lines + [""]


def ablation_section(inp: Inputs) -> list[str]:
    """Beam BLEU of every model for a recipe and each of its ablations in the pipeline; the
    Δ columns follow one model (scratch when it ran)."""
    recipes = inp.params["recipes"]
    ablations = [r for r in inp.recipes if "ablation_of" in recipes[r]]
    focus = "scratch" if "scratch" in inp.models else inp.models[0]
    lines = []
    for full in dict.fromkeys(recipes[r]["ablation_of"] for r in ablations):
        if full not in inp.recipes:
            continue
        rows = []
        for r in [full, *(a for a in ablations if recipes[a]["ablation_of"] == full)]:
            row = {"recipe": r, "removed": recipes[r].get("removes", "(nothing)")}
            for m in inp.models:
                row |= {f"{m} {t}": inp.cell(r, m, t).bleu for t in inp.testsets}
            row |= {f"Δ {focus} {t}": inp.cell(r, focus, t).bleu - inp.cell(full, focus, t).bleu
                    for t in inp.testsets}
            rows.append(row)
        lines += [f"## Ablation of `{full}` (beam BLEU, mean over seeds)", "",
                  md_table(pd.DataFrame(rows)), ""]
    return lines


def search_steps(recipes: dict) -> list[str]:
    """The recipes of every search tree (`step_of`), each step after the one it builds on:
    a tree's first recipe, then each of its branches whole, in params.yaml's order."""
    steps = [r for r in recipes if "step_of" in recipes[r]]
    firsts = [r for r in dict.fromkeys(recipes[s]["step_of"] for s in steps)
              if "step_of" not in recipes[r]]

    def tree(step: str) -> list[str]:
        return [step] + [s for child in steps if recipes[child]["step_of"] == step
                         for s in tree(child)]

    return [s for first in firsts for s in tree(first)]


def search_section(inp: Inputs) -> list[str]:
    """The recipe search as it ran: every search step's runs found in results/ (also those
    outside pipeline.recipes: `make demo-search` trains them), judged on the validation set;
    Δ BLEU is against the step it builds on, same model and seed."""
    recipes, rows, bleu_of = inp.params["recipes"], [], {}  # (step, model, seed): valid BLEU
    for recipe in search_steps(recipes):
        for path in sorted(inp.results.glob(f"{recipe}-*-s*/train.json")):
            t = read_json(path)
            bleu = t["valid_bleu_greedy"]
            if bleu is None:  # trained under torchrun: no validation decoding
                continue
            parent = recipes[recipe].get("step_of")
            earlier = bleu_of.get((parent, t["model"], t["seed"]))
            rows.append({"step": recipe, "builds on": parent or "-",
                         "adds": recipes[recipe].get("adds", "(the start)"),
                         "model": t["model"], "seed": t["seed"], "params": f"{t['params']:,}",
                         "updates": t["updates"], "epochs": t["epochs"],
                         "train min": f"{t['train_minutes']:.1f}",
                         "valid loss": f"{t['best_valid_loss']:.4f}",
                         "valid BLEU greedy": f"{bleu:.2f}",
                         "Δ BLEU": "-" if earlier is None else f"{bleu - earlier:+.2f}"})
            bleu_of[recipe, t["model"], t["seed"]] = bleu
    if not rows:
        return []
    return ["## Recipe search (validation set only)", "",
            "Each step adds one ingredient to the step it builds on and trains for about the "
            "same minutes (`train.max_updates` set from its speed); Δ BLEU is what the "
            "ingredient bought over that step (same model and seed). Every choice is made on "
            "these validation figures, and no test set is decoded here. `make demo-search` "
            "trains the steps; the rows are the runs found in `results/`.", "",
            md_table(pd.DataFrame(rows), text=True), ""]


def reference_section(inp: Inputs) -> list[str]:
    """Our published-recipe test loss and speed beside the published numbers."""
    lines = ["## Against the published reference", ""]
    if "published" not in inp.recipes:
        return lines + ["The `published` recipe is not in `pipeline.recipes`.", ""]
    testset = inp.testsets[0]
    rows = []
    for model in inp.models:
        r, pub = inp.cell("published", model, testset), PUBLISHED.get(model, {})
        rows.append({"model": model,
                     "test loss (ours)": stats.Summary(r.loss, r.loss_std, r.seeds).format(4),
                     "test loss (published)": pub.get("loss", "-"),
                     "s/epoch (ours)": f"{r.seconds_per_epoch:.1f}",
                     "s/epoch (published)": pub.get("seconds_per_epoch", "-"),
                     "device (ours)": inp.runs[Run("published", model, inp.seeds[0])]["train"][
                         "device"]})
    return lines + [md_table(pd.DataFrame(rows), text=True), "",
                    f"Ours on {testset}. The published losses average the batch-mean loss over "
                    "batches; ours are per token over the whole test set, so small differences "
                    "are expected.", ""] + reference_curves(inp)


# The published recipe, and those that take one of its departures from the reference back
# (docs/results.md, "Our published curve against the reference's").
REFERENCE_RECIPES = {"published": "ours", "published_random": "random batches",
                     "published_faithful": "random batches, fp32"}


def reference_curves(inp: Inputs) -> list[str]:
    """The validation loss of the first epochs beside the published runs': the published
    recipe's and, when the pipeline runs them, those of the recipes that take a departure
    from the reference back; each the mean over the seeds."""
    table = {}
    for model, published in PUBLISHED.items():
        if model not in inp.models:
            continue
        for recipe, label in REFERENCE_RECIPES.items():
            if recipe not in inp.recipes:
                continue
            curves = [inp.runs[Run(recipe, model, s)]["history"]["valid_loss"].to_numpy()
                      for s in inp.seeds]
            common = min(len(curve) for curve in [*curves, published["valid_loss"]])
            mean = np.mean([curve[:common] for curve in curves], axis=0)
            table[f"{model} ({label})"] = [f"{loss:.3f}" for loss in mean]
        table[f"{model} (published)"] = [f"{loss:.2f}" for loss in published["valid_loss"]]
    if not table:
        return []
    epochs = min(len(column) for column in table.values())
    frame = pd.DataFrame({"epoch": range(1, epochs + 1),
                          **{name: column[:epochs] for name, column in table.items()}})
    seeds = f"seed {inp.seeds[0]}" if len(inp.seeds) == 1 else f"mean of seeds {inp.seeds}"
    return [f"Validation loss by epoch, ours ({seeds}) beside the published runs':",
            "", md_table(frame, text=True), ""]


# The A/B of the attention kernels: the published recipe with every kernel allowed, cuDNN's
# included (train.attention_kernels: any), against the published runs, routed or not.
KERNELS_AB = ("published_cudnn", "published")


def kernels_section(inp: Inputs) -> list[str]:
    """The attention kernels each run was allowed (train.json's attention_kernels: "any", or
    the route NMT_ATTENTION_KERNELS set), and, where results/ holds published_cudnn runs
    (in the pipeline or trained on their own), their validation loss by epoch against the
    published runs', mean over the seeds each side has."""
    routes: dict[str, list[str]] = {}
    for run, r in inp.runs.items():
        routes.setdefault(r["train"].get("attention_kernels", "not recorded"), []).append(run.name)
    lines = ["## Attention kernels", "",
             "The attention kernels each run was allowed to take (`train.json`: "
             "`attention_kernels`; `any`: every kernel, else the route "
             "`NMT_ATTENTION_KERNELS` set): " + "; ".join(
                 f"{route}: {', '.join(names)}" for route, names in routes.items()) + ".", ""]
    ab, routed = KERNELS_AB
    table, used = {}, []
    for model in (BASELINE, "scratch"):
        folders = sorted(inp.results.glob(f"{ab}-{model}-s*/history.csv"))
        if not folders or routed not in inp.recipes or model not in inp.models:
            continue
        sides = {f"{model}, {ab} (any)": [pd.read_csv(path).valid_loss for path in folders],
                 f"{model}, {routed}": [inp.runs[Run(routed, model, s)]["history"].valid_loss
                                       for s in inp.seeds]}
        for path in folders:
            kernels = read_json(need(path.parent / "train.json")).get("attention_kernels")
            used.append(f"{path.parent.name} ({kernels or 'not recorded'})")
        epochs = min(len(curve) for curves in sides.values() for curve in curves)
        means = [np.mean([c.to_numpy()[:epochs] for c in curves], axis=0)
                 for curves in sides.values()]
        table |= dict(zip(sides, means, strict=True))
        table[f"{model}, difference"] = means[0] - means[1]
    if not table:
        return lines + [f"No A/B runs: results/ holds no `{ab}` run of baseline or scratch "
                        f"beside the `{routed}` recipe's (they train with every attention kernel "
                        "allowed, cuDNN's included: docs/results.md, \"The study\").", ""]
    epochs = min(len(column) for column in table.values())
    frame = pd.DataFrame({"epoch": range(1, epochs + 1),
                          **{name: [f"{x:+.3f}" if "difference" in name else f"{x:.3f}"
                                    for x in column[:epochs]] for name, column in table.items()}})
    return lines + [f"Validation loss by epoch, mean over each side's seeds: `{ab}` "
                    f"(every kernel allowed; runs: {', '.join(used)}) against `{routed}` "
                    f"(seeds {inp.seeds}); difference = {ab} - {routed}.", "",
                    md_table(frame, text=True), ""]


def training_section(inp: Inputs, figures: dict[str, str]) -> list[str]:
    """Loss curves, the other curves of history.csv (lr, gradient norm, speed), each run's
    training speed, and the speed benchmark."""
    testset = inp.testsets[0]
    lines = ["## Training", "", f"![loss curves](figures/{figures['loss']})", "",
             "Per epoch: the learning rate, the mean gradient norm of the epoch's updates "
             "(before clipping), seconds and tokens a second.", "",
             "In the table below, `wall s` is a run's whole training, from each of its "
             "processes' start to its outputs, and `epochs s` the sum of its epochs (the "
             "updates); train.json's `seconds` says where the rest went.", "",
             f"![training curves](figures/{figures['training']})", ""]
    speed = pd.DataFrame([
        {"run": run.name, "device": r["train"]["device"], "epochs": r["train"]["epochs"],
         "best epoch": r["train"]["best_epoch"], "best valid loss": r["train"]["best_valid_loss"],
         "s/epoch": r["train"]["seconds_per_epoch"],
         "train tokens/s": r["train"]["tokens_per_second"],
         f"beam s ({testset})": r["evaluation"]["testsets"][testset]["seconds_beam"]}
        | machine_columns(r["train"]) for run, r in inp.runs.items()])
    return lines + [md_table(speed, ".3f"), ""] + machine_note(inp) + bench_lines(inp)


def machine_columns(summary: dict) -> dict:
    """train.json's device report as table columns ("-" for a run trained before it): the
    run's wall time beside its epochs' sum among them."""
    compiled, seconds = summary.get("compile"), summary.get("seconds", {})
    return {"wall s": seconds.get("wall", "-"), "epochs s": seconds.get("epochs", "-"),
            "precision": summary.get("precision", "-"),
            "compile s": summary.get("compile_seconds", "-") if compiled else "off",
            "CUDA graphs": summary.get("cuda_graphs", "-"),
            "peak MB": summary.get("peak_memory_mb", "-")}


def machine_note(inp: Inputs) -> list[str]:
    """The devices the runs trained on, by name, and what their peak memory measures; the
    precisions they trained and decoded in, and why (train.json: nmt.training.precision)."""
    seen = sorted({f"{r['train']['device_name']} (peak memory: {r['train']['peak_memory_of']})"
                   for r in inp.runs.values() if "device_name" in r["train"]})
    kinds = (("training", ""), ("decoding", "decode_"))
    why = sorted({f"{what} in {t[key + 'precision']} ({t[key + 'precision_reason']})"
                  for t in (r["train"] for r in inp.runs.values()) for what, key in kinds
                  if key + "precision_reason" in t})
    return ([f"Trained on: {'; '.join(seen)}. Epoch 1's seconds include the compile time.", ""]
            if seen else []) + ([f"Precision: {'; '.join(why)}.", ""] if why else [])


def bench_lines(inp: Inputs) -> list[str]:
    """results/bench.json as a table: every model bench timed, and the ratio where given."""
    bench = read_json(need(inp.results / "bench.json"))
    units = {"train": "train tokens/s", "greedy": "greedy sentences/s",
             "beam": "beam sentences/s"}
    spreads = bench.get("ratio_spread", {})  # benches before issue 58 did not measure it
    rows = [{"what": label, **{m: v for m, v in bench[k].items() if m != "ratio"},
             **({"scratch/baseline": bench[k]["ratio"]} if "ratio" in bench[k] else {}),
             **({"ratio quartiles": spread_cell(spreads[k])} if k in spreads else {})}
            for k, label in units.items()]
    lines = [f"### Speed benchmark (`nmt bench`, {bench['device']}, recipe {bench['recipe']})",
             "", md_table(pd.DataFrame(rows), ".2f"), ""]
    if spreads:
        lines += ["Each ratio is the median of per-pair ratios: the models alternate step by "
                  "step on the same work. `ratio quartiles` are those ratios' quartiles and "
                  "their spread (interquartile range over the median); over "
                  f"{bench['ratio_max_spread']:.0%} a ratio is NOT TRUSTED: other load on the "
                  "machine moved it (run `nmt bench` again on a quiet machine).", ""]
    if bench.get("padding"):  # random and bucketed sentence batches, or token batches
        lines += ["Padding, the padded share of the source and target positions of an epoch's "
                  "training batches: " + ", ".join(
                      f"{kind} {share:.1%}" for kind, share in bench["padding"].items()) + ".", ""]
    if bench.get("padding_share"):  # what the timed steps computed on padding
        lines += [f"The timed batches (lengths a multiple of {bench['pad_multiple']}) are "
                  f"{bench['padding_share']['src']:.1%} padding in the source, "
                  f"{bench['padding_share']['tgt']:.1%} in the target.", ""]
    if bench.get("mfu"):
        precision = bench.get("precision", "bf16")
        peak = bench.get("peak_gflops", {}).get(precision)
        of = (f"of this machine's measured {precision} matmul peak, {peak:,.1f} GFLOP/s"
              if bench.get("peak_measured") else f"of the GPU's dense {precision} peak")
        lines += [f"Model FLOPs utilisation in training ({of}; steps in {precision}): " +
                  ", ".join(f"{m} {v:.1%}" for m, v in bench["mfu"].items()) + ".", ""]
    if bench.get("peak_memory_mib"):
        lines += ["Peak GPU memory in training: " + ", ".join(
            f"{m} {v:,} MiB" for m, v in bench["peak_memory_mib"].items()) + ".", ""]
    return lines


def spread_cell(spread: dict) -> str:
    """A ratio's quartiles and spread (bench.json's ratio_spread) as a table cell."""
    low, high = spread["quartiles"]
    return (f"{low:.2f}-{high:.2f} ({spread['spread']:.0%}"
            f"{'' if spread['trusted'] else ', NOT TRUSTED'})")


def verification_section(inp: Inputs) -> list[str]:
    """Each recipe's checklist (results/verify/<recipe>.json): which kinds of check ran (twin:
    scratch against torch.nn.Transformer; property: every model on its own), and each check."""
    lines = ["## Verification", "",
             "`nmt verify`: twin checks compare scratch with torch.nn.Transformer on shared "
             "weights, where the baseline can express the configuration; property checks (cached "
             "= full decoding, fused = math attention, padding, gradients, parameter count) run "
             "for every model.", ""]
    for recipe in inp.recipes:
        v = read_json(need(inp.results / "verify" / f"{recipe}.json"))
        columns = ["name", "kind", "passed", "max_abs_diff", "tolerance"]
        df = pd.DataFrame(v["checks"])[[c for c in columns if c in v["checks"][0]]]
        lines += [f"### {recipe}: {'all checks passed' if v['passed'] else 'FAILED'}", ""]
        if "twin" in v:  # written before verify had two kinds: not said
            lines += ["Twin checks: ran." if v["twin"] else
                      f"Twin checks: none ({v['twin_reason']}); passed or failed on its "
                      "property checks alone.", ""]
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


def data_bench_section(inp: Inputs) -> list[str]:
    """results/data_bench.json (`nmt bench --data`, `make bench-data`), when there: each data
    stage's seconds, pairs a second and peak memory on a synthetic corpus of a million pairs."""
    path = inp.results / "data_bench.json"
    if not path.is_file():
        return []
    bench = read_json(path)
    rows = [{"step": s["what"], "seconds": s["seconds"], "pairs/s": f"{s['pairs_per_second']:,}",
             "peak RSS (GB)": s["peak_rss_gb"]} for s in bench["steps"]]
    verdict = "within" if bench["within_limit"] else "over"
    return [f"## Data stages at scale (`nmt bench --data`, {bench['pairs']:,} pairs)", "",
            f"Corpus: {bench['corpus']}; tokenize in {bench['threads']} process(es) on "
            f"{bench['cpus']} CPUs. Each step ran in a process of its own; its peak is the "
            "summed resident memory of that process and the processes it started.", "",
            md_table(pd.DataFrame(rows), ".2f", text=True), "",
            f"Highest peak: {bench['peak_rss_gb']:.2f} GB, {verdict} the "
            f"{bench['limit_gb']:g} GB goal.", ""]


def decoding_section(inp: Inputs) -> list[str]:
    """results/<run>/decoding.json (`nmt bench --decoding`), when there: our greedy and beam
    search against CTranslate2's in fp32 and int8 on the run's weights, on the same threads."""
    lines = []
    for path in sorted(inp.results.glob("*/decoding.json")):
        bench = read_json(path)
        rows = [{"decoder": f"{r['engine']} {r['compute_type']}", "method": r["method"],
                 "sentences/s": r["sentences_per_s"], "tokens/s": r["tokens_per_s"],
                 "BLEU": r["bleu"], "same as nmt": f"{r['identical_to_nmt']}/{bench['sentences']}"}
                for r in bench["rows"]]
        check = bench.get("export_check") or {}
        lines += [f"## Decoding engines: {bench['run']} (`nmt bench --decoding`)", "",
                  f"{bench['sentences']} sentences of {bench['testset']}, beam "
                  f"{bench['beam_size']}, {bench['threads']} CPU thread(s), median of "
                  f"{bench['repeats']} alternating repeats. CTranslate2 decodes the run's export "
                  f"(`nmt export`), whose per-token log-probabilities were within "
                  f"{check.get('max_abs_logprob_diff', float('nan')):.1e} of ours on "
                  f"{check.get('pairs', 0)} validation pairs; its beam search is ranked by GNMT "
                  "as ours is.", "", md_table(pd.DataFrame(rows), ".2f", text=True), ""]
    return lines


# --- the stage -------------------------------------------------------------------------------

def write_tables(inp: Inputs, out: Path) -> None:
    """results.csv (per seed), results_summary.csv (seed aggregates), metrics.json (for
    `dvc metrics show`: seed means, numbers only) and statistics.json (the verdicts and the
    comparisons)."""
    with atomic_path(out / "results.csv") as tmp:
        inp.table.to_csv(tmp, index=False, float_format="%.4f")
    with atomic_path(out / "results_summary.csv") as tmp:
        inp.summary.to_csv(tmp, index=False, float_format="%.4f")
    metrics = {}
    for r in inp.summary.itertuples():
        metrics.setdefault(r.recipe, {}).setdefault(r.model, {})[r.testset] = {
            "loss": r.loss, "bleu": r.bleu, "chrf": r.chrf}
    write_json(out / "metrics.json", metrics)
    curves = pd.concat([r["history"][["epoch", "train_loss", "valid_loss"]].assign(run=run.name)
                        for run, r in inp.runs.items()])
    with atomic_path(out / "curves.csv") as tmp:  # `dvc plots show`: one chart, all runs
        curves.to_csv(tmp, index=False)
    write_json(out / "statistics.json", {
        "verdicts": list(inp.verdicts.values()),
        "comparisons": [{"recipe": recipe, "testset": testset, **c.to_dict()}
                        for (recipe, _, testset), found in inp.comparisons.items()
                        for c in found]})


@dataclass(frozen=True)
class Paths:
    tokenized: Path  # data/tokenized: sources and references of the samples
    vocab: Path  # data/vocab: holds <recipe>/meta.json of every recipe
    results: Path  # results/: every run's folder, verify/ and bench.json
    out: Path  # reports/


def report(settings: dict, paths: Paths) -> None:
    """Stage report: read results/ and data/, write reports/: report.md, tables and figures.
    settings: params.yaml (every recipe, the pipeline lists, report.samples)."""
    out = Path(paths.out)
    inp = load(settings, paths.tokenized, paths.vocab, paths.results)
    with atomic_dir(out / "figures") as folder:
        figures = draw_figures(inp, folder)
    lines = (head_section(inp) + results_section(inp) + statistics_section(inp)
             + search_section(inp) + ablation_section(inp) + reference_section(inp)
             + kernels_section(inp) + training_section(inp, figures)
             + verification_section(inp) + samples_section(inp)
             + attention_section(inp, figures) + setup_section(inp) + data_bench_section(inp)
             + decoding_section(inp))
    write_tables(inp, out)
    write_text(out / "report.md", "\n".join(lines))
    log.info("wrote %s, results.csv (%d rows), results_summary.csv, metrics.json, "
             "statistics.json, figures/ (%s)", out / "report.md", len(inp.table),
             ", ".join(figures.values()))


# ---- `nmt report`: nmt.cli builds the subcommand from HELP, arguments and command ----------------

HELP = ("Read results/ and data/, write reports/report.md, reports/results.csv and "
        "figures.")


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.results(parser)
    parser.add_argument("--tokenized", type=Path, default=commandline.TOKENIZED)
    parser.add_argument("--vocab", type=Path, default=None, help="holds <recipe>/ (default: "
                        "data/vocab)")
    parser.add_argument("--out", type=Path, default=commandline.REPORTS)


def command(args, params: dict) -> None:
    report(params, Paths(tokenized=args.tokenized, vocab=args.vocab or commandline.VOCAB,
                         results=args.results, out=args.out))
