"""How much faster do N trainings sharing one GPU go, together, than one alone? The concurrency
factors S(N) that tools/gpu/plan.py plans a GPU machine's minutes with (--concurrency FILE):

    python3 tools/gpu/concurrency.py [--counts 1,3,6,9] [--updates 200] [--steps 20]
        [--recipe published] [--model scratch] [--json FILE] [--params params.yaml]
        [--tokenized data/tokenized] [--vocab data/vocab/RECIPE]
        [--layers N] [--d-model N] [--heads N] [--ffn N] [--threads 1]

For each N of --counts, N separate processes (as Snakemake's trainings are) each build the
recipe's model and the update nmt train makes (nmt.stages.bench.make_update: Adam, the lr
schedule, label smoothing, clipping, the training precision; replayed as CUDA graphs where
train.cuda_graphs allows), make one untimed pass over --steps real training batches (the
allocator, kernel choice, a graph capture for each shape), wait for each other, then make
--updates timed updates over those batches. N x updates / (the last one's end - the first
one's start) is the aggregate updates a second; S(N) is that over N = 1's. The model size
options shrink the recipe's model (a smoke test on the CPU).

It measures under the environment it is given: tools/gpu/run.sh runs it without CUDA MPS, then
with MPS where the daemon started; `mps` records whether CUDA_MPS_PIPE_DIRECTORY was set. It
also counts the work of one update (torch.profiler: CUDA kernels and copies on a GPU, aten
operators on the CPU), eager and, where a graph was captured, graphed. Writes JSON to --json:
{"mps": bool, "device": ..., "alone_updates_per_s": x, "factors": {"1": 1.0, "3": ...},
"runs": [one per N], "kernels_per_update": {...}, ...}; prints a line per N. Exit 1 with one
line when a process fails. tests/test_tools.py runs it at tiny size on the CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import signal
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from nmt.core.codecs import load_codecs  # noqa: E402
from nmt.core.runtime import limit_attention_kernels, pick_device, seed_everything  # noqa: E402
from nmt.models import MODELS, ModelConfig, build_model  # noqa: E402
from nmt.pipeline.params import load_params  # noqa: E402
from nmt.pipeline.recipes import resolve  # noqa: E402
from nmt.stages.bench import SpeedPlan, bench_inputs, make_update, sync  # noqa: E402
from nmt.training.graphs import resolve_cuda_graphs, resolve_pad_multiple  # noqa: E402
from nmt.training.precision import choose  # noqa: E402
from nmt.training.precision_timing import Workload  # noqa: E402

WAIT_SECONDS = 300  # for the slowest process to get ready, and for each one's result
SIZE_OPTIONS = {"layers": ("num_encoder_layers", "num_decoder_layers"), "d_model": ("d_model",),
                "heads": ("nhead",), "ffn": ("dim_feedforward",)}


class Failure(Exception):
    """A measurement that cannot go on: main prints it as one line."""


def settings_of(args: argparse.Namespace) -> dict:
    """The recipe's resolved settings, its model shrunk by the size options given."""
    settings = resolve(load_params(args.params), args.recipe)
    for option, keys in SIZE_OPTIONS.items():
        if getattr(args, option) is not None:
            settings["model"].update(dict.fromkeys(keys, getattr(args, option)))
    return settings


def build_update(args: argparse.Namespace, seed: int, graphs_allowed: bool = True):
    """(the update nmt train would make for the recipe and model, its --steps batches, the
    device), on the batches of epoch 1 as bench times them."""
    settings = settings_of(args)
    device = pick_device(settings["train"]["device"])
    limit_attention_kernels()  # the route run.sh exported after the preflight, as every stage
    codecs = load_codecs(args.vocab or REPO / "data" / "vocab" / args.recipe)
    graphs = graphs_allowed and resolve_cuda_graphs(settings["train"]["cuda_graphs"], device,
                                                    compiled=False, processes=1, accumulate=1)
    pad_multiple = resolve_pad_multiple(settings["train"]["pad_multiple"], graphs)
    batches, _, _ = bench_inputs(settings, args.tokenized, SpeedPlan(args.recipe, args.steps, 1, 1),
                                 codecs, device, pad_multiple)
    precision = choose(settings["train"]["precision"], device,  # as nmt train chooses it
                       Workload.of(settings, len(codecs[0]), len(codecs[1]), "train")).precision
    seed_everything(seed)
    model = build_model(args.model, ModelConfig.from_dict(settings["model"]), len(codecs[0]),
                        len(codecs[1])).to(device).train()
    update = make_update(model, settings, device, precision, graphs,
                         updates=len(batches) + args.updates)
    return update, batches, device


