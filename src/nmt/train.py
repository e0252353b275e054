"""Stage train: fit one model of one recipe; keep the best checkpoint by validation loss.

Writes results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv (one row an epoch) and
train.json (the summary the report reads), all four only when training completes.

Reading order: `train` (the stage), `setup` (what a run trains with), `train_epoch` and `update`
(the loop), `end_epoch` (validation, best, patience), `average_recent`, `write_outputs`.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from nmt import checkpoint
from nmt.config import ModelConfig, NmtError, Run
from nmt.data import Batches, load_pairs
from nmt.files import write_json, write_text
from nmt.models import build_model
from nmt.runtime import pick_device, seed_everything, token_loss
from nmt.vocab import PAD_ID, load_codecs

log = logging.getLogger("nmt.train")

HISTORY_FIELDS = ("epoch", "train_loss", "valid_loss", "lr", "seconds", "tokens_per_second")
# Wall-clock columns: they differ between two runs of identical numbers, nothing else does.
TIMING_FIELDS = ("seconds", "tokens_per_second")
OUTPUTS = ("best.pt", "last.pt", "history.csv", "train.json")


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


def cpu_copy(model: torch.nn.Module) -> dict:
    """A detached CPU copy of the model's weights (best-so-far and averaging buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass
class Trainer:
    """What a run trains with, built once by `setup`: settings, data, model and optimizer."""

    run: Run
    params: dict  # the resolved recipe
    run_dir: Path
    device: torch.device
    cfg: ModelConfig
    model: torch.nn.Module  # the weights
    step_model: torch.nn.Module  # what a training step calls: the model, maybe compiled
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_batches: Batches
    valid_batches: Batches
    vocab_sizes: tuple[int, int]

    @property
    def t(self) -> dict:
        return self.params["train"]

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def plan(self, epoch: int) -> list[list[int]]:
        """The micro-batches (index lists) epoch `epoch` (1-based) trains on, in order."""
        return self.train_batches.indices(epoch - 1)

    def updates_per_epoch(self) -> int:
        return math.ceil(len(self.plan(1)) / self.t["accumulate"])


@dataclass
class Progress:
    """Where a run stands: the epoch loop's state, none of it in the model or optimizer."""

    epoch: int = 1  # the epoch in progress (1-based)
    batch: int = 0  # micro-batches of this epoch's plan already trained on
    step: int = 0  # optimizer updates so far (what the lr schedule counts)
    loss_sum: float = 0.0  # this epoch's summed training token loss so far
    tokens: int = 0  # ... and its target tokens
    seconds: float = 0.0  # training time spent on this epoch so far
    history: list[dict] = field(default_factory=list)  # one row a finished epoch
    best_loss: float = math.inf
    best_epoch: int | str | None = None
    best_state: dict | None = None  # the weights of the best epoch (CPU)
    stale: int = 0  # epochs since the validation loss last improved
    recent: list[dict] = field(default_factory=list)  # the last average_last epochs' weights

    def done(self, t: dict) -> bool:
        """Every epoch trained, or patience ran out."""
        return self.epoch > t["epochs"] or bool(t["patience"] and self.stale >= t["patience"])


def train(params: dict, run: Run, tokenized_dir: Path, vocab_dir: Path, run_dir: Path) -> dict:
    """Train one (recipe, model, seed) run; returns the summary also written to train.json."""
    tr = setup(params, run, tokenized_dir, vocab_dir, run_dir)
    p = Progress()
    while not p.done(tr.t):
        train_epoch(tr, p)
        end_epoch(tr, p)
    if not math.isfinite(p.best_loss):
        raise NmtError(f"{run.name}: the validation loss never became finite "
                       "(fix: lower train.lr or set train.clip_grad_norm)")
    return write_outputs(tr, p, average_recent(tr, p))


