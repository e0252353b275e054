"""Recipes: params.yaml's top-level sections with one recipe's overrides merged over them.

`resolve(params, "tuned")` is what every recipe stage runs with (the config stage writes it to
params/<recipe>.yaml). An ablation (`ablation_of`, `removes`) inherits its base recipe's
overrides, then applies its own; so does a search step (`step_of`, `adds`), which adds
one ingredient to the step before it.
"""

from __future__ import annotations

import copy
from functools import singledispatch
from typing import Any

from nmt.core.errors import NmtError

# What a recipe may override. data and tokenize (the corpus) are the same for every recipe of
# one pipeline, as the data stages run once (nmt.pipeline.corpus).
RECIPE_SECTIONS = ("data", "tokenize", "vocab", "model", "train", "evaluate")
NOT_RESOLVED = ("recipes", "pipeline", "bench")  # sections about the pipeline, not a recipe


@singledispatch  # another mapping type may register its own (nmt.pipeline.tracking does)
def resolve(params: dict, recipe: str) -> dict[str, Any]:
    """The sections of one recipe: the top level with recipes.<recipe> merged over it."""
    if recipe not in params["recipes"]:
        known = ", ".join(params["recipes"])
        raise NmtError(f"unknown recipe {recipe!r} (fix: use one of: {known})")
    resolved = {k: copy.deepcopy(v) for k, v in params.items() if k not in NOT_RESOLVED}
    return merge(resolved, overrides(params, recipe))


def builds_on(recipe: dict) -> str | None:
    """The recipe whose overrides this one starts from: ablation_of or step_of (or None)."""
    return recipe.get("ablation_of") or recipe.get("step_of")


def overrides(params: dict, recipe: str, seen: tuple = ()) -> dict:
    """What a recipe changes: its base recipe's overrides (ablation_of, step_of), then its
    own sections."""
    if recipe in seen:
        raise NmtError(f"params.yaml: recipes.{recipe}: ablation_of/step_of goes round in a "
                       f"circle ({' -> '.join(seen + (recipe,))}) (fix: point it at a full "
                       "recipe)")
    r = params["recipes"][recipe]
    base = overrides(params, builds_on(r), seen + (recipe,)) if builds_on(r) else {}
    return merge(base, {k: v for k, v in r.items() if k in RECIPE_SECTIONS})


def merge(base: dict, override: dict) -> dict:
    """A deep copy of base with override's values in place, section by section."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
