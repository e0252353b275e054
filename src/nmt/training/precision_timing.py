"""Timing fp32 against bf16 autocast on this CPU: the calibration behind train.precision `auto`.

Training times an update (forward, loss, backward, clipping, Adam: nmt.training.step, the
update train makes) of each of a recipe's three models at its sizes, on a batch of at most
MAX_CALIBRATION_TOKENS; decoding times greedy search of a batch, as evaluate and train's
validation decode (`Workload`).

A measurement is trusted only when it is sound (issue 58): each model's fp32 and bf16 passes
alternate, pair by pair, and the pair's ratio (fp32 seconds over bf16 seconds, two passes a
moment apart) is what counts (`Timing`); its median over 3-5 pairs is the model's speedup, and
the interquartile range of the ratios over that median its spread. A model whose spread is
over MAX_SPREAD (other load came and went during the passes) is noisy. What is chosen from a
measurement: nmt.training.precision; where measurements are kept: nmt.training.precision_cache.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass

import torch

from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.runtime import autocast
from nmt.models import MODELS, ModelConfig, build_model
from nmt.training.step import UpdateConfig, Updater

log = logging.getLogger("nmt.precision")

PRECISIONS = ("fp32", "bf16")

# bf16 is chosen where every model's median ratio (seconds in fp32 over seconds in bf16) is at
# least this: fp32 is the reference and bf16 rounds, so it must pay clearly.
BF16_MIN_SPEEDUP = 1.1

# The calibration of each model: one untimed pass in each precision (allocator, oneDNN's kernel
# choice), then pairs of timed passes, the order within a pair swapped each time (fp32 first,
# then bf16 first) so that a machine speeding up or slowing down favours neither: MIN_PAIRS of
# them where those agree (little spread, all on one side of BF16_MIN_SPEEDUP), else PAIRS.
MIN_PAIRS, PAIRS = 3, 5

# A model's measurement is noisy where the interquartile range of its per-pair ratios is more
# than this share of their median. The single-pass calibration's ratio moved by about 0.05
# between quiet runs; on this repository's 2-core VM shared with other jobs (load 6-9), each of 6
# demo-size calibrations (3 train, 3 decode) had models at 24-275 %, per-pair ratios 0.06-12x
# (docs/cpu-and-precision.md).
MAX_SPREAD = 0.2

# A calibration update holds at most this many tokens (the demo's and tuned recipes' batch):
# a larger batch would not change which precision is faster, only cost minutes and memory
# (train.batch_size 10**9 asked 128 GB). nmt estimate scales the seconds to the recipe's batch.
MAX_CALIBRATION_TOKENS = 4096

# A calibration batch: sentences of this many tokens (Multi30k's are 12-14 plus <bos>/<eos>),
# as many as the recipe's batch holds; random ids. Decoding: DECODE_SENTENCES of them, the same
# for train's validation and evaluate, so that one measurement serves both (and train reads no
# evaluate setting: the stage contract holds it to the keys it declares).
SENTENCE_TOKENS, DECODE_SENTENCES = 16, 64


def batch_sentences(settings: dict) -> int:
    """The sentences of SENTENCE_TOKENS tokens a recipe's training batch holds."""
    train = settings["train"]
    sentences = (train["max_tokens"] // SENTENCE_TOKENS if train["batch_by"] == "tokens"
                 else train["batch_size"])
    return max(1, sentences)


