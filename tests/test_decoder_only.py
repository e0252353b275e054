"""The decoder-only translator: layout, sizes, search, checkpoints, training, and its checks."""

import dataclasses
import math

import pytest
import torch
import torch.nn as nn

import nmt.stages.verify as verify
from nmt.core import checkpoint
from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID
from nmt.core.decoding import DecodeConfig, output_limits, translate_batches
from nmt.core.loss import token_loss
from nmt.models import ModelConfig, build_model, mapping
from nmt.models.baseline import plain_path
from nmt.models.decoder_only import block as block_module
from nmt.models.decoder_only import model as model_module
from nmt.models.decoder_only.attention import SelfAttention
from nmt.models.decoder_only.layer_norm import LayerNorm
from nmt.models.decoder_only.model import DecoderOnlyTransformer, packed_mask
from nmt.models.decoder_only.size import (
    block_param_count,
    decoder_only_layers,
    decoder_only_param_count,
    encoder_decoder_param_count,
)
from nmt.models.masks import bias
from nmt.models.scratch.embedding import sinusoids
from nmt.stages.verify import decoder_only, properties
from synthetic import synthetic_batches
from test_models import OpCount, padded_batch
from test_verify import assert_fails_exactly

CFG = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=32, nhead=4,
                  dim_feedforward=64, dropout=0.1, max_len=64)
