# Shared by the rules: the recipe and model lists, and params as rerun triggers.
import json
import sys
from pathlib import Path

# The package holds the rules a JSON schema cannot express (d_model % nhead, ...).
sys.path.insert(0, str(Path(workflow.basedir).parent / "src"))
from nmt.config import NmtError, check_semantics, resolve  # noqa: E402

try:
    check_semantics(config)
except NmtError as e:
    raise SystemExit(f"params.yaml: {e}")

RECIPES = config["pipeline"]["recipes"]
MODELS = config["pipeline"]["models"]
SEEDS = config["pipeline"]["seeds"]
CODE = "src/nmt"


wildcard_constraints:
    recipe="[a-z][a-z0-9_]*",
    model="baseline|scratch",
    seed=r"\d+",


def section(name, recipe=None):
    """One params section as JSON: Snakemake re-runs a rule whose params changed."""
    source = resolve(config, recipe) if recipe else config
    return json.dumps(source[name], sort_keys=True)


def vocab_section(recipe):
    """The vocab keys this recipe's kind reads (min_freq for word, bpe_size for bpe)."""
    v = resolve(config, recipe)["vocab"]
    used = {"word": "min_freq", "bpe": "bpe_size"}[v["kind"]]
    return json.dumps({"kind": v["kind"], used: v[used]})
