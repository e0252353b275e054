"""`nmt bench`: training and decoding speed of both models on the same real data, one process.

Training: the same batches through both models (Adam steps), warm-up steps excluded, median
of several repeats, in target tokens per second. Decoding: the same test sentences, greedy
and beam search, in sentences per second. Ratios are scratch / baseline, so > 1 means the
scratch model is faster. On CUDA it also reports peak memory and model FLOPs utilisation.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from nmt import checkpoint
from nmt.data import Batches, collate, load_pairs
from nmt.files import write_json
from nmt.models import MODEL_NAMES, ModelConfig, build_model
from nmt.search import beam_search, greedy
from nmt.train import autocast, seed_everything, token_loss
from nmt.vocab import PAD_ID, load_codecs

log = logging.getLogger("nmt.bench")

# Dense bf16 tensor-core peaks (FLOP/s), for MFU.
BF16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in BF16_PEAK.items() if k in name), None)


def train_flops(cfg: ModelConfig, tgt_vocab_size: int, batches) -> float:
    """Model FLOPs of one pass over batches: 6 x weights touched per real token + attention."""
    d, ff = cfg.d_model, cfg.dim_feedforward
    enc = cfg.num_encoder_layers * (4 * d * d + 2 * d * ff)  # attention projections + FFN
    dec = cfg.num_decoder_layers * (8 * d * d + 2 * d * ff)  # self + cross attention + FFN
    gen = tgt_vocab_size * d
    total = 0.0
    for src, tgt in batches:
        s, t = (src != PAD_ID).sum().item(), (tgt[:, 1:] != PAD_ID).sum().item()
        S, T = src.shape[1], tgt.shape[1] - 1
        # QK^T and AV: 2 matmuls x 2 FLOPs x 3 (forward + backward) = 12 per (query, key, dim).
        attn = 12 * d * (cfg.num_encoder_layers * s * S + cfg.num_decoder_layers * t * (T + S))
        total += 6 * (enc * s + (dec + gen) * t) + attn
    return total


def time_training(model, batches, device, warmup: int, repeats: int) -> tuple[float, float]:
    """(median target tokens/s, seconds of one timed pass) over the same batches."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                           fused=device.type == "cuda")
    on_device = [(s.to(device), t.to(device)) for s, t in batches]
    tokens = sum(int((t[:, 1:] != PAD_ID).sum()) for _, t in batches)

    def step(src, tgt):
        loss, n = token_loss(model, src, tgt, device)
        opt.zero_grad(set_to_none=True)
        (loss / n).backward()
        opt.step()

    model.train()
    for src, tgt in on_device[:warmup]:
        step(src, tgt)
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for src, tgt in on_device:
            step(src, tgt)
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return tokens / seconds, seconds


@torch.inference_mode()
def time_decoding(model, src_batches, device, repeats: int, **search) -> float:
    """Median sentences per second over the same source batches."""
    model.eval()
    on_device = [s.to(device) for s in src_batches]
    n = sum(s.shape[0] for s in src_batches)

    def decode():
        for src in on_device:
            with autocast(device):
                if search["beam_size"] == 1:
                    greedy(model, src, search["max_len"])
                else:
                    beam_search(model, src, **search)
        sync(device)

    decode()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        decode()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def bench(args, params: dict) -> dict:
    from nmt.config import resolve

    r = resolve(params, args.recipe)
    b = {k: params["bench"][k] if getattr(args, k) is None else getattr(args, k)
         for k in ("steps", "warmup", "repeats", "sentences")}
    device = checkpoint.pick_device(args.device)
    src_codec, tgt_codec = load_codecs(args.vocab / args.recipe)
    cfg = ModelConfig.from_dict(r["model"])
    t = r["train"]
    train_pairs = load_pairs(args.tokenized, "train", src_codec, tgt_codec, cfg.max_len)
    batches = Batches(train_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                      shuffle=True, seed=t["seed"])
    batches = list(batches)[: b['warmup'] + b['steps']]
    warm, timed = batches[: b['warmup']], batches[b['warmup']:]
    test = load_pairs(args.tokenized, "test_2016_flickr", src_codec, tgt_codec, cfg.max_len)
    test = sorted(test[: b['sentences']], key=lambda p: len(p[0]))
    e = r["evaluate"]
    src_batches = [collate(test[i : i + e["batch_size"]])[0]
                   for i in range(0, len(test), e["batch_size"])]
    max_len = int(e["max_len_a"] * max(len(p[0]) for p in test) + e["max_len_b"])
    log.info("bench on %s: %d timed training batches (+%d warm-up), %d sentences to decode",
             device, len(timed), len(warm), len(test))

    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "recipe": args.recipe, "steps": len(timed), "sentences": len(test),
           "train": {}, "greedy": {}, "beam": {}, "peak_memory_mib": {}, "mfu": {}}
    peak = peak_flops(device)
    for name in MODEL_NAMES:
        seed_everything(0)
        model = build_model(name, cfg, len(src_codec), len(tgt_codec)).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        tok_s, seconds = time_training(model, warm + timed, device, len(warm), b['repeats'])
        out["train"][name] = round(tok_s, 1)
        if peak:
            out["mfu"][name] = round(train_flops(cfg, len(tgt_codec), timed) / seconds / peak, 4)
        out["greedy"][name] = round(time_decoding(
            model, src_batches, device, b['repeats'], beam_size=1, max_len=max_len), 2)
        out["beam"][name] = round(time_decoding(
            model, src_batches, device, b['repeats'], beam_size=e["beam_size"],
            length_penalty=e["length_penalty"], max_len=max_len), 2)
        if device.type == "cuda":
            out["peak_memory_mib"][name] = round(torch.cuda.max_memory_allocated(device) / 2**20)
        del model
    for key in ("train", "greedy", "beam"):
        out[key]["ratio"] = round(out[key]["scratch"] / out[key]["baseline"], 3)
    print_table(out)
    if args.json:
        write_json(args.json, out)
    return out


def print_table(out: dict) -> None:
    print(f"\nnmt bench: {out['device']}, recipe {out['recipe']}, {out['steps']} training steps, "
          f"{out['sentences']} sentences decoded")
    print(f"{'':26}{'baseline':>12}{'scratch':>12}{'scratch/baseline':>18}")
    for key, label in (("train", "train tokens/s"), ("greedy", "greedy sentences/s"),
                       ("beam", "beam sentences/s")):
        v = out[key]
        print(f"{label:26}{v['baseline']:>12,.1f}{v['scratch']:>12,.1f}{v['ratio']:>18.2f}")
    for key, label in (("peak_memory_mib", "peak memory MiB"), ("mfu", "MFU (bf16 peak)")):
        if out[key]:
            v = out[key]
            print(f"{label:26}{v['baseline']:>12}{v['scratch']:>12}")
