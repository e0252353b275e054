"""Timing models against each other: their steps alternated one by one, per-pair ratios.

Step i of every model does the same work. The models take turns step by step (the order
rotated each step, so each goes first as often), each step timed on its own, after an untimed
warm-up pass: load that comes and goes (other jobs, clocks) hits the steps of one round alike,
where timing one model's whole pass and then another's let a neighbour's job move a ratio 4x
(issue 58). A model's figure is its median over the repeats; a ratio, the first model's
seconds over another's, is the median of the per-step ratios, with their quartiles and spread
(the interquartile range over the median). One over MAX_RATIO_SPREAD is not to be trusted.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

# A ratio is reported as not to be trusted where the interquartile range of its per-pair ratios
# is more than this share of their median: the threshold precision.py's calibration trusts its
# ratios to (MAX_SPREAD; what this shared VM gave: docs/cpu-and-precision.md).
MAX_RATIO_SPREAD = 0.2


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Paired:
    """Models' timings, step by step: their seconds, and each other model's per-pair ratios
    against the first."""

    seconds: dict[str, float]  # each model's median over the repeats of a pass over its steps
    # per other model, per step: the first model's seconds over its seconds (its speed ratio)
    ratios: dict[str, list[float]]
    peak: dict[str, int]  # CUDA peak memory of each model's steps (bytes); 0 elsewhere

    def ratio_spread(self, name: str) -> dict:
        """Model `name`'s ratios' median, quartiles and spread (interquartile range over the
        median), and whether the spread is within MAX_RATIO_SPREAD."""
        ratios = self.ratios[name]
        median = statistics.median(ratios)
        if len(ratios) > 1:
            first, _, third = statistics.quantiles(ratios, n=4, method="inclusive")
        else:
            first = third = median
        spread = round((third - first) / median, 3)  # trusted or not as bench.json shows it
        return {"median": round(median, 3), "quartiles": [round(first, 3), round(third, 3)],
                "spread": spread, "pairs": len(ratios), "trusted": spread <= MAX_RATIO_SPREAD}


def interleaved(steps: dict[str, list], repeats: int, device,
                clock=time.perf_counter) -> Paired:
    """Models' steps (step i of each does the same work), timed in turns step by step: step i
    of each model, the order rotated each step (two models: swapped), so that load which comes
    and goes hits the steps of one round alike. Each step is timed on its own (`clock`: the
    tests plant one), on CUDA between synchronizations (a step's launch cannot overlap the
    step before); an untimed warm-up pass over all steps comes first. One model alone: its
    times, and no ratio."""
    names = list(steps)
    first, count = names[0], len(steps[names[0]])
    for name in names:  # an untimed warm-up pass: allocator, kernel selection
        for step in steps[name]:
            step()
    totals: dict[str, list[float]] = {name: [] for name in names}
    peak, ratios = {name: 0 for name in names}, {name: [] for name in names[1:]}
    for repeat in range(repeats):
        spent = {name: 0.0 for name in names}
        for index in range(count):
            turn = (repeat * count + index) % len(names)
            seconds = {}
            for name in names[turn:] + names[:turn]:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                sync(device)
                start = clock()
                steps[name][index]()
                sync(device)
                seconds[name] = clock() - start
                if device.type == "cuda":
                    peak[name] = max(peak[name], torch.cuda.max_memory_allocated(device))
            for name in names[1:]:
                ratios[name].append(seconds[first] / seconds[name])
            for name in names:
                spent[name] += seconds[name]
        for name in names:
            totals[name].append(spent[name])
    return Paired({name: statistics.median(t) for name, t in totals.items()}, ratios, peak)
