"""Against the published reference: our published-recipe test loss, speed and validation
curve beside the published runs', and the attention-kernel A/B (cuDNN's kernels allowed or
not)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nmt.core import stats
from nmt.core.files import read_json
from nmt.core.runs import Run
from nmt.stages.report.inputs import BASELINE, Inputs, need
from nmt.stages.report.load import read_losses
from nmt.stages.report.markdown import md_table

# The published comparison this project reproduces (test loss after 15 epochs, its GPU, and
# the validation loss of its first 7 epochs, fp32, as issue 46 quotes them).
PUBLISHED = {"baseline": {"loss": 2.0176, "seconds_per_epoch": "52-53",
                          "valid_loss": [3.80, 3.49, 3.29, 3.11, 2.96, 2.75, 2.49]},
             "scratch": {"loss": 2.0239, "seconds_per_epoch": "55-56",
                         "valid_loss": [3.84, 3.50, 3.29, 3.15, 2.93, 2.72, 2.46]}}


# The reference's test loss is the mean of its batches' mean token losses, batches of 32
# sentences in file order; ours is the token mean over the whole test set.
REFERENCE_BATCH = 32
# What the averaging must move ours by, as a share of the gap, to count as its cause (below
# RULED_OUT it is ruled out; docs/results.md lists the other candidates).
RULED_OUT = 0.1


def reference_section(inp: Inputs) -> list[str]:
    """Our published-recipe test loss and speed beside the published numbers, what the gap
    between them is, and what is known of its cause."""
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
    return lines + [md_table(pd.DataFrame(rows), text=True), ""] + gap_lines(
        inp, testset) + reference_curves(inp)


def batch_mean_loss(losses: list[float], tokens: list[int], batch: int) -> float:
    """The test loss as the reference averages it: each batch's token mean (batches of
    `batch` sentences in file order), then the mean over batches."""
    means = [sum(losses[i:i + batch]) / sum(tokens[i:i + batch])
             for i in range(0, len(losses), batch)]
    return float(np.mean(means))


def gap_lines(inp: Inputs, testset: str) -> list[str]:
    """The gap of our test loss to the published one, model by model; the reference's way of
    averaging applied to our per-sentence losses (translations/<testset>.loss.tsv) and the
    share of the gap it accounts for; the candidates left and the runs that decide them."""
    found = []
    for model in (m for m in PUBLISHED if m in inp.models):
        per_token, batch_mean = [], []
        for seed in inp.seeds:
            losses, tokens = read_losses(
                inp.run_files("published", model, seed).translations / f"{testset}.loss.tsv")
            per_token.append(sum(losses) / sum(tokens))
            batch_mean.append(batch_mean_loss(losses, tokens, REFERENCE_BATCH))
        ours, averaged = float(np.mean(per_token)), float(np.mean(batch_mean))
        gap = PUBLISHED[model]["loss"] - ours
        found.append((model, ours, averaged, gap, (averaged - ours) / gap if gap else 0.0))
    if not found:
        return []
    gaps = ", ".join(f"{m} {o:.4f} against {PUBLISHED[m]['loss']:.4f} ({-g:+.3f})"
                     for m, o, _, g, _ in found)
    moved = ", ".join(f"{m} {a:.4f} against {o:.4f} per token ({a - o:+.4f}, "
                      f"{share:.0%} of its gap)" for m, o, a, _, share in found)
    shares = [abs(share) for *_, share in found]
    if max(shares) < RULED_OUT:
        cause = (f"so the averaging is ruled out as the cause (it moves ours by less than "
                 f"{RULED_OUT:.0%} of the gap)")
    elif min(shares) >= 1 - RULED_OUT:
        cause = "so the averaging accounts for the gap"
    else:
        cause = "so the averaging accounts for part of the gap, not all"
    return [f"The gap on {testset}, ours minus published (mean over seeds {inp.seeds}): "
            f"{gaps}. Averaged as the reference does (each {REFERENCE_BATCH}-sentence batch's "
            f"token mean, then the mean over batches; from each run's per-sentence losses), "
            f"ours would read {moved}: {cause}.", "",
            "What else differs from the reference, with what each predicts, is in "
            "docs/results.md (\"Our published curve against the reference's\"): the batching "
            "(the `published_random` recipe takes it back), bf16 (`published_faithful` "
            "against `published_random`), TF32 matmuls, a newline token the reference's "
            "tokenizer may keep, and dropout at validation. "
            + deciding_runs(inp, testset), ""]


def deciding_runs(inp: Inputs, testset: str) -> str:
    """Which of the recipes that take a departure back ran, with their test loss."""
    said = []
    for recipe, label in list(REFERENCE_RECIPES.items())[1:]:
        if recipe not in inp.recipes:
            said.append(f"`{recipe}` ({label}) has not run")
            continue
        losses = ", ".join(f"{m} {inp.cell(recipe, m, testset).loss:.4f}"
                           for m in PUBLISHED if m in inp.models)
        said.append(f"`{recipe}` ({label}) ran: test loss {losses}")
    return "Of the runs that decide them: " + "; ".join(said) + "."


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
