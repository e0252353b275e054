"""The corpus a pipeline trains on: which recipe's settings the data stages use, and which raw
files they make.

Whatever its kind (data.corpus: multi30k, files, huggingface; one module each in
nmt.pipeline.corpora), `nmt download` writes the same folder: data/raw/<split>.<lang>.gz for
train, val and every data.testsets name, so tokenize and everything after it never ask which kind.
A recipe may override data and tokenize, but the data stages run once a pipeline: the
recipes of one pipeline must share one corpus, that of pipeline.recipes[0] (checked by
nmt.pipeline.params).
"""

from __future__ import annotations

from nmt.pipeline.recipes import resolve

CORPUS_SECTIONS = ("data", "tokenize")  # what the data stages read of a recipe


def corpus_recipe(params: dict) -> str:
    """The recipe whose data and tokenize sections the data stages run with."""
    return params["pipeline"]["recipes"][0]


def corpus_settings(params: dict) -> dict:
    """The pipeline's corpus: the data and tokenize sections of corpus_recipe, resolved."""
    return resolve(params, corpus_recipe(params))


def splits(data: dict) -> list[str]:
    """Every split the data stages make: train, val, then data.testsets."""
    return ["train", "val", *data["testsets"]]


def raw_names(data: dict) -> list[str]:
    """The files of data/raw: <split>.<lang>.gz of every split, both languages."""
    return [f"{split}.{lang}.gz" for split in splits(data)
            for lang in (data["source_lang"], data["target_lang"])]
