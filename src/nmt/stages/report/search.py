"""What each ingredient bought: the recipe search as it ran (validation set only) and the
ablations of a recipe (test BLEU)."""

from __future__ import annotations

import pandas as pd

from nmt.core.files import read_json
from nmt.stages.report.inputs import Inputs
from nmt.stages.report.markdown import md_table


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
