"""Stage train: fit one model of one recipe; keep the best checkpoint by validation loss.

Writes results/<recipe>-<model>/: best.pt, last.pt, history.csv (one row an epoch) and
train.json (the summary the report reads).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from nmt import checkpoint
from nmt.config import ModelConfig, NmtError, Run
from nmt.data import Batches, load_pairs
from nmt.files import write_json, write_text
from nmt.models import build_model
from nmt.runtime import corpus_loss, pick_device, seed_everything, token_loss
from nmt.vocab import load_codecs

log = logging.getLogger("nmt.train")

HISTORY_FIELDS = ("epoch", "train_loss", "valid_loss", "lr", "seconds", "tokens_per_second")


def lr_factor(step: int, warmup: int) -> float:
    """Linear warmup to the peak lr, then inverse-sqrt decay; constant when warmup is 0."""
    if warmup == 0:
        return 1.0
    step = max(step, 1)
    return min(step / warmup, math.sqrt(warmup / step))


def average_states(states: list[dict]) -> dict:
    """Element-wise mean of several state dicts (checkpoint averaging)."""
    return {k: sum(s[k].float() for s in states).div(len(states)).to(states[0][k].dtype)
            for k in states[0]}


def train(params: dict, run: Run, tokenized_dir: Path, vocab_dir: Path, run_dir: Path) -> dict:
    """Train one (recipe, model) run; returns the summary also written to train.json."""
    t, m = params["train"], params["model"]
    run_dir = Path(run_dir)
    recipe, model_name = run.recipe, run.model
    device = pick_device(t["device"])
    seed_everything(run.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers (optimizer) on tensor cores

    src_codec, tgt_codec = load_codecs(vocab_dir)
    cfg = ModelConfig.from_dict(m)
    train_pairs = load_pairs(tokenized_dir, "train", src_codec, tgt_codec, cfg.max_len)
    valid_pairs = load_pairs(tokenized_dir, "val", src_codec, tgt_codec, cfg.max_len)
    train_batches = Batches(train_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                            shuffle=True, seed=run.seed)
    valid_batches = Batches(valid_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                            shuffle=False)
    log.info("read %d train / %d valid pairs from %s, vocab %d/%d from %s", len(train_pairs),
             len(valid_pairs), tokenized_dir, len(src_codec), len(tgt_codec), vocab_dir)

    model = build_model(model_name, cfg, len(src_codec), len(tgt_codec)).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s-%s: %s parameters on %s", recipe, model_name, f"{n_params:,}", device)
    # Batch shapes vary with sentence length: compile once for dynamic shapes, not per length.
    step_model = (torch.compile(model, dynamic=True) if t["compile"] and device.type == "cuda"
                  else model)
    optimizer = torch.optim.Adam(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                 eps=t["eps"], fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s + 1, t["warmup_steps"]))

    def save(path, **extra):
        checkpoint.save(path, model, name=model_name, recipe=recipe, cfg=cfg,
                        src_vocab_size=len(src_codec), tgt_vocab_size=len(tgt_codec),
                        params={"model": m, "train": t}, n_params=n_params, **extra)

    history, recent, best, stale = [], [], math.inf, 0
    for epoch in range(1, t["epochs"] + 1):
        model.train()
        start = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        tokens = torch.zeros((), device=device, dtype=torch.long)
        bar = tqdm(train_batches, desc=f"epoch {epoch}/{t['epochs']}", unit="batch", leave=False)
        for i, (src, tgt) in enumerate(bar):
            loss, n = token_loss(step_model, src, tgt, device, t["label_smoothing"])
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            if t["clip_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t["clip_grad_norm"])
            optimizer.step()
            scheduler.step()
            loss_sum += loss.detach()
            tokens += n
            if i % 50 == 0:  # reading the loss syncs with the GPU: only now and then
                elapsed = time.perf_counter() - start
                bar.set_postfix(loss=f"{(loss_sum / tokens).item():.3f}",
                                tok_s=f"{tokens.item() / elapsed:,.0f}")
        train_loss = (loss_sum / tokens).item()
        seconds = time.perf_counter() - start  # .item() above waited for the GPU
        valid_loss = corpus_loss(model, valid_batches, device)
        row = {"epoch": epoch, "train_loss": round(train_loss, 5),
               "valid_loss": round(valid_loss, 5), "lr": scheduler.get_last_lr()[0],
               "seconds": round(seconds, 2), "tokens_per_second": round(tokens.item() / seconds)}
        history.append(row)
        log.info("epoch %d: train %.4f valid %.4f (%.1f s, %s tok/s)", epoch, train_loss,
                 valid_loss, seconds, f"{row['tokens_per_second']:,}")
        if t["average_last"]:
            recent = (recent + [{k: v.detach().cpu().clone()
                                 for k, v in model.state_dict().items()}])[-t["average_last"]:]
        if valid_loss < best:
            best, stale, best_epoch = valid_loss, 0, epoch
            save(run_dir / "best.pt", epoch=epoch, valid_loss=valid_loss)
        else:
            stale += 1
        save(run_dir / "last.pt", epoch=epoch, valid_loss=valid_loss)
        write_history(run_dir / "history.csv", history)
        if t["patience"] and stale >= t["patience"]:
            log.info("no better valid loss for %d epochs: stopping early", stale)
            break
    if not math.isfinite(best):
        raise NmtError(f"{recipe}-{model_name}: the validation loss never became finite "
                       "(fix: lower train.lr or set train.clip_grad_norm)")

    averaged = None
    if len(recent) > 1:
        model.load_state_dict(average_states(recent))
        averaged = corpus_loss(model, valid_batches, device)
        log.info("average of the last %d epochs: valid %.4f (best single %.4f)", len(recent),
                 averaged, best)
        if averaged < best:
            best, best_epoch = averaged, f"avg{len(recent)}"
            save(run_dir / "best.pt", epoch=history[-1]["epoch"], valid_loss=averaged,
                 averaged=len(recent))

    summary = {
        "run": run_dir.name, "recipe": recipe, "model": model_name, "seed": run.seed,
        "device": str(device),
        "params": n_params, "epochs": len(history), "best_epoch": best_epoch,
        "best_valid_loss": round(best, 5), "averaged_valid_loss": averaged,
        "seconds_per_epoch": round(sum(r["seconds"] for r in history) / len(history), 2),
        "tokens_per_second": round(sum(r["tokens_per_second"] for r in history) / len(history)),
        "train_pairs": len(train_pairs), "config": {"model": m, "train": t},
    }
    write_json(run_dir / "train.json", summary)
    log.info("wrote %s (best valid loss %.4f at epoch %s)", run_dir, best, best_epoch)
    return summary


def write_history(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())
