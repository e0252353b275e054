"""The models: the registry, configuration, interface, weight mapping, incremental decoding,
masks.

The interface tests run on every model of the registry; the mapping and equivalence tests on
the two twins, baseline and scratch (the decoder-only model has its own tests in
test_decoder_only.py)."""

import cmath
import collections
import dataclasses
import inspect
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.models import MODELS, ModelConfig, build_model, interface, registry
from nmt.models.mapping import baseline_to_scratch, scratch_to_baseline
from nmt.models.masks import bias
from nmt.models.scratch.attention import MultiHeadAttention, scaled_dot_product_attention
from nmt.models.scratch.dropout import Dropout, keep_mask
from nmt.models.scratch.rotary import Rotary

SMALL = ModelConfig(num_encoder_layers=2, num_decoder_layers=3, d_model=32, nhead=4,
                    dim_feedforward=64, dropout=0.1, max_len=64)
pytestmark = pytest.mark.usefixtures("one_thread")
SRC_V, TGT_V, PAD = 50, 40, 1
MODEL_NAMES = registry.names()
ENCODER_DECODERS = [n for n in MODELS if MODELS[n].encoder_decoder]
TAKES_REFERENCE = [n for n in MODELS if MODELS[n].takes_reference_weights]
TWINS = ("baseline", "scratch")  # the pair models.mapping relates: one function, two codes




def padded_batch():
    """Source and target with <bos>=2 ... <eos>=3 and right padding (<pad>=1) in some rows."""
    src = torch.tensor([[2, 11, 12, 13, 14, 15, 3],
                        [2, 16, 17, 3, 1, 1, 1],
                        [2, 18, 3, 1, 1, 1, 1]])
    tgt = torch.tensor([[2, 21, 22, 23, 3, 1],
                        [2, 24, 25, 26, 27, 3],
                        [2, 28, 3, 1, 1, 1]])
    return src, tgt


def pair(cfg=SMALL, dtype=torch.float64, src_v=SRC_V, tgt_v=TGT_V):
    """Seeded baseline and a scratch model holding its weights, eval mode."""
    torch.manual_seed(0)
    baseline = build_model("baseline", cfg, src_v, tgt_v, PAD)
    scratch = build_model("scratch", cfg, src_v, tgt_v, PAD)
    scratch.load_state_dict(baseline_to_scratch(baseline.state_dict()))
    return baseline.to(dtype).eval(), scratch.to(dtype).eval()


def model_named(name, dtype=torch.float64):
    """pair()'s baseline or scratch, or another seeded model of the registry; eval mode."""
    if name in TWINS:
        return pair(dtype=dtype)[TWINS.index(name)]
    torch.manual_seed(0)
    return build_model(name, SMALL, SRC_V, TGT_V, PAD).to(dtype).eval()


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_config_validation():
    assert ModelConfig.from_dict({}) == ModelConfig()
    assert ModelConfig.from_dict(dataclasses.asdict(SMALL)) == SMALL
    with pytest.raises(ValueError, match="not divisible by nhead"):
        ModelConfig(d_model=500, nhead=8)
    with pytest.raises(ValueError, match=r"unknown model settings \['heads'\]"):
        ModelConfig.from_dict({"heads": 8})


def test_build_model_names():
    assert MODEL_NAMES[:3] == ("baseline", "scratch", "decoder_only")
    for name in MODEL_NAMES:
        assert isinstance(build_model(name, SMALL, SRC_V, TGT_V), nn.Module)
    with pytest.raises(ValueError, match="unknown model 'lstm'; choose one of baseline, scratch"):
        build_model("lstm", SMALL, SRC_V, TGT_V)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_registry_says_what_each_model_is(name):
    """Each entry against the model it builds: a name that can be part of a path, a class that
    takes bos_id exactly where the entry says it reads it, an encoder-decoder exactly where it
    has decode(tgt, memory, src), export for encoder-decoders only, and the closed-form
    parameter count (untied and tied) equal to the model's."""
    entry = registry.entry(name)
    assert entry.name == name and re.fullmatch(r"[a-z][a-z0-9_]*", name)
    signature = inspect.signature(entry.model_class())
    assert ("bos_id" in signature.parameters) is entry.reads_bos
    model = build_model(name, SMALL, SRC_V, TGT_V, PAD)
    assert hasattr(model, "decode") is entry.encoder_decoder
    assert entry.encoder_decoder or not entry.exports
    assert n_params(model) == entry.parameters(SMALL, SRC_V, TGT_V)
    tied = dataclasses.replace(SMALL, tie_embeddings=True)
    assert n_params(build_model(name, tied, SRC_V, SRC_V)) == entry.parameters(tied, SRC_V,
                                                                                SRC_V)
    assert set(entry.positions) <= {"sinusoidal", "rotary"}
    for positions in ("sinusoidal", "rotary"):
        if positions not in entry.positions:
            with pytest.raises(ValueError, match="positions"):
                build_model(name, dataclasses.replace(SMALL, positions=positions), SRC_V, TGT_V)


