"""The data stages at scale: compact pairs, the same batches as the list-based code, streamed
tokenization (any process count), tokenize.words: false, vocab.bpe_sample, nmt bench --data."""

import hashlib
import json
import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import REPO
from nmt.cli import main
from nmt.commands import data_bench
from nmt.core.codecs import SPECIALS, Vocab, WordCodec, load_codecs
from nmt.core.data import (
    BUCKET_POOL,
    Batches,
    Pairs,
    bucketed_sentence_batches,
    collate,
    load_pairs,
    pad,
    padded_length,
    padding_fraction,
    read_side,
    sentence_batches,
    token_batches,
)
from nmt.core.errors import NmtError
from nmt.pipeline.params import load_params
from nmt.stages import tokenize as tokenize_module
from nmt.stages import vocab
from nmt.stages.report import data_bench_section
from nmt.stages.tokenize import Paths as TokenizePaths
from nmt.stages.tokenize import tokenize

DATA = load_params(REPO / "params.yaml")["data"]

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
    assert pairs[-len(pairs)] == listed[0]  # as a list: every index from -len to len - 1
    assert isinstance(pairs[5], tuple) and isinstance(pairs[5][0], list)
    head = pairs[:100]
    assert isinstance(head, Pairs) and list(head) == listed[:100]
    assert list(pairs[10:20]) == listed[10:20] and len(pairs[5000:]) == 0
    assert list(Pairs.of(listed[:50])) == listed[:50] and Pairs.of(pairs) is pairs
    assert pairs.src.ids.dtype == np.int32 and pairs.src.ids.base is None  # one array a side
    assert Pairs.of(listed[:50]).tgt.ids.dtype == np.int32  # 4 bytes an id, lists or not
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
    # collate itself, by default: padded to the longest sentence of each side, no further
    src, tgt = collate([([2, 5, 3], [2, 3]), ([2, 3], [2, 6, 7, 3])])
    assert src.tolist() == [[2, 5, 3], [2, 3, 1]] and tgt.tolist() == [[2, 3, 1, 1], [2, 6, 7, 3]]


# sha256 (first 16 hex digits) of what the code before streaming and compact pairs (commit
# 14db30e) wrote and batched for the `prepared` data: the same bytes, the same batches.
BEFORE = {
    "bpe/meta.json": "c27ee96c3db8e800",
    "bpe/spm.model": "d8ec1c81520f0010",
    "tokenized/stats.json": "ce8515ff07fb9758",
    "tokenized/test_2016_flickr.de.tok": "691f0811ababa701",
    "tokenized/test_2016_flickr.en.txt": "5017668da780f255",
    "tokenized/train.de.tok": "6b872597cd401948",
    "tokenized/train.de.txt": "17e36053806e5e5e",
    "tokenized/train.en.tok": "6bac896dcd6468ce",
    "tokenized/train.en.txt": "4cf5285426b1cae3",
    "tokenized/val.en.tok": "17904156c3a8175c",
    "word/meta.json": "3220f3e93871ac5d",
    "word/src.json": "40fe691ddbb5ac65",
    "word/tgt.json": "bd503f86eb5cb593",
    # (batch order of epochs 0 and 1, the tensors of epoch 0), seed 0
    "word-sentences-True": "a25f43a6a1015fb2 77764114519a9503",
    "word-sentences-False": "67dfdcd795cbf64c a21b9f37e30ca54b",
    "word-tokens-False": "100f8eb557484f81 4994adf9e5905007",
    "bpe-sentences-True": "2492e39a2db77947 b49d51a81b60fc04",
    "bpe-tokens-False": "f3a77111110ce159 3f96f1e5b49424e0",
}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def test_files_vocabularies_and_batches_are_those_of_before(prepared):
    """Multi30k's own numbers do not move: tokenized files, vocabularies (meta.json included:
    no bpe_sample key while it is 0) and batches, byte for byte."""
    root = prepared["root"]
    for name, want in BEFORE.items():
        if "/" in name:
            assert digest((root / name if name.startswith("tokenized") else
                           root / "vocab" / name).read_bytes()) == want, name
            continue
        kind, batch_by, bucket = name.split("-")
        pairs = load_pairs(prepared["tokenized"], "train", *load_codecs(prepared[kind]), 256)
        batches = Batches(pairs, batch_by, 32, 4096, shuffle=True, seed=0,
                          bucket=bucket == "True")
        order = [batches.indices(epoch) for epoch in (0, 1)]
        tensors = hashlib.sha256()
        for src, tgt in batches:
            tensors.update(src.numpy().tobytes())
            tensors.update(tgt.numpy().tobytes())
        assert f"{digest(json.dumps(order).encode())} {tensors.hexdigest()[:16]}" == want, name


