"""Decoding: greedy and beam search, batched over many sentences with the models' caches.

Both searches take src (B, S) token ids and a per-sentence limit on output length, and return
each sentence's output ids without <bos> and <eos>. Beam search keeps B sentences x K beams as
B*K rows of one batch; `cache.reorder` gives each row the decoder state of its new beam.

Rules both searches share, so that beam_size=1 gives exactly the greedy output:
- <pad> and <bos> are never produced;
- a sentence's output holds at most `limit` tokens: at that step only <eos> may follow;
- beam scores are summed log-probabilities; a finished hypothesis of n tokens (counting its
  <eos>) is ranked by score / ((5 + n) / 6) ** alpha, the GNMT length penalty.

A sentence's beam search ends when no alive hypothesis can still beat its best finished one,
or at its limit: its output is the one that searching every step to the limit would give. (It
used to end once K hypotheses had finished, fairseq's rule, which could return a hypothesis
it knew to be worse: a model that had memorized a sentence said it greedily, while three beams
that had taken one improbable token finished first and the beam output was the best of them.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID
from nmt.core.data import pad
from nmt.core.errors import memory_fix

CHECK_EVERY = 4  # steps between "is every sentence done?" checks, each a host-device sync
# The widest beam (evaluate.beam_size's maximum in the schema, nmt translate --beam's): a batch
# of beam search holds beam_size x evaluate.batch_size hypotheses (100 x 128 = 12,800 at the
# default batch), and beams much wider than about 10 lower BLEU (Koehn and Knowles 2017, "Six
# Challenges for Neural Machine Translation"), so a wider one is a typo, not a search.
MAX_BEAM = 100


def output_limits(src_lens, a: float, b: int, cap: int | None = None) -> list[int]:
    """Longest output of each sentence: int(a * source tokens + b), at most cap."""
    return [min(int(a * n + b), cap) if cap else int(a * n + b) for n in src_lens]


def _constrain(logp: torch.Tensor, at_limit: torch.Tensor) -> torch.Tensor:
    """In place on logp (N, V): ban <pad> and <bos>; rows at their length limit may only end."""
    logp[:, PAD_ID] = -math.inf
    logp[:, BOS_ID] = -math.inf
    eos = logp[:, EOS_ID].clone()
    logp.masked_fill_(at_limit[:, None], -math.inf)  # an (N, 1) mask: no (N, V) one
    logp[:, EOS_ID] = eos
    return logp


def _strip(rows: torch.Tensor) -> list[list[int]]:
    """Token rows (padded with <pad>) -> id lists; one transfer to the host."""
    return [[i for i in row if i != PAD_ID] for row in rows.tolist()]


def greedy(model, src: torch.Tensor, max_len) -> list[list[int]]:
    """The most probable next token at every step. max_len: an int, or (B,) limits (a list
    or a tensor)."""
    with torch.inference_mode():
        B, device = src.size(0), src.device
        limit = torch.as_tensor(max_len, device=device).expand(B)
        steps = int(limit.max()) + 1  # +1: the step that may only produce <eos>
        cache = model.init_cache(model.encode(src), src)
        sentence = torch.arange(B, device=device)  # the rows still decoded, by index in src
        tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=device)
        out = torch.full((B, steps), PAD_ID, dtype=torch.long, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        for t in range(steps):
            # The argmax of the logits is that of the log-probabilities: no softmax needed.
            logits = model.decode_step(cache, tokens)  # (B, V)
            tokens = _constrain(logits, t >= limit).argmax(dim=-1)
            # Finished rows feed <pad>, which attention masks out, and record nothing.
            tokens = tokens.masked_fill(done, PAD_ID)
            done |= tokens == EOS_ID
            out[sentence, t] = tokens.masked_fill(done, PAD_ID)
            if (t + 1) % CHECK_EVERY == 0 and bool(done.any()):
                going = (~done).nonzero().squeeze(1)  # finished sentences leave the batch
                if len(going) == 0:
                    break
                sentence, limit, tokens, done = (x[going] for x in (sentence, limit, tokens, done))
                cache.keep(going)
        return _strip(out)


@dataclass
class Beams:
    """Beam search's state: a row for each sentence still decoded, K hypotheses in each."""

    sentence: torch.Tensor  # (B,) its index in the batch beam_search was given
    limit: torch.Tensor  # (B,) its longest output
    scores: torch.Tensor  # (B, K) summed log-probabilities of the alive hypotheses
    alive: torch.Tensor  # (B, K, steps) their tokens
    fin_scores: torch.Tensor  # (B, K) the K best finished hypotheses: normalized scores
    fin_tokens: torch.Tensor  # (B, K, steps) and tokens
    done: torch.Tensor  # (B,) none alive can beat the best finished, or the limit reached

    def rows(self, keep: torch.Tensor) -> Beams:
        return Beams(*(getattr(self, f.name)[keep] for f in fields(self)))

    def best(self) -> torch.Tensor:
        """(B, steps) each sentence's best finished hypothesis."""
        rows = torch.arange(len(self.sentence), device=self.fin_tokens.device)
        return self.fin_tokens[rows, self.fin_scores.argmax(dim=1)]


