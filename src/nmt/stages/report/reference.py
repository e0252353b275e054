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
from nmt.stages.report.markdown import md_table

# The published comparison this project reproduces (test loss after 15 epochs, its GPU, and
# the validation loss of its first 7 epochs, fp32, as issue 46 quotes them).
PUBLISHED = {"baseline": {"loss": 2.0176, "seconds_per_epoch": "52-53",
                          "valid_loss": [3.80, 3.49, 3.29, 3.11, 2.96, 2.75, 2.49]},
             "scratch": {"loss": 2.0239, "seconds_per_epoch": "55-56",
                         "valid_loss": [3.84, 3.50, 3.29, 3.15, 2.93, 2.72, 2.46]}}


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
