"""`nmt bench`: training and decoding speed of both models on the same real data, one process.

Both models hold the same weights (through the state-dict mapping), so they do the same work.
Training: the same batches through both models, each an update nmt train makes (one function
builds both: nmt.training.step.updater, with the recipe's label smoothing, clipping, Adam and
lr schedule), in target tokens per second.
Decoding: the same test sentences, greedy and beam search, in sentences per second. The
models alternate step by step (a training update, a decoding batch: the same work through one
model, then through the other, the order swapped each pair), after an untimed warm-up pass; each
model's figure is its median over the repeats. Ratios are scratch / baseline (> 1: the scratch
model is faster), the median of the per-pair ratios: load that comes and goes hits both steps of
a pair alike, where timing one model's whole pass and then the other's let a neighbour's job
move a ratio 4x (issue 58). bench.json's ratio_spread gives each ratio's interquartile range
and spread (that range over the median); one over MAX_RATIO_SPREAD is said not to be trusted,
in bench.json and in the printed table. Training
steps and decoding run in the recipe's train.precision as nmt train and evaluate resolve it
(decoding on a CPU: fp32 under `auto`), and the steps on batches padded to train.pad_multiple
as nmt train resolves it (`auto`: 8 where the steps replay as CUDA graphs); bench.json
reports the multiple and the share of the timed batches' token slots that is padding.
Model FLOPs utilisation (MFU) is the steps' model FLOPs a second over a peak: on CUDA the GPU's
dense bf16 peak from its data sheet; on the CPU the machine's own, measured by a short
calibration (the fastest of a few large matrix products, in fp32 and in bf16). On CUDA it also
reports peak memory.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from dataclasses import dataclass
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
from nmt.models import ModelConfig, build_model
from nmt.models.mapping import baseline_to_scratch
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.training.config import TrainConfig
from nmt.training.graphs import resolve_cuda_graphs, resolve_pad_multiple
from nmt.training.precision import choices, recorded
from nmt.training.step import Updater, updater

log = logging.getLogger("nmt.bench")

# Dense bf16 tensor-core peaks of GPUs (FLOP/s, data sheets), for MFU on CUDA.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}
# The CPU's calibration: the fastest of the products of two square matrices of this size
# (2 x 2048^3 = 17 GFLOP each: 55-70 ms in fp32 and 9-17 ms in bf16 on 2 cores with AMX)
# repeated for CALIBRATION_SECONDS, after one untimed. On this repository's 2-core VM the best
# of one calibration varied between processes: 179-322 GFLOP/s fp32, 844-2,150 bf16.
CALIBRATION_SIZE, CALIBRATION_SECONDS = 2048, 0.5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# A ratio is reported as not to be trusted where the interquartile range of its per-pair ratios
# is more than this share of their median: the threshold precision.py's calibration trusts its
# ratios to (MAX_SPREAD; what this shared VM gave: docs/cpu-and-precision.md).
MAX_RATIO_SPREAD = 0.2


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device) -> dict:
    """The peaks MFU is taken of, in FLOP/s by precision: a GPU's dense bf16 peak from its data
    sheet (none for a GPU the table lacks); on the CPU each precision's measured matmul_peak."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in BF16_PEAK.items() if k in name), None)
        return {"bf16": peak} if peak else {}
    return {precision: matmul_peak(dtype, device) for precision, dtype in DTYPES.items()}


