# What the generated rules (rules/stages.smk) call: their params and resources that depend on
# the config.
from nmt.pipeline.recipes import resolve
from nmt.pipeline.declaration import declared_values, lookup


def declared(params=(), recipe_params=(), bench_params=(), corpus_params=()):
    """A job's `values` param: the values of the keys its stage declares, as JSON (params:
    keys of params.yaml; recipe_params: of the job's recipe, resolved; bench_params: of
    bench.recipe's; corpus_params: of pipeline.recipes[0]'s, the corpus's). Snakemake re-runs
    a job when its params change."""
    return lambda wildcards: declared_values(
        config, params, recipe_params, bench_params, corpus_params, wildcards.get("recipe")
    )


def from_recipe(key):
    """A key of the job's recipe, resolved: train.devices is the GPUs a training holds."""
    return lambda wildcards: lookup(resolve(config, wildcards.recipe), key)


def listed(key):
    """A wildcard constraint: one of the names in the params.yaml list `key` (an empty list:
    none, so the rule has no job)."""
    return "|".join(lookup(config, key)) or "(?!)"