TIED = dataclasses.replace(CFG, tie_embeddings=True)
CAUSAL = dataclasses.replace(CFG, attention="causal")
SRC_V, TGT_V = 50, 40
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(cfg=CFG, src_v=SRC_V, tgt_v=TGT_V, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return build_model("decoder_only", cfg, src_v, tgt_v, PAD_ID).to(dtype).eval()


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# --- LayerNorm ---------------------------------------------------------------------------


def std_variant(norm: LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """The common variant: unbiased std, eps outside the square root."""
    mean = x.mean(-1, keepdim=True)
    return norm.weight * (x - mean) / (x.std(-1, keepdim=True) + norm.eps) + norm.bias


def test_layer_norm_is_nn_layer_norm_and_the_std_variant_is_not():
    torch.manual_seed(0)
    d = 8
    ours, ref = LayerNorm(d).double(), nn.LayerNorm(d).double()
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
        ref.weight.copy_(ours.weight)
        ref.bias.copy_(ours.bias)
    x = torch.randn(4, 5, d, dtype=torch.float64) * 3 + 1
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-12)
        # The definition written out step by step is the function the fused forward computes.
        torch.testing.assert_close(ours.written_out(x), ours(x), rtol=0, atol=1e-12)
        assert verify.max_abs_diff(std_variant(ours, x), ours.written_out(x)) > 1e-2
        # Unbiased std is sqrt(D / (D - 1)) times the biased one: 7% off at D = 8.
        assert verify.max_abs_diff(std_variant(ours, x), ref(x)) > 1e-2
        # eps placement alone: near-constant rows show it (var ~ eps).
        flat = torch.full((1, d), 2.0, dtype=torch.float64) + 1e-3 * torch.randn(1, d).double()
        biased_outside = ours.weight * (flat - flat.mean(-1, keepdim=True)) / (
            flat.var(-1, unbiased=False, keepdim=True).sqrt() + ours.eps) + ours.bias
        assert verify.max_abs_diff(biased_outside, ref(flat)) > 1e-3
        torch.testing.assert_close(ours(flat), ref(flat), rtol=0, atol=1e-12)
        wide, wide_ref = LayerNorm(d, eps=0.5).double(), nn.LayerNorm(d, eps=0.5).double()
        torch.testing.assert_close(wide(flat), wide_ref(flat), rtol=0, atol=1e-12)  # its eps
        torch.testing.assert_close(wide.written_out(flat), wide_ref(flat), rtol=0, atol=1e-12)


# --- layout, shapes, masks ---------------------------------------------------------------


@pytest.mark.parametrize("cfg", [CFG, TIED, CAUSAL], ids=["untied", "tied", "causal"])
def test_shapes_and_attention_maps(cfg):
    v = SRC_V if cfg.tie_embeddings else TGT_V
    model = tiny(cfg, SRC_V, v)
    src, tgt = padded_batch()
    (B, S), T, H, L = src.shape, tgt.size(1), cfg.nhead, model.num_layers
    with torch.no_grad():
        assert model(src, tgt).shape == (B, T, v)
        cache = model.init_cache(model.encode(src), src)
        assert model.decode_step(cache, tgt[:, 0]).shape == (B, v)
        maps = model.attention_maps(src, tgt)
    assert set(maps) == {"self", "decoder_cross"} and [len(maps[k]) for k in maps] == [L] * 2
    assert [w.shape for w in maps["decoder_cross"]] == [(B, H, T, S)] * L
    assert [w.shape for w in maps["self"]] == [(B, H, S + T, S + T)] * L
    # Exactly the allowed keys get weight: real ones, the source block both ways in prefix
    # mode, otherwise only earlier or same positions.
    real = torch.cat([src != PAD_ID, tgt != PAD_ID], dim=1)[:, None, None, :]
    allowed = torch.ones(S + T, S + T, dtype=torch.bool).tril()
    if cfg.attention == "prefix":
        allowed[:S, :S] = True
    for w in maps["self"]:
        assert (w.masked_select(~(allowed & real)) == 0).all()
        assert (w.masked_select(allowed & real) > 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    for w, full in zip(maps["decoder_cross"], maps["self"], strict=True):
        assert torch.equal(w, full[:, :, S:, :S])


def test_every_block_returns_weights_only_when_asked():
    """Called with their defaults, states, the stack, a block and its attention run the fused
    kernel and return no weights: only attention_maps pays for them."""
    model = tiny()
    src, tgt = padded_batch()
    block = model.stack.layers[0]
    with torch.no_grad():
        x = model.embed_packed(src, tgt)
        mask = bias(packed_mask(src, tgt, PAD_ID, prefix=True), x)
        assert model.states(src, tgt)[2] == model.stack(x, mask)[2] == [None] * model.num_layers
        assert block(x, mask)[2] is None and block.attn(x, mask)[2] is None


@pytest.mark.parametrize("cfg", [CFG, TIED], ids=["untied", "tied"])
def test_the_packed_embedding_by_hand(cfg):
    """[source | target] rows of the table times sqrt(d_model), plus the sinusoid of each
    token's position: a source token its index, a target token its row's real source length
    plus its index (<bos> read as <sep>, the last row)."""
    v = SRC_V if cfg.tie_embeddings else TGT_V
    model = tiny(cfg, SRC_V, v)
    src, tgt = padded_batch()
    lengths = (src != PAD_ID).sum(1).tolist()  # 7, 4, 3
    offset = 0 if cfg.tie_embeddings else SRC_V
    table, d = model.embed.token.weight, cfg.d_model
    sines = sinusoids(2 * cfg.max_len, d).double()
    want = torch.zeros(src.size(0), src.size(1) + tgt.size(1), d, dtype=torch.float64)
    for b in range(src.size(0)):
        for i, token in enumerate(src[b].tolist()):
            want[b, i] = table[token] * math.sqrt(d) + sines[i]
        for j, token in enumerate(tgt[b].tolist()):
            row = offset + v if token == BOS_ID else offset + token
            want[b, src.size(1) + j] = table[row] * math.sqrt(d) + sines[lengths[b] + j]
    with torch.no_grad():
        torch.testing.assert_close(model.embed_packed(src, tgt), want, rtol=0, atol=1e-12)


def test_table_layout_tied_and_untied():
    untied, tied = tiny(CFG, SRC_V, SRC_V), tiny(TIED, SRC_V, SRC_V)
    d = CFG.d_model
    assert untied.embed.token.weight.shape == (2 * SRC_V + 1, d)
    assert tied.embed.token.weight.shape == (SRC_V + 1, d)
    assert n_params(untied) - n_params(tied) == SRC_V * d  # one vocabulary's rows
    tgt = torch.tensor([[BOS_ID, 7, EOS_ID, PAD_ID]])
    assert untied.embed.target_rows(tgt).tolist() == [[2 * SRC_V, SRC_V + 7, SRC_V + 3,
                                                       SRC_V + 1]]
    assert tied.embed.target_rows(tgt).tolist() == [[SRC_V, 7, 3, 1]]
    for model in (untied, tied):  # <bos> is read as <sep>, the last row
        assert model.embed.sep_id == model.embed.token.num_embeddings - 1
    # The LM head is the target rows of the one table: no weights of its own.
    src, tgt = padded_batch()
    for model, offset in ((untied, SRC_V), (tied, 0)):
        with torch.no_grad():
            x, _, _ = model.states(src, tgt)
            want = x[:, src.size(1):] @ model.embed.token.weight[offset : offset + SRC_V].T
            torch.testing.assert_close(model(src, tgt), want, rtol=0, atol=1e-12)
        vocab_sized = [n for n, p in model.named_parameters()
                       if p.shape[0] in (SRC_V, SRC_V + 1, 2 * SRC_V + 1)]
        assert vocab_sized == ["embed.token.weight"]


def test_xavier_uniform_everywhere():
    model = tiny(dataclasses.replace(CFG, d_model=64, dim_feedforward=256, decoder_only_layers=2),
                 dtype=torch.float32)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            bound = math.sqrt(6.0 / sum(p.shape))
            assert p.abs().max() <= bound and p.abs().max() > 0.9 * bound, name


@pytest.mark.parametrize("cfg", [CFG, TIED, CAUSAL], ids=["untied", "tied", "causal"])
def test_padding_and_cache_exact(cfg):
    """Rows alone = rows in a padded batch; decode_step at every position = forward."""
    v = SRC_V if cfg.tie_embeddings else TGT_V
    model = tiny(cfg, SRC_V, v)
    src, tgt = padded_batch()
    assert properties.padding_diff(model, src, tgt, PAD_ID) <= 1e-12
    assert properties.cached_decoding_diff(model, src, tgt) <= 1e-12
    with torch.no_grad():
        fused = model(src, tgt)
        model.set_fused_attention(False)
        torch.testing.assert_close(model(src, tgt), fused, rtol=0, atol=1e-12)


def test_the_stack_is_torchs_pre_norm_encoder():
    """GPT-2's layout, checked against torch's own: from the same weights and mask, the stack
    over [source | target] computes what nn.TransformerEncoder of pre-norm layers (norm_first,
    ReLU) and a final LayerNorm computes."""
    cfg = dataclasses.replace(CFG, decoder_only_layers=2)
    model = tiny(cfg)
    src, tgt = padded_batch()
    layer = nn.TransformerEncoderLayer(cfg.d_model, cfg.nhead, cfg.dim_feedforward, dropout=0.0,
                                       batch_first=True, norm_first=True)
    reference = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(cfg.d_model),
                                      enable_nested_tensor=False).double().eval()
    # the twins' renaming of an encoder layer (models.mapping), its attention named "attn" here
    rules = [(ours.removeprefix("encoder."), theirs.removeprefix("transformer.encoder."))
             for theirs, ours in mapping._layer("encoder", [("self_attn", "attn")], norms=2)]
    reference.load_state_dict(mapping._rename(model.stack.state_dict(),
                                              [*rules, ("norm.{p}", "norm.{p}")]))
    with torch.no_grad(), plain_path():
        x = model.embed_packed(src, tgt)
        (B, n, _), H = x.shape, cfg.nhead
        mask = bias(packed_mask(src, tgt, PAD_ID, prefix=True), x).expand(B, H, n, n)
        want = reference(x, mask=mask.reshape(B * H, n, n))
        torch.testing.assert_close(model.states(src, tgt)[0], want, rtol=0, atol=1e-10)


def test_set_fused_attention_switches_the_kernel():
    """True: torch's fused attention kernel in every layer; False: the math path (softmax)."""
    model = tiny()
    src, tgt = padded_batch()
    for fused in (False, True):
        model.set_fused_attention(fused)
        with OpCount() as count, torch.no_grad():
            model(src, tgt)
        assert count.ops["_scaled_dot_product_flash_attention_for_cpu"] == (
            model.num_layers if fused else 0)
        assert count.ops["_softmax"] == (0 if fused else model.num_layers)


def test_prefix_and_causal_differ_over_the_source_only():
    """Same weights: the modes differ (prefix: earlier source positions see later ones)."""
    prefix, causal = tiny(CFG), tiny(CAUSAL)
    causal.load_state_dict(prefix.state_dict())
    src, tgt = padded_batch()
    with torch.no_grad():
        hp, hc = prefix.states(src, tgt)[0], causal.states(src, tgt)[0]
    assert verify.max_abs_diff(hp[:, src.size(1):], hc[:, src.size(1):]) > 1e-3
    assert decoder_only.causal_source_diff(causal, src, tgt, PAD_ID) == 0.0
    assert decoder_only.prefix_unreached(prefix, src, tgt, PAD_ID) == 0.0


def test_length_limits():
    """Source and target each up to max_len tokens, in forward as in decode_step; one more is
    refused, naming the side."""
    model = tiny()
    ok, long = torch.full((1, CFG.max_len), 5), torch.full((1, CFG.max_len + 1), 5)
    with torch.no_grad():
        assert model(ok, ok).shape == (1, CFG.max_len, TGT_V)  # positions up to 2 max_len - 1
        for src, tgt, side in ((long, ok[:, :2], "source"), (ok[:, :2], long, "target")):
            with pytest.raises(ValueError, match=f"^{side} of {CFG.max_len + 1} positions"):
                model(src, tgt)
        cache = model.init_cache(model.encode(ok), ok)
        for t in range(CFG.max_len):
            model.decode_step(cache, ok[:, t])
        with pytest.raises(ValueError, match=f"^target of {CFG.max_len + 1} positions"):
            model.decode_step(cache, ok[:, 0])


# --- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [CFG, TIED, dataclasses.replace(CFG, decoder_only_layers=3)])
def test_param_count_formulas_equal_the_models(cfg):
    v = SRC_V if cfg.tie_embeddings else TGT_V
    model = build_model("decoder_only", cfg, SRC_V, v)
    assert n_params(model) == decoder_only_param_count(cfg, SRC_V, v)
    assert model.num_layers == decoder_only_layers(cfg, SRC_V, v)
    for name in ("baseline", "scratch"):
        assert n_params(build_model(name, cfg, SRC_V, v)) == encoder_decoder_param_count(
            cfg, SRC_V, v)


PUBLISHED = (ModelConfig(), 19211, 10836)
TUNED = (ModelConfig(num_encoder_layers=4, num_decoder_layers=4, d_model=256, nhead=4,
                     dim_feedforward=1024, tie_embeddings=True), 8000, 8000)


@pytest.mark.parametrize("size", [PUBLISHED, TUNED], ids=["published", "tuned"])
def test_derived_layers_match_the_encoder_decoder_within_10_percent(size):
    cfg, src_v, tgt_v = size
    layers = decoder_only_layers(cfg, src_v, tgt_v)
    ratio = (decoder_only_param_count(cfg, src_v, tgt_v)
             / encoder_decoder_param_count(cfg, src_v, tgt_v))
    assert abs(ratio - 1) < 0.10, (layers, ratio)
    for other in (layers - 1, layers + 1):  # the nearest count of whole blocks
        r = decoder_only_param_count(cfg, src_v, tgt_v, other) / encoder_decoder_param_count(
            cfg, src_v, tgt_v)
        assert abs(r - 1) >= abs(ratio - 1)
    assert decoder_only_layers(dataclasses.replace(cfg, decoder_only_layers=5), src_v,
                               tgt_v) == 5


def test_a_layer_count_set_or_derived_is_at_least_one():
    """decoder_only_layers: 1 is taken as it is; an encoder-decoder too small for one block
    (no layers, its embeddings near the joint table's size) still gets one."""
    assert decoder_only_layers(dataclasses.replace(CFG, decoder_only_layers=1), SRC_V, TGT_V) == 1
    none = dataclasses.replace(CFG, num_encoder_layers=0, num_decoder_layers=0)
    budget = (encoder_decoder_param_count(none, SRC_V, TGT_V)
              - decoder_only_param_count(none, SRC_V, TGT_V, num_layers=0))
    assert budget < block_param_count(none) / 2  # the nearest count of blocks would be 0
    assert decoder_only_layers(none, SRC_V, TGT_V) == 1


def test_tuned_size_model_has_the_formula_count():
    cfg, src_v, tgt_v = TUNED
    assert n_params(build_model("decoder_only", cfg, src_v, tgt_v)) == decoder_only_param_count(
        cfg, src_v, tgt_v)


# --- search, checkpoints, training -------------------------------------------------------


def sources(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (n,), generator=g).tolist()
    return [[BOS_ID] + torch.randint(4, vocab, (k,), generator=g).tolist() + [EOS_ID]
            for k in lengths]


def uncached_greedy(model, src_ids: list[int], limit: int) -> list[int]:
    """One sentence, the whole prefix through forward each step, the searches' rules."""
    out, src = [], torch.tensor([src_ids])
    while True:
        with torch.no_grad():
            logits = model(src, torch.tensor([[BOS_ID] + out]))[0, -1].clone()
        logits[[PAD_ID, BOS_ID]] = -math.inf
        token = EOS_ID if len(out) >= limit else int(logits.argmax())
        if token == EOS_ID:
            return out
        out.append(token)


@pytest.mark.parametrize("cfg", [CFG, TIED], ids=["untied", "tied"])
def test_search_through_translate_batches(cfg):
    v = SRC_V if cfg.tie_embeddings else 12  # a small target vocabulary: <eos> comes early
    model = tiny(cfg, SRC_V, v)
    with torch.no_grad():
        model.embed.token.weight[model.embed.tgt_offset + EOS_ID] *= 3
    srcs = sources(7, SRC_V)
    kw = {"max_len_a": 1.0, "max_len_b": 3}
    greedy = translate_batches(model, srcs, DecodeConfig("greedy", batch_size=3, **kw))
    limits = output_limits([len(s) - 2 for s in srcs], 1.0, 3)
    assert greedy == [uncached_greedy(model, s, n) for s, n in zip(srcs, limits, strict=True)]
    assert translate_batches(model, srcs, DecodeConfig("beam", 1, batch_size=4, **kw)) == greedy
    beam = translate_batches(model, srcs, DecodeConfig("beam", 4, batch_size=3, **kw))
    assert all(len(h) <= n and all(4 <= t < v for t in h)
               for h, n in zip(beam, limits, strict=True))


def test_checkpoint_round_trip(tmp_path):
    cfg = dataclasses.replace(CAUSAL, decoder_only_layers=2)
    model = tiny(cfg, dtype=torch.float32)
    path = tmp_path / "best.pt"
    checkpoint.save(path, model, name="decoder_only", recipe="t", cfg=cfg, src_vocab_size=SRC_V,
                    tgt_vocab_size=TGT_V, params={})
    loaded, ckpt = checkpoint.load(path)
    assert isinstance(loaded, DecoderOnlyTransformer) and loaded.num_layers == 2
    assert ModelConfig(**ckpt["model_config"]) == cfg and not loaded.prefix
    src, tgt = padded_batch()
    with torch.no_grad():
        assert torch.equal(loaded(src, tgt), model(src, tgt))


def test_adam_steps_reduce_the_loss():
    torch.manual_seed(0)
    model = build_model("decoder_only", CFG, SRC_V, TGT_V).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    src, tgt = padded_batch()
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss, n = token_loss(model, src, tgt, "cpu")
        (loss / n).backward()
        opt.step()
        losses.append(loss.item() / n.item())
    assert losses[-1] < 0.3 * losses[0], losses


# --- the verify checks and planted bugs --------------------------------------------------


@pytest.fixture(scope="module")
def batches():
    return synthetic_batches(3, 4, SRC_V, TGT_V, pad_id=PAD_ID)


def run(batches, cfg=CFG, src_v=SRC_V, tgt_v=TGT_V):
    checks = verify.model_checks("decoder_only", cfg, src_v, tgt_v, PAD_ID, batches)
    return checks, {c["name"].removeprefix("decoder_only: "): c["passed"] for c in checks}


@pytest.mark.parametrize("cfg", [CFG, TIED, CAUSAL], ids=["untied", "tied", "causal"])
def test_checks_pass_on_the_real_model(cfg, batches):
    v = SRC_V if cfg.tie_embeddings else TGT_V
    checks, passed = run(synthetic_batches(3, 4, SRC_V, v), cfg, SRC_V, v)
    assert all(passed.values()), verify.format_table({"checks": checks, "passed": False})
    assert all(c["name"].startswith("decoder_only: ") and
               set(c) == {"name", "kind", "passed", "max_abs_diff", "tolerance", "seconds"}
               and c["kind"] == "property"
               for c in checks)
    mode = "prefix: source sees later source" if cfg.attention == "prefix" else \
        "causal: source sees no later source"
    assert f"{mode} (float64)" in passed and len(checks) == 10  # 9 + gradients finite


def test_run_checks_includes_and_gates_on_them(monkeypatch):
    big = synthetic_batches(30, 4, SRC_V, TGT_V, pad_id=PAD_ID)
    small = dataclasses.replace(CFG, num_encoder_layers=1, num_decoder_layers=1)
    tiny_traj = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=8, nhead=2,
                            dim_feedforward=16)
    result = verify.run_checks(small, SRC_V, TGT_V, PAD_ID, big, trajectory_cfg=tiny_traj)
    names = [c["name"] for c in result["checks"] if c["name"].startswith("decoder_only: ")]
    assert result["passed"] and len(names) == 10
    assert result["config"]["decoder_only"]["layers"] == decoder_only_layers(small, SRC_V, TGT_V)
    std_layer_norm(monkeypatch)
    assert not verify.run_checks(small, SRC_V, TGT_V, PAD_ID, big,
                                 trajectory_cfg=tiny_traj)["passed"]


