"""What a finished run writes (stage train's outputs): last.pt, best.pt, history.csv and
train.json, the last written last, as it marks a finished run."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from nmt.core import checkpoint
from nmt.core.errors import last_outputs
from nmt.core.files import write_json, write_text
from nmt.core.runtime import autocast, cpu_features, device_name, peak_memory
from nmt.training.precision import recorded
from nmt.training.state import Progress, Trainer

log = logging.getLogger("nmt.train")


def write_outputs(trainer: Trainer, progress: Progress, averaged: float | None,
                  spent: Callable[[], dict]) -> dict:
    """Write last.pt, best.pt, history.csv and train.json (last: it marks a finished run).
    `spent()`: the run's seconds by phase so far (state.spent), read once the summary's valid
    BLEU is decoded."""
    files, last, meta = trainer.paths.run, progress.history[-1], trainer.checkpoint_meta
    checkpoint.save(files.last, trainer.model, **meta, epoch=last["epoch"],
                    valid_loss=last["valid_loss"])
    trainer.model.load_state_dict(progress.best_state)
    summary = summarize(trainer, progress, averaged)  # (its greedy BLEU: the best weights)
    summary["seconds"] = where_time_went(progress, spent())
    mean_of = {"averaged": progress.best_averaged} if progress.best_averaged else {}
    with last_outputs():  # a SIGTERM from here on waits, then finds every output in place
        checkpoint.save(files.best, trainer.model, **meta, epoch=progress.best_epoch,
                        valid_loss=progress.best_loss, **mean_of)
        write_history(files.history, progress.history)
        write_json(files.summary, summary)
    log.info("wrote %s (best valid loss %.4f at epoch %s)", files.folder, progress.best_loss,
             progress.best_name)
    return summary


def summarize(trainer: Trainer, progress: Progress, averaged: float | None) -> dict:
    """train.json: what the report reads about a run."""
    run, history = trainer.run, progress.history
    return {
        "run": run.name, "recipe": run.recipe, "model": run.model, "seed": run.seed,
        "device": str(trainer.device), "params": trainer.n_params, "epochs": len(history),
        "best_epoch": progress.best_name, "best_valid_loss": round(progress.best_loss, 5),
        "averaged_valid_loss": averaged, "updates": progress.step,
        "seconds_per_epoch": round(sum(r["seconds"] for r in history) / len(history), 2),
        # the budget: training and validation passes, interruptions not counted
        # to 4 places (6 ms): a tiny run's minutes rounded to 2 were 0.0, and so was the
        # ms per update tools/precision_check.py derives from them
        "train_minutes": round((sum(r["seconds"] for r in history) + progress.valid_seconds)
                               / 60, 4),
        "tokens_per_second": round(sum(r["tokens_per_second"] for r in history) / len(history)),
        "train_pairs": len(trainer.train_batches.pairs),
        "pad_multiple": trainer.train_batches.pad_multiple,  # train.pad_multiple resolved
        "valid_bleu_greedy": valid_bleu(trainer),
        **machine_report(trainer),
        "config": trainer.checkpoint_meta["params"],  # the settings the checkpoints record
    }


def where_time_went(progress: Progress, phases: dict[str, float]) -> dict[str, float]:
    """The run's wall time (every process of it, from each one's start) beside the sum of its
    epochs (the updates, history.csv's seconds), and what else it went on: the validation
    passes, each process's start (interpreter, imports, data, model, resume state read),
    saving (the loop's own time in resume.save), the end (the averaged weights' validation,
    last.pt, the greedy valid BLEU) and the rest (logging, best.pt and this file; a killed
    process's work after its last resume state)."""
    named = {"epochs": sum(row["seconds"] for row in progress.history),
             "validation": progress.valid_seconds,
             **{phase: phases.get(phase, 0.0) for phase in ("start", "saving", "end")}}
    wall = phases["wall"]
    return {key: round(value, 2)
            for key, value in {"wall": wall, **named, "other": wall - sum(named.values())}.items()}


def valid_bleu(trainer: Trainer) -> float | None:
    """Greedy BLEU (sacreBLEU, detokenized, cased) of the model as it is (the best weights)
    on the validation split: what recipe choices are made on, never on a test set. None
    with several processes: while rank 0 decoded, another rank aborted at exit in CI
    ("terminate called without an active exception"); the search steps train in one."""
    if trainer.world.size > 1:
        return None
    # Imported here, not at module level, so that DDP ranks load what they did before.
    from sacrebleu.metrics import BLEU

    from nmt.core.decoding import DecodeConfig, translate_batches
    from nmt.core.text import read_lines

    model, codec = trainer.model.eval(), trainer.tgt_codec
    decoding = DecodeConfig("greedy", cap=trainer.checkpoint_meta["cfg"].max_len - 1)
    precision = trainer.precisions["decode"].precision  # as evaluate decodes
    with torch.inference_mode(), autocast(trainer.device, precision):
        ids = translate_batches(model, trainer.valid_batches.pairs, decoding,
                                desc="valid greedy", progress=trainer.world.main)
    hypotheses = [codec.decode(h) for h in ids]
    return round(BLEU().corpus_score(hypotheses, [read_lines(trainer.valid_references)]).score, 2)


def machine_report(trainer: Trainer) -> dict:
    """What a result needs to explain its speed and its digits: the device's name (on a CPU also
    its instruction set, runtime.cpu_features), the precision, compile on/off and its cost,
    torch's threads (on a CPU the bits of a training depend on them), the peak memory
    (runtime.peak_memory says what is measured). The compile figures are dynamo's own
    (torch._dynamo.utils, not a public API): this process's seconds compiling (forward and
    backward graphs, every recompile; a resumed run counts its own) and the graphs compiled
    (1 when dynamic shapes cover every batch, more on a recompile or a graph break). Epoch
    1's seconds include the compile time."""
    update = trainer.update
    report = {"device_name": device_name(trainer.device), **recorded(trainer.precisions),
              "compile": update.compiled, "attention_kernels": trainer.attention_kernels,
              "threads": trainer.threads}
    if trainer.device.type == "cpu":
        report |= cpu_features()
    if update.compile_failed:
        report["compile_failed"] = update.compile_failed
    if trainer.device.type == "cuda":  # CUDA graphs captured by this process (0: none)
        report["cuda_graphs"] = len(update.graphs.graphs) if update.graphs else 0
    if update.graphs_failed:
        report["cuda_graphs_failed"] = update.graphs_failed
    if update.compiled:
        from torch._dynamo.utils import compilation_time_metrics, counters

        report["compile_seconds"] = round(
            sum(compilation_time_metrics.get("_compile.compile_inner", [])), 2)
        report["compiled_graphs"] = counters["stats"]["unique_graphs"]
    return report | peak_memory(trainer.device)


def write_history(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())