def test_models_come_in_the_registrys_order_the_reference_first():
    """What bench times: pipeline.models in the registry's order, whatever order it lists."""
    assert registry.in_order(reversed(MODEL_NAMES)) == tuple(MODEL_NAMES)
    assert MODEL_NAMES[0] == registry.REFERENCE == "baseline"
    assert registry.in_order(["decoder_only", "scratch"]) == ("scratch", "decoder_only")
    with pytest.raises(ValueError, match="unknown model 'no_such_model'"):
        registry.in_order(["no_such_model"])
    assert set(registry.exportable()) <= {n for n in MODEL_NAMES if MODELS[n].encoder_decoder}


def test_the_registry_finds_each_entry_module_and_orders_the_models():
    """discovered() (run once, at import, to fill MODELS; called again here, where a mutant of
    it can be seen): one entry a module of nmt/models/entries, named as the module, in the
    entries' `order`."""
    found = registry.discovered()
    modules = Path(registry.__file__).parent / "entries"
    assert set(found) == {p.stem for p in modules.glob("*.py")} - {"__init__"} == set(MODELS)
    assert list(found) == list(MODELS) and found == MODELS
    assert [entry.order for entry in found.values()] == sorted(e.order for e in found.values())
    assert all(name == entry.name for name, entry in found.items())


@pytest.mark.parametrize("name", TAKES_REFERENCE)
def test_the_registry_gives_each_encoder_decoders_weights_scratchs_names(name):
    """What bench and the export load: a model's state dict under scratch's names, with which
    a scratch model computes the same logits (bench loads the reference's weights, so
    renamed, into each other model that takes them)."""
    model = model_named(name)
    scratch = build_model("scratch", SMALL, SRC_V, TGT_V, PAD).double().eval()
    scratch.load_state_dict(registry.entry(name).scratch_state_dict(model.state_dict()))
    src, tgt = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(scratch(src, tgt), model(src, tgt), rtol=0, atol=1e-10)


