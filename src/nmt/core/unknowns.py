"""Unknown words in an output: none is dropped without a sign (evaluate.unknown_words).

A word vocabulary maps each word it lacks to <unk>; 35-57 % of the test sets' German sentences
hold a word the demo vocabulary lacks, mostly compounds and rare nouns. A model that outputs
<unk> knows that a word belongs there, not which. Decoding used to drop it, and a sentence
lost a word without a sign ("People the roof of a house." on test_2016_flickr). Now:

- copy (default): unknown replacement as in OpenNMT (Luong et al., 2015). Each <unk> becomes
  the source token that the cross-attention weighted most when the model produced it (the
  last decoder layer, mean of its heads; for the decoder-only model its target queries over
  the source keys). The attention comes from one teacher-forced pass over the finished
  output, which is what incremental decoding computed (verify: cached = full decoding), so
  greedy and beam outputs are treated alike.
- mark: the output keeps a visible <unk> (SentencePiece writes its own mark, " ⁇ ").

A source token the vocabulary lacks is copied as it was written: the codecs give each id's
surface (`surfaces`), unknown tokens included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.core.codecs import BOS_ID, SPECIALS, UNK_ID
from nmt.core.data import pad, side_file
from nmt.core.text import read_lines

MODES = ("copy", "mark")
COPY_BATCH = 64  # outputs holding an <unk> whose attention one pass reads


@dataclass(frozen=True)
class Detokenized:
    """The outputs as text, and how many <unk> they held (each copied or marked)."""

    lines: list[str]
    unknowns: int


def detokenize_outputs(model, sources: list[list[int]], surfaces: list[list[str]],
                       outputs: list[list[int]], tgt_codec, mode: str) -> Detokenized:
    """Each output's text, its <unk> copied from its source or marked (`mode`, MODES).
    sources: <bos> ids <eos> as decoded; surfaces: each source id's written token, in order
    (at least as many as the ids between <bos> and <eos>); outputs: the decoded ids."""
    if mode not in MODES:
        raise ValueError(f"unknown_words {mode!r}: use one of {MODES}")
    kept = [[i for i in out if i >= len(SPECIALS) or i == UNK_ID] for out in outputs]
    pieces = [tgt_codec.pieces(ids) for ids in kept]  # no <bos>, <eos>, <pad> left
    if mode == "copy":
        todo = [n for n, ids in enumerate(kept) if UNK_ID in ids]
        for start in range(0, len(todo), COPY_BATCH):
            chunk = todo[start: start + COPY_BATCH]
            attended = most_attended(model, [sources[n] for n in chunk],
                                     [kept[n] for n in chunk])
            for n, positions in zip(chunk, attended, strict=True):
                for t, i in enumerate(kept[n]):
                    if i == UNK_ID:  # source position p is surface p - 1
                        pieces[n][t] = surfaces[n][positions[t] - 1]
    return Detokenized([tgt_codec.join(p) for p in pieces],
                       sum(ids.count(UNK_ID) for ids in kept))


def most_attended(model, sources: list[list[int]],
                  outputs: list[list[int]]) -> list[list[int]]:
    """For each output token, the source position (1 .. len(src) - 2: a real token, not <bos>
    or <eos>) that the last decoder layer's cross-attention, mean of heads, weighted most when
    the model produced it; one teacher-forced pass over the padded batch. Row t of the
    attention is the query that predicted out[t]; padding changes no real row (verify)."""
    with torch.inference_mode():
        device = next(model.parameters()).device
        src = pad(sources).to(device)
        tgt_in = pad([[BOS_ID, *out] for out in outputs]).to(device)
        weights = model.attention_maps(src, tgt_in)["decoder_cross"][-1].float().mean(1)  # (B,T,S)
        return [(w[: len(out), 1: len(s) - 1].argmax(dim=1) + 1).tolist()
                for w, s, out in zip(weights, sources, outputs, strict=True)]


def source_surfaces(tokenized_dir: Path, split: str, src_codec) -> list[list[str]]:
    """Each source sentence of a split as its written tokens (pieces for BPE), from the file
    its ids are read from (data.side_file)."""
    return [src_codec.surfaces(line)
            for line in read_lines(side_file(tokenized_dir, split, src_codec))]