@torch.inference_mode()
def matmul_peak(dtype: torch.dtype, device: torch.device, size: int = CALIBRATION_SIZE,
                seconds: float = CALIBRATION_SECONDS) -> float:
    """FLOP/s of the fastest product of two size x size matrices in dtype, of those `seconds`
    allow (5 at least), on this process's threads: what the machine's matrix units give."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    a @ b  # untimed: kernel selection, memory
    times: list[float] = []
    while len(times) < 5 or sum(times) < seconds:
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times)


def train_flops(cfg: ModelConfig, tgt_vocab_size: int, batches) -> float:
    """Model FLOPs of one pass over batches (forward and backward): 6 x the weights each real
    token passes through, + attention's products. A source token passes through the encoder
    and each decoder layer's cross-attention keys and values; a target token through the
    decoder's other projections, its FFNs and the generator."""
    d, ff = cfg.d_model, cfg.dim_feedforward
    per_source = (cfg.num_encoder_layers * (4 * d * d + 2 * d * ff)  # attention + FFN
                  + cfg.num_decoder_layers * 2 * d * d)  # cross-attention keys and values
    per_target = (cfg.num_decoder_layers * (6 * d * d + 2 * d * ff)  # self: 4, cross: 2 d*d
                  + tgt_vocab_size * d)  # the generator
    total = 0.0
    for src, tgt in batches:
        s, t = (src != PAD_ID).sum().item(), (tgt[:, 1:] != PAD_ID).sum().item()
        S, T = src.shape[1], tgt.shape[1] - 1
        # QK^T and AV: 2 matmuls x 2 FLOPs x 3 (forward + backward) = 12 per (query, key, dim).
        attn = 12 * d * (cfg.num_encoder_layers * s * S + cfg.num_decoder_layers * t * (T + S))
        total += 6 * (per_source * s + per_target * t) + attn
    return total


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
class Paired:
    """Two models' timings, step by step: their seconds and the per-pair ratios."""

    seconds: dict[str, float]  # each model's median over the repeats of a pass over its steps
    ratios: list[float]  # per pair: the first model's seconds over the second's (its speed ratio)
    peak: dict[str, int]  # CUDA peak memory of each model's steps (bytes); 0 elsewhere

    def ratio_spread(self) -> dict:
        """The ratios' median, quartiles and spread (interquartile range over the median), and
        whether the spread is within MAX_RATIO_SPREAD."""
        median = statistics.median(self.ratios)
        if len(self.ratios) > 1:
            first, _, third = statistics.quantiles(self.ratios, n=4, method="inclusive")
        else:
            first = third = median
        spread = round((third - first) / median, 3)  # trusted or not as bench.json shows it
        return {"median": round(median, 3), "quartiles": [round(first, 3), round(third, 3)],
                "spread": spread, "pairs": len(self.ratios),
                "trusted": spread <= MAX_RATIO_SPREAD}


def interleaved(steps: dict[str, list], repeats: int, device,
                clock=time.perf_counter) -> Paired:
    """Two models' steps (step i of each does the same work), timed alternately step by step:
    step i of one model, then of the other, the order swapped each pair, so that load which
    comes and goes (other jobs, clocks) hits both steps of a pair alike. Each step is timed on
    its own (`clock`: the tests plant one), on CUDA between synchronizations (a step's launch
    cannot overlap the step before); an untimed warm-up pass over all steps comes first."""
    names = list(steps)
    assert len(names) == 2, "interleaved times two models against each other"
    count = len(steps[names[0]])
    for name in names:  # an untimed warm-up pass: allocator, kernel selection
        for step in steps[name]:
            step()
    totals: dict[str, list[float]] = {name: [] for name in names}
    peak, ratios = {name: 0 for name in names}, []
    for repeat in range(repeats):
        spent = {name: 0.0 for name in names}
        for index in range(count):
            order = names if (repeat * count + index) % 2 == 0 else names[::-1]
            pair = {}
            for name in order:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                sync(device)
                start = clock()
                steps[name][index]()
                sync(device)
                pair[name] = clock() - start
                if device.type == "cuda":
                    peak[name] = max(peak[name], torch.cuda.max_memory_allocated(device))
            ratios.append(pair[names[0]] / pair[names[1]])
            for name in names:
                spent[name] += pair[name]
        for name in names:
            totals[name].append(spent[name])
    return Paired({name: statistics.median(t) for name, t in totals.items()}, ratios, peak)


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


def bench(settings: dict, paths: Paths, plan: SpeedPlan) -> dict:
    """Stage bench: training and decoding speed of baseline and scratch on the same weights
    and data; prints a table, writes paths.json. settings: the resolved bench recipe."""
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
    models = twin_models(cfg, len(src_codec), len(tgt_codec), device)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "recipe": plan.recipe, "testset": testset, "steps": len(timed),
           "sentences": len(test), "padding": padding, "pad_multiple": pad_multiple,
           "padding_share": padding_share(timed), "attention_kernels": kernels}
    chosen = choices(settings, device, len(src_codec), len(tgt_codec))
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
        spreads[method] = timed_decoding.ratio_spread()
    updates = {name: make_update(m.train(), settings, device, precision, graphs,
                                 len(timed) * (plan.repeats + 1))
               for name, m in models.items()}
    speed, spreads["train"] = training_speed(updates, timed, plan.repeats, device, cfg,
                                             len(tgt_codec))
    out |= speed
    # The ratios (scratch / baseline) are the per-pair medians, not the quotient of the two
    # medians above: those each carry the load of their own moments.
    for key in ("train", "greedy", "beam"):
        out[key]["ratio"] = spreads[key].pop("median")
    out["ratio_spread"] = {key: spreads[key] for key in ("train", "greedy", "beam")}
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


