"""One precision for a recipe's runs in a checkout: `train.precision: auto`'s choices, decided
once on a machine and recorded in results/precision/<recipe>.json, where every later run of
the recipe there (its trainings, evaluations, the bench, `nmt estimate`) reads them.

The machine cache (nmt.training.precision_cache) keeps measurements, not decisions: a
measurement taken beside other work can be noisy, and a noisy one is not kept, so on a busy
machine the runs of one comparison decided apart (a fresh clone's `make demo`: the baseline
trained in fp32 and scratch in bf16, and the report's first sentence named the baseline
better). Here the first run to decide records its choices, inconclusive ones (fp32) included;
later runs take them, whatever a measurement would say now. A record of another machine (its
CPU, torch's kernels, threads) is decided again, with one line. `rm
results/precision/<recipe>.json` decides again by hand. Not a declared output: neither DVC
nor Snakemake deletes it. A file lock makes runs that start together decide once.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from nmt.core.files import write_json
from nmt.training.precision import Choice, choices
from nmt.training.precision_cache import locked, machine

log = logging.getLogger("nmt.precision")

FOLDER = Path("precision")  # under results/


def record_path(results: Path, recipe: str) -> Path:
    return Path(results) / FOLDER / f"{recipe}.json"


def recipe_choices(settings: dict, device: torch.device, src_vocab: int, tgt_vocab: int,
                   record: Path | None) -> dict[str, Choice]:
    """precision.choices of a recipe (settings), decided once in the checkout (`record`) where
    they are measured: `auto` on a CPU. Elsewhere (given, a GPU, or no record) as choices
    gives them."""
    measure = lambda: choices(settings, device, src_vocab, tgt_vocab)  # noqa: E731
    if record is None or settings["train"]["precision"] != "auto" or \
            torch.device(device).type != "cpu":
        return measure()
    return decided(record, measure)


def decided(path: Path, decide: Callable[[], dict[str, Choice]]) -> dict[str, Choice]:
    """The recipe's choices ({"train", "decode"}): the record's, when it is this machine's;
    else decide() now, recorded for the recipe's later runs (where the record's folder cannot
    be written, for this run only, with one warning)."""
    with locked(path, unusable=unrecorded) as usable:
        found = read(path) if usable else None
        if found is not None and found.get("machine") == machine():
            return {kind: Choice(found[kind]["precision"],
                                 f"{found[kind]['reason']} (recorded for the recipe in {path} "
                                 f"by its first run here, {found['decided']})",
                                 found[kind].get("speedup")) for kind in ("train", "decode")}
        if found is not None:
            log.info("%s was decided on another machine (%s): deciding again here", path,
                     found.get("machine", {}).get("cpu", "unknown"))
        chosen = decide()
        if usable:
            write_json(path, {"machine": machine(),
                              "decided": datetime.now(UTC).isoformat(timespec="seconds"),
                              **{kind: {"precision": c.precision, "reason": c.reason,
                                        "speedup": c.speedup} for kind, c in chosen.items()}})
        return chosen


def unrecorded(path: Path, error: OSError) -> None:
    log.warning("cannot record the recipe's precision in %s (%s): deciding for this run only",
                path.parent, error.strerror or error)


def read(path: Path) -> dict | None:
    """The record, or None where there is none or it is damaged (one warning: decided again)."""
    if not path.exists():
        return None
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(path.read_text("utf-8"))
        if isinstance(found, dict) and isinstance(found.get("decided"), str) and all(
                isinstance(found.get(kind), dict) and found[kind].get("precision") in
                ("fp32", "bf16") and isinstance(found[kind].get("reason"), str)
                for kind in ("train", "decode")):
            return found
    log.warning("%s is damaged: deciding the recipe's precision again", path)
    return None
