"""The data stages at scale: compact pairs, the same batches as the list-based code, streamed
tokenization (any process count), tokenize.words: false, vocab.bpe_sample, nmt bench --data."""

import random

import numpy as np
import pytest
import torch

from nmt.data import (
    BUCKET_POOL,
    Batches,
    Pairs,
    bucketed_sentence_batches,
    collate,
    load_pairs,
    padding_fraction,
    sentence_batches,
    token_batches,
)
from nmt.vocab import load_codecs

# --- the list-based batching as it was, the reference the numpy version must match ----------


def reference_bucketed(pairs, batch_size, rng):
    order = list(range(len(pairs)))
    if rng is not None:
        rng.shuffle(order)
    pool = BUCKET_POOL * batch_size if rng is not None else len(order)
    batches = []
    for first in range(0, len(order), pool):
        members = sorted(order[first : first + pool],
                         key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
        batches += [members[i : i + batch_size] for i in range(0, len(members), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


def reference_tokens(pairs, max_tokens, rng):
    keys = [(max(len(s), len(t)), rng.random() if rng else 0.0, i) for i, (s, t) in
            enumerate(pairs)]
    keys.sort()
    batches, batch, longest = [], [], 0
    for length, _, i in keys:
        if batch and max(longest, length) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def reference_padding(pairs, batches):
    real = padded = 0
    for idx in batches:
        for side in (0, 1):
            lengths = [len(pairs[i][side]) for i in idx]
            real += sum(lengths)
            padded += len(lengths) * max(lengths)
    return 1 - real / padded


@pytest.fixture(scope="module", params=["word", "bpe"])
def both(request, prepared):
    """(compact Pairs, the same pairs as the old list of (list, list) tuples)."""
    pairs = load_pairs(prepared["tokenized"], "train", *load_codecs(prepared[request.param]), 256)
    return pairs, [(list(s), list(t)) for s, t in pairs]


@pytest.mark.parametrize("seed", [0, 1, 7, None])
def test_batches_are_the_list_based_ones(both, seed):
    """Same batches, same order, same state of the generator after: the published recipe and a
    resumed run stay bit-identical. None: no shuffling (validation)."""
    pairs, listed = both

    def rngs():
        return (None, None) if seed is None else (random.Random(seed), random.Random(seed))

    for batch_size in (32, 7):
        new, old = rngs()
        assert bucketed_sentence_batches(pairs, batch_size, new) == reference_bucketed(
            listed, batch_size, old)
        assert new is None or new.random() == old.random()
        new, old = rngs()
        assert sentence_batches(len(pairs), batch_size, new) == sentence_batches(
            len(listed), batch_size, old)
    for max_tokens in (600, 4096, 25):  # 25: shorter than some sentences (one a batch)
        new, old = rngs()
        batches = token_batches(pairs, max_tokens, new)
        assert batches == reference_tokens(listed, max_tokens, old)
        assert new is None or new.random() == old.random()
        assert padding_fraction(pairs, batches) == reference_padding(listed, batches)


def test_compact_pairs_behave_like_the_list(both):
    pairs, listed = both
    assert len(pairs) == len(listed) and list(pairs) == listed
    assert pairs[5] == listed[5] and pairs[-1] == listed[-1]
    assert isinstance(pairs[5], tuple) and isinstance(pairs[5][0], list)
    head = pairs[:100]
    assert isinstance(head, Pairs) and list(head) == listed[:100]
    assert list(pairs[10:20]) == listed[10:20] and len(pairs[5000:]) == 0
    assert list(Pairs.of(listed[:50])) == listed[:50] and Pairs.of(pairs) is pairs
    assert pairs.src.ids.dtype == np.int32 and pairs.src.ids.base is None  # one array a side
    with pytest.raises(IndexError):
        pairs[len(pairs)]


def test_batch_tensors_are_what_collate_makes(both):
    """Batches pad a batch with numpy from the id arrays: the tensors collate made of lists."""
    pairs, listed = both
    for multiple, limit in ((1, 0), (8, 0), (8, 20)):
        batches = Batches(pairs, "tokens", 0, 600, shuffle=True, seed=3, pad_multiple=multiple,
                          max_len=limit)
        for idx in batches.indices(0)[:20]:
            src, tgt = batches.batch(idx)
            want_src, want_tgt = collate([listed[i] for i in idx], multiple, limit)
            assert src.dtype == want_src.dtype == torch.long
            assert src.equal(want_src) and tgt.equal(want_tgt)
