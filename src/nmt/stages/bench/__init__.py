"""`nmt bench`: training and decoding speed of the models of pipeline.models on the same real
data, one process.

The models are timed in the registry's order (nmt.models.registry: baseline, the reference,
first), each against the first. Those that take the reference's weights (scratch:
`takes_reference_weights`) hold them, under the scratch model's names, so they do the same work
as the reference; any other (the decoder-only model) its own, seeded. Decoding starts from
untrained weights, so every sentence runs to its length limit whatever the model. Training: the
same batches through every model, each an update nmt train makes (one function builds them all:
nmt.training.step.updater, with the recipe's label smoothing, clipping, Adam and lr schedule),
in target tokens per second.
Decoding: the same test sentences, greedy and beam search, in sentences per second. The
models take turns step by step (timing.py: a training update, a decoding batch, the same work
through each model, the order rotated each step), after an untimed warm-up pass; each model's
figure is its median over the repeats. Ratios are each model over the reference (> 1: it is
faster than torch.nn.Transformer), the median of the per-pair ratios; bench.json's
ratio_spread gives each ratio's interquartile range and spread, and one over MAX_RATIO_SPREAD
is said not to be trusted, in bench.json and in the printed table (table.py, which also says
how bench.json names the ratios). Training steps and decoding run in the recipe's
train.precision as nmt train and evaluate resolve it (decoding on a CPU: fp32 under `auto`),
and the steps on batches padded to train.pad_multiple as nmt train resolves it (`auto`: 8
where the steps replay as CUDA graphs); bench.json reports the multiple and the share of the
timed batches' token slots that is padding. Model FLOPs utilisation (MFU, flops.py) is the
steps' model FLOPs a second over a peak. On CUDA it also reports peak memory.

- timing.py: interleaved, the models' steps in turns, and the per-pair ratios (Paired);
- flops.py: the steps' model FLOPs and the peaks MFU is a share of;
- table.py: the printed table, and bench.json's names for the ratios.
"""

from __future__ import annotations

import argparse
import functools
import logging
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import torch

from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs, padding_fraction
from nmt.core.decoding import DecodeConfig, length_batches, translate_batches
from nmt.core.files import write_json
from nmt.core.runtime import (
    autocast,
    bound_gpu_memory,
    limit_attention_kernels,
    pick_device,
    seed_everything,
)
from nmt.models import ModelConfig, build_model, registry
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.stages.bench.flops import peak_flops, train_flops
from nmt.stages.bench.table import print_speeds, ratio_name
from nmt.stages.bench.timing import MAX_RATIO_SPREAD, interleaved, sync
from nmt.training.config import TrainConfig
from nmt.training.graphs import resolve_cuda_graphs, resolve_pad_multiple
from nmt.training.precision import recorded
from nmt.training.precision_record import recipe_choices, record_path
from nmt.training.step import Updater, updater

__all__ = ["MAX_RATIO_SPREAD", "Paths", "SpeedPlan", "bench", "bench_inputs", "interleaved",
           "make_update", "padding_share", "sync", "train_flops"]

log = logging.getLogger("nmt.bench")

def make_update(model, settings: dict, device, precision: str, graphs: bool,
                updates: int) -> Updater:
    """The update nmt train makes (nmt.training.step.updater), for the recipe's train:
    settings (Adam, lr schedule, label smoothing, clipping) in `precision`, eager or with
    `graphs` replayed as CUDA graphs; its lr schedule spans the `updates` bench makes."""
    return updater(model, TrainConfig.from_dict(settings["train"]), device,
                   precision=precision, total_updates=updates, graphs_on=graphs)


def decoder_steps(model, sources, device, dc: DecodeConfig, precision: str = "fp32") -> list:
    """Functions that each decode one batch of the sources, batched as nmt evaluate batches
    them (longest first, dc.batch_size a batch), in `precision` (as evaluate decodes:
    nmt.training.precision's choice for decoding)."""
    batches = [[sources[i] for i in idx]
               for idx in length_batches([pair[0] for pair in sources], dc.batch_size)]

    def step(batch):
        with autocast(device, precision):
            translate_batches(model, batch, dc, progress=False)

    return [functools.partial(step, batch) for batch in batches]


