"""Token-id datasets and batches: <bos>/<eos> added, <pad> padded, seeded shuffling.

Two ways to batch, chosen by train.batch_by:
- sentences: a fixed number of sentences a batch (the published setting); with train.bucket,
  sentences of similar length share a batch (little padding), else they are drawn at random;
- tokens: length-bucketed batches of up to max_tokens padded tokens (far less padding).

A split is held compactly (`Pairs`: one int32 array of ids a side, and offsets), read and
encoded as its files stream past, so a million pairs load in seconds and in a few hundred MB;
batching sorts their length arrays with numpy, drawing from random.Random exactly as the
list-based version did, so a seed still gives the same batches in the same order.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, islice
from pathlib import Path

import numpy as np
import torch

from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID
from nmt.core.errors import NmtError
from nmt.core.text import count_lines, iter_lines, no_text, token_file

log = logging.getLogger("nmt.data")

Pair = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Sentences:
    """One side of a split as token ids, end to end in one int32 array: sentence i is
    ids[starts[i]:starts[i + 1]]. A million sentences take about 60 MB, a small share of
    what lists of Python ints took (an object and a pointer an id, a list a sentence)."""

    ids: np.ndarray  # int32, every sentence's ids, <bos> ... <eos> included
    starts: np.ndarray  # int64, len(self) + 1 offsets into ids

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]]) -> Sentences:
        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        ids = np.fromiter(chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
        return cls(ids, np.concatenate([[0], np.cumsum(lengths)]))

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[self.starts[i] : self.starts[i + 1]].tolist()

    def padded(self, idx: list[int], multiple: int = 1, limit: int = 0) -> torch.Tensor:
        """(B, T) LongTensor of sentences idx, as `pad` makes it, but in a few numpy
        operations rather than a tensor a sentence (an epoch of a million pairs: seconds)."""
        lengths, starts = self.lengths[idx], self.starts[:-1][idx]
        length = padded_length(int(lengths.max()), multiple, limit)
        positions = np.arange(length)
        real = positions < lengths[:, None]  # (B, T): holds an id, not <pad>
        out = np.full((len(idx), length), PAD_ID, dtype=np.int64)
        out[real] = self.ids[(starts[:, None] + positions)[real]]
        return torch.from_numpy(out)

    def span(self, first: int, stop: int) -> Sentences:
        """Sentences first..stop-1, sharing this one's memory."""
        return Sentences(self.ids[self.starts[first] : self.starts[stop]],
                         self.starts[first : stop + 1] - self.starts[first])


class Pairs:
    """(source ids, target ids) pairs of a split, stored compactly (Sentences a side) but
    used as the list of tuples it replaces: len(pairs), pairs[i] -> (list, list), pairs[:n]
    (another Pairs), iteration. The batching below reads the length arrays directly."""

    def __init__(self, src: Sentences, tgt: Sentences):
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source but {len(tgt)} target sentences")
        self.src, self.tgt = src, tgt

    @classmethod
    def of(cls, pairs: Pairs | Sequence[Pair]) -> Pairs:
        """pairs as Pairs: itself, or a list of (source ids, target ids) tuples converted."""
        if isinstance(pairs, Pairs):
            return pairs
        return cls(Sentences.from_lists([p[0] for p in pairs]),
                   Sentences.from_lists([p[1] for p in pairs]))

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, key: int | slice) -> Pair | Pairs:
        if isinstance(key, slice):
            first, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("Pairs slices take every pair (step 1)")
            stop = max(first, stop)
            return Pairs(self.src.span(first, stop), self.tgt.span(first, stop))
        if not -len(self) <= key < len(self):
            raise IndexError(f"pair {key} of {len(self)}")
        key %= len(self)
        return self.src[key], self.tgt[key]

    def __iter__(self) -> Iterator[Pair]:
        return (self[i] for i in range(len(self)))


# Lines encoded at a time while a split is read: bounded memory, few array appends.
CHUNK_LINES = 50_000


def read_side(path: Path, codec, max_len: int) -> tuple[Sentences, np.ndarray]:
    """One side's sentences as <bos> ids <eos>, encoded while the file streams past, and which
    of them were cut (bool, a sentence each): over-long sentences keep their first max_len - 2
    tokens and still end in <eos>."""
    id_chunks, length_chunks, cut_chunks = [], [], []
    lines = iter_lines(path)
    while chunk := list(islice(lines, CHUNK_LINES)):
        whole = codec.encode_lines(chunk)
        cut_chunks.append(np.fromiter((len(ids) > max_len - 2 for ids in whole), dtype=bool,
                                      count=len(whole)))
        encoded = [[BOS_ID, *ids[: max_len - 2], EOS_ID] for ids in whole]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        id_chunks.append(np.fromiter(chain.from_iterable(encoded), dtype=np.int32,
                                     count=int(lengths.sum())))
        length_chunks.append(lengths)
    lengths = np.concatenate(length_chunks) if length_chunks else np.zeros(0, np.int64)
    cut = np.concatenate(cut_chunks) if cut_chunks else np.zeros(0, bool)
    return Sentences(np.concatenate(id_chunks) if id_chunks else np.zeros(0, np.int32),
                     np.concatenate([[0], np.cumsum(lengths)])), cut


