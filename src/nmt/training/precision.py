"""train.precision's `auto`: the faster of fp32 and bf16 autocast on this machine, measured.

A CPU's flags say what it can do, not what is faster on it: on a 2-core Xeon that lists
AVX512-BF16 but has no AMX, bf16 autocast made the demo's training step 0.75x as fast as fp32,
while on one with AMX it was 1.31x as fast (issue 48). So on a CPU, `auto` times the recipe's
three models at the recipe's sizes both ways, once per machine, and keeps bf16 only where it
is at least BF16_MIN_SPEEDUP as fast: fp32 is the reference, and bf16 rounds. Training times
an update (forward, loss, backward, clipping, Adam: nmt.training.step, the update train
makes); decoding times greedy search of a batch, as evaluate and train's validation decode.

The measurement is cached in NMT_CACHE_DIR (default ~/.cache/nmt)/precision.json, one entry a
machine (CPU model, torch's vector kernels and version, threads, oneDNN's and MKL's ISA caps),
version of the models' code and workload (kind, model sizes, vocabularies, batch), so a fresh
clone's first run measures (seconds) and later runs, other clones included, read it. A file
lock makes processes that start together (DDP ranks, parallel Snakemake jobs) measure once and
agree. On a CUDA GPU, `auto` is bf16 wherever the GPU has it (tensor cores). `fp32` and `bf16`
are taken as given.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
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
# bf16 is chosen where the measured time in fp32 over that in bf16 is at least this: a margin
# over a machine's noise (one calibration's ratio moved by about 0.05 between runs here).
BF16_MIN_SPEEDUP = 1.1
CACHE_ENV = "NMT_CACHE_DIR"
# A calibration batch: sentences of this many tokens (Multi30k's are 12-14 plus <bos>/<eos>),
# as many as the recipe's batch holds; random ids. Decoding: DECODE_SENTENCES of them, the same
# for train's validation and evaluate, so that one measurement serves both (and train reads no
# evaluate setting: the stage contract holds it to the keys it declares).
SENTENCE_TOKENS, DECODE_SENTENCES = 16, 64
REPEATS = 3  # timed passes of each (model, precision), after one untimed; the median is kept
DECISIVE = 3.0  # ... unless the untimed pass of one precision took this many times the other's
# The environment variables that cap the instructions oneDNN and MKL use (torch's own cap,
# ATEN_CPU_CAPABILITY, shows in get_cpu_capability): a machine with them set is another kind.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


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
        """The workload of a resolved recipe (`settings`: model and train)."""
        train, model = settings["train"], tuple(sorted(settings["model"].items()))
        if kind == "decode":
            return cls("decode", model, src_vocab, tgt_vocab, DECODE_SENTENCES)
        sentences = (train["max_tokens"] // SENTENCE_TOKENS if train["batch_by"] == "tokens"
                     else train["batch_size"])
        return cls("train", model, src_vocab, tgt_vocab, max(1, sentences),
                   train["label_smoothing"], train["clip_grad_norm"])


@dataclass(frozen=True)
class Choice:
    """The precision a run takes, and why (what train.json, evaluation.json, bench.json say)."""

    precision: str  # fp32 | bf16
    reason: str
    speedup: float | None = None  # measured: seconds in fp32 / seconds in bf16

    def record(self, prefix: str = "") -> dict:
        out = {f"{prefix}precision": self.precision, f"{prefix}precision_reason": self.reason}
        return out | ({f"{prefix}bf16_speedup": self.speedup} if self.speedup else {})


def choose(setting: str, device: torch.device, workload: Workload | None = None) -> Choice:
    """train.precision on a device for a workload (None: no measurement; fp32 on a CPU)."""
    if setting != "auto":
        return Choice(setting, f"train.precision: {setting}")
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Choice("bf16", "auto: a CUDA GPU with bf16 tensor cores")
        return Choice("fp32", "auto: a CUDA GPU without bf16")
    if device.type != "cpu" or workload is None:
        return Choice("fp32", f"auto: fp32 on {device.type} (nothing measured)")
    seconds = calibration(workload)
    speedup = round(sum(s["fp32"] for s in seconds.values())
                    / sum(s["bf16"] for s in seconds.values()), 3)
    precision = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    what = "an update" if workload.kind == "train" else "greedy decoding"
    reason = (f"auto: {what} of the recipe's models ran {speedup:.2f}x as fast in bf16 as in "
              f"fp32 on this CPU ({cpuinfo_field('model name') or 'unknown'}, "
              f"{torch.backends.cpu.get_cpu_capability()}; bf16 from {BF16_MIN_SPEEDUP}x)")
    return Choice(precision, reason, speedup)


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


def calibration(workload: Workload) -> dict:
    """{model: {precision: seconds}} of the workload on this machine: the cache's entry, or
    measured now (and cached) where there is none. A cache that cannot be kept (a read-only
    home) costs a measurement each run, with one warning, not the run."""
    path = cache_path()
    key = {"machine": machine(), "models": models_code(), "workload": jsonable(workload)}
    with locked(path) as usable:
        entries = read_cache(path) if usable else []
        found = next((e for e in entries if {k: e.get(k) for k in key} == key), None)
        if found:
            return found["seconds"]
        log.info("measuring fp32 against bf16 on this CPU (%s of %s; once, cached in %s)",
                 workload.kind, ", ".join(MODELS), path)
        seconds = measure(workload)
        measured = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            if usable:
                write_json(path, [*entries, key | {"seconds": seconds, "measured": measured}])
        except OSError as error:
            unkept(path, error)
    return seconds


def unkept(path: Path, error: OSError) -> None:
    log.warning("cannot keep precision measurements in %s (%s): measuring for this run only "
                "(fix: %s=<a writable folder>)", path.parent, error.strerror or error, CACHE_ENV)


def jsonable(workload: Workload) -> dict:
    """The workload as its cache entry holds it (JSON's lists, not tuples)."""
    return json.loads(json.dumps(asdict(workload)))


def read_cache(path: Path) -> list:
    """The cache's entries; a damaged or foreign file is measured over, with one warning."""
    if not path.exists():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(entries, list) and all(
                isinstance(e, dict) and isinstance(e.get("seconds"), dict) for e in entries):
            return entries
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    log.warning("%s is not a list of precision measurements: measuring again, and it is "
                "rewritten", path)
    return []


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


def measure(workload: Workload) -> dict:
    """Median seconds of the workload for each model in each precision, on the CPU. The two
    precisions alternate, so drift in the machine's speed hits both alike. Where the untimed
    first pass already differs DECISIVE-fold (bf16 emulated without AVX512: 10-17x slower),
    that pass is the measurement: more passes would cost minutes and decide nothing."""
    cfg = ModelConfig.from_dict(dict(workload.model))
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(4, min(workload.src_vocab, workload.tgt_vocab),
                          (workload.sentences, SENTENCE_TOKENS), generator=generator)
    seconds = {}
    for name in MODELS:
        torch.manual_seed(0)
        model = build_model(name, cfg, workload.src_vocab, workload.tgt_vocab)
        run = (update(model, batch, workload) if workload.kind == "train"
               else decode(model, batch))
        first = {precision: timed(run, precision) for precision in PRECISIONS}
        if max(first.values()) >= DECISIVE * min(first.values()):
            seconds[name] = {p: round(t, 5) for p, t in first.items()}
        else:
            times = [{p: timed(run, p) for p in PRECISIONS} for _ in range(REPEATS)]
            seconds[name] = {p: round(statistics.median(t[p] for t in times), 5)
                             for p in PRECISIONS}
        log.info("%s %s: fp32 %.0f ms, bf16 %.0f ms", name, workload.kind,
                 1e3 * seconds[name]["fp32"], 1e3 * seconds[name]["bf16"])
    return seconds


def timed(run, precision: str) -> float:
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
