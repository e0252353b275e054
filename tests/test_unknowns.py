"""nmt.core.unknowns: an output's <unk> is copied from the source by cross-attention, or marked;
never dropped. A known-answer case for the positions, then real tiny models of all three kinds."""

import pytest
import torch

from nmt.core.codecs import BOS_ID, EOS_ID, SPECIALS, UNK_ID, load_codecs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.unknowns import detokenize_outputs, most_attended, source_surfaces
from nmt.models import ModelConfig, build_model
from nmt.models.mapping import scratch_to_baseline

TINY = ModelConfig(num_encoder_layers=2, num_decoder_layers=2, d_model=32, nhead=4,
                   dim_feedforward=64, dropout=0.0, max_len=64, decoder_only_layers=2)


class Attending(torch.nn.Module):
    """A model whose cross-attention is given: `last` (T + 1, S) is the last decoder layer's
    mean over heads, split into two heads that disagree with it; the two layers before it
    point at <eos> throughout."""

    def __init__(self, last: torch.Tensor):
        super().__init__()
        self.last = last
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def attention_maps(self, src, tgt_in):
        assert tgt_in[0, 0].item() == BOS_ID and tgt_in.size(1) == self.last.size(0)
        other = torch.zeros_like(self.last)
        other[:, 3] = 0.9  # alone, the second head would always point at source position 3
        heads = torch.stack([2 * self.last - other, other])  # their mean: self.last
        first = torch.zeros_like(heads)
        first[..., -1] = 1.0  # every query on <eos>
        return {"decoder_cross": [first[None], first[None], heads[None]]}


def test_an_unk_copies_the_real_source_token_it_attended_to_most():
    """Output position t reads attention row t (the query that predicted it), over the real
    source tokens only: <bos> and <eos> weigh most in some rows here but are never copied."""
    src = [BOS_ID, 10, UNK_ID, 11, EOS_ID]  # "Ein Zzyzx Hut"
    written = ["Ein", "Zzyzx", "Hut"]
    hat = len(SPECIALS)  # the vocabulary's first word: an id just past the special tokens
    out = [UNK_ID, hat, UNK_ID]
    last = torch.tensor([[0.10, 0.20, 0.60, 0.05, 0.05],   # predicts out[0]: Zzyzx
                         [0.00, 0.90, 0.10, 0.00, 0.00],   # predicts out[1] (not an <unk>)
                         [0.70, 0.05, 0.05, 0.15, 0.05],   # out[2]: <bos> most, then Hut
                         [0.00, 0.00, 0.00, 0.00, 1.00]])  # predicts <eos>
    model = Attending(last)
    assert most_attended(model, [src], [out]) == [[2, 1, 3]]

    class Codec:
        def pieces(self, ids):
            return [{UNK_ID: SPECIALS[UNK_ID], hat: "hat"}[i] for i in ids]

        def join(self, pieces):
            return " ".join(pieces)

    copied = detokenize_outputs(model, [src], [written], [[*out, EOS_ID]], Codec(), "copy")
    assert copied.lines == ["Zzyzx hat Hut"] and copied.unknowns == 2
    marked = detokenize_outputs(model, [src], [written], [out], Codec(), "mark")
    assert marked.lines == ["<unk> hat <unk>"] and marked.unknowns == 2
    with pytest.raises(ValueError, match="unknown_words 'drop'"):
        detokenize_outputs(model, [src], [written], [out], Codec(), "drop")


def tiny(name: str, codecs) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(name, TINY, len(codecs[0]), len(codecs[1])).eval()


def with_unknowns(model, codecs, prepared) -> tuple[list, list, list]:
    """(sources, their written tokens, outputs): 60 test sentences (word vocabulary) decoded
    greedily, every third output token then made an <unk> (a random model seldom writes one
    by itself; which token the attention copies does not depend on how it was chosen)."""
    from nmt.core.data import load_pairs

    pairs = load_pairs(prepared["tokenized"], "test_2016_flickr", *codecs, TINY.max_len)[:60]
    sources = [p[0] for p in pairs]
    written = source_surfaces(prepared["tokenized"], "test_2016_flickr", codecs[0])
    outputs = translate_batches(model, sources, DecodeConfig("greedy", cap=TINY.max_len - 1),
                                progress=False)
    outputs = [[UNK_ID if t % 3 == 1 and i != EOS_ID else i for t, i in enumerate(out)]
               for out in outputs]
    return sources, written[:len(sources)], outputs


@pytest.mark.parametrize("name", ["scratch", "baseline", "decoder_only"])
def test_no_unk_is_dropped_on_real_sentences(prepared, name):
    """copy leaves no <unk> and puts in each place the written source word the model attended
    to most; mark leaves every <unk> visible; both count them."""
    codecs = load_codecs(prepared["word"])
    model = tiny(name, codecs)
    sources, written, outputs = with_unknowns(model, codecs, prepared)
    unks = sum(out.count(UNK_ID) for out in outputs)
    assert unks > 50
    marked = detokenize_outputs(model, sources, written, outputs, codecs[1], "mark")
    assert marked.unknowns == unks == sum(line.split().count("<unk>") for line in marked.lines)
    copied = detokenize_outputs(model, sources, written, outputs, codecs[1], "copy")
    assert copied.unknowns == unks and not any("<unk>" in line for line in copied.lines)
    for src, words, out, line in zip(sources, written, outputs, copied.lines, strict=True):
        kept = [i for i in out if i != EOS_ID]
        [picks] = most_attended(model, [src], [kept])  # alone: no padding
        for t in (t for t, i in enumerate(kept) if i == UNK_ID):
            assert 1 <= picks[t] <= len(src) - 2 and words[picks[t] - 1] in line
        # The padded batch copied what the sentence alone copies.
        assert detokenize_outputs(model, [src], [words], [out], codecs[1], "copy").lines == [line]


def test_the_twin_models_copy_the_same_words(prepared):
    """The baseline (nn.MultiheadAttention's weights) and scratch (its own math path), holding
    the same weights, attend alike, so they copy the same source token for every <unk>."""
    codecs = load_codecs(prepared["word"])
    scratch = tiny("scratch", codecs)
    baseline = build_model("baseline", TINY, len(codecs[0]), len(codecs[1])).eval()
    baseline.load_state_dict(scratch_to_baseline(scratch.state_dict()))
    sources, written, outputs = with_unknowns(scratch, codecs, prepared)
    by_scratch = detokenize_outputs(scratch, sources, written, outputs, codecs[1], "copy")
    by_baseline = detokenize_outputs(baseline, sources, written, outputs, codecs[1], "copy")
    assert by_scratch == by_baseline and by_scratch.unknowns > 50
    picks = most_attended(scratch, sources, [[i for i in o if i != EOS_ID] for o in outputs])
    assert len({p for row in picks for p in row}) > 5  # the copies come from many places


def test_a_bpe_source_keeps_the_text_of_a_character_it_lacks(prepared):
    """SentencePiece maps a character it never saw to <unk>; its surface keeps the character,
    one surface per id, so a copy gives the character back."""
    src_codec, tgt_codec = load_codecs(prepared["bpe"])
    line = "Ein Mann mit ☂ im Regen."
    ids, written = src_codec.encode(line), src_codec.surfaces(line)
    assert len(ids) == len(written) and UNK_ID in ids
    assert "☂" in written[ids.index(UNK_ID)]
    assert tgt_codec.join(written) == line
    assert tgt_codec.join(["▁A", "▁man", "<unk>"]) == "A man ⁇ "  # mark: SentencePiece's sign
