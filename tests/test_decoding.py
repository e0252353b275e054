"""Greedy and beam search against plain, one-sentence, uncached reference implementations."""

import math

import pytest
import torch
import torch.nn.functional as F

from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID
from nmt.core.data import pad
from nmt.core.decoding import (
    CHECK_EVERY,
    Beams,
    DecodeConfig,
    beam_search,
    greedy,
    output_limits,
    reachable,
    translate_batches,
)
from nmt.models import ModelConfig, build_model, registry

SRC_V, TGT_V = 40, 14  # a small target vocabulary: <eos> competes, ends come at many lengths
A, B = 1.0, 3


def seeded(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(num_encoder_layers=2, num_decoder_layers=2, d_model=32, nhead=4,
                      dim_feedforward=64, dropout=0.1, max_len=64)
    return build_model(name, cfg, SRC_V, TGT_V).eval()


def tiny_model(name: str, seed: int = 0):
    model = seeded(name, seed)
    with torch.no_grad():
        model.generator.bias[EOS_ID] += 1.5  # some hypotheses end early, others at the limit
    return model


def sources(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=g).tolist()
    return [[BOS_ID] + torch.randint(4, SRC_V, (k,), generator=g).tolist() + [EOS_ID]
            for k in lengths]


def next_logp(model, src: torch.Tensor, prefix: list[int], at_limit: bool) -> torch.Tensor:
    """Log-probabilities of the token after prefix, under the searches' shared rules."""
    logits = model.decode(torch.tensor([[BOS_ID] + prefix]), model.encode(src), src)[0, -1]
    logp = F.log_softmax(logits.float(), dim=-1)
    logp[[PAD_ID, BOS_ID]] = -math.inf
    if at_limit:
        logp[torch.arange(TGT_V) != EOS_ID] = -math.inf
    return logp


def reference_greedy(model, src_ids: list[int], limit: int) -> list[int]:
    src, out = torch.tensor([src_ids]), []
    for t in range(limit + 1):
        tok = int(next_logp(model, src, out, t >= limit).argmax())
        if tok == EOS_ID:
            break
        out.append(tok)
    return out


def reference_beam(model, src_ids: list[int], k: int, alpha: float, limit: int) -> list[int]:
    """Textbook beam search over Python lists: every hypothesis re-decoded from scratch, every
    step searched up to the limit (no rule for stopping early), the best finished one kept."""
    src = torch.tensor([src_ids])
    alive, finished = [(0.0, [])], []  # (summed log-prob, tokens)
    for t in range(limit + 1):
        cands = []
        for score, toks in alive:
            logp = next_logp(model, src, toks, t >= limit).tolist()
            cands += [(score + lp, toks + [w]) for w, lp in enumerate(logp) if lp > -math.inf]
        cands = sorted(cands, key=lambda c: -c[0])[: 2 * k]
        for rank, (score, toks) in enumerate(cands):
            if toks[-1] == EOS_ID and rank < k:
                finished.append((score / ((5 + len(toks)) / 6) ** alpha, toks[:-1]))
        finished = sorted(finished, key=lambda c: -c[0])[:k]
        alive = [c for c in cands if c[1][-1] != EOS_ID][:k]
    return max(finished, key=lambda c: c[0])[1]


def limits(srcs):
    return output_limits([len(s) - 2 for s in srcs], A, B)


def test_output_limits():
    assert output_limits([0, 5, 10], 1.2, 10) == [10, 16, 22]
    assert output_limits([100, 10], 1.2, 10, cap=63) == [63, 22]  # a cap limits only above it


def test_the_models_cap_limits_every_output():
    """DecodeConfig.cap (the model's max_len - 1) wins over a * source length + b."""
    model, srcs = tiny_model("scratch"), sources(8, seed=5)
    for method in ("greedy", "beam"):
        outs = translate_batches(model, srcs, DecodeConfig(method=method, beam_size=2,
                                                           max_len_a=3.0, max_len_b=20, cap=2),
                                 progress=False)
        assert max(map(len, outs)) == 2, method


def test_decoding_settings_come_from_the_evaluate_section_and_name_their_keys():
    ev = {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 7,
          "batch_size": 64, "testsets": ["x"]}
    dc = DecodeConfig.from_params(ev, "beam", 99)
    assert dc == DecodeConfig(method="beam", beam_size=4, length_penalty=1.0, max_len_a=1.5,
                              max_len_b=7, cap=99, batch_size=64,
                              batch_key="evaluate.batch_size", beam_key="evaluate.beam_size")
    assert DecodeConfig.from_params(ev, "greedy", None, beam_size=2,
                                    beam_key="--beam") == DecodeConfig(
        method="greedy", beam_size=2, length_penalty=1.0, max_len_a=1.5, max_len_b=7, cap=None,
        batch_size=64, batch_key="evaluate.batch_size", beam_key="--beam")


def test_out_of_memory_names_what_to_shrink():
    """The beam when there is one to shrink; nothing named where the sizes came from code."""
    ev = {"beam_size": 4, "length_penalty": 1.0, "max_len_a": 1.5, "max_len_b": 7,
          "batch_size": 64}
    assert DecodeConfig.from_params(ev, "beam", None).shrink() == (
        "a smaller evaluate.beam_size or evaluate.batch_size: beam search holds 4 x 64 "
        "hypotheses at once")
    assert DecodeConfig.from_params(ev, "beam", None, beam_size=2).shrink().startswith(
        "a smaller evaluate.beam_size or")  # a beam of two is a beam
    for method, beam in (("greedy", 4), ("beam", 1)):
        assert DecodeConfig.from_params(ev, method, None, beam_size=beam).shrink() == \
            "a smaller evaluate.batch_size"
    assert DecodeConfig(method="beam", beam_size=4).shrink() is None  # set in code


def test_decoding_out_of_memory_carries_what_to_shrink():
    """The error a decoding step raises for memory reaches the CLI with its fix attached."""
    model, ev = tiny_model("scratch"), {"beam_size": 3, "length_penalty": 1.0,
                                        "max_len_a": 1.5, "max_len_b": 7, "batch_size": 8}

    def no_memory(*args):
        raise MemoryError

    model.decode_step = no_memory
    dc = DecodeConfig.from_params(ev, "beam", None)
    with pytest.raises(MemoryError) as caught:
        translate_batches(model, sources(2), dc, progress=False)
    assert caught.value.memory_fix == dc.shrink() == (
        "a smaller evaluate.beam_size or evaluate.batch_size: beam search holds 3 x 8 "
        "hypotheses at once")


@pytest.mark.parametrize("name", ["baseline", "scratch"])
def test_batched_greedy_equals_one_sentence_at_a_time_in_input_order(name):
    model, srcs = tiny_model(name), sources(9)
    dc = DecodeConfig(batch_size=4, method="greedy", max_len_a=A, max_len_b=B)
    batched = translate_batches(model, srcs, dc, progress=False)
    lims = limits(srcs)
    single = [greedy(model, torch.tensor([s]), n)[0] for s, n in zip(srcs, lims, strict=True)]
    reference = [reference_greedy(model, s, n) for s, n in zip(srcs, lims, strict=True)]
    assert batched == single == reference
    assert all(len(h) <= n for h, n in zip(batched, lims, strict=True))
    assert len({len(h) for h in batched}) > 2  # ends at several lengths were exercised


@pytest.mark.parametrize("name", ["baseline", "scratch"])
def test_beam_of_one_equals_greedy(name):
    model, srcs = tiny_model(name), sources(12, seed=2)
    kw = dict(batch_size=5, max_len_a=A, max_len_b=B)
    assert (translate_batches(model, srcs, DecodeConfig(method="beam", beam_size=1, **kw))
            == translate_batches(model, srcs, DecodeConfig(method="greedy", **kw)))


@pytest.mark.parametrize("name", ["baseline", "scratch"])
@pytest.mark.parametrize("k,alpha,n", [(3, 0.6, 6), (4, 0.0, 6), (3, 2.0, 16), (6, 0.6, 12)])
def test_batched_beam_equals_reference(name, k, alpha, n):
    """A strong length penalty (alpha 2) and wide beams over more sentences: finished
    hypotheses of different lengths compete, and some are found after K others finished."""
    model, srcs = tiny_model(name), sources(n, seed=3)
    dc = DecodeConfig(batch_size=4, method="beam", beam_size=k, length_penalty=alpha,
                      max_len_a=A, max_len_b=B)
    batched = translate_batches(model, srcs, dc, progress=False)
    reference = [reference_beam(model, s, k, alpha, n)
                 for s, n in zip(srcs, limits(srcs), strict=True)]
    assert batched == reference
    assert len({len(h) for h in batched}) > 1


def test_reachable_is_the_best_score_any_ending_can_give():
    """An alive hypothesis's summed score can only fall, so the best it can still finish with
    is that score over the largest penalty of the lengths it may end at (its limit's tokens and
    the <eos> at most): no looser (searching on for nothing), no tighter (stopping before a
    better hypothesis ends). The best alive row bounds the sentence."""
    scores = torch.tensor([[-3.0, -5.0], [-0.5, -math.inf], [-math.inf, -math.inf]])
    limit, steps = torch.tensor([7, 20, 4]), 21
    beams = Beams(torch.arange(3), limit, scores, torch.zeros(3, 2, steps, dtype=torch.long),
                  torch.full((3, 2), -math.inf), torch.zeros(3, 2, steps, dtype=torch.long),
                  torch.zeros(3, dtype=torch.bool))
    for alpha in (0.0, 0.6, 2.0):
        best = [max(row[0] / ((5 + n) / 6) ** alpha for n in range(1, int(cap) + 2))
                for row, cap in zip(scores.tolist(), limit, strict=True)]
        assert reachable(beams, alpha).tolist() == pytest.approx(best)


def test_a_sentence_leaves_the_search_once_nothing_alive_can_win():
    """A model that ends every sentence at once (<eos> all but certain): after the first step
    the empty output's score (about 0) beats what any alive hypothesis (about -30) can reach,
    so the sentence leaves at the first check, CHECK_EVERY steps in, not at its limit of 40."""
    model, src = tiny_model("scratch"), torch.tensor(sources(1, seed=4))
    with torch.no_grad():
        model.generator.bias[EOS_ID] += 30
    steps, decode_step = [], model.decode_step
    model.decode_step = lambda *args: steps.append(1) or decode_step(*args)
    assert beam_search(model, src, beam_size=3, length_penalty=0.6, max_len=40) == [[]]
    assert len(steps) == CHECK_EVERY


def test_beam_search_accepts_one_shared_limit():
    model, src = tiny_model("scratch"), torch.tensor(sources(1, seed=4))
    out = beam_search(model, src, beam_size=3, length_penalty=0.6, max_len=2)
    assert len(out) == 1 and len(out[0]) <= 2 and all(3 < i < TGT_V for i in out[0])


def test_pairs_are_accepted_and_an_unknown_method_is_refused():
    model, srcs = tiny_model("baseline"), sources(3)
    pairs = [(s, [BOS_ID, EOS_ID]) for s in srcs]
    dc = DecodeConfig(batch_size=2)
    assert translate_batches(model, pairs, dc) == translate_batches(model, srcs, dc)
    with pytest.raises(ValueError, match="unknown search method"):
        translate_batches(model, srcs, DecodeConfig(method="sample"))


# A CPU has one device, so a tensor made without one (torch.arange(B) where
# torch.arange(B, device=src.device) was meant) lands on the model's device here and goes
# unseen until a GPU run fails. Two ways to show it on a CPU: torch's default device set to
# `meta` (a device of shapes without values), so that a tensor made without a device is not
# on the CPU model's; or the model on `meta`, so that a batch not moved to its device is not.
@pytest.mark.parametrize("name", registry.names())
def test_the_searches_make_every_tensor_on_the_models_device(name):
    """Greedy and beam search of a CPU model give the same outputs with `meta` as the
    default device: every tensor they (and the model's decoding steps) make is made on the
    model's device."""
    model, srcs = seeded(name), sources(7, seed=5)
    src, lims = pad(srcs), torch.tensor(limits(srcs))
    outputs = [greedy(model, src, lims), beam_search(model, src, 3, 0.6, lims)]
    with torch.device("meta"):
        assert [greedy(model, src, lims), beam_search(model, src, 3, 0.6, lims)] == outputs


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_translate_batches_moves_sources_and_limits_to_the_models_device(method):
    """A model on `meta` decodes until its first value is read (which a meta tensor cannot
    give): the sources and their limits reached its device. Left on the CPU, the first
    operation that mixes them with the model's tensors would fail first."""
    model = seeded("scratch").to("meta")
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        translate_batches(model, sources(3), DecodeConfig(method=method, beam_size=2),
                          progress=False)
