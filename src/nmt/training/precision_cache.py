"""The machine's precision measurements, kept: NMT_CACHE_DIR (default ~/.cache/nmt)/precision.json.

A sound measurement (nmt.training.precision_timing) is cached, one entry a machine (CPU model,
torch's vector kernels and version, threads, oneDNN's and MKL's ISA caps), version of the
models' code and workload (kind, model sizes, vocabularies, batch), so a fresh clone's first
run measures (seconds) and later runs, other clones included, read it (`calibration`). An
inconclusive one (a noisy model) holds INCONCLUSIVE_HOLD_SECONDS only. A file lock makes
processes that start together (DDP ranks, parallel Snakemake jobs) measure once and agree. A
damaged cache (any value of any type where a figure belongs, a folder at its path) is one
warning and a fresh measurement.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import torch

import nmt.models as models_package
from nmt.core.files import write_json
from nmt.core.runtime import cpuinfo_field
from nmt.models import MODELS
from nmt.training import precision_timing
from nmt.training.precision_timing import MIN_PAIRS, Timing, Workload

log = logging.getLogger("nmt.precision")

CACHE_ENV = "NMT_CACHE_DIR"

# An inconclusive measurement is not kept as the machine's: its entry (fp32) holds only this
# many seconds, for the processes that start with the one that measured (DDP ranks, parallel
# jobs wait for its lock, and must agree); a run that starts later measures again.
INCONCLUSIVE_HOLD_SECONDS = 300

# The cache entries this code writes and reads; entries of earlier versions (one pass of each
# precision, or the sum of the models' times: issue 58) are left in the file for their clones.
CALIBRATION_FORMAT = 2

# The environment variables that cap the instructions oneDNN and MKL use (torch's own cap,
# ATEN_CPU_CAPABILITY, shows in get_cpu_capability): a machine with them set is another kind.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


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
        timings = precision_timing.measure(workload)
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
def locked(path: Path, unusable=unkept):
    """An exclusive lock beside the file at `path` (the cache, or a precision record) while the
    block runs, so that one process measures or decides; yields whether the file can be used
    (False, with unusable(path, error)'s warning, where its folder cannot be made or locked)."""
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 - held across the yield
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError as error:
        unusable(path, error)
        yield False
        return
    try:
        yield True
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