@dataclass(frozen=True)
class Paths:
    tokenized: Path  # data/tokenized: training batches and test sentences
    vocab: Path  # data/vocab/<recipe>
    json: Path | None = None  # results/bench.json: the figures, if given


@dataclass(frozen=True)
class SpeedPlan:
    """What to measure: params' bench: section, each value overridable on the command line."""

    recipe: str  # whose model, batches and decoding settings
    steps: int  # timed training steps a repeat
    repeats: int  # the median of this many repeats is reported
    sentences: int  # test sentences decoded
    device: str = "auto"
    # what to time: pipeline.models (timed in the registry's order); default every model
    models: tuple[str, ...] = field(default_factory=registry.names)


def bench(settings: dict, paths: Paths, plan: SpeedPlan) -> dict:
    """Stage bench: training and decoding speed of plan.models on the same data (and the
    reference's weights where they take them); prints a table, writes paths.json. settings:
    the resolved bench recipe."""
    device = pick_device(plan.device)
    bound_gpu_memory(device)
    kernels = limit_attention_kernels()
    src_codec, tgt_codec = load_codecs(paths.vocab)
    cfg = ModelConfig.from_dict(settings["model"])
    # One process, one batch a step, eager: CUDA graphs wherever train.cuda_graphs allows them.
    graphs = resolve_cuda_graphs(settings["train"]["cuda_graphs"], device, compiled=False,
                                 processes=1, accumulate=1)
    pad_multiple = resolve_pad_multiple(settings["train"]["pad_multiple"], graphs)
    timed, test, padding = bench_inputs(settings, paths.tokenized, plan, (src_codec, tgt_codec),
                                        device, pad_multiple)
    testset = settings["evaluate"]["testsets"][0]
    log.info("bench on %s: %d training batches and %d sentences, %d timed repeats each",
             device, len(timed), len(test), plan.repeats)
    models = bench_models(plan.models, cfg, len(src_codec), len(tgt_codec), device)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "recipe": plan.recipe, "testset": testset, "steps": len(timed),
           "sentences": len(test), "padding": padding, "pad_multiple": pad_multiple,
           "padding_share": padding_share(timed), "attention_kernels": kernels}
    record = record_path(Path(paths.json).parent, plan.recipe) if paths.json else None
    chosen = recipe_choices(settings, device, len(src_codec), len(tgt_codec), record)
    precision, decoding = chosen["train"].precision, chosen["decode"].precision
    out |= recorded(chosen)
    # Decoding first, from the shared untrained weights: every sentence runs to its limit.
    spreads = {}
    for method in ("greedy", "beam"):
        dc = DecodeConfig.from_params(settings["evaluate"], method, cfg.max_len - 1)
        timed_decoding = interleaved({name: decoder_steps(m, test, device, dc, decoding)
                                      for name, m in models.items()}, plan.repeats, device)
        out[method] = {name: round(len(test) / s, 2)
                       for name, s in timed_decoding.seconds.items()}
        spreads[method] = {name: timed_decoding.ratio_spread(name) for name in others(models)}
    updates = {name: make_update(m.train(), settings, device, precision, graphs,
                                 len(timed) * (plan.repeats + 1))
               for name, m in models.items()}
    speed, spreads["train"] = training_speed(updates, timed, plan.repeats, device, cfg,
                                             len(tgt_codec))
    out |= speed
    medians, out["ratio_spread"] = ratios(list(models), spreads)
    for kind, figures in medians.items():
        out[kind] |= figures
    out["ratio_max_spread"] = MAX_RATIO_SPREAD
    print_speeds(out)
    if paths.json:
        write_json(paths.json, out)
    return out


def bench_inputs(settings: dict, tokenized: Path, plan: SpeedPlan, codecs: tuple, device,
                 pad_multiple: int):
    """(the timed training batches, padded to a multiple of `pad_multiple`, the test sentences
    to decode, the padding of the recipe's training batches: padding_shares). The batches stay
    on the host, pinned for CUDA, as nmt train hands them to an update: the step copies them
    to the device without waiting, and a CUDA graph update copies them into its own buffers
    (on an H200 one handed device tensors failed its capture, and bench timed eager steps)."""
    train, max_len = settings["train"], settings["model"]["max_len"]
    train_pairs = load_pairs(tokenized, "train", *codecs, max_len)
    batches = Batches.for_training(train_pairs, train, seed=0, pad_multiple=pad_multiple,
                                   max_len=max_len)
    timed = [(src.pin_memory(), tgt.pin_memory()) if device.type == "cuda" else (src, tgt)
             for src, tgt in islice(batches, plan.steps)]
    testset = settings["evaluate"]["testsets"][0]  # the attention example and samples use it
    test = load_pairs(tokenized, testset, *codecs, max_len)[: plan.sentences]
    return timed, test, padding_shares(train_pairs, train)