def twin_models(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, device) -> dict:
    """baseline and scratch holding one set of weights: the same function, so the same decoded
    lengths and the same training trajectory, and the timings compare equal work."""
    seed_everything(0)
    models = {"baseline": build_model("baseline", cfg, src_vocab_size, tgt_vocab_size)}
    models["scratch"] = build_model("scratch", cfg, src_vocab_size, tgt_vocab_size)
    models["scratch"].load_state_dict(baseline_to_scratch(models["baseline"].state_dict()))
    return {name: m.to(device).eval() for name, m in models.items()}


def training_speed(updates: dict[str, Updater], timed: list, repeats: int, device,
                   cfg: ModelConfig, tgt_vocab_size: int) -> tuple[dict, dict]:
    """Training tokens/s, peak memory (CUDA) and MFU of each model's updates on the timed
    batches, in their precision, replayed as CUDA graphs where nmt train would (eagerly, with a
    warning, if a capture fails: the untimed pass finds it; `cuda_graphs` says which was
    timed). MFU is of the peak of the precision trained in (peak_flops; none without one).
    Also the per-pair ratio's spread (Paired.ratio_spread): the models alternate update by
    update, each update on the same batch through both."""
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
            **({"cuda_graphs_failed": failed} if failed else {})}, timed_training.ratio_spread()


def print_speeds(out: dict) -> None:
    print(f"\nnmt bench: {out['device']}, recipe {out['recipe']}, {out['steps']} training steps, "
          f"{out['sentences']} sentences decoded in {out['decode_precision']}")
    print(f"{'':26}{'baseline':>12}{'scratch':>12}{'scratch/baseline':>18}   (median of "
          f"{out['ratio_spread']['train']['pairs']} update pairs; decoding: of batch pairs)")
    for key, label in (("train", "train tokens/s"), ("greedy", "greedy sentences/s"),
                       ("beam", "beam sentences/s")):
        v, spread = out[key], out["ratio_spread"][key]
        print(f"{label:26}{v['baseline']:>12,.1f}{v['scratch']:>12,.1f}{v['ratio']:>18.2f}"
              f"   quartiles {spread['quartiles'][0]:.2f}-{spread['quartiles'][1]:.2f}"
              + ("" if spread["trusted"] else
                 f", spread {spread['spread']:.1%}: NOT TRUSTED (over "
                 f"{out['ratio_max_spread']:.0%}; other load on the machine? run it again)"))
    print("padding (an epoch's batches): " + ", ".join(
        f"{kind} {share:.1%}" for kind, share in out["padding"].items()))
    print(f"padding (the timed batches, lengths a multiple of {out['pad_multiple']}): "
          f"source {out['padding_share']['src']:.1%}, target {out['padding_share']['tgt']:.1%}")
    gflops = out["train_gflops"]
    print(f"{'train GFLOP/s (' + out['precision'] + ')':26}{gflops['baseline']:>12,.1f}"
          f"{gflops['scratch']:>12,.1f}")
    if out["mfu"]:
        print(f"{'MFU':26}{out['mfu']['baseline']:>12.1%}{out['mfu']['scratch']:>12.1%}"
              f"   of {mfu_peak(out)}")
    if out["peak_memory_mib"]:
        v = out["peak_memory_mib"]
        print(f"{'peak memory MiB':26}{v['baseline']:>12}{v['scratch']:>12}")


def mfu_peak(out: dict) -> str:
    """What bench.json's MFU is a share of, in words."""
    peak = out["peak_gflops"][out["precision"]]
    kind = "measured matmul peak" if out["peak_measured"] else "data-sheet dense peak"
    return f"the {kind} in {out['precision']}, {peak:,.1f} GFLOP/s"


# ---- `nmt bench`: nmt.cli builds the subcommand from HELP, arguments and command -----------------

HELP = ("Train both models for a fixed number of steps on the same real batches, then "
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
    plan = SpeedPlan(recipe=recipe, device=args.device, **{
        k: params["bench"][k] if getattr(args, k) is None else getattr(args, k)
        for k in ("steps", "repeats", "sentences")})
    bench(resolve(params, recipe), Paths(
        tokenized=args.tokenized, vocab=args.vocab or commandline.VOCAB / recipe,
        json=args.json), plan)