def after_build(monkeypatch, breakage):
    build = properties.build_model

    def broken_build(name, *args, **kwargs):
        model = build(name, *args, **kwargs)
        if name == "decoder_only":
            breakage(model)
        return model

    monkeypatch.setattr(properties, "build_model", broken_build)


def std_layer_norm(monkeypatch):
    """The common LayerNorm variant: unbiased std, eps outside the root."""
    monkeypatch.setattr(LayerNorm, "forward", std_variant)


def target_sees_next(monkeypatch):
    """The causal mask lets each position see the next one as well."""
    mask = model_module.packed_mask

    def leaky(src, tgt, pad_id, prefix):
        m = mask(src, tgt, pad_id, prefix)
        n = m.size(-1)
        return m | torch.ones(n, n, dtype=torch.bool).tril(1)

    monkeypatch.setattr(model_module, "packed_mask", leaky)


def prefix_ignored(monkeypatch):
    """The source is attended causally even though the config says prefix."""
    mask = model_module.packed_mask
    monkeypatch.setattr(model_module, "packed_mask",
                        lambda src, tgt, pad_id, prefix: mask(src, tgt, pad_id, False))


def target_blind_to_source(monkeypatch):
    """Target queries attend only target keys."""
    mask = model_module.packed_mask

    def blind(src, tgt, pad_id, prefix):
        m = mask(src, tgt, pad_id, prefix).clone()
        m[..., src.size(1):, : src.size(1)] = False
        return m

    monkeypatch.setattr(model_module, "packed_mask", blind)