def reachable(s: Beams, length_penalty: float) -> torch.Tensor:
    """(B,) the best normalized score any alive hypothesis can still finish with: a token's
    log-probability only lowers a summed score, and the longest ending (limit tokens and the
    <eos>) divides it by the largest penalty (alpha >= 0)."""
    longest = (5 + s.limit + 1) / 6
    return s.scores[:, 0] / longest ** length_penalty


def beam_search(model, src: torch.Tensor, beam_size: int, length_penalty: float,
                max_len) -> list[list[int]]:
    """The best finished hypothesis of a K-beam search per sentence. max_len: an int, or (B,)
    limits (a list or a tensor)."""
    with torch.inference_mode():
        B, K, device = src.size(0), beam_size, src.device
        limit = torch.as_tensor(max_len, device=device).expand(B)
        steps = int(limit.max()) + 1
        ranks = torch.arange(2 * K, device=device)

        cache = model.init_cache(model.encode(src), src, beams=K)  # row b*K + i: beam i of b
        tokens = torch.full((B * K,), BOS_ID, dtype=torch.long, device=device)
        # Only beam 0 starts alive; the others would repeat its hypotheses.
        scores = torch.full((B, K), -math.inf, device=device)
        scores[:, 0] = 0.0
        no_tokens = torch.full((B, K, steps), PAD_ID, dtype=torch.long, device=device)
        s = Beams(torch.arange(B, device=device), limit, scores, no_tokens,
                  torch.full((B, K), -math.inf, device=device), no_tokens.clone(),
                  torch.zeros(B, dtype=torch.bool, device=device))
        out = torch.full((B, steps), PAD_ID, dtype=torch.long, device=device)

        for t in range(steps):
            B = len(s.sentence)
            logp = F.log_softmax(model.decode_step(cache, tokens).float(), dim=-1)  # (B*K, V)
            at_limit = t >= s.limit  # (B,)
            logp = _constrain(logp, at_limit.repeat_interleave(K))
            V = logp.size(-1)
            cand = (s.scores[:, :, None] + logp.view(B, K, V)).view(B, K * V)
            # 2K candidates: even if K of them end in <eos>, K remain to continue.
            top, idx = cand.topk(2 * K, dim=1)  # (B, 2K), best first
            beam, tok = idx // V, idx % V
            is_eos = tok == EOS_ID

            # An <eos> among the K best candidates finishes a hypothesis of t + 1 tokens.
            ends = is_eos[:, :K] & top[:, :K].isfinite() & ~s.done[:, None]
            normed = torch.where(ends, top[:, :K] / ((5 + t + 1) / 6) ** length_penalty, -math.inf)
            ended = s.alive.gather(1, beam[:, :K, None].expand(B, K, steps))
            s.fin_scores, keep = torch.cat([s.fin_scores, normed], dim=1).topk(K, dim=1)  # of 2K
            s.fin_tokens = torch.cat([s.fin_tokens, ended], dim=1).gather(
                1, keep[:, :, None].expand(B, K, steps))

            # The K best candidates that do not end go on, in score order.
            _, pick = torch.where(is_eos, ranks + 2 * K, ranks).topk(K, dim=1, largest=False)
            s.scores, beam, tokens = top.gather(1, pick), beam.gather(1, pick), tok.gather(1, pick)
            s.alive = s.alive.gather(1, beam[:, :, None].expand(B, K, steps))
            s.alive[:, :, t] = tokens
            cache.reorder((torch.arange(B, device=device)[:, None] * K + beam).view(-1))

            s.done |= (s.fin_scores[:, 0] >= reachable(s, length_penalty)) | at_limit
            if (t + 1) % CHECK_EVERY == 0 and bool(s.done.any()):
                # Finished sentences leave the batch: their beams cost no more steps.
                out[s.sentence[s.done]] = s.best()[s.done]
                going = (~s.done).nonzero().squeeze(1)
                if len(going) == 0:
                    return _strip(out)
                s, tokens = s.rows(going), tokens[going]
                cache.keep(going)
            tokens = tokens.view(-1)
        out[s.sentence] = s.best()
        return _strip(out)


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode: params.yaml's `evaluate:` decoding keys, plus the model's length cap."""

    method: str = "beam"  # greedy | beam
    beam_size: int = 5
    length_penalty: float = 0.6
    max_len_a: float = 1.2  # longest output: a * source tokens + b ...
    max_len_b: int = 10
    cap: int | None = None  # ... and at most cap (the model's max_len - 1)
    batch_size: int = 128
    # The settings batch_size and beam_size came from, which an out-of-memory line names
    # (shrink); empty where they were set in code (train's validation decoding).
    batch_key: str = ""
    beam_key: str = ""

    @classmethod
    def from_params(cls, ev: dict, method: str, cap: int | None, **overrides) -> DecodeConfig:
        """From an `evaluate:` section; overrides win (e.g. beam_size from the command line,
        with beam_key naming it)."""
        keys = ("beam_size", "length_penalty", "max_len_a", "max_len_b", "batch_size")
        named = {"batch_key": "evaluate.batch_size", "beam_key": "evaluate.beam_size"}
        return cls(method=method, cap=cap, **({k: ev[k] for k in keys} | named | overrides))

    def shrink(self) -> str | None:
        """What to make smaller when decoding runs out of memory: the batch, and in beam
        search the beam, since each of the batch's sentences holds beam_size hypotheses.
        None where the sizes were set in code: the command's own MEMORY_FIX applies."""
        if not self.batch_key:
            return None
        if self.method == "beam" and self.beam_size > 1:
            return (f"a smaller {self.beam_key} or {self.batch_key}: beam search holds "
                    f"{self.beam_size} x {self.batch_size} hypotheses at once")
        return f"a smaller {self.batch_key}"