def setup(params: dict, run: Run, tokenized_dir: Path, vocab_dir: Path, run_dir: Path) -> Trainer:
    """Read the data and vocabulary, build the seeded model, its optimizer and lr schedule."""
    t = params["train"]
    device = pick_device(t["device"])
    seed_everything(run.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers (optimizer) on tensor cores

    src_codec, tgt_codec = load_codecs(vocab_dir)
    cfg = ModelConfig.from_dict(params["model"])
    train_pairs = load_pairs(tokenized_dir, "train", src_codec, tgt_codec, cfg.max_len)
    valid_pairs = load_pairs(tokenized_dir, "val", src_codec, tgt_codec, cfg.max_len)
    log.info("read %d train / %d valid pairs from %s, vocab %d/%d from %s", len(train_pairs),
             len(valid_pairs), tokenized_dir, len(src_codec), len(tgt_codec), vocab_dir)

    model = build_model(run.model, cfg, len(src_codec), len(tgt_codec)).to(device)
    # Batch shapes vary with sentence length: compile once for dynamic shapes, not per length.
    step_model = (torch.compile(model, dynamic=True) if t["compile"] and device.type == "cuda"
                  else model)
    optimizer = torch.optim.Adam(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                 eps=t["eps"], fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s + 1, t["warmup_steps"]))
    tr = Trainer(run, params, Path(run_dir), device, cfg, model, step_model, optimizer, scheduler,
                 Batches(train_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                         shuffle=True, seed=run.seed),
                 Batches(valid_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                         shuffle=False),
                 (len(src_codec), len(tgt_codec)))
    log.info("%s: %s parameters on %s", run.name, f"{tr.n_params:,}", device)
    return tr


def train_epoch(tr: Trainer, p: Progress) -> None:
    """Train the rest of epoch p.epoch, from micro-batch p.batch of its plan to the end."""
    plan, k = tr.plan(p.epoch), tr.t["accumulate"]
    tr.model.train()
    start = time.perf_counter() - p.seconds
    loss_sum = torch.tensor(p.loss_sum, dtype=torch.float64, device=tr.device)
    tokens = torch.tensor(p.tokens, dtype=torch.long, device=tr.device)
    bar = tqdm(total=len(plan), initial=p.batch, desc=f"epoch {p.epoch}/{tr.t['epochs']}",
               unit="batch", leave=False)
    while p.batch < len(plan):
        group = plan[p.batch : p.batch + k]
        loss, n = update(tr, [tr.train_batches.batch(idx) for idx in group])
        loss_sum += loss
        tokens += n
        p.batch += len(group)
        p.step += 1
        bar.update(len(group))
        if p.step % 50 == 0:  # reading the loss syncs with the GPU: only now and then
            bar.set_postfix(loss=f"{(loss_sum / tokens).item():.3f}")
    bar.close()
    p.loss_sum, p.tokens = loss_sum.item(), int(tokens.item())
    p.seconds = time.perf_counter() - start  # .item() above waited for the GPU


