"""Token-id datasets and batches: <bos>/<eos> added, <pad> padded, seeded shuffling.

Two ways to batch, chosen by train.batch_by:
- sentences: a fixed number of sentences a batch (the published setting); with train.bucket,
  sentences of similar length share a batch (little padding), else they are drawn at random;
- tokens: length-bucketed batches of up to max_tokens padded tokens (far less padding).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import torch

from nmt.errors import NmtError
from nmt.text import read_lines, read_tokens
from nmt.vocab import BOS_ID, EOS_ID, PAD_ID

Pair = tuple[list[int], list[int]]


def load_pairs(tokenized_dir: Path, split: str, src_codec, tgt_codec, max_len: int) -> list[Pair]:
    """(source ids, target ids) of one split, each wrapped in <bos> ... <eos>, cut to max_len."""
    tokenized_dir = Path(tokenized_dir)

    def path(codec) -> Path:
        return tokenized_dir / f"{split}.{codec.lang}.{'tok' if codec.kind == 'word' else 'txt'}"

    def side(codec):
        sents = (read_tokens if codec.kind == "word" else read_lines)(path(codec))
        # Over-long sentences keep their first max_len - 2 tokens and still end in <eos>.
        return [[BOS_ID] + codec.encode(s)[: max_len - 2] + [EOS_ID] for s in sents]

    src, tgt = side(src_codec), side(tgt_codec)
    if len(src) != len(tgt):
        raise NmtError(f"{path(src_codec)} has {len(src)} lines but {path(tgt_codec)} has "
                       f"{len(tgt)}: the {split} split is not aligned (fix: re-run nmt tokenize)")
    return list(zip(src, tgt, strict=True))


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


def bucketed_sentence_batches(pairs: list[Pair], batch_size: int,
                              rng: random.Random | None) -> list[list[int]]:
    """Index lists of batch_size sentences of similar length: the shuffled sentences are cut
    into pools of BUCKET_POOL batches, each pool sorted by (source, target) length and cut
    into batches, then the batches of all pools shuffled. Without rng: sorted, unshuffled."""
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


def padding_fraction(pairs: list[Pair], batches: list[list[int]]) -> float:
    """Padded positions / all positions of the source and target tensors of these batches."""
    real = padded = 0
    for idx in batches:
        for side in (0, 1):
            lengths = [len(pairs[i][side]) for i in idx]
            real += sum(lengths)
            padded += len(lengths) * max(lengths)
    return 1 - real / padded


def token_batches(pairs: list[Pair], max_tokens: int, rng: random.Random | None) -> list[list[int]]:
    """Index lists grouped by length so each batch holds at most max_tokens padded tokens."""
    keys = [(max(len(s), len(t)), rng.random() if rng else 0.0, i) for i, (s, t) in
            enumerate(pairs)]
    keys.sort()  # by length; the random key shuffles sentences of equal length
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


class Batches:
    """An epoch's worth of (src, tgt) LongTensor batches; reshuffled with seed + epoch."""

    def __init__(self, pairs: list[Pair], batch_by: str, batch_size: int, max_tokens: int,
                 shuffle: bool, seed: int = 0, bucket: bool = False, pad_multiple: int = 1,
                 max_len: int = 0):
        self.pairs, self.batch_by, self.bucket = pairs, batch_by, bucket  # bucket: sentences only
        # Batch lengths rounded up to a multiple of pad_multiple, not past max_len (pad).
        self.pad_multiple, self.max_len = pad_multiple, max_len
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._order = None  # (epoch, batches) of the epoch last built

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
        """The (src, tgt) tensors of one index list."""
        return collate([self.pairs[i] for i in idx], self.pad_multiple, self.max_len)

    def __len__(self) -> int:
        return len(self.indices())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for idx in self.indices():
            yield self.batch(idx)
        self.epoch += 1