def worker(index: int, args: argparse.Namespace, ready, results) -> None:
    """One training process: its update, an untimed pass over the batches, then (once every
    process is ready) --updates timed updates; puts its start and end times on `results`."""
    try:
        torch.set_num_threads(args.threads)
        update, batches, device = build_update(args, seed=index)
        for src, tgt in batches:  # untimed: allocator, kernel choice, each shape's capture
            update([(src, tgt, True)])
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        ready.wait(timeout=WAIT_SECONDS)
        start = time.monotonic()  # one clock for every process (CLOCK_MONOTONIC)
        for step in range(args.updates):
            src, tgt = batches[step % len(batches)]
            update([(src, tgt, True)])
        sync(device)
        end = time.monotonic()
        peak = (round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
                if device.type == "cuda" else None)
        results.put({"index": index, "start": start, "end": end, "peak_memory_mb": peak,
                     "graphed": update.graphs is not None and not update.graphs_failed,
                     "device": torch.cuda.get_device_name(device) if device.type == "cuda"
                     else "cpu"})
    except BaseException as error:  # noqa: BLE001 - every failure reaches the parent
        ready.abort()  # the others stop waiting for this one
        results.put({"index": index, "error": f"{type(error).__name__}: {error}".splitlines()[0]})


def at_once(args: argparse.Namespace, count: int) -> dict:
    """`count` trainings in separate processes at the same time: their aggregate updates a
    second, each one's, and the highest peak memory."""
    spawn = multiprocessing.get_context("spawn")  # fresh processes: no CUDA state inherited
    ready, results = spawn.Barrier(count), spawn.Queue()
    processes = [spawn.Process(target=worker, args=(index, args, ready, results), daemon=True)
                 for index in range(count)]
    for process in processes:
        process.start()
    rows = []
    give_up = time.monotonic() + 2 * WAIT_SECONDS
    try:
        while len(rows) < count:
            try:
                rows.append(results.get(timeout=5))
            except queue.Empty:  # a process killed (out of memory, a signal) puts nothing
                died = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if died or time.monotonic() > give_up:
                    raise Failure(f"{count} at once: a process gave no result ("
                                  + (f"it ended with exit code {died[0]}" if died else
                                     f"none in {2 * WAIT_SECONDS} s") + ")") from None
    finally:  # none outlives this call: on a failure or a SIGTERM (main) they are ended now
        for process in processes:
            process.join(timeout=30 if len(rows) == count else 0)
            if process.is_alive():
                process.terminate()
    # The first failure that is not a process stopped waiting for the failed one (its barrier)
    failed = sorted((row["error"].startswith("BrokenBarrierError"), row["index"], row["error"])
                    for row in rows if "error" in row)
    if failed:
        raise Failure(f"{count} at once: process {failed[0][1]} failed: {failed[0][2]}")
    seconds = max(row["end"] for row in rows) - min(row["start"] for row in rows)
    peaks = [row["peak_memory_mb"] for row in rows if row["peak_memory_mb"] is not None]
    return {"processes": count, "seconds": round(seconds, 6),
            "updates_per_s": round(count * args.updates / seconds, 3),
            "each_updates_per_s": [round(args.updates / (row["end"] - row["start"]), 3)
                                   for row in sorted(rows, key=lambda row: row["index"])],
            "graphed": all(row["graphed"] for row in rows),
            "peak_memory_mb": max(peaks) if peaks else None, "device": rows[0]["device"]}


