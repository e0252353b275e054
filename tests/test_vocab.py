"""What the vocabularies are learnt from (tests/test_data_stages.py tests how)."""

from __future__ import annotations

import shutil

from conftest import REPO
from nmt.pipeline.params import load_params
from nmt.stages import vocab
from test_orchestrators import digests


def test_the_vocabularies_are_learnt_from_the_train_split_alone(prepared, tmp_path):
    """Both kinds are byte for byte the same built from data/tokenized or from its train split
    alone: no validation or test sentence reaches them (a BPE trained on a test set too would
    segment that test set as it had seen it, and score it better than it should)."""
    train_only = tmp_path / "tokenized"
    train_only.mkdir()
    for path in prepared["tokenized"].glob("train.*"):
        shutil.copy(path, train_only / path.name)
    assert sorted(p.name for p in prepared["tokenized"].iterdir()) != sorted(
        p.name for p in train_only.iterdir())  # the test sets are beside the train split there
    params = load_params(REPO / "params.yaml")
    kinds = {"word": params,  # as the prepared fixture builds them
             "bpe": params | {"vocab": {**params["vocab"], "kind": "bpe", "bpe_size": 1000}}}
    for kind, settings in kinds.items():
        vocab.build(settings, vocab.Paths(train_only, tmp_path / kind))
        built, prepared_files = (sorted(p.name for p in folder.iterdir())
                                 for folder in (tmp_path / kind, prepared[kind]))
        assert digests(tmp_path / kind, built) == digests(prepared[kind], prepared_files), kind