def padding_shares(pairs: list, train: dict) -> dict:
    """The padded share of source and target positions over one epoch of training batches
    (seed 0): for sentence batches random and bucketed alike (train.bucket picks one), so the
    report shows what bucketing saves; for token batches (always bucketed) theirs."""
    if train["batch_by"] == "tokens":
        return {"tokens": round(padding_fraction(pairs, Batches(
            pairs, "tokens", train["batch_size"], train["max_tokens"], True).indices()), 4)}
    return {kind: round(padding_fraction(pairs, Batches(
        pairs, "sentences", train["batch_size"], 0, True, bucket=bucket).indices()), 4)
        for kind, bucket in (("random", False), ("bucketed", True))}


def padding_share(batches: list) -> dict:
    """The share of the source and of the target token slots of these (src, tgt) batches that
    hold padding: what the steps compute and throw away (bucketing and pad_multiple's cost)."""
    shares = {}
    for side, tensors in zip(("src", "tgt"), zip(*batches, strict=True), strict=True):
        pads = sum(int((tensor == PAD_ID).sum()) for tensor in tensors)
        shares[side] = round(pads / sum(tensor.numel() for tensor in tensors), 4)
    return shares


def bench_models(names: tuple[str, ...], cfg: ModelConfig, src_vocab_size: int,
                 tgt_vocab_size: int, device) -> dict:
    """The models `names` (pipeline.models), in the registry's order, each built after
    seeding; those that take the reference's weights hold the reference's (under the scratch
    model's names) where the reference is among them: the same function, so the same
    training trajectory, and the timings compare equal work."""
    models = {}
    for name in registry.in_order(names):
        seed_everything(0)
        models[name] = build_model(name, cfg, src_vocab_size, tgt_vocab_size)
    reference = registry.REFERENCE
    if reference in models:
        weights = registry.entry(reference).scratch_state_dict(models[reference].state_dict())
        for name in models:
            if name != reference and registry.entry(name).takes_reference_weights:
                models[name].load_state_dict(weights)
    return {name: m.to(device).eval() for name, m in models.items()}


def others(models: dict) -> list[str]:
    """The models timed against the first (the reference)."""
    return list(models)[1:]


def ratios(models: list[str], spreads: dict) -> tuple[dict, dict]:
    """bench.json's ratios ({kind: {name: ratio}}) and ratio_spread, named as table.py says,
    from {kind: {model: its ratio_spread}}. A ratio is the median of the per-pair ratios, not
    the quotient of the two models' medians: those each carry the load of their own moments."""
    kinds = ("train", "greedy", "beam")
    medians = {kind: {ratio_name(models, name): spreads[kind][name].pop("median")
                      for name in models[1:]} for kind in kinds}
    if len(models) < 2:  # one model: nothing to compare
        return medians, {}
    spread = {kind: spreads[kind][models[1]] for kind in kinds}
    spread |= {ratio_name(models, name): {kind: spreads[kind][name] for kind in kinds}
               for name in models[2:]}
    return medians, spread