def update(tr: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor]]):
    """One optimizer update from micro-batches; returns their (summed token loss, tokens).

    The update's loss is the summed token loss of all its micro-batches divided by their total
    target tokens, so accumulate k on batches of B equals one batch of k*B.
    """
    total = sum(int((tgt[:, 1:] != PAD_ID).sum()) for _, tgt in micro)
    tr.optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64, device=tr.device)
    for src, tgt in micro:
        loss, _ = token_loss(tr.step_model, src, tgt, tr.device, tr.t["label_smoothing"])
        (loss / total).backward()
        loss_sum += loss.detach()
    if tr.t["clip_grad_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.t["clip_grad_norm"])
    tr.optimizer.step()
    tr.scheduler.step()
    return loss_sum, total


@torch.inference_mode()
def validate(tr: Trainer) -> float:
    """Per-token cross-entropy on the validation split (no label smoothing, no dropout)."""
    tr.model.eval()
    total = torch.zeros((), dtype=torch.float64, device=tr.device)
    count = 0
    for idx in tr.valid_batches.indices():
        src, tgt = tr.valid_batches.batch(idx)
        loss, n = token_loss(tr.model, src, tgt, tr.device)
        total += loss
        count += int(n)
    tr.model.train()
    return total.item() / count


def end_epoch(tr: Trainer, p: Progress) -> None:
    """Validate; record the epoch's row; keep the best weights and the averaging window."""
    valid_loss = validate(tr)
    train_loss = p.loss_sum / p.tokens
    row = {"epoch": p.epoch, "train_loss": round(train_loss, 5),
           "valid_loss": round(valid_loss, 5), "lr": tr.scheduler.get_last_lr()[0],
           "seconds": round(p.seconds, 2), "tokens_per_second": round(p.tokens / p.seconds)}
    p.history.append(row)
    log.info("epoch %d: train %.4f valid %.4f (%.1f s, %s tok/s)", p.epoch, train_loss,
             valid_loss, p.seconds, f"{row['tokens_per_second']:,}")
    if tr.t["average_last"]:
        p.recent = (p.recent + [cpu_copy(tr.model)])[-tr.t["average_last"]:]
    if valid_loss < p.best_loss:
        p.best_loss, p.best_epoch, p.best_state, p.stale = valid_loss, p.epoch, cpu_copy(
            tr.model), 0
    else:
        p.stale += 1
        if tr.t["patience"] and p.stale >= tr.t["patience"]:
            log.info("no better valid loss for %d epochs: stopping early", p.stale)
    p.epoch, p.batch, p.loss_sum, p.tokens, p.seconds = p.epoch + 1, 0, 0.0, 0, 0.0


def average_recent(tr: Trainer, p: Progress) -> float | None:
    """Validate the mean of the last average_last epochs' weights; it becomes best if better."""
    if len(p.recent) < 2:
        return None
    trained = cpu_copy(tr.model)
    tr.model.load_state_dict(average_states(p.recent))
    averaged = validate(tr)
    log.info("average of the last %d epochs: valid %.4f (best single %.4f)", len(p.recent),
             averaged, p.best_loss)
    if averaged < p.best_loss:
        p.best_loss, p.best_epoch, p.best_state = averaged, f"avg{len(p.recent)}", cpu_copy(
            tr.model)
    tr.model.load_state_dict(trained)
    return averaged


def write_outputs(tr: Trainer, p: Progress, averaged: float | None) -> dict:
    """Write last.pt, best.pt, history.csv and train.json (last: it marks a finished run)."""
    def save(name, **extra):
        checkpoint.save(tr.run_dir / name, tr.model, name=tr.run.model, recipe=tr.run.recipe,
                        cfg=tr.cfg, src_vocab_size=tr.vocab_sizes[0],
                        tgt_vocab_size=tr.vocab_sizes[1], params=tr.params,
                        n_params=tr.n_params, **extra)

    last = p.history[-1]
    save("last.pt", epoch=last["epoch"], valid_loss=last["valid_loss"])
    tr.model.load_state_dict(p.best_state)
    if isinstance(p.best_epoch, str):  # an average of the last epochs won
        save("best.pt", epoch=last["epoch"], valid_loss=p.best_loss, averaged=len(p.recent))
    else:
        save("best.pt", epoch=p.best_epoch, valid_loss=p.best_loss)
    write_history(tr.run_dir / "history.csv", p.history)
    summary = summarize(tr, p, averaged)
    write_json(tr.run_dir / "train.json", summary)
    log.info("wrote %s (best valid loss %.4f at epoch %s)", tr.run_dir, p.best_loss, p.best_epoch)
    return summary


def summarize(tr: Trainer, p: Progress, averaged: float | None) -> dict:
    """train.json: what the report reads about a run."""
    h = p.history
    return {
        "run": tr.run.name, "recipe": tr.run.recipe, "model": tr.run.model, "seed": tr.run.seed,
        "device": str(tr.device), "params": tr.n_params, "epochs": len(h),
        "best_epoch": p.best_epoch, "best_valid_loss": round(p.best_loss, 5),
        "averaged_valid_loss": averaged, "updates": p.step,
        "seconds_per_epoch": round(sum(r["seconds"] for r in h) / len(h), 2),
        "tokens_per_second": round(sum(r["tokens_per_second"] for r in h) / len(h)),
        "train_pairs": len(tr.train_batches.pairs),
        "config": {"model": tr.params["model"], "train": tr.t},
    }


def write_history(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())