# --- tokenize: processes, tokenize.words: false ----------------------------------------------

SETTINGS = {"data": DATA | {"max_train_pairs": 3000, "max_test_pairs": 100},
            "tokenize": {"batch_size": 100, "words": True}}


def test_tokenize_writes_the_same_bytes_in_any_number_of_processes(prepared, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setattr(tokenize_module, "PARALLEL_FROM", 0)  # workers even for tiny splits
    one = tokenize(SETTINGS, TokenizePaths(prepared["raw"], tmp_path / "one"), processes=1)
    two = tokenize(SETTINGS, TokenizePaths(prepared["raw"], tmp_path / "two"), processes=2)
    assert one == two and one["train.de"]["sentences"] == 3000
    for path in (tmp_path / "one").iterdir():
        assert path.read_bytes() == (tmp_path / "two" / path.name).read_bytes(), path.name


def test_words_false_writes_raw_text_only_and_word_recipes_say_so(prepared, tmp_path):
    text = tmp_path / "text"
    settings = SETTINGS | {"tokenize": {"batch_size": 100, "words": False}}
    stats = tokenize(settings, TokenizePaths(prepared["raw"], text))
    assert stats["train.en"] == {"sentences": 3000} and not list(text.glob("*.tok"))
    assert (text / "val.en.txt").read_bytes() == (prepared["tokenized"] / "val.en.txt").read_bytes()
    params = load_params(REPO / "params.yaml")
    with pytest.raises(NmtError) as err:
        vocab.build(params, vocab.Paths(text, tmp_path / "word"))
    message = str(err.value)
    assert "\n" not in message and "tokenize.words: false" in message
    assert "fix: set tokenize.words: true and re-run nmt tokenize" in message
    assert not (tmp_path / "word").exists()
    with pytest.raises(NmtError, match="tokenize.words: false.*fix: set tokenize.words: true"):
        load_pairs(text, "val", *load_codecs(prepared["word"]), 256)
    # BPE reads the raw text: a folder without word tokens serves it as well.
    pairs = load_pairs(text, "val", *load_codecs(prepared["bpe"]), 256)
    assert list(pairs) == list(load_pairs(prepared["tokenized"], "val",
                                          *load_codecs(prepared["bpe"]), 256))


def test_bpe_sample_trains_on_a_seeded_sample_and_says_so(prepared, tmp_path):
    params = load_params(REPO / "params.yaml")
    sampled = params | {"vocab": params["vocab"] | {"kind": "bpe", "bpe_size": 500,
                                                    "bpe_sample": 1500}}
    metas = [vocab.build(sampled, vocab.Paths(prepared["tokenized"], tmp_path / name))
             for name in ("a", "b")]
    assert metas[0] == metas[1] and metas[0]["bpe_sample"] == 1500
    models = {name: (tmp_path / name / "spm.model").read_bytes() for name in ("a", "b")}
    assert models["a"] == models["b"]
    whole = vocab.build(sampled | {"vocab": sampled["vocab"] | {"bpe_sample": 0}},
                        vocab.Paths(prepared["tokenized"], tmp_path / "whole"))
    assert "bpe_sample" not in whole
    assert models["a"] != (tmp_path / "whole" / "spm.model").read_bytes()


# --- nmt bench --data --------------------------------------------------------------------------

def test_bench_data_runs_every_step_and_reports_its_peak(prepared, tmp_path, capsys):
    out = tmp_path / "data_bench.json"
    # 3,000 pairs fill no 32k BPE: a smaller one, as the wmt14 recipe's would be at scale.
    plan = data_bench.DataPlan(pairs=3000, threads=2, bpe_size=500, bpe_sample=2000)
    data_bench.bench_data(data_bench.Paths(raw=prepared["raw"], json=out), plan)
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["steps"]] == list(data_bench.STEPS)
    for step in result["steps"]:
        assert step["seconds"] > 0 and step["pairs_per_second"] > 0 and step["peak_rss_gb"] > 0
    steps = {s["step"]: s for s in result["steps"]}
    assert steps["tokenize"]["sentences"] == steps["tokenize_text"]["sentences"] == 3000
    assert steps["load_word"]["batches"] > 0 and steps["vocab_bpe"]["src_size"] == 500
    assert result["pairs"] == 3000 and result["within_limit"]
    table = capsys.readouterr().out
    assert "peak RSS GB" in table and "load_bpe" in table
    lines = data_bench_section(SimpleNamespace(results=tmp_path))
    assert "Data stages at scale" in lines[0] and any("load_pairs" in line for line in lines)
    assert data_bench_section(SimpleNamespace(results=tmp_path / "none")) == []


