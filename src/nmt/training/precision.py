"""train.precision's `auto`: the faster of fp32 and bf16 autocast on this machine, measured.

A CPU's flags say what it can do, not what is faster on it: on a 2-core Xeon that lists
AVX512-BF16 but has no AMX, bf16 autocast made the demo's training step 0.75x as fast as fp32,
while on one with AMX it was 1.31x as fast (issue 48). So on a CPU, `auto` times the recipe's
three models at the recipe's sizes both ways, once per machine (nmt.training.precision_timing:
an update for training, greedy search for decoding; kept in nmt.training.precision_cache).

Where any model's measurement is noisy, it is inconclusive: the run takes fp32, says so in its
precision_reason, and nothing is cached (the next run measures again). Otherwise bf16 is chosen
only where EVERY model is at least BF16_MIN_SPEEDUP as fast in it: a recipe's models are
compared with each other, so they train in one precision, and no model is put in bf16 by
another's gain. bf16_speedup records the slowest model's speedup. On a CUDA GPU, `auto` is
bf16 wherever the GPU has it (tensor cores). `fp32` and `bf16` are taken as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.core.runtime import cpuinfo_field
from nmt.training.precision_cache import INCONCLUSIVE_HOLD_SECONDS, calibration
from nmt.training.precision_timing import BF16_MIN_SPEEDUP, MAX_SPREAD, Timing, Workload


@dataclass(frozen=True)
class Choice:
    """The precision a run takes, and why (what train.json, evaluation.json, bench.json say)."""

    precision: str  # fp32 | bf16
    reason: str
    speedup: float | None = None  # measured: the slowest model's median fp32 / bf16 ratio

    def record(self, prefix: str = "") -> dict:
        out = {f"{prefix}precision": self.precision, f"{prefix}precision_reason": self.reason}
        return out | ({f"{prefix}bf16_speedup": self.speedup} if self.speedup else {})


def choose(setting: str, device: torch.device, workload: Workload | None = None,
           timings: dict[str, Timing] | None = None) -> Choice:
    """train.precision on a device for a workload (None: no measurement; fp32 on a CPU);
    `timings`: the workload's calibration where the caller has it already."""
    if setting != "auto":
        return Choice(setting, f"train.precision: {setting}")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Choice("bf16", "auto: a CUDA GPU with bf16 tensor cores")
        return Choice("fp32", "auto: a CUDA GPU without bf16")
    if device.type != "cpu" or workload is None:
        return Choice("fp32", f"auto: fp32 on {device.type} (nothing measured)")
    return decided(workload, timings or calibration(workload))


def decided(workload: Workload, timings: dict[str, Timing]) -> Choice:
    """The Choice a calibration makes: fp32 where it is noisy (with why), else bf16 where every
    model is at least BF16_MIN_SPEEDUP as fast in it."""
    what = "an update" if workload.kind == "train" else "greedy decoding"
    each = ", ".join(f"{name} {timing.speedup:.2f}x (spread {timing.spread:.0%})"
                     for name, timing in timings.items())
    machine_words = (f"this CPU ({cpuinfo_field('model name') or 'unknown'}, "
                     f"{torch.backends.cpu.get_cpu_capability()})")
    noisy = [name for name, timing in timings.items() if timing.noisy]
    if noisy:
        return Choice("fp32", f"auto: fp32 for this run, as the measurement was inconclusive: "
                      f"the bf16/fp32 speed ratios of {', '.join(noisy)} varied too much from "
                      f"pair to pair (interquartile range over median above {MAX_SPREAD:.0%}: "
                      f"{each}; {what} on {machine_words}); not cached: a run that starts over "
                      f"{INCONCLUSIVE_HOLD_SECONDS // 60} minutes later measures again")
    slowest = min(timings, key=lambda name: timings[name].speedup)
    speedup = round(timings[slowest].speedup, 3)
    precision = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    return Choice(precision, f"auto: {what} ran {each} as fast in bf16 as in fp32 on "
                  f"{machine_words}; medians of alternating pairs; bf16 where every model is "
                  f"at least {BF16_MIN_SPEEDUP}x, the slowest here: {slowest}", speedup)


def choices(settings: dict, device: torch.device, src_vocab: int, tgt_vocab: int) -> dict:
    """train.precision's Choice for both kinds of a recipe's work: "train" and "decode"."""
    return {kind: choose(settings["train"]["precision"], device,
                         Workload.of(settings, src_vocab, tgt_vocab, kind))
            for kind in ("train", "decode")}


def recorded(both: dict) -> dict:
    """What train.json and bench.json say of `choices`: decoding's keys start with decode_."""
    return both["train"].record() | both["decode"].record("decode_")