def load_pairs(tokenized_dir: Path, split: str, src_codec, tgt_codec, max_len: int) -> Pairs:
    """(source ids, target ids) of one split, each wrapped in <bos> ... <eos>, cut to max_len
    (how many pairs were cut is said once, in a warning). Word vocabularies read the .tok
    files, BPE the raw .txt files. A side without a token is refused: train would learn to say
    nothing, and exit 0."""
    src_path, tgt_path = side_file(tokenized_dir, split, src_codec), side_file(
        tokenized_dir, split, tgt_codec)
    src_lines, tgt_lines = count_lines(src_path), count_lines(tgt_path)  # before the long work
    if src_lines != tgt_lines:
        raise NmtError(f"{src_path} has {src_lines} lines but {tgt_path} has {tgt_lines}: the "
                       f"{split} split is not aligned (fix: re-run nmt tokenize)")
    (src, src_cut), (tgt, tgt_cut) = (read_side(path, codec, max_len) for path, codec in
                                      ((src_path, src_codec), (tgt_path, tgt_codec)))
    for path, side in ((src_path, src), (tgt_path, tgt)):
        if len(side.ids) == 2 * len(side):  # <bos> <eos> a sentence: nothing to learn or score
            raise no_text(path, split, len(side))
    if cut := int((src_cut | tgt_cut).sum()):
        log.warning("%s: %d of %d pairs are longer than model.max_len %d allows (%d + <bos> and "
                    "<eos>) on the source side (%d) or the target side (%d); each keeps its first "
                    "%d tokens (fix, to keep them whole: raise model.max_len)", split, cut,
                    len(src_cut), max_len, max_len - 2, int(src_cut.sum()), int(tgt_cut.sum()),
                    max_len - 2)
    return Pairs(src, tgt)


def side_file(tokenized_dir: Path, split: str, codec) -> Path:
    """The file one side of a split is read from: word vocabularies read the .tok files, BPE
    the raw .txt files."""
    if codec.kind == "word":
        return token_file(tokenized_dir, split, codec.lang)
    return Path(tokenized_dir) / f"{split}.{codec.lang}.txt"