@dataclass(frozen=True)
class Workload:
    """What a calibration times: the recipe's models at its sizes, training or decoding."""

    kind: str  # "train" (an update) | "decode" (greedy search of a batch)
    model: tuple  # the recipe's model: section, as sorted (key, value) pairs
    src_vocab: int
    tgt_vocab: int
    sentences: int  # a batch's sentences, each SENTENCE_TOKENS long
    label_smoothing: float = 0.0  # train: the loss's
    clip: float = 0.0  # train: clip_grad_norm

    @classmethod
    def of(cls, settings: dict, src_vocab: int, tgt_vocab: int, kind: str) -> Workload:
        """The workload of a resolved recipe (`settings`: model and train); a training batch
        of the recipe's size, at most MAX_CALIBRATION_TOKENS."""
        train, model = settings["train"], tuple(sorted(settings["model"].items()))
        if kind == "decode":
            return cls("decode", model, src_vocab, tgt_vocab, DECODE_SENTENCES)
        sentences = min(batch_sentences(settings), MAX_CALIBRATION_TOKENS // SENTENCE_TOKENS)
        return cls("train", model, src_vocab, tgt_vocab, sentences,
                   train["label_smoothing"], train["clip_grad_norm"])


@dataclass(frozen=True)
class Timing:
    """One model's calibration: (fp32 seconds, bf16 seconds) of each pair, in timed order."""

    pairs: tuple[tuple[float, float], ...]

    @property
    def ratios(self) -> list[float]:
        """Each pair's fp32 seconds over its bf16 seconds: > 1 where bf16 was faster."""
        return [fp32 / bf16 for fp32, bf16 in self.pairs]

    @property
    def speedup(self) -> float:
        """The median ratio: bf16's speed over fp32's, a moment's load cancelled pair by pair."""
        return statistics.median(self.ratios)

    @property
    def spread(self) -> float:
        """The interquartile range of the ratios over their median (0: every pair agreed)."""
        first, _, third = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return (third - first) / self.speedup

    @property
    def noisy(self) -> bool:
        return self.spread > MAX_SPREAD

    @property
    def seconds(self) -> dict[str, float]:
        """The median seconds of a pass in each precision."""
        return {precision: statistics.median(pair[index] for pair in self.pairs)
                for index, precision in enumerate(PRECISIONS)}


def measure(workload: Workload) -> dict[str, Timing]:
    """{model: Timing} of the workload on the CPU: for each model, an untimed pass in each
    precision, then pairs of timed passes that alternate (the order swapped each pair):
    MIN_PAIRS where those are settled, else PAIRS."""
    cfg = ModelConfig.from_dict(dict(workload.model))
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(4, min(workload.src_vocab, workload.tgt_vocab),
                          (workload.sentences, SENTENCE_TOKENS), generator=generator)
    timings = {}
    for name in MODELS:
        torch.manual_seed(0)
        model = build_model(name, cfg, workload.src_vocab, workload.tgt_vocab)
        run = (update(model, batch, workload) if workload.kind == "train"
               else decode(model, batch))
        for precision in PRECISIONS:  # untimed: allocator, kernel choice
            run(precision)
        pairs: list[tuple[float, float]] = []
        while len(pairs) < PAIRS and not (len(pairs) == MIN_PAIRS
                                          and settled(Timing(tuple(pairs)))):
            order = PRECISIONS if len(pairs) % 2 == 0 else PRECISIONS[::-1]
            seconds = {precision: timed(run, precision, name) for precision in order}
            pairs.append((round(seconds["fp32"], 6), round(seconds["bf16"], 6)))
        timings[name] = Timing(tuple(pairs))
        log.info("%s %s: fp32 %.0f ms, bf16 %.0f ms (medians), bf16 %.2fx as fast, spread %.0f%%",
                 name, workload.kind, 1e3 * timings[name].seconds["fp32"],
                 1e3 * timings[name].seconds["bf16"], timings[name].speedup,
                 100 * timings[name].spread)
    return timings


def settled(timing: Timing) -> bool:
    """Whether the pairs so far agree: little spread, and all on one side of the choice."""
    return not timing.noisy and (min(timing.ratios) >= BF16_MIN_SPEEDUP
                                 or max(timing.ratios) < BF16_MIN_SPEEDUP)


def timed(run, precision: str, model: str) -> float:
    """Seconds of one pass of `model`'s `run` in `precision` (the clock the tests stand in)."""
    start = time.perf_counter()
    run(precision)
    return time.perf_counter() - start


def update(model: torch.nn.Module, batch: torch.Tensor, workload: Workload):
    """A function that takes one training update of `model` on `batch` in a precision."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    updaters = {precision: Updater(model=model, optimizer=optimizer, scheduler=None,
                                   device=torch.device("cpu"), config=UpdateConfig(
                                       precision, workload.label_smoothing, workload.clip))
                for precision in PRECISIONS}

    def run(precision: str) -> None:
        updaters[precision]([(batch, batch, True)])

    return run


def decode(model: torch.nn.Module, batch: torch.Tensor):
    """A function that decodes every sentence of `batch` greedily in a precision (random
    weights: each runs to the length limit)."""
    model.eval()
    sources = batch.tolist()
    config = DecodeConfig("greedy", cap=SENTENCE_TOKENS * 2, batch_size=len(sources))

    def run(precision: str) -> None:
        with torch.inference_mode(), autocast(torch.device("cpu"), precision):
            translate_batches(model, sources, config, progress=False)

    return run
