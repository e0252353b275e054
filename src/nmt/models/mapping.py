"""State-dict conversion between the baseline (nn.Transformer) and the scratch model.

The two hold the same tensors under different names, so the mapping is a renaming:
nn.MultiheadAttention's packed in_proj_weight is scratch's qkv.weight as it is.
"""

import re

_ATTENTION = [("in_proj_weight", "qkv.weight"), ("in_proj_bias", "qkv.bias"),
              ("out_proj.{p}", "out.{p}")]


def _layer(side: str, attentions: list, norms: int) -> list:
    """Name pairs of one encoder or decoder layer; {i} is the layer index, {p} weight or bias."""
    b, s = f"transformer.{side}.layers.{{i}}.", f"{side}.layers.{{i}}."
    pairs = [(f"{b}{ba}.{x}", f"{s}{sa}.{y}") for ba, sa in attentions for x, y in _ATTENTION]
    pairs += [(f"{b}linear1.{{p}}", f"{s}ff.w1.{{p}}"), (f"{b}linear2.{{p}}", f"{s}ff.w2.{{p}}")]
    pairs += [(f"{b}norm{n}.{{p}}", f"{s}norm{n}.{{p}}") for n in range(1, norms + 1)]
    return pairs


def pairs() -> list[tuple[str, str]]:
    """(baseline name, scratch name) of every tensor: built when a conversion runs, not when
    the module is imported (make mutate's mutants of _layer take effect only so)."""
    return [
        ("src_tok_emb.embedding.weight", "src_embed.token.weight"),
        ("tgt_tok_emb.embedding.weight", "tgt_embed.token.weight"),
        *_layer("encoder", [("self_attn", "self_attn")], norms=2),
        ("transformer.encoder.norm.{p}", "encoder.norm.{p}"),
        *_layer("decoder", [("self_attn", "self_attn"), ("multihead_attn", "cross_attn")],
                norms=3),
        ("transformer.decoder.norm.{p}", "decoder.norm.{p}"),
        ("generator.{p}", "generator.{p}"),
    ]


def _pattern(template: str) -> re.Pattern:
    rx = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)")
    return re.compile(rx.replace(r"\{p\}", "(?P<p>weight|bias)") + "$")


def _rename(state_dict: dict, pairs: list) -> dict:
    """Rename every entry by the one rule it matches; anything unmatched is an error."""
    rules = [(_pattern(src), dst) for src, dst in pairs]
    out = {}
    for name, tensor in state_dict.items():
        hits = [(m, dst) for rx, dst in rules if (m := rx.match(name))]
        if len(hits) != 1:
            raise KeyError(f"{name!r} matches {len(hits)} mapping rules, expected exactly 1")
        m, dst = hits[0]
        new = dst.format(**m.groupdict())
        if new in out:
            raise KeyError(f"two entries map to {new!r}")
        out[new] = tensor
    return out


def baseline_to_scratch(state_dict: dict) -> dict:
    """Baseline state dict -> scratch state dict (the same tensors, renamed)."""
    return _rename(state_dict, pairs())


def scratch_to_baseline(state_dict: dict) -> dict:
    """Scratch state dict -> baseline state dict (the same tensors, renamed)."""
    return _rename(state_dict, [(s, b) for b, s in pairs()])