def padded_length(longest: int, multiple: int = 1, limit: int = 0) -> int:
    """The longest length rounded up to a multiple of `multiple`, but not past `limit` (the
    positional table's length; 0: no limit) where rounding would cross it. Fewer distinct
    shapes and tensor-core-sized lengths; train's torch.compile, for dynamic shapes, needs no
    padding to compile once (tests/test_gpu_path.py)."""
    rounded = -(-longest // multiple) * multiple
    return rounded if not limit or rounded <= limit else max(longest, limit)


def pad(seqs: list[list[int]], multiple: int = 1, limit: int = 0) -> torch.Tensor:
    """(B, T) LongTensor, right-padded with <pad> to padded_length (the longest length, by
    default)."""
    length = padded_length(max(map(len, seqs)), multiple, limit)
    out = torch.full((len(seqs), length), PAD_ID, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def collate(pairs: list[Pair], multiple: int = 1, limit: int = 0) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """(src, tgt) batches of pairs, each padded as `pad` does."""
    return (pad([p[0] for p in pairs], multiple, limit),
            pad([p[1] for p in pairs], multiple, limit))


def sentence_batches(n: int, batch_size: int, rng: random.Random | None) -> list[list[int]]:
    """Index lists of batch_size sentences, in a shuffled order when rng is given."""
    order = list(range(n))
    if rng is not None:
        rng.shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


# Sentences sorted by length together: a pool of this many batches. Large enough that a batch
# pads little, small enough that which sentences meet in a batch still changes every epoch.
BUCKET_POOL = 100


def bucketed_sentence_batches(pairs: Pairs | list[Pair], batch_size: int,
                              rng: random.Random | None) -> list[list[int]]:
    """Index lists of batch_size sentences of similar length: the shuffled sentences are cut
    into pools of BUCKET_POOL batches, each pool sorted by (source, target) length and cut
    into batches, then the batches of all pools shuffled. Without rng: sorted, unshuffled.
    The shuffles are random.Random's, as they always were, so a seed gives the same batches."""
    pairs = Pairs.of(pairs)
    src_lengths, tgt_lengths = pairs.src.lengths, pairs.tgt.lengths
    order = list(range(len(pairs)))
    if rng is not None:
        rng.shuffle(order)
    order = np.array(order, dtype=np.int64)
    pool = BUCKET_POOL * batch_size if rng is not None else len(order)
    batches = []
    for first in range(0, len(order), pool):
        members = order[first : first + pool]
        # lexsort is stable, as sorted() was: equal lengths keep their shuffled order.
        members = members[np.lexsort((tgt_lengths[members], src_lengths[members]))].tolist()
        batches += [members[i : i + batch_size] for i in range(0, len(members), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


def padding_fraction(pairs: Pairs | list[Pair], batches: list[list[int]]) -> float:
    """Padded positions / all positions of the source and target tensors of these batches."""
    pairs = Pairs.of(pairs)
    real = padded = 0
    for lengths in (pairs.src.lengths, pairs.tgt.lengths):
        for idx in batches:
            batch = lengths[idx]
            real += int(batch.sum())
            padded += len(idx) * int(batch.max())
    return 1 - real / padded


def token_batches(pairs: Pairs | list[Pair], max_tokens: int,
                  rng: random.Random | None) -> list[list[int]]:
    """Index lists grouped by length so each batch holds at most max_tokens padded tokens."""
    pairs = Pairs.of(pairs)
    longest = np.maximum(pairs.src.lengths, pairs.tgt.lengths)
    # One draw a sentence, in index order, as ever: it shuffles sentences of equal length,
    # and the same seed gives the same batches (a resumed run finds its order again).
    draws = [rng.random() for _ in range(len(pairs))] if rng else [0.0] * len(pairs)
    # By length, then draw; lexsort is stable, so index breaks what ties remain.
    order = np.lexsort((np.array(draws), longest))
    batches, batch = [], []
    for i, length in zip(order.tolist(), longest[order].tolist(), strict=True):
        # In ascending order, this sentence is the longest of the batch it joins.
        if batch and length * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


class Batches:
    """An epoch's worth of (src, tgt) LongTensor batches; reshuffled with seed + epoch."""

    def __init__(self, pairs: Pairs | list[Pair], batch_by: str, batch_size: int,
                 max_tokens: int, shuffle: bool, seed: int = 0, bucket: bool = False,
                 pad_multiple: int = 1, max_len: int = 0):
        self.pairs = Pairs.of(pairs)
        self.batch_by, self.bucket = batch_by, bucket  # bucket: sentence batches only
        # Batch lengths rounded up to a multiple of pad_multiple, not past max_len (pad).
        self.pad_multiple, self.max_len = pad_multiple, max_len
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._order = None  # (epoch, batches) of the epoch last built

    @classmethod
    def for_training(cls, pairs: Pairs | list[Pair], train, seed: int, pad_multiple: int = 1,
                     max_len: int = 0) -> Batches:
        """The train split's batches as a recipe's train settings (a mapping with batch_by,
        batch_size, max_tokens, bucket) make them, reshuffled every epoch from `seed`: what
        nmt train, the bench and the GPU tools all take."""
        return cls(pairs, train["batch_by"], train["batch_size"], train["max_tokens"],
                   shuffle=True, seed=seed, bucket=train["bucket"], pad_multiple=pad_multiple,
                   max_len=max_len)

    def indices(self, epoch: int | None = None) -> list[list[int]]:
        """An epoch's batches as index lists (default: the current epoch), built once an epoch.

        The order depends only on (seed, epoch), so a resumed run finds it again from the epoch.
        """
        epoch = self.epoch if epoch is None else epoch
        if self._order is None or self._order[0] != epoch:
            rng = random.Random(self.seed + epoch) if self.shuffle else None
            if self.batch_by == "tokens":
                order = token_batches(self.pairs, self.max_tokens, rng)
            elif self.bucket:
                order = bucketed_sentence_batches(self.pairs, self.batch_size, rng)
            else:
                order = sentence_batches(len(self.pairs), self.batch_size, rng)
            self._order = (epoch, order)
        return self._order[1]

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The (src, tgt) tensors of one index list (what collate makes of those pairs)."""
        return (self.pairs.src.padded(idx, self.pad_multiple, self.max_len),
                self.pairs.tgt.padded(idx, self.pad_multiple, self.max_len))

    def __len__(self) -> int:
        return len(self.indices())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.indices():
            yield self.batch(idx)
        self.epoch += 1