def test_bench_data_without_the_multi30k_files_is_one_line(params_file, tmp_path, capsys):
    assert main(["--params", str(params_file), "bench", "--data", "--raw",
                 str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"nmt bench: error: {tmp_path / 'empty'} lacks the Multi30k raw files (train, "
                   "val, test_2016_flickr; de, en) (fix: run `nmt download` first, or give --raw "
                   "a folder holding them)")


def test_pairs_cut_to_max_len_are_counted_once(prepared, caplog):
    """Multi30k's val split at max_len 12: the pairs with a side of more than 10 tokens are
    cut, and one warning says how many, on which side; at 256 none is and nothing is said."""
    codecs = load_codecs(prepared["word"])
    with caplog.at_level(logging.WARNING, logger="nmt.data"):
        whole = load_pairs(prepared["tokenized"], "val", *codecs, 256)
        assert caplog.records == []
        cut = load_pairs(prepared["tokenized"], "val", *codecs, 12)
    longer = [(len(s) > 12, len(t) > 12) for s, t in whole]
    both = sum(a or b for a, b in longer)
    sources, targets = (sum(side) for side in zip(*longer, strict=True))
    assert 0 < both < len(whole) and len(caplog.records) == 1
    assert caplog.records[0].getMessage() == (
        f"val: {both} of {len(whole)} pairs are longer than model.max_len 12 allows (10 + <bos> "
        f"and <eos>) on the source side ({sources}) or the target side ({targets}); each keeps "
        "its first 10 tokens (fix, to keep them whole: raise model.max_len)")
    assert max(len(s) for s, _ in cut) == 12 == max(len(t) for _, t in cut)


# --- small cases by hand: a side file, a Batches' defaults and epochs ---------------------


def test_a_side_reads_as_int32_ids_cut_to_max_len_and_an_empty_one_as_none(tmp_path):
    """read_side: <bos> ids <eos> a line, in one int32 array (4 bytes an id), a line too long
    for max_len cut to its first max_len - 2 tokens and marked; an empty file: no sentences."""
    codec = WordCodec(Vocab([*SPECIALS, "a", "b", "c"]), "de")
    (tmp_path / "x.de.tok").write_text("a b\nc a b c\n\n")
    side, cut = read_side(tmp_path / "x.de.tok", codec, max_len=4)
    assert [side[i] for i in range(len(side))] == [[2, 4, 5, 3], [2, 6, 4, 3], [2, 3]]
    assert side.ids.dtype == np.int32 and cut.tolist() == [False, True, False]
    (tmp_path / "empty.de.tok").write_text("")
    side, cut = read_side(tmp_path / "empty.de.tok", codec, max_len=4)
    assert len(side) == len(side.ids) == 0 and side.ids.dtype == np.int32 and cut.shape == (0,)


PAIRS = [([2, 5, 3], [2, 6, 6, 3]), ([2, 5, 5, 5, 3], [2, 3]), ([2, 3], [2, 6, 3]),
         ([2, 5, 5, 3], [2, 6, 6, 6, 6, 3]), ([2, 5, 3], [2, 3])]


def test_batches_iterate_epoch_after_epoch_from_the_seed():
    """Pass k over a Batches is indices(k), reshuffled from (seed, k); with shuffle off, the
    pairs in order every pass."""
    batches = Batches(PAIRS, "sentences", 2, 0, shuffle=True, seed=5)
    for epoch in range(4):
        want = sentence_batches(len(PAIRS), 2, random.Random(5 + epoch))
        assert batches.indices(epoch) == want
        assert [src.tolist() for src, _ in batches] == [
            collate([PAIRS[i] for i in idx])[0].tolist() for idx in want]
        assert batches.epoch == epoch + 1
    unshuffled = Batches(PAIRS, "sentences", 2, 0, shuffle=False)
    assert unshuffled.indices(0) == unshuffled.indices(1) == [[0, 1], [2, 3], [4]]


def test_a_pad_multiple_without_max_len_has_no_limit():
    """Batches and Sentences.padded, as collate: lengths rounded up to pad_multiple, with no
    limit unless max_len is given; padded() by default pads to the longest sentence only."""
    pairs = Pairs.of(PAIRS)
    src, tgt = Batches(PAIRS, "sentences", 5, 0, shuffle=False, pad_multiple=4).batch([0, 1])
    assert src.shape == (2, 8) and tgt.shape == (2, 4)
    assert pairs.src.padded([0, 4]).tolist() == collate([PAIRS[0], PAIRS[4]])[0].tolist()
    assert pairs.src.padded([0, 4]).shape == (2, 3)


@pytest.mark.parametrize("batch_by,bucket", [("sentences", True), ("tokens", False)])
def test_batches_for_training_are_the_recipes(batch_by, bucket):
    """for_training: the recipe's batch_by, batch_size, max_tokens and bucket, shuffled from
    the seed, padded to pad_multiple up to max_len: the Batches written out."""
    train = {"batch_by": batch_by, "batch_size": 2, "max_tokens": 12, "bucket": bucket}
    got = Batches.for_training(PAIRS, train, seed=9, pad_multiple=4, max_len=5)
    want = Batches(PAIRS, batch_by, 2, 12, shuffle=True, seed=9, bucket=bucket, pad_multiple=4,
                   max_len=5)
    for epoch in (0, 1):
        assert got.indices(epoch) == want.indices(epoch)
    assert got.indices(0) != Batches(PAIRS, batch_by, 2, 12, shuffle=True, seed=10,
                                     bucket=bucket).indices(0)
    for idx in want.indices(0):
        assert all(a.equal(b) for a, b in zip(got.batch(idx), want.batch(idx), strict=True))
    plain = Batches.for_training(PAIRS, train, seed=9)  # no rounding, no limit by default
    assert [len(plain.batch(idx)[0][0]) for idx in plain.indices(0)] == [
        max(len(PAIRS[i][0]) for i in idx) for idx in plain.indices(0)]


def test_padded_length_and_pad_by_hand():
    """Rounded up to the multiple; where that would cross the limit (the positions table),
    the limit, or the longest length itself if longer; by default the longest length."""
    cases = {(5, 1, 0): 5, (5, 8, 0): 8, (5, 8, 20): 8, (16, 8, 16): 16, (17, 8, 20): 20,
             (23, 8, 20): 23, (5, 1, 3): 5}
    assert {args: padded_length(*args) for args in cases} == cases
    assert padded_length(5) == 5 and padded_length(5, 4) == 8
    assert pad([[2, 5, 3], [2, 3]]).tolist() == [[2, 5, 3], [2, 3, 1]]  # to the longest


def test_a_side_without_text_is_refused_and_one_with_text_is_not(tmp_path):
    """load_pairs: a side whose lines are all empty (<bos> <eos> each) is one clear error; a
    side with a word on any line loads."""
    codecs = [WordCodec(Vocab([*SPECIALS, "a"]), lang) for lang in ("de", "en")]
    for lines, text in ((3, True), (3, False), (1, False)):
        (tmp_path / "train.de.tok").write_text("a\n" * lines)
        (tmp_path / "train.en.tok").write_text(("a\n" if text else "\n") * lines)
        if text:
            assert len(load_pairs(tmp_path, "train", *codecs, 10)) == lines
        else:
            with pytest.raises(NmtError, match="holds no text"):
                load_pairs(tmp_path, "train", *codecs, 10)