def positions_of_the_padded_row(monkeypatch):
    """Target positions counted from the padded source width, not the real length."""
    def packed(src, tgt, pad_id):
        B, S, T = src.size(0), src.size(1), tgt.size(1)
        return torch.arange(S).expand(B, S), S + torch.arange(T).expand(B, T)

    monkeypatch.setattr(model_module, "positions", packed)


def padding_keys_attended(monkeypatch):
    """Padded keys are not masked."""
    mask = model_module.packed_mask
    monkeypatch.setattr(model_module, "packed_mask",
                        lambda src, tgt, pad_id, prefix: mask(src, tgt, -1, prefix))


def fused_ignores_mask(monkeypatch):
    """The fused path attends every key; the math path (weights) is right."""
    forward = SelfAttention.forward

    def broken(self, x, mask, past_kv=None, need_weights=False):
        use = mask if need_weights or not self.fused else torch.ones_like(mask)
        return forward(self, x, use, past_kv, need_weights)

    monkeypatch.setattr(SelfAttention, "forward", broken)


def reorder_forgets_lengths(monkeypatch):
    """Beam reordering moves keys and values, but tiles the source lengths in the old order."""
    def reorder(self, index):
        self.kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.kv]
        self.mask = self.mask.index_select(0, index)
        self.lengths = self.lengths.repeat(len(index) // len(self.lengths))  # not index_select
        return self

    monkeypatch.setattr(model_module.KVCache, "reorder", reorder)


def untied_head(monkeypatch):
    """An LM head with weights of its own: outputs fine, the size not what the formula says."""
    def add_head(model):
        model.extra_head = nn.Linear(model.embed.token.embedding_dim, model.embed.tgt_vocab_size)

    after_build(monkeypatch, add_head)


def maps_head_averaged(monkeypatch):
    """attention_maps returns head-averaged weights (B, T, S)."""
    maps = DecoderOnlyTransformer.attention_maps
    monkeypatch.setattr(DecoderOnlyTransformer, "attention_maps", lambda self, s, t: {
        k: [w.mean(1) for w in ws] for k, ws in maps(self, s, t).items()})


def no_final_norm(monkeypatch):
    """The stack skips its final LayerNorm; every property still holds (a control)."""
    forward = block_module.Stack.forward

    def skip(self, x, mask, past_kv=None, need_weights=False):
        norm, self.norm = self.norm, nn.Identity()
        try:
            return forward(self, x, mask, past_kv, need_weights)
        finally:
            self.norm = norm

    monkeypatch.setattr(block_module.Stack, "forward", skip)


LN, CAUSALITY = "LayerNorm = nn.LayerNorm (float64)", "causality (float64)"
REACH, PREFIX = "source reaches every target position (float64)", \
    "prefix: source sees later source (float64)"
CACHE, PADDING = "kv-cache decoding (float64)", "padding changes nothing (float64)"
FUSED, COUNT, SHAPES = "fused vs math attention (float64)", "parameter count", "output shapes"

# breakage: (checks that must fail, checks that must still pass)
BREAKAGES = {
    std_layer_norm: ([LN], [CAUSALITY, CACHE, PADDING, COUNT]),
    target_sees_next: ([CAUSALITY, CACHE], [LN, COUNT, REACH]),
    prefix_ignored: ([PREFIX], [CAUSALITY, CACHE, PADDING, REACH]),
    target_blind_to_source: ([REACH], [CAUSALITY, PADDING, PREFIX]),
    positions_of_the_padded_row: ([PADDING, CACHE], [CAUSALITY, REACH, PREFIX]),
    padding_keys_attended: ([PADDING], [CAUSALITY, LN, COUNT]),
    fused_ignores_mask: ([FUSED, CAUSALITY, PADDING], [LN, COUNT, SHAPES]),
    reorder_forgets_lengths: ([CACHE], [CAUSALITY, PADDING, FUSED]),
    untied_head: ([COUNT], [CAUSALITY, CACHE, PADDING]),
    maps_head_averaged: ([SHAPES], [CAUSALITY, CACHE, PADDING, COUNT]),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES), ids=lambda f: f.__name__)
def test_broken_model_fails_the_right_checks(breakage, batches, monkeypatch):
    breakage(monkeypatch)
    assert_fails_exactly(*run(batches), *BREAKAGES[breakage])


def test_a_harmless_change_passes(batches, monkeypatch):
    """Control: a different architecture with the same properties fails no check."""
    no_final_norm(monkeypatch)
    checks, passed = run(batches)
    assert all(passed.values()), verify.format_table({"checks": checks, "passed": False})
