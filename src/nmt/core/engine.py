"""CTranslate2, the inference engine: our encoder-decoders as its model, and decoding and scoring
through it under the rules of nmt.core.decoding, in our token ids.

How this architecture maps onto CTranslate2's TransformerSpec (tests/test_export.py checks
each against our model):
- Post-norm layers with a final LayerNorm after each stack (nn.Transformer's layout): the spec
  is built pre-norm, which gives each stack its `layer_norm`, then marked post-norm; the engine
  applies a stack's layer_norm whenever the spec holds one.
- Positions: our sinusoid table (interleaved sin/cos from position 0) is written into the spec;
  the engine's own table is [sin | cos] halves from position 1.
- Cross-attention: the engine keeps the query projection apart from the packed key/value one;
  self-attention keeps our packed [W_q; W_k; W_v] as it is.
- Tied embeddings: the same array in three places; `optimize` stores it once.
- Beam search: the engine runs the algorithm of nmt.core.decoding (2K candidates, an <eos>
  among the K best finishes a hypothesis) but stops a sentence once `patience` x K hypotheses
  have finished, where ours goes on until no alive hypothesis can still win; it ranks the
  finished ones by score / length ** lp, we by GNMT's score / ((5 + length) / 6) ** alpha,
  and returns only its K best of them. So it searches with patience 2 (`PATIENCE`), is given
  the lp closest to GNMT's curve (`engine_length_penalty`) and returns all K with their
  scores; `pick_best` undoes its penalty and ranks them as nmt.core.decoding does. A
  hypothesis cut at its length limit is completed with <eos>, as nmt.core.decoding forces.
- <pad> and <bos> are never produced: the engine removes them before its softmax,
  nmt.core.decoding after it, which can move beam choices of barely trained weights only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from nmt.core.codecs import BOS_ID, EOS_ID, SPECIALS
from nmt.core.decoding import DecodeConfig, output_limits
from nmt.core.errors import NmtError
from nmt.core.files import read_json
from nmt.core.records import check_folder
from nmt.core.runs import Run
from nmt.models import ModelConfig, registry
from nmt.models.scratch.embedding import sinusoids

BANNED = [[SPECIALS[1]], [SPECIALS[2]]]  # <pad>, <bos>: never produced (nmt.core.decoding's rule)
# The engine's beam stops a sentence at PATIENCE x K finished hypotheses; ours when none alive
# can still win. At 1 (the engine's default) 963 of test_2016_flickr's 1,000 beam outputs of a
# demo-recipe model were ours, at 2 all 1,000 (docs/serving-ctranslate2.md).
PATIENCE = 2.0


def tokens_of(codec) -> list[str]:
    """The codec's tokens by id, specials first, for the engine's vocabulary files."""
    tokens = list(SPECIALS) + codec.pieces(range(len(SPECIALS), len(codec)))
    if len(set(tokens)) != len(tokens):
        raise ValueError("the vocabulary holds one token twice; the engine maps tokens to ids "
                         "by their text")
    return tokens


def model_spec(name: str, state_dict: dict, cfg: ModelConfig, src_tokens: list[str],
               tgt_tokens: list[str]):
    """A ctranslate2 TransformerSpec holding the weights of model `name`, one the registry
    says exports (a post- or pre-norm encoder-decoder with the scratch model's weights)."""
    from ctranslate2.specs import transformer_spec

    weights = registry.entry(name).scratch_state_dict(state_dict)
    weights = {k: v.detach().float().cpu().numpy() for k, v in weights.items()}
    # pre_norm=True builds each stack's final layer_norm; pre_norm then says where the
    # layers' own norms go (our norm_first).
    encoder = transformer_spec.TransformerEncoderSpec(cfg.num_encoder_layers, cfg.nhead,
                                                      pre_norm=True)
    decoder = transformer_spec.TransformerDecoderSpec(cfg.num_decoder_layers, cfg.nhead,
                                                      pre_norm=True)
    encoder.pre_norm = decoder.pre_norm = cfg.norm_first
    table = sinusoids(cfg.max_len, cfg.d_model).numpy()
    fill_encoder(encoder, weights, table)
    fill_decoder(decoder, weights, table, cfg.d_model)
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.register_source_vocabulary(src_tokens)
    spec.register_target_vocabulary(tgt_tokens)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = SPECIALS[0], *SPECIALS[2:]
    spec.config.decoder_start_token = SPECIALS[BOS_ID]
    spec.config.layer_norm_epsilon = 1e-5  # nn.LayerNorm's
    spec.validate()
    return spec


def set_linear(spec, weights: dict, name: str) -> None:
    spec.weight, spec.bias = weights[f"{name}.weight"], weights[f"{name}.bias"]


def set_norm(spec, weights: dict, name: str) -> None:
    spec.gamma, spec.beta = weights[f"{name}.weight"], weights[f"{name}.bias"]


def set_self_attention(spec, weights: dict, ours: str) -> None:
    """A layer's self-attention and its norm1: our packed [W_q; W_k; W_v] as it is."""
    set_linear(spec.linear[0], weights, f"{ours}.self_attn.qkv")
    set_linear(spec.linear[1], weights, f"{ours}.self_attn.out")
    set_norm(spec.layer_norm, weights, f"{ours}.norm1")


def set_feed_forward(spec, weights: dict, ours: str, norm: str) -> None:
    set_linear(spec.linear_0, weights, f"{ours}.ff.w1")
    set_linear(spec.linear_1, weights, f"{ours}.ff.w2")
    set_norm(spec.layer_norm, weights, f"{ours}.{norm}")


def fill_encoder(spec, weights: dict, table: np.ndarray) -> None:
    spec.embeddings[0].weight = weights["src_embed.token.weight"]  # scaled by sqrt(d) there too
    spec.position_encodings.encodings = table
    set_norm(spec.layer_norm, weights, "encoder.norm")
    for i, layer in enumerate(spec.layer):
        set_self_attention(layer.self_attention, weights, f"encoder.layers.{i}")
        set_feed_forward(layer.ffn, weights, f"encoder.layers.{i}", "norm2")


def fill_decoder(spec, weights: dict, table: np.ndarray, d_model: int) -> None:
    spec.embeddings.weight = weights["tgt_embed.token.weight"]
    spec.position_encodings.encodings = table
    set_norm(spec.layer_norm, weights, "decoder.norm")
    set_linear(spec.projection, weights, "generator")
    for i, layer in enumerate(spec.layer):
        ours = f"decoder.layers.{i}"
        set_self_attention(layer.self_attention, weights, ours)
        packed_w = weights[f"{ours}.cross_attn.qkv.weight"]  # rows [W_q; W_k; W_v]
        packed_b = weights[f"{ours}.cross_attn.qkv.bias"]
        query, memory = layer.attention.linear[0], layer.attention.linear[1]
        query.weight, query.bias = packed_w[:d_model], packed_b[:d_model]
        memory.weight, memory.bias = packed_w[d_model:], packed_b[d_model:]
        set_linear(layer.attention.linear[2], weights, f"{ours}.cross_attn.out")
        set_norm(layer.attention.layer_norm, weights, f"{ours}.norm2")
        set_feed_forward(layer.ffn, weights, ours, "norm3")


def export_command(run) -> str:
    return f"`nmt export --recipe {run.recipe} --model {run.model} --seed {run.seed}`"


def check_export(folder: Path, run) -> dict:
    """The export's nmt.json (its max_len an int), once folder holds the run's export as nmt
    export wrote it; else one line naming the command that writes it: no export, a file
    that differs from the export's SHA256SUMS (a damaged model.bin, another export's vocab/),
    or another run's export (folders swapped or copied: nmt.json names the run it holds)."""
    if not (folder / "nmt.json").is_file() or not (folder / "model.bin").is_file():
        raise NmtError(f"{folder} holds no export (fix: {export_command(run)})")
    check_folder(folder)
    try:
        meta = read_json(folder / "nmt.json")
        held = Run(meta["recipe"], meta["model"], int(meta["seed"]))
        meta["max_len"] = int(meta["max_len"])
    except (ValueError, KeyError, TypeError) as e:  # broken JSON, a missing key
        raise damaged_export(folder, run, e) from None
    if held != run or meta.get("run") != run.name:
        raise NmtError(f"{folder}/nmt.json says the folder holds the export of "
                       f"{meta.get('run', held.name)}, not of {run.name}: export folders were "
                       f"swapped or copied (fix: {export_command(run)})")
    return meta


def check_export_vocab(folder: Path, run, src_tokens: list[str], tgt_tokens: list[str]) -> None:
    """The export's vocab/ gives the tokens the engine was exported with (its own
    *_vocabulary.json, one file if shared): another vocabulary would silently change every
    id the engine reads and writes."""
    files = ({"source": "shared", "target": "shared"} if (folder / "shared_vocabulary.json")
             .is_file() else {"source": "source", "target": "target"})
    for side, tokens in (("source", src_tokens), ("target", tgt_tokens)):
        path = folder / f"{files[side]}_vocabulary.json"
        try:
            exported = read_json(path)
        except (OSError, ValueError) as e:
            raise damaged_export(folder, run, e) from None
        if exported != tokens:
            raise NmtError(f"{folder}/vocab: its {side} vocabulary ({len(tokens)} tokens) is "
                           f"not the one the engine was exported with ({path.name}: "
                           f"{len(exported)} tokens) (fix: {export_command(run)} again)")


def damaged_export(folder: Path, run, error: Exception) -> NmtError:
    """The one line for an export whose files cannot be read (a truncated model.bin, a broken
    nmt.json or config.json): what failed, and the command that writes it again."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return NmtError(f"{folder} holds a damaged export ({reason.rstrip(': ')}) (fix: "
                    f"{export_command(run)} again)")


def open_engine(folder: Path, run, src_tokens: list[str], tgt_tokens: list[str],
                compute_type: str = "float32", threads: int = 1) -> Engine:
    """The run's export (check_export has found one there) as an Engine; one line if the
    engine cannot read it."""
    try:
        return Engine(folder, src_tokens, tgt_tokens, compute_type, threads)
    except (RuntimeError, ValueError) as e:  # what ctranslate2 raises for files it cannot read
        raise damaged_export(folder, run, e) from None


def engine_length_penalty(alpha: float, longest: int = 64) -> float:
    """The lp whose length ** lp comes closest to GNMT's ((5 + length) / 6) ** alpha, least
    squares in log space over lengths 1..longest (a constant factor ranks alike). Never 0:
    the engine then stops at its first finished best beam, which nmt.core.decoding does not."""
    lengths = np.arange(1, longest + 1)
    slope, _ = np.polyfit(np.log(lengths), alpha * np.log((5 + lengths) / 6), 1)
    return max(float(slope), 1e-6)


class Engine:
    """A ctranslate2.Translator over an exported folder, taking and giving our token ids."""

    def __init__(self, folder: Path, src_tokens: list[str], tgt_tokens: list[str],
                 compute_type: str = "float32", threads: int = 1):
        import ctranslate2

        self.translator = ctranslate2.Translator(str(folder), device="cpu",
                                                 compute_type=compute_type, inter_threads=1,
                                                 intra_threads=threads)
        self.src_tokens, self.tgt_tokens = src_tokens, tgt_tokens
        self.tgt_ids = {t: i for i, t in enumerate(tgt_tokens)}

    def source(self, ids: list[int]) -> list[str]:
        return [self.src_tokens[i] for i in ids]  # <bos> ... <eos>, as our encoders read it

    def target(self, ids: list[int]) -> list[str]:
        return [self.tgt_tokens[i] for i in ids]

    def score(self, pairs) -> list[list[float]]:
        """Per-token log-probabilities of each pair's target (its tokens and <eos>): (source
        ids, target ids with <bos> and <eos>) pairs."""
        results = self.translator.score_batch([self.source(s) for s, _ in pairs],
                                              [self.target(t[1:-1]) for _, t in pairs],
                                              max_input_length=0)
        return [r.log_probs for r in results]

    def translate(self, sources, dc: DecodeConfig) -> list[list[int]]:
        """Decode like nmt.core.decoding.translate_batches: the same length limits (sentences of one
        limit batched together, since the engine takes one limit a call) and, for beam search,
        the same GNMT ranking. sources: id lists with <bos>/<eos>, or (source, target) pairs."""
        sources = [s[0] if isinstance(s, tuple) else s for s in sources]
        limits = output_limits([len(s) - 2 for s in sources], dc.max_len_a, dc.max_len_b, dc.cap)
        by_limit = defaultdict(list)
        for i, limit in enumerate(limits):
            by_limit[limit].append(i)
        beam = dc.beam_size if dc.method == "beam" else 1
        lp = engine_length_penalty(dc.length_penalty)
        outputs: list[list[int]] = [[] for _ in sources]
        for limit, idx in sorted(by_limit.items()):
            for start in range(0, len(idx), dc.batch_size):
                chunk = idx[start : start + dc.batch_size]
                batch = [self.source(sources[i]) for i in chunk]
                results = self.search(batch, beam, lp, limit)
                for i, src, result in zip(chunk, batch, results, strict=True):
                    outputs[i] = self.pick_best(src, result, lp, dc.length_penalty)
        return outputs

    def search(self, batch: list[list[str]], beam: int, lp: float, limit: int):
        """The engine's own search over source tokens under nmt.core.decoding's rules (one length
        limit, <pad> and <bos> banned): all `beam` hypotheses of each, with their scores."""
        return self.translator.translate_batch(
            batch, beam_size=beam, num_hypotheses=beam, length_penalty=lp, patience=PATIENCE,
            return_scores=True, return_end_token=True, max_decoding_length=limit,
            min_decoding_length=0, suppress_sequences=BANNED, max_input_length=0)

    def pick_best(self, src: list[str], result, lp: float, alpha: float) -> list[int]:
        """The hypothesis nmt.core.decoding would return: summed log-probabilities (the engine's
        score is the sum / n ** lp), those cut at the limit completed with <eos>, ranked by
        score / ((5 + n) / 6) ** alpha."""
        eos = SPECIALS[EOS_ID]
        ranked = []
        for tokens, score in zip(result.hypotheses, result.scores, strict=True):
            total = score * len(tokens) ** lp
            if not tokens or tokens[-1] != eos:  # cut at the limit: <eos> follows there
                tokens = [*tokens, eos]
                if len(result.hypotheses) > 1:  # greedy keeps its one hypothesis as it is
                    total = sum(self.translator.score_batch([src], [tokens[:-1]])[0].log_probs)
            ranked.append((total / ((5 + len(tokens)) / 6) ** alpha, tokens[:-1]))
        best = max(ranked, key=lambda scored: scored[0])[1]
        return [self.tgt_ids[t] for t in best]


def max_abs_difference(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest |a - b| over every token of every sentence (same lengths required)."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if len(x) != len(y):
            return math.inf
        worst = max([worst, *(abs(p - q) for p, q in zip(x, y, strict=True))])
    return worst
