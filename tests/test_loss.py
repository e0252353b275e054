"""core/loss.py, the training objective, against computations by hand: pads ignored, one loss
a sentence or their sum, the precision asked for with a float32 loss, and the corpus loss
summed in float64 over batches, ranks combined before the division, dropout off and the
model's mode given back."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nmt.core.codecs import BOS_ID, EOS_ID
from nmt.core.data import pad
from nmt.core.loss import corpus_loss, token_loss
from nmt.models import ModelConfig, build_model

TINY = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                   dim_feedforward=32, dropout=0.0, max_len=32)
SRC_VOCAB, TGT_VOCAB = 30, 40
CPU = torch.device("cpu")


def sentences(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    """<bos> w1 .. wn <eos> of random words, one list a length."""
    g = torch.Generator().manual_seed(seed)
    return [[BOS_ID, *torch.randint(4, vocab, (n,), generator=g).tolist(), EOS_ID]
            for n in lengths]


@pytest.fixture(autouse=True)
def no_grad():
    """The values alone are compared: no autograd graph."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("scratch", TINY, SRC_VOCAB, TGT_VOCAB).eval()


@pytest.fixture(scope="module")
def pairs() -> tuple[list[list[int]], list[list[int]]]:
    """Four pairs of different lengths: a batch of them is padded on both sides."""
    return sentences([3, 7, 1, 5], SRC_VOCAB, 1), sentences([6, 2, 4, 9], TGT_VOCAB, 2)


def test_pads_are_ignored_and_each_sentence_has_its_own_loss(model, pairs):
    srcs, tgts = pairs
    alone = [token_loss(model, pad([s]), pad([t]), CPU) for s, t in zip(srcs, tgts, strict=True)]
    per, tokens = token_loss(model, pad(srcs), pad(tgts), CPU, reduction="none")
    assert per.shape == (4,)
    assert per.tolist() == pytest.approx([float(loss) for loss, _ in alone], rel=1e-5)
    assert int(tokens) == sum(len(t) - 1 for t in tgts) == sum(int(n) for _, n in alone)
    summed, n = token_loss(model, pad(srcs), pad(tgts), CPU)
    assert summed.shape == () and int(n) == int(tokens)
    assert float(summed) == pytest.approx(float(per.sum()), rel=1e-6)


def test_bf16_runs_the_forward_in_bf16_and_gives_a_float32_loss(model, pairs):
    src, tgt = (pad(x) for x in pairs)
    fp32, _ = token_loss(model, src, tgt, CPU, precision="fp32")
    bf16, _ = token_loss(model, src, tgt, CPU, precision="bf16")
    assert fp32.dtype == bf16.dtype == torch.float32
    assert bf16 != fp32 and float(bf16) == pytest.approx(float(fp32), rel=0.02)


def batches_of(pairs, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    srcs, tgts = pairs
    return [(pad(srcs[i:i + size]), pad(tgts[i:i + size])) for i in range(0, len(srcs), size)]


def by_hand(model, batches, precision: str = "fp32") -> tuple[float, int]:
    """(summed loss in float64, tokens) of token_loss over the batches, one at a time."""
    losses = [token_loss(model, src, tgt, CPU, precision=precision) for src, tgt in batches]
    return sum(float(loss) for loss, _ in losses), sum(int(n) for _, n in losses)


def test_the_corpus_loss_is_the_float64_sum_over_batches_over_the_tokens(model):
    many = (sentences([2, 9, 4, 6, 1, 8] * 5, SRC_VOCAB, 3),
            sentences([5, 3, 7, 2, 9, 4] * 5, TGT_VOCAB, 4))
    batches = batches_of(many, 4)  # 8 batches, the last of 2
    total, tokens = by_hand(model, batches)
    assert corpus_loss(model, batches, CPU) == total / tokens  # float32 sums would differ
    # bf16: each batch's forward in bf16, as token_loss runs it
    total16, _ = by_hand(model, batches, "bf16")
    assert corpus_loss(model, batches, CPU, precision="bf16") == total16 / tokens != \
        total / tokens


def test_the_ranks_sums_combine_before_the_division(model, pairs):
    """`reduce` (training's World.sum) gets [summed loss, tokens] and returns every rank's."""
    batches = batches_of(pairs, 2)
    total, tokens = by_hand(model, batches)
    seen = []

    def other_rank_adds(sums: torch.Tensor) -> torch.Tensor:
        seen.append(sums.tolist())
        return sums + torch.tensor([100.0, 50.0], dtype=torch.float64)

    assert corpus_loss(model, batches, CPU, reduce=other_rank_adds) == pytest.approx(
        (total + 100.0) / (tokens + 50), rel=1e-12)
    assert seen == [[pytest.approx(total, rel=1e-12), tokens]]


def test_dropout_is_off_and_the_mode_comes_back(pairs):
    torch.manual_seed(0)
    dropping = build_model("scratch", dataclasses.replace(TINY, dropout=0.5), SRC_VOCAB,
                           TGT_VOCAB).train()
    batches = batches_of(pairs, 2)
    first = corpus_loss(dropping, batches, CPU)
    assert dropping.training  # given back as it came
    assert corpus_loss(dropping, batches, CPU) == first  # no dropout mask drawn
    assert first == by_hand(dropping.eval(), batches)[0] / by_hand(dropping, batches)[1]


def test_the_losses_are_summed_on_the_models_device(model, pairs):
    """With `meta` as torch's default device, a sum made without a device (on a GPU: on the
    CPU, beside a model on the GPU) is not on the model's: the corpus loss comes out the same."""
    batches = [(pad(pairs[0][:2]), pad(pairs[1][:2])), (pad(pairs[0][2:]), pad(pairs[1][2:]))]
    expected = corpus_loss(model, batches, CPU)
    with torch.device("meta"):
        assert corpus_loss(model, batches, CPU) == expected