def length_batches(sources: list, batch_size: int) -> list[list[int]]:
    """The indices of `sources` (id lists) in decoding batches of batch_size, longest first:
    little padding per batch, and an out-of-memory error shows at once."""
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def translate_batches(model, sources, dc: DecodeConfig, desc: str = "",
                      progress: bool = True) -> list[list[int]]:
    """Decode many sentences, batched by length; outputs come back in input order.

    sources: source id lists with <bos>/<eos> (or (source, target) pairs, whose source is used).
    """
    if dc.method not in ("greedy", "beam"):
        raise ValueError(f"unknown search method {dc.method!r}; use 'greedy' or 'beam'")
    sources = [s[0] if isinstance(s, tuple) else s for s in sources]
    device = next(model.parameters()).device
    outputs: list[list[int]] = [[] for _ in sources]
    # The bar is closed on an error too (leave=False: cleared), so the error's line starts a
    # line of its own.
    with tqdm(total=len(sources), desc=desc or dc.method, unit="sent", leave=False,
              disable=not progress) as bar, memory_fix(dc.shrink()):
        for idx in length_batches(sources, dc.batch_size):
            src = pad([sources[i] for i in idx]).to(device)
            # a list: the searches make it a tensor on the sources' device
            limits = output_limits([len(sources[i]) - 2 for i in idx], dc.max_len_a,
                                   dc.max_len_b, dc.cap)
            if dc.method == "greedy":
                hyps = greedy(model, src, limits)
            else:
                hyps = beam_search(model, src, dc.beam_size, dc.length_penalty, limits)
            for i, h in zip(idx, hyps, strict=True):
                outputs[i] = h
            bar.update(len(idx))
    return outputs
