"""The report's figures (matplotlib, PNG files only): loss curves, the other history.csv
curves, and each model's attention map of one sentence."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from nmt.core.files import atomic_path, read_json  # noqa: E402
from nmt.core.runs import Run  # noqa: E402
from nmt.stages.report.inputs import Inputs, need  # noqa: E402
from nmt.stages.report.reference import PUBLISHED, REFERENCE_RECIPES  # noqa: E402

# history.csv's columns that the loss figure draws; every other one gets its own panel in the
# training figure (lr, grad_norm, seconds, tokens_per_second, and any number a run logs later)
LOSS_COLUMNS = ("epoch", "train_loss", "valid_loss")


def plot_losses(inp: Inputs, path: Path) -> dict[str, list[str]]:
    """Train (dashed) and validation (solid) loss per epoch, one panel a recipe: each seed a
    thin line, the mean over seeds bold, one colour a model; on the panels of the recipes that
    reproduce the published runs, their validation loss dotted. Returns each panel's legend."""
    n = len(inp.recipes)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4.2), squeeze=False)
    legends = {}
    for ax, recipe in zip(axes[0], inp.recipes, strict=True):
        for column, style, what in (("train_loss", "--", "train"), ("valid_loss", "-", "valid")):
            plot_seeds(ax, inp, recipe, column, style, what)
        plot_published(ax, inp, recipe)
        seeds = f", mean of {len(inp.seeds)} seeds (thin: each seed)" if len(inp.seeds) > 1 else ""
        ax.set(title=f"recipe: {recipe}{seeds}", xlabel="epoch", ylabel="loss per token")
        legends[recipe] = [text.get_text() for text in ax.legend(fontsize=8).get_texts()]
    fig.tight_layout()
    save(fig, path)
    return legends


def plot_published(ax, inp: Inputs, recipe: str) -> None:
    """The published runs' validation loss by epoch (reference.PUBLISHED, the epochs the
    reference reports), dotted in each model's colour, on a recipe that reproduces them."""
    if recipe not in REFERENCE_RECIPES:
        return
    for i, model in enumerate(inp.models):
        if model in PUBLISHED:
            curve = PUBLISHED[model]["valid_loss"]
            ax.plot(range(1, len(curve) + 1), curve, ":", marker="o", markersize=3,
                    color=f"C{i}", lw=1.5, label=f"{model} valid (published)")


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
