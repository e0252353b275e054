"""train.precision's `auto`: the faster of fp32 and bf16 autocast on this machine, measured.

A CPU's flags say what it can do, not what is faster on it: on a 2-core Xeon that lists
AVX512-BF16 but has no AMX, bf16 autocast made the demo's training step 0.75x as fast as fp32,
while on one with AMX it was 1.31x as fast (issue 48). So on a CPU, `auto` times the recipe's
three models at the recipe's sizes both ways, once per machine. Training times an update
(forward, loss, backward, clipping, Adam: nmt.training.step, the update train makes) on a
batch of at most MAX_CALIBRATION_TOKENS; decoding times greedy search of a batch, as evaluate
and train's validation decode.

A measurement is trusted only when it is sound (issue 58): each model's fp32 and bf16 passes
alternate, pair by pair, and the pair's ratio (fp32 seconds over bf16 seconds, two passes a
moment apart) is what counts; its median over 3-5 pairs is the model's speedup, and the
interquartile range of the ratios over that median its spread. Where any model's spread is over
MAX_SPREAD (other load came and went during the passes), the measurement is inconclusive: the
run takes fp32, says so in its precision_reason, and nothing is cached (the next run measures
again). Otherwise bf16 is chosen only where EVERY model is at least BF16_MIN_SPEEDUP as fast in
it: a recipe's models are compared with each other, so they train in one precision, and no
model is put in bf16 by another's gain. bf16_speedup records the slowest model's speedup.

A sound measurement is cached in NMT_CACHE_DIR (default ~/.cache/nmt)/precision.json, one entry
a machine (CPU model, torch's vector kernels and version, threads, oneDNN's and MKL's ISA caps),
version of the models' code and workload (kind, model sizes, vocabularies, batch), so a fresh
clone's first run measures (seconds) and later runs, other clones included, read it. A file
lock makes processes that start together (DDP ranks, parallel Snakemake jobs) measure once and
agree. A damaged cache (any value of any type where a figure belongs, a folder at its path) is
one warning and a fresh measurement. On a CUDA GPU, `auto` is bf16 wherever the GPU has it
(tensor cores). `fp32` and `bf16` are taken as given.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

import nmt.models as models_package
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.files import write_json
from nmt.core.runtime import autocast, cpuinfo_field
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
CACHE_ENV = "NMT_CACHE_DIR"
# An inconclusive measurement is not kept as the machine's: its entry (fp32) holds only this
# many seconds, for the processes that start with the one that measured (DDP ranks, parallel
# jobs wait for its lock, and must agree); a run that starts later measures again.
INCONCLUSIVE_HOLD_SECONDS = 300
# The cache entries this code writes and reads; entries of earlier versions (one pass of each
# precision, or the sum of the models' times: issue 58) are left in the file for their clones.
CALIBRATION_FORMAT = 2
# A calibration batch: sentences of this many tokens (Multi30k's are 12-14 plus <bos>/<eos>),
# as many as the recipe's batch holds; random ids. Decoding: DECODE_SENTENCES of them, the same
# for train's validation and evaluate, so that one measurement serves both (and train reads no
# evaluate setting: the stage contract holds it to the keys it declares).
SENTENCE_TOKENS, DECODE_SENTENCES = 16, 64
# The environment variables that cap the instructions oneDNN and MKL use (torch's own cap,
# ATEN_CPU_CAPABILITY, shows in get_cpu_capability): a machine with them set is another kind.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


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


def machine() -> dict:
    """What the speed of fp32 and bf16 depends on besides the workload."""
    return {"cpu": cpuinfo_field("model name") or "unknown",
            "capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "isa_caps": {name: os.environ[name] for name in ISA_CAPS if name in os.environ}}


@functools.cache
def models_code() -> str:
    """A fingerprint of the models' source files: a changed model is measured again."""
    root = Path(models_package.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_path() -> Path:
    folder = os.environ.get(CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nmt"
    return Path(folder) / "precision.json"


def calibration(workload: Workload) -> dict[str, Timing]:
    """{model: Timing} of the workload on this machine: the cache's entry, or measured now,
    and cached where it is sound (no model noisy; a noisy one holds INCONCLUSIVE_HOLD_SECONDS,
    for the processes that wait for this one's lock, and no longer). A cache that cannot be
    kept (a read-only home, a folder at its path) costs a measurement each run, with one
    warning, not the run."""
    path = cache_path()
    key = {"calibration": CALIBRATION_FORMAT, "machine": machine(), "models": models_code(),
           "workload": jsonable(workload)}
    with locked(path) as usable:
        entries = read_cache(path) if usable else None
        same = [entry for entry in entries
                if {k: entry.get(k) for k in key} == key] if entries else []
        if same and (not same[0].get("inconclusive") or held(same[0])):
            return timings_of(same[0])
        log.info("measuring fp32 against bf16 on this CPU (%s of %s; cached in %s if sound)",
                 workload.kind, ", ".join(MODELS), path)
        timings = measure(workload)
        if entries is not None:
            others = [entry for entry in entries if entry not in same]
            try:
                write_json(path, [*others, key | entry_of(timings)])
            except OSError as error:
                unkept(path, error)
    return timings


def held(entry: dict) -> bool:
    """Whether an inconclusive entry is young enough to hold (INCONCLUSIVE_HOLD_SECONDS)."""
    age = datetime.now(UTC) - datetime.fromisoformat(entry["measured"])
    return age.total_seconds() < INCONCLUSIVE_HOLD_SECONDS


def entry_of(timings: dict[str, Timing]) -> dict:
    """A cache entry's figures: each model's pairs as timed, and (for a person, and for clones
    of earlier versions, which read it) its median seconds; an inconclusive one says so."""
    entry = {"pairs": {name: [list(pair) for pair in timing.pairs]
                       for name, timing in timings.items()},
             "seconds": {name: {p: round(s, 6) for p, s in timing.seconds.items()}
                         for name, timing in timings.items()},
             "measured": datetime.now(UTC).isoformat(timespec="seconds")}
    noisy = any(timing.noisy for timing in timings.values())
    return entry | ({"inconclusive": True} if noisy else {})


def timings_of(entry: dict) -> dict[str, Timing]:
    """The Timing of each model in a cache entry; ValueError for anything but every model's
    pairs of two positive, finite seconds (at least MIN_PAIRS of them), and for an
    inconclusive mark that is not `true` with the time it was measured."""
    if "inconclusive" in entry and not (entry["inconclusive"] is True and isinstance(
            entry.get("measured"), str) and datetime.fromisoformat(entry["measured"]).tzinfo):
        raise ValueError("an inconclusive mark without its time")
    pairs = entry.get("pairs")
    if not isinstance(pairs, dict) or set(pairs) != set(MODELS):
        raise ValueError("not a calibration of this code's models")
    timings = {}
    for name in MODELS:
        model_pairs = pairs[name]
        if not isinstance(model_pairs, list) or len(model_pairs) < MIN_PAIRS:
            raise ValueError(f"{name}: not a list of pairs")
        for pair in model_pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and all(
                    type(s) in (int, float) and math.isfinite(s) and s > 0 for s in pair)):
                raise ValueError(f"{name}: {pair!r} is not two positive numbers of seconds")
        timings[name] = Timing(tuple((float(fp32), float(bf16)) for fp32, bf16 in model_pairs))
    return timings


WARNED: set[str] = set()  # what this process has warned of: train and decode each calibrate


def warn_once(message: str) -> None:
    if message not in WARNED:
        WARNED.add(message)
        log.warning(message)


def unkept(path: Path, error: OSError) -> None:
    warn_once(f"cannot keep precision measurements in {path.parent} "
              f"({error.strerror or error}): measuring for this run only (fix: "
              f"{CACHE_ENV}=<a writable folder>)")


def jsonable(workload: Workload) -> dict:
    """The workload as its cache entry holds it (JSON's lists, not tuples)."""
    return json.loads(json.dumps(asdict(workload)))


def read_cache(path: Path) -> list | None:
    """The cache's entries of use (this code's whole ones, and other versions', for their
    clones). A damaged file (not JSON, not a list of objects, or one of this code's entries
    with a value of the wrong type) is one warning, and rewritten without the damage (the
    caller holds the lock). None, with one warning, where a folder stands at `path`."""
    if path.is_dir():
        warn_once(f"{path} is a folder, not a file of precision measurements: measuring for "
                  f"this run only (fix: remove it, or {CACHE_ENV}=<another folder>)")
        return None
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        entries = None
    if isinstance(entries, list):
        kept = [entry for entry in entries if isinstance(entry, dict) and usable_entry(entry)]
        if len(kept) == len(entries):
            return kept
        warn_once(f"{path} holds {len(entries) - len(kept)} damaged precision measurement(s): "
                  "they are dropped from it (and measured again where needed)")
    else:
        kept = []
        warn_once(f"{path} is not a list of precision measurements: measuring again, and it "
                  "is rewritten")
    try:
        write_json(path, kept)
    except OSError as error:
        unkept(path, error)
    return kept


def usable_entry(entry: dict) -> bool:
    """Whether a cache entry can stay: another version's (not read here), or a whole one."""
    if entry.get("calibration") != CALIBRATION_FORMAT:
        return "calibration" not in entry or type(entry["calibration"]) is int
    try:
        timings_of(entry)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock beside the cache at `path` while the block runs, so that one process
    measures; yields whether the cache can be used (False, with one warning, where its folder
    cannot be made or locked)."""
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the yield
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as error:
        unkept(path, error)
        yield False
        return
    try:
        yield True
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


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
