"""Random batches shaped like real ones, for the verify checklists' tests (tests only)."""

from __future__ import annotations

import torch


def synthetic_batches(n: int, batch_size: int, src_vocab_size: int, tgt_vocab_size: int,
                      pad_id: int = 1, bos_id: int = 2, eos_id: int = 3, max_tokens: int = 12,
                      seed: int = 0) -> list:
    """n random (src, tgt) batches shaped like real ones: <bos> words <eos>, right-padded."""
    g = torch.Generator().manual_seed(seed)

    def side(vocab_size):
        lengths = torch.randint(1, max_tokens + 1, (batch_size,), generator=g).tolist()
        out = torch.full((batch_size, max(lengths) + 2), pad_id, dtype=torch.long)
        for row, n_words in enumerate(lengths):
            words = torch.randint(4, vocab_size, (n_words,), generator=g)
            out[row, : n_words + 2] = torch.cat([torch.tensor([bos_id]), words,
                                                 torch.tensor([eos_id])])
        return out

    return [(side(src_vocab_size), side(tgt_vocab_size)) for _ in range(n)]