def test_the_registry_and_the_light_layers_import_no_torch():
    """The command line, params validation and run names read the registry: none of them
    imports torch (a model's module is imported when one is built)."""
    code = ("import sys; import nmt.models, nmt.core.runs, nmt.pipeline.params, "
            "nmt.pipeline.commandline; from nmt.models import registry; registry.names(); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]


@pytest.mark.parametrize("norm_first", [False, True])
def test_every_model_builds_without_a_warning(norm_first):
    """nn.Transformer warns, for pre-norm layers, that it will not use nested tensors: as
    wanted, so the baseline keeps that one warning from the user."""
    cfg = dataclasses.replace(SMALL, norm_first=norm_first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in MODEL_NAMES:
            build_model(name, cfg, SRC_V, TGT_V)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_build_models_special_ids_reach_the_model(name):
    """build_model's pad_id (and bos_id, for a model that reads it) are the ids the model
    masks and reads: a batch written with <pad> = 7 (and targets starting with <bos> = 9)
    gives, at every real target position, the logits of the pipeline's ids (1 and 2)."""
    torch.manual_seed(0)
    ours = build_model(name, SMALL, SRC_V, TGT_V).double().eval()
    theirs = build_model(name, SMALL, SRC_V, TGT_V, pad_id=7, bos_id=9).double().eval()
    theirs.load_state_dict(ours.state_dict())
    src, tgt = padded_batch()
    bos = 9 if registry.entry(name).reads_bos else 2
    their_tgt = torch.where(tgt == PAD, 7, tgt)
    their_tgt[:, 0] = bos
    with torch.no_grad():
        want, got = ours(src, tgt), theirs(torch.where(src == PAD, 7, src), their_tgt)
    real = tgt != PAD
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_class_built_with_its_defaults_is_build_models(name):
    """The class alone, as a notebook may build it (registry.entry(name).model_class()), takes
    the pipeline's special ids by default: with build_model's weights, the same logits on a
    padded batch whose targets start with <bos>."""
    torch.manual_seed(0)
    built = build_model(name, SMALL, SRC_V, TGT_V).double().eval()
    bare = registry.entry(name).model_class()(SMALL, SRC_V, TGT_V).double().eval()
    bare.load_state_dict(built.state_dict())
    src, tgt = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(bare(src, tgt), built(src, tgt), rtol=0, atol=0)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tie_embeddings_needs_one_vocabulary(name):
    with pytest.raises(ValueError, match="shared vocabulary"):
        build_model(name, dataclasses.replace(SMALL, tie_embeddings=True), SRC_V, TGT_V)


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_tie_embeddings(name):
    untied = build_model(name, SMALL, SRC_V, SRC_V)
    tied = build_model(name, dataclasses.replace(SMALL, tie_embeddings=True), SRC_V, SRC_V)
    assert n_params(untied) - n_params(tied) == 2 * SRC_V * SMALL.d_model
    sd = tied.state_dict(keep_vars=True)
    shared = [p for p in sd.values() if p.shape == (SRC_V, SMALL.d_model)]
    assert len(shared) == 3 and all(p is shared[0] for p in shared)


def test_tied_mapping_and_equivalence():
    cfg = dataclasses.replace(SMALL, tie_embeddings=True)
    baseline, scratch = pair(cfg, src_v=SRC_V, tgt_v=SRC_V)
    src, tgt = padded_batch()
    assert n_params(baseline) == n_params(scratch)
    assert scratch.generator.weight is scratch.src_embed.token.weight
    with torch.no_grad():
        torch.testing.assert_close(scratch(src, tgt), baseline(src, tgt), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_interface_shapes(name):
    """Every registered model keeps the interface nmt.models.interface writes down: its
    protocols (an EncoderDecoder exactly where the entry says encoder_decoder, FusedSwitchable
    where it has property checks) and the rules no signature shows: shapes, one
    cross-attention map a decoder layer (an encoder-decoder's rows sum to 1), decode_step =
    forward at the position fed, a cache for beams."""
    entry = registry.entry(name)
    model = build_model(name, SMALL, SRC_V, TGT_V, PAD).eval()
    assert isinstance(model, interface.TranslationModel)
    assert isinstance(model, interface.EncoderDecoder) is entry.encoder_decoder
    assert isinstance(model, interface.FusedSwitchable) or not entry.checks
    src, tgt = padded_batch()
    B, S = src.shape
    T = tgt.size(1)
    with torch.no_grad():
        logits = model(src, tgt)
        assert logits.shape == (B, T, TGT_V)
        memory = model.encode(src)
        cache = model.init_cache(memory, src)
        assert isinstance(cache, interface.DecoderCache)
        step = model.decode_step(cache, tgt[:, 0])
        assert step.shape == (B, TGT_V)
        torch.testing.assert_close(step, logits[:, 0], rtol=1e-4, atol=1e-4)
        assert isinstance(model.init_cache(memory, src, beams=3), interface.DecoderCache)
        cross = model.attention_maps(src, tgt)["decoder_cross"]  # what evaluate draws
        assert all(w.shape == (B, SMALL.nhead, T, S) for w in cross) and cross
        weight = cross[-1].sum(-1)  # a query's weight on the source
        if entry.encoder_decoder:  # one map a decoder layer, each row a distribution
            assert len(cross) == SMALL.num_decoder_layers
            torch.testing.assert_close(weight, torch.ones(B, SMALL.nhead, T))
        else:  # the source block of one self-attention over source and target
            assert bool((weight <= 1 + 1e-6).all()) and bool((weight > 0).all())
        if name in ENCODER_DECODERS:
            assert memory.shape == (B, S, SMALL.d_model)
            assert model.decode(tgt, memory, src).shape == (B, T, TGT_V)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_checkpoint_holds_the_learned_parameters_only(name):
    """Every model's state dict is its parameters (tied ones under each name): the position
    tables are constants, rebuilt by the model, not saved (nor demanded) in a checkpoint."""
    for cfg in (SMALL, dataclasses.replace(SMALL, tie_embeddings=True)):
        model = build_model(name, cfg, SRC_V, SRC_V, PAD)
        params = dict(model.named_parameters(remove_duplicate=False))
        assert model.state_dict().keys() == params.keys()


def test_same_parameter_count_and_init_distribution():
    torch.manual_seed(1)
    baseline = build_model("baseline", SMALL, SRC_V, TGT_V)
    scratch = build_model("scratch", SMALL, SRC_V, TGT_V)
    assert n_params(baseline) == n_params(scratch)
    # Independently initialised, matching tensors come from the same distribution: the
    # same zeros, ones and uniform bounds (the largest |value| nears the bound).
    mapped = scratch_to_baseline(scratch.state_dict())
    for name, want in baseline.state_dict().items():
        got = mapped[name]
        assert got.shape == want.shape, name
        if (want == want.flatten()[0]).all():  # attention biases 0, LayerNorm 1 and 0
            assert torch.equal(want, got), name
        else:
            ratio = (got.abs().max() / want.abs().max()).item()
            assert 0.8 < ratio < 1.25, (name, ratio)


def test_mapping_round_trip_and_leftovers():
    baseline, scratch = pair()
    sd = baseline.state_dict()
    to_scratch = baseline_to_scratch(sd)
    assert to_scratch.keys() == scratch.state_dict().keys()
    back = scratch_to_baseline(to_scratch)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    with pytest.raises(KeyError, match="extra.weight"):
        baseline_to_scratch({**sd, "extra.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="matches 0 mapping rules"):
        scratch_to_baseline({**scratch.state_dict(), "decoder.layers.0.norm4.weight": None})


@pytest.mark.parametrize("fastpath", [True, False])
def test_scratch_equals_baseline(fastpath):
    """With nn.Transformer's eval fast path (nested tensors) on or off, logits agree."""
    baseline, scratch = pair()
    src, tgt = padded_batch()
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(fastpath)
    try:
        with torch.no_grad():
            torch.testing.assert_close(scratch(src, tgt), baseline(src, tgt), rtol=0, atol=1e-10)
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_inference_under_the_cpus_bf16_autocast(name):
    """Every model scores and decodes without gradients under bf16 autocast on the CPU, as
    evaluate and train's greedy validation run a bf16-trained model, close to fp32. torch's
    encoder fast path checks only CUDA's autocast: the baseline took it under the CPU's and
    failed ("expected scalar type Float but found BFloat16")."""
    model = model_named(name, torch.float32)
    src, tgt = padded_batch()
    encode = (lambda: model.encode(src)) if name in ENCODER_DECODERS else (lambda: None)
    with torch.no_grad():
        logits, memory = model(src, tgt), encode()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits_bf16, memory_bf16 = model(src, tgt), encode()
    assert logits_bf16.dtype == torch.bfloat16  # the generator's product ran in bf16
    torch.testing.assert_close(logits_bf16.float(), logits, rtol=0, atol=0.1)
    if memory is not None:  # at the real positions (fp32's fast path zeroes padded ones)
        real = src != PAD
        torch.testing.assert_close(memory_bf16.float()[real], memory[real], rtol=0, atol=0.1)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_decode_step_equals_forward(name, dtype, atol):
    """Step-by-step logits equal the full forward at every position (padded src and tgt)."""
    model = model_named(name, dtype)
    src, tgt = padded_batch()
    with torch.no_grad():
        memory = model.encode(src)
        full = model(src, tgt)  # (B, T, V)
        cache = model.init_cache(memory, src)
        for t in range(tgt.size(1)):
            torch.testing.assert_close(model.decode_step(cache, tgt[:, t]), full[:, t],
                                       rtol=0, atol=atol)


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_decode_of_the_memory_equals_forward(name):
    """decode(tgt, encode(src), src), verify's path through the memory, gives forward's logits:
    the memory's padding (rows 1 and 2 of the batch) is masked as in forward."""
    model = model_named(name)
    src, tgt = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(model.decode(tgt, model.encode(src), src), model(src, tgt),
                                   rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cache_reorder_moves_beams_within_their_sentence(name):
    """Beam search's reorder(index): 2 beams a sentence with different prefixes; then the
    beams of even sentences swap and both rows of odd ones take beam 1 (rows repeat). Each
    continues as a full forward pass over its new prefix does."""
    model = model_named(name)
    src, tgt = padded_batch()
    B = src.size(0)
    sentence = torch.arange(B).repeat_interleave(2)  # rows 2s and 2s + 1: sentence s
    prefix = torch.stack([tgt[sentence[0::2], :2], tgt[(sentence[1::2] + 1) % B, :2]], 1)
    prefix = prefix.view(2 * B, 2)  # beam 0: the sentence's own start; beam 1: the next one's
    swap = torch.tensor([1, 0]).repeat(B)
    index = 2 * sentence + torch.where(sentence % 2 == 0, swap, 1)
    rest = tgt[sentence, 2:]
    with torch.no_grad():
        cache = model.init_cache(model.encode(src), src, beams=2)
        for t in range(2):
            model.decode_step(cache, prefix[:, t])
        cache.reorder(index)
        steps = [model.decode_step(cache, rest[:, t]) for t in range(rest.size(1))]
        full = model(src[sentence], torch.cat([prefix[index], rest], dim=1))
    for t, step in enumerate(steps):
        torch.testing.assert_close(step, full[:, t + 2], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cache_keep_drops_finished_sentences(name):
    """After keep(sentences), the other sentences' rows are gone and the kept ones continue,
    both beams of each, as a full forward pass over them does."""
    model = model_named(name)
    src, tgt = padded_batch()
    kept = torch.arange(0, src.size(0), 2)  # sentences 0, 2, ...
    rows = torch.stack([2 * kept, 2 * kept + 1], dim=1).view(-1)
    tgt2 = tgt.repeat_interleave(2, dim=0)
    with torch.no_grad():
        cache = model.init_cache(model.encode(src), src, beams=2)
        for t in range(2):
            model.decode_step(cache, tgt2[:, t])
        cache.keep(kept)
        steps = [model.decode_step(cache, tgt2[rows, t]) for t in range(2, tgt.size(1))]
        full = model(src[kept].repeat_interleave(2, dim=0), tgt2[rows])
    for t, step in zip(range(2, tgt.size(1)), steps, strict=True):
        torch.testing.assert_close(step, full[:, t], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_decode_steps_past_the_caches_first_room(name):
    """70 target positions, step by step, equal the full forward at every one: scratch's cache
    starts with room for 32 (decoder.CAPACITY) and grows to 64, then 128, keeping what it
    held; a row's padding in the middle of its target changes nothing either."""
    cfg = dataclasses.replace(SMALL, max_len=80)
    torch.manual_seed(0)
    model = build_model(name, cfg, SRC_V, TGT_V, PAD).double().eval()
    src = torch.tensor([[2, 11, 12, 13, 3], [2, 14, 3, PAD, PAD]])
    tgt = torch.randint(4, TGT_V, (2, 70))
    tgt[1, 40:] = PAD
    with torch.no_grad():
        full = model(src, tgt)
        cache = model.init_cache(model.encode(src), src)
        steps = torch.stack([model.decode_step(cache, tgt[:, t]) for t in range(70)], dim=1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)


def test_attention_maps_mask_exactly():
    _, scratch = pair()
    src, tgt = padded_batch()
    with torch.no_grad():
        maps = scratch.attention_maps(src, tgt)
    B, S, T, H = src.size(0), src.size(1), tgt.size(1), SMALL.nhead
    assert [len(maps[k]) for k in ("encoder_self", "decoder_self", "decoder_cross")] == [2, 3, 3]
    src_pad, tgt_pad = src == PAD, tgt == PAD
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for w in maps["encoder_self"]:
        assert w.shape == (B, H, S, S)
        assert (w.masked_select(src_pad[:, None, None, :].expand_as(w)) == 0).all()
    for w in maps["decoder_cross"]:
        assert w.shape == (B, H, T, S)
        assert (w.masked_select(src_pad[:, None, None, :].expand_as(w)) == 0).all()
    for w in maps["decoder_self"]:
        assert w.shape == (B, H, T, T)
        hidden = future | tgt_pad[:, None, None, :]
        assert (w.masked_select(hidden.expand_as(w)) == 0).all()
    for w in [w for ws in maps.values() for w in ws]:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_fully_masked_query_gives_zeros_not_nan():
    attn = MultiHeadAttention(8, 2, 0.0).double()
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    mask = torch.tensor([True, False, True])[None, None, :, None]  # query 1 sees nothing
    out, w = attn(x, mask, need_weights=True)
    assert not out.isnan().any() and (w[0, :, 1] == 0).all()


MASK_CONVERSIONS = {"bitwise_not", "logical_not", "masked_fill", "masked_fill_", "where",
                    "scalar_tensor", "zeros_like", "eq", "ne", "pad", "constant_pad_nd"}


class OpCount(TorchDispatchMode):
    """The aten ops a block of code dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def forward_ops(name: str, layers: int) -> collections.Counter:
    """Ops of a training forward and backward (dropout 0: the fused attention, as on a GPU)."""
    cfg = ModelConfig(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, max_len=32,
                      num_encoder_layers=layers, num_decoder_layers=layers)
    torch.manual_seed(0)
    model = build_model(name, cfg, 40, 40).train()
    src, tgt = torch.randint(4, 40, (3, 7)), torch.randint(4, 40, (3, 6))
    src[0, -2:], tgt[1, -3:], tgt[:, 0] = 1, 1, 2
    with OpCount() as counted:
        model(src, tgt).float().sum().backward()
    return counted.ops


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_masks_are_built_once_a_forward_not_in_every_layer(name):
    """What two more layers of each kind add is layers' work only: no op that builds or
    converts a mask (F.scaled_dot_product_attention turned a boolean mask into a bias in every
    call, nn.MultiheadAttention in each of its 19 attentions; nmt.models.masks)."""
    added = forward_ops(name, 4) - forward_ops(name, 2)
    assert added and not MASK_CONVERSIONS & set(added), added


def test_a_bias_and_the_boolean_mask_it_comes_from_attend_alike():
    attn = MultiHeadAttention(8, 2, 0.0).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.rand(2, 1, 5, 5) > 0.4
    keep[..., 0] = True  # every query sees a key
    for fused in (True, False):
        attn.fused = fused
        torch.testing.assert_close(attn(x, keep)[0], attn(x, bias(keep, x))[0], rtol=0, atol=0)


def test_a_bias_is_in_the_dtype_of_the_queries_it_is_added_to():
    """The bias a forward builds from its hidden states has the dtype of the queries that
    attention makes of them: under the CPU's bf16 autocast, fp32 states give bf16 queries and
    a bf16 bias (a float32 bias beside them is the cast each call that masks.py avoids)."""
    attn = MultiHeadAttention(8, 2, 0.0)
    keep = torch.rand(2, 1, 5, 5) > 0.4
    for dtype, autocast in ((torch.float32, False), (torch.float64, False),
                            (torch.float32, True)):
        x = torch.randn(2, 5, 8, dtype=dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            queries = attn.to(dtype).project_self(x)[0]
            assert bias(keep, x).dtype == queries.dtype == (torch.bfloat16 if autocast else dtype)


def test_a_layer_returns_its_weights_only_when_asked():
    """Attention weights (B, H, T, S) come back on request (attention_maps); else the fused
    kernel runs and none are returned, in eval as in training."""
    attn = MultiHeadAttention(8, 2, 0.0).double()
    x, keep = torch.randn(2, 5, 8, dtype=torch.float64), torch.ones(2, 1, 5, 5, dtype=torch.bool)
    for training in (False, True):
        attn.train(training)
        assert attn(x, keep)[1] is None
        assert attn(x, keep, need_weights=True)[1].shape == (2, 2, 5, 5)


def test_every_scratch_block_returns_weights_only_when_asked():
    """Called with their defaults, the stacks, their layers and the model's encoded/decoded run
    the fused kernel and return no weights: only attention_maps pays for them."""
    _, scratch = pair()
    src, tgt = padded_batch()
    layer = scratch.decoder.layers[0]
    with torch.no_grad():
        memory, src_bias, encoded = scratch.encoded(src)
        x, y = scratch.embed_src(src), scratch.embed_tgt(tgt)
        tgt_bias = bias(scratch.tgt_mask(tgt), y)
        _, decoded_self, decoded_cross = scratch.decoded(tgt, memory, src_bias)
        _, stack_self, stack_cross = scratch.decoder(y, memory, tgt_bias, src_bias)
        _, layer_weights = layer(y, layer.cross_attn.project_memory(memory), tgt_bias, src_bias)
        assert encoded == scratch.encoder(x, src_bias)[1] == [None, None]
        assert scratch.encoder.layers[0](x, src_bias)[1] is None
        assert decoded_self == decoded_cross == stack_self == stack_cross == [None] * 3
        assert layer_weights == (None, None)
        maps = scratch.attention_maps(src, tgt)  # and when asked, every layer's
    assert all(w.shape[:2] == (3, SMALL.nhead) for ws in maps.values() for w in ws)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fused_equals_math(dtype, atol):
    _, scratch = pair(dtype=dtype)
    src, tgt = padded_batch()
    with torch.no_grad():
        fused = scratch(src, tgt)
        scratch.set_fused_attention(False)
        math_path = scratch(src, tgt)
    torch.testing.assert_close(fused, math_path, rtol=0, atol=atol)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_extra_padding_changes_nothing(name):
    """More pad columns after source and target leave every existing logit as it was."""
    model = model_named(name)
    src, tgt = padded_batch()
    B, T = tgt.shape
    with torch.no_grad():
        want = model(src, tgt)
        got = model(torch.cat([src, torch.full((B, 3), PAD)], dim=1),
                    torch.cat([tgt, torch.full((B, 2), PAD)], dim=1))
    torch.testing.assert_close(got[:, :T], want, rtol=0, atol=1e-10)


def test_positions_identical_and_bounded():
    """The twins' sinusoid tables are one table; a sequence of max_len positions fits and one
    more is refused."""
    baseline, scratch = pair()
    torch.testing.assert_close(scratch.pos.table, baseline.positional_encoding.pos_embedding,
                               rtol=0, atol=0)
    table = scratch.pos.table
    assert table[0, 0::2].abs().max() == 0 and (table[0, 1::2] == 1).all()
    assert math.isclose(table[3, 0].item(), math.sin(3.0), abs_tol=1e-7)  # float32 table
    longest = torch.full((1, SMALL.max_len), 5)  # max_len positions fit; one more does not
    for model in (baseline, scratch):
        with torch.no_grad():
            assert model.encode(longest).shape == (1, SMALL.max_len, SMALL.d_model)
        with pytest.raises(ValueError, match="max_len"):
            model.encode(torch.full((1, SMALL.max_len + 1), 5))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_dropout_only_in_train_mode(name):
    model = build_model(name, SMALL, SRC_V, TGT_V, PAD)
    src, tgt = padded_batch()
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(src, tgt), model(src, tgt))
        model.eval()
        assert torch.equal(model(src, tgt), model(src, tgt))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_training_forward_makes_every_tensor_on_the_models_device(name):
    """With `meta` as torch's default device, a tensor made without a device (a mask, the
    positions, a dropout mask) is not on the CPU model's, and the forward fails, as it would
    on a GPU: the same seeded forward and backward give the same loss and gradients."""
    src, tgt = padded_batch()
    runs = []
    for default in ("cpu", "meta"):
        model = model_named(name, torch.float32).train()
        torch.manual_seed(1)
        with torch.device(default):
            loss = model(src, tgt).logsumexp(-1).sum()
            loss.backward()
        runs.append([loss, *(p.grad for p in model.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_models_stand_alone():
    """nmt.models imports nothing else of nmt: with every other nmt module blocked, it builds
    and runs all three models (what a notebook lifting models/ out of the pipeline does)."""
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("nmt.") and not name.startswith("nmt.models"):
            raise ImportError(f"nmt.models imported {name}")
sys.meta_path.insert(0, Block())
import torch
from nmt.models import MODELS, ModelConfig, build_model
cfg = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                  dim_feedforward=32)
src, tgt = torch.tensor([[2, 5, 6, 3]]), torch.tensor([[2, 7, 3]])
for name in MODELS:
    assert build_model(name, cfg, 10, 12)(src, tgt).shape == (1, 3, 12), name
print(sorted(m for m in sys.modules if m.startswith("nmt")))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert all(m == "nmt" or m.startswith("nmt.models") for m in eval(proc.stdout))


def test_dropout_mask_keeps_each_element_alone_with_its_probability():
    """Dropout's mask (four elements a 64-bit draw): each element kept with probability 1 - p,
    neighbours (lanes of one draw) and elements a draw apart independent, the kept ones scaled
    by 1 / (1 - p), gradients through the same mask. Tolerances are 10 standard deviations."""
    torch.manual_seed(0)
    n = 1 << 20
    for p in (0.1, 0.5, 0.9):
        drop = Dropout(p).train()
        y = drop(torch.ones(n))
        kept = y != 0
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(kept.float().mean().item() - (1 - p)) < 10 * sd, p
        assert torch.equal(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
        for gap in (1, 4):  # the next lane of a draw, the same lane of the next draw
            both = (kept[:-gap] & kept[gap:]).float().mean().item()
            assert abs(both - (1 - p) ** 2) < 10 * sd, (p, gap)
    x = torch.randn(64, 32, requires_grad=True)
    drop = Dropout(0.3).train()
    y = drop(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() / 0.7)
    assert torch.equal(drop.eval()(x), x) and torch.equal(Dropout(0.0).train()(x), x)
    assert not Dropout(1.0).train()(x).any()  # nn.Dropout's answer: all zeros, no NaN


def test_dropout_mask_is_the_seeded_generators():
    """The mask comes from torch's default generator: a seed repeats it (what bit-identical
    resume relies on), and different shapes of the same size draw the same elements. On a CPU
    it is keep_mask's, four elements a draw (not nn.Dropout's, a draw each)."""
    drop = Dropout(0.5).train()
    torch.manual_seed(3)
    a = drop(torch.ones(6, 7))
    torch.manual_seed(3)
    assert torch.equal(drop(torch.ones(42)).view(6, 7), a)
    assert not torch.equal(drop(torch.ones(6, 7)), a)
    torch.manual_seed(3)
    assert torch.equal(a != 0, keep_mask((6, 7), 0.5))


def test_attention_drops_its_weights_with_the_cheap_mask_on_a_cpu():
    """In training on a CPU, attention takes its math path, so that its weights are dropped by
    Dropout's mask (F.scaled_dot_product_attention would draw nn.Dropout's: three times the
    cost)."""
    attn = MultiHeadAttention(16, 2, 0.5).train()
    x = torch.randn(3, 5, 16)
    torch.manual_seed(1)
    y, weights = attn(x, None)
    assert weights is None  # none requested
    torch.manual_seed(1)
    want, _ = scaled_dot_product_attention(*attn.project_self(x), None, attn.scale, attn.dropout)
    assert torch.equal(y, attn.project_out(want))


# --- positions: the attention hook and rotary positions ---------------------------------

ROTARY = dataclasses.replace(SMALL, positions="rotary")


def rotary_scratch(dtype=torch.float64):
    torch.manual_seed(0)
    return build_model("scratch", ROTARY, SRC_V, TGT_V, PAD).to(dtype).eval()


def test_positions_validation_and_who_refuses_rotary():
    assert ModelConfig().positions == "sinusoidal"
    with pytest.raises(ValueError, match="unknown positions 'alibi'"):
        ModelConfig(positions="alibi")
    with pytest.raises(ValueError, match="even d_model / nhead"):
        ModelConfig(d_model=12, nhead=4, positions="rotary")
    for name in ("baseline", "decoder_only"):  # one line each, saying the fix
        with pytest.raises(ValueError, match=r"sinusoidal positions only.*\(fix: ") as e:
            build_model(name, ROTARY, SRC_V, TGT_V)
        assert "\n" not in str(e.value)


def test_the_default_hook_is_the_identity():
    """Sinusoidal (default) models hand queries and keys through untouched: the same tensors."""
    _, scratch = pair()
    attn = scratch.encoder.layers[0].self_attn
    x = torch.randn(2, SMALL.nhead, 5, SMALL.d_model // SMALL.nhead, dtype=torch.float64)
    assert attn.rotary is None and attn.at_positions(x, None) is x
    assert scratch.pos.table is not None


def test_rotary_goes_through_the_hook_in_self_attention_only():
    model = rotary_scratch()
    assert model.pos.table is None  # no sinusoids at the embeddings
    rotaries = {id(layer.self_attn.rotary) for layer in [*model.encoder.layers,
                                                         *model.decoder.layers]}
    assert len(rotaries) == 1 and None not in rotaries  # one table, every self-attention
    assert all(layer.cross_attn.rotary is None for layer in model.decoder.layers)
    assert n_params(model) == n_params(pair()[1])  # rotary has no weights
    assert not any("rotary" in k for k in model.state_dict())  # checkpoints unchanged


def test_rotary_scores_depend_on_the_distance_only():
    """q at p and k at p' score the same as at p + s and p' + s; a plain dot product does not
    depend on positions at all, so the rotation is there and relative."""
    attn = rotary_scratch().encoder.layers[0].self_attn
    q, k = torch.randn(2, 1, 1, 1, SMALL.d_model // SMALL.nhead, dtype=torch.float64)

    def score(p, p2):
        return (attn.at_positions(q, p) *
                attn.at_positions(k, p2)).sum()

    # The tables are float32 (as the sinusoids'): angles agree to float32's rounding.
    torch.testing.assert_close(score(3, 7), score(10, 14), rtol=0, atol=1e-6)
    assert abs(score(3, 7) - score(3, 8)) > 1e-3
    torch.testing.assert_close(attn.at_positions(q, 0), q, rtol=0, atol=0)


def test_rotary_turns_each_pair_by_its_angle_as_complex_numbers_do():
    """RoFormer's rotation, computed another way: pair i of a (T, Dh) input, as the complex
    number x[i] + 1j x[i + Dh/2], times e^(1j p 10000^(-2i/Dh)) at position p (cmath, one
    number at a time), at positions 2,040-2,047, where float32 frequencies are visibly off
    (the tables themselves are float32, rounded once). A bf16 input stays bf16."""
    d_head, max_len, start = 8, 2048, 2040
    rotary = Rotary(d_head, max_len)
    x = torch.randn(max_len - start, d_head, dtype=torch.float64)
    got = rotary(x, start)
    half = d_head // 2
    for t in range(x.size(0)):
        for i in range(half):
            angle = (start + t) * 10000.0 ** (-2 * i / d_head)
            z = complex(x[t, i], x[t, i + half]) * cmath.exp(1j * angle)
            assert abs(got[t, i] - z.real) < 1e-6 and abs(got[t, i + half] - z.imag) < 1e-6
    assert rotary(x.bfloat16(), start).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_rotary_cached_decoding_fused_and_padding(dtype, atol):
    """Every path reads the hook: step-by-step = forward, fused = math, extra padding inert."""
    model = rotary_scratch(dtype)
    src, tgt = padded_batch()
    B, T = tgt.shape
    with torch.no_grad():
        full = model(src, tgt)
        cache = model.init_cache(model.encode(src), src)
        steps = torch.stack([model.decode_step(cache, tgt[:, t]) for t in range(T)], dim=1)
        padded = model(torch.cat([src, torch.full((B, 3), PAD)], dim=1),
                       torch.cat([tgt, torch.full((B, 2), PAD)], dim=1))
        model.set_fused_attention(False)
        math_path = model(src, tgt)
    torch.testing.assert_close(steps, full, rtol=0, atol=atol)
    torch.testing.assert_close(padded[:, :T], full, rtol=0, atol=atol)
    torch.testing.assert_close(math_path, full, rtol=0, atol=atol)
    _, sinusoidal = pair(dtype=dtype)
    with torch.no_grad():
        assert (sinusoidal(src, tgt) - full).abs().max() > 1e-3  # another model indeed