def work_of_one_update(args: argparse.Namespace, graphs_allowed: bool) -> dict:
    """The kernels (CUDA) or aten operators (CPU) that one update of the first batch runs,
    after one untimed update of it (its capture, where graphed)."""
    update, batches, device = build_update(args, seed=0, graphs_allowed=graphs_allowed)
    src, tgt = batches[0]
    update([(src, tgt, True)])
    sync(device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        update([(src, tgt, True)])
        sync(device)
    if device.type == "cuda":
        count = sum(event.device_type == DeviceType.CUDA for event in prof.events())
        return {"count": count, "of": "CUDA kernels and copies",
                "graphed": update.graphs is not None and not update.graphs_failed}
    count = sum(event.name.startswith("aten::") for event in prof.events())
    return {"count": count, "of": "aten operators (nested ones too)", "graphed": False}


def kernels_per_update(args: argparse.Namespace) -> dict:
    """One update's work, eager and (where the recipe replays graphs) graphed; a profiler that
    fails costs only this figure."""
    counted = {}
    for kind, graphs_allowed in (("eager", False), ("graphed", True)):
        try:
            work = work_of_one_update(args, graphs_allowed)
        except Exception as error:  # noqa: BLE001 - a side figure: say why it is missing
            counted[kind] = {"count": None, "error": str(error).splitlines()[0][:200]}
            continue
        if work.pop("graphed") == graphs_allowed:  # "graphed" only where a graph was captured
            counted[kind] = work
    return counted


def parse_counts(text: str) -> list[int]:
    """--counts: whole numbers of 1 or more, comma-separated; 1 is always measured (first)."""
    try:
        counts = [int(word) for word in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: not whole numbers of 1 or more, e.g. 1,3,6,9")
    return sorted({1, *counts})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=parse_counts, default=[1, 3, 6, 9],
                        help="trainings at once to measure, e.g. 1,3,6,9")
    parser.add_argument("--updates", type=int, default=200, help="timed updates a process")
    parser.add_argument("--steps", type=int, default=20, help="training batches a process cycles")
    parser.add_argument("--recipe", default="published")
    parser.add_argument("--model", default="scratch", choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads a process (the "
                        "GPU profile's: 1)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--tokenized", type=Path, default=REPO / "data" / "tokenized")
    parser.add_argument("--vocab", type=Path, help="default: data/vocab/RECIPE")
    for option in SIZE_OPTIONS:
        parser.add_argument(f"--{option.replace('_', '-')}", type=int,
                            help="shrink the model (a smoke test)")
    args = parser.parse_args()
    if args.updates < 1 or args.steps < 1:
        parser.error("--updates and --steps must be 1 or more")
    # run.sh's timeout sends SIGTERM: exit through at_once's cleanup, which ends the trainings
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    runs = []
    try:
        for count in args.counts:  # 1 first: S(N) is over its updates a second
            run = at_once(args, count)
            run["factor"] = round(run["updates_per_s"] / (runs or [run])[0]["updates_per_s"], 3)
            runs.append(run)
            print(f"{count} at once: {run['updates_per_s']:.1f} updates/s in all, "
                  f"{run['factor']:.2f}x one alone ({run['seconds']:.1f} s; "
                  f"MPS {'on' if mps else 'off'})", flush=True)
    except Failure as failure:
        print(f"concurrency.py: {failure}")
        return 1
    alone = runs[0]["updates_per_s"]
    model = settings_of(args)["model"]
    report = {"mps": mps, "device": runs[0]["device"], "recipe": args.recipe,
              "model": args.model, "model_size": {key: model[key] for keys in
                                                  SIZE_OPTIONS.values() for key in keys},
              "updates": args.updates, "steps": args.steps,
              "threads": args.threads, "graphed": runs[0]["graphed"],
              "alone_updates_per_s": alone,
              "factors": {str(run["processes"]): run["factor"] for run in runs},
              "runs": runs, "kernels_per_update": kernels_per_update(args)}
    for kind, work in report["kernels_per_update"].items():
        print(f"one {kind} update: {work['count']} {work.get('of', work.get('error'))}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