def training_speed(updates: dict[str, Updater], timed: list, repeats: int, device,
                   cfg: ModelConfig, tgt_vocab_size: int) -> tuple[dict, dict]:
    """Training tokens/s, peak memory (CUDA) and MFU of each model's updates on the timed
    batches, in their precision, replayed as CUDA graphs where nmt train would (eagerly, with a
    warning, if a capture fails: the untimed pass finds it; `cuda_graphs` says which was
    timed). MFU is of the peak of the precision trained in (peak_flops; none without one).
    Also each per-pair ratio's spread (Paired.ratio_spread): the models take turns update by
    update, each update on the same batch through each."""
    # The peak is measured before and after the updates, the higher kept: on a shared machine
    # one calibration can catch a slow moment.
    before = peak_flops(device)
    steps = {name: [functools.partial(update, [(src, tgt, True)]) for src, tgt in timed]
             for name, update in updates.items()}
    timed_training = interleaved(steps, repeats, device)
    seconds, peak = timed_training.seconds, timed_training.peak
    precision = next(iter(updates.values())).config.precision
    tokens = sum(int((tgt[:, 1:] != PAD_ID).sum()) for _, tgt in timed)
    flops, after = train_flops(cfg, tgt_vocab_size, timed), peak_flops(device)
    peaks = {p: max(f, before[p]) for p, f in after.items()}
    top = peaks.get(precision)
    failed = {name: u.graphs_failed for name, u in updates.items() if u.graphs_failed}
    return {"train": {name: round(tokens / s, 1) for name, s in seconds.items()},
            "precision": precision,
            "peak_memory_mib": {n: round(p / 2**20) for n, p in peak.items()}
            if any(peak.values()) else {},
            "train_gflops": {n: round(flops / s / 1e9, 3) for n, s in seconds.items()},
            "peak_gflops": {p: round(f / 1e9, 1) for p, f in peaks.items()},
            "peak_measured": device.type == "cpu",
            "mfu": {n: round(flops / s / top, 4) for n, s in seconds.items()} if top else {},
            "cuda_graphs": all(u.graphs is not None for u in updates.values()),
            **({"cuda_graphs_failed": failed} if failed else {})}, {
        name: timed_training.ratio_spread(name) for name in others(updates)}


# ---- `nmt bench`: nmt.cli builds the subcommand from HELP, arguments and command -----------------

HELP = ("Train the models of pipeline.models (the reference, torch.nn.Transformer, first, and "
        "each other against it) for a fixed number of steps on the same real batches, then "
        "decode the same sentences greedily and with beam search; print a speed table.")
MEMORY_FIX = "a smaller bench.sentences, or the recipe's smaller batches"


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.data(parser)
    commandline.threads(parser)
    commandline.gpu(parser)
    parser.add_argument("--recipe", default=None, help="default: bench.recipe from params")
    parser.add_argument("--device", default="auto")
    # Defaults come from params.yaml's bench: section.
    parser.add_argument("--steps", type=int, default=None, help="timed training steps a repeat")
    parser.add_argument("--repeats", type=int, default=None,
                        help="the median of this many is shown")
    parser.add_argument("--sentences", type=int, default=None, help="test sentences to decode")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    # `nmt bench --data` and `--decoding`: benchmarks beside the stage, which nmt.cli runs
    # instead of it (its INSTEAD: nmt.commands.data_bench, nmt.commands.decoding_bench)
    parser.add_argument("--data", action="store_true",
                        help="instead: time the data stages (download, tokenize, vocab, "
                             "loading an epoch of batches) and their peak memory on a synthetic "
                             "corpus of --pairs pairs built from the Multi30k files in --raw; "
                             "--threads: tokenize's processes (default: every core)")
    parser.add_argument("--pairs", type=int, default=1_000_000,
                        help="with --data: training pairs")
    parser.add_argument("--raw", type=Path, default=commandline.RAW,
                        help="with --data: the Multi30k raw files (default: data/raw)")
    parser.add_argument("--decoding", action="store_true",
                        help="instead: decode the first test set with --run's best.pt (our "
                             "greedy and beam search) and with its CTranslate2 export in fp32 "
                             "and int8, on the same threads; speed, BLEU and agreement, written "
                             "to --json (default: results/<run>/decoding.json)")
    parser.add_argument("--run", default="published-scratch-s0", help="with --decoding: the run")
    parser.add_argument("--results", type=Path, default=commandline.RESULTS,
                        help="with --decoding: holds <run>/")
    parser.add_argument("--exports", type=Path, default=commandline.EXPORTS,
                        help="with --decoding: holds <run>/, written by nmt export")


def command(args, params: dict) -> None:
    recipe = args.recipe or params["bench"]["recipe"]
    plan = SpeedPlan(recipe=recipe, models=tuple(params["pipeline"]["models"]),
                     device=args.device, **{
        k: params["bench"][k] if getattr(args, k) is None else getattr(args, k)
        for k in ("steps", "repeats", "sentences")})
    bench(resolve(params, recipe), Paths(
        tokenized=args.tokenized, vocab=args.vocab or commandline.VOCAB / recipe,
        json=args.json), plan)
