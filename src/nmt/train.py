"""Stage train: fit one model of one recipe; keep the best checkpoint by validation loss.

Writes results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv (one row an epoch) and
train.json (the summary the report reads), all four only when training completes. Until then
the run lives in resume.pt (nmt/resume.py): `nmt train` again continues it where it stopped,
with the numbers an uninterrupted run gives; SIGINT/SIGTERM stop after the current step.

Reading order: `train` (the stage), `setup` (what a run trains with), `start` (fresh or
resumed), `run_epochs`, `train_epoch` and `update` (the loop), `end_epoch` (validation, best,
patience), `save_state`, `average_recent`, `write_outputs`. Several processes (train.devices,
torchrun): nmt/distributed.py; the resume state's format: nmt/resume.py.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from nmt import checkpoint, distributed, resume
from nmt.data import Batches, load_pairs
from nmt.distributed import World
from nmt.errors import NmtError
from nmt.files import write_json, write_text
from nmt.models import ModelConfig, build_model
from nmt.runs import Run
from nmt.runtime import seed_everything, token_loss
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
    world: World  # this process's rank of how many (one process: 0 of 1)
    device: torch.device
    cfg: ModelConfig
    model: torch.nn.Module  # the weights
    ddp: torch.nn.Module  # the model, wrapped in DistributedDataParallel under torchrun
    step_model: torch.nn.Module  # what a training step calls: ddp, maybe compiled
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_batches: Batches
    valid_batches: Batches
    vocab_sizes: tuple[int, int]
    config: dict  # what a resume state must match (resume.config_key)
    vocab_sha256: str = ""  # the vocabulary's fingerprint, recorded in checkpoints
    saved: str = ""  # where the last resume state written or found stands
    last_save: float = field(default_factory=time.monotonic)
    validations: int = 0  # validation passes of this process (for the test hook)

    @property
    def t(self) -> dict:
        return self.params["train"]

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def resume_path(self) -> Path:
        return self.run_dir / resume.FILE

    def plan(self, epoch: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of epoch `epoch` (1-based) as (indices, real), in order:
        every world.size-th batch of the epoch's seeded order (distributed.shard)."""
        return distributed.shard(self.train_batches.indices(epoch - 1), self.world)

    @cached_property
    def updates_per_epoch(self) -> int:
        """Optimizer updates an epoch (token batches: epoch 1's count, others differ by a few)."""
        return math.ceil(len(self.plan(1)) / self.t["accumulate"])

    def save_due(self) -> bool:
        minutes = self.t["save_every_minutes"]
        return minutes > 0 and time.monotonic() - self.last_save >= 60 * minutes


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

    def where(self, tr: Trainer) -> str:
        return (f"epoch {self.epoch}, step {self.step} of "
                f"{tr.updates_per_epoch * tr.t['epochs']}")


def train(params: dict, run: Run, tokenized_dir: Path, vocab_dir: Path, run_dir: Path, *,
          restart: bool = False) -> dict:
    """Train one (recipe, model, seed) run; returns the summary also written to train.json.

    Continues a matching resume state in run_dir unless `restart`; a signal raises
    resume.Stopped.
    """
    tr = setup(params, run, tokenized_dir, vocab_dir, run_dir)
    try:
        if tr.world.main:
            check_room(tr.run_dir, tr.n_params, tr.t["average_last"])
        p = start(tr, restart)
        run_epochs(tr, p)
        if not math.isfinite(p.best_loss):
            raise NmtError(f"{run.name}: the validation loss never became finite "
                           "(fix: lower train.lr or set train.clip_grad_norm)")
        averaged = average_recent(tr, p)
        if not tr.world.main:
            return {}
        summary = write_outputs(tr, p, averaged)
        tr.resume_path.unlink(missing_ok=True)  # the stage is complete
        return summary
    except (dist.DistError, RuntimeError) as e:
        why = distributed.lost_peer(e) if tr.world.group else None
        if why is None:
            raise
        if resume.threading_main():  # torchrun SIGTERMs the survivors: let this line out first
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise NmtError(f"rank {tr.world.rank}: another training process failed or vanished "
                       f"({why}); {kept(tr)}") from None
    finally:
        distributed.leave()


def run_epochs(tr: Trainer, p: Progress) -> None:
    """Train until p.done, a resume state after every epoch; on SIGINT/SIGTERM write one
    after the current step and raise Stopped."""
    with resume.StopSignals(echo=1.0 if tr.world.group else 0.0, announce=tr.world.main) as stop:
        try:
            while not p.done(tr.t):
                if train_epoch(tr, p, stop):
                    end_epoch(tr, p)
                    save_state(tr, p)
                stop.signum = tr.world.max([stop.signum])[0]  # ranks agree
                if stop.signum:
                    raise stopped(tr, p, stop.signum)
        except KeyboardInterrupt:
            raise resume.Stopped(130, f"interrupted at once; {kept(tr)}"
                                 if tr.world.main else "") from None


def setup(params: dict, run: Run, tokenized_dir: Path, vocab_dir: Path, run_dir: Path) -> Trainer:
    """Read the data and vocabulary, build the seeded model, its optimizer and lr schedule."""
    t = params["train"]
    world, device = distributed.join(t["device"], t["devices"])
    if not world.main:  # one process reports progress
        logging.getLogger("nmt").setLevel(logging.WARNING)
    seed_everything(run.seed)  # the same initial weights on every rank
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers (optimizer) on tensor cores

    src_codec, tgt_codec = load_codecs(vocab_dir)
    cfg = ModelConfig.from_dict(params["model"])
    train_pairs = load_pairs(tokenized_dir, "train", src_codec, tgt_codec, cfg.max_len)
    valid_pairs = load_pairs(tokenized_dir, "val", src_codec, tgt_codec, cfg.max_len)
    log.info("read %d train / %d valid pairs from %s, vocab %d/%d from %s", len(train_pairs),
             len(valid_pairs), tokenized_dir, len(src_codec), len(tgt_codec), vocab_dir)

    model = build_model(run.model, cfg, len(src_codec), len(tgt_codec)).to(device)
    if world.rank:  # other dropout masks on other ranks
        torch.manual_seed(run.seed + 1_000_003 * world.rank)
    ddp = distributed.wrap(model, world, device)
    # Batch shapes vary with sentence length: compile once for dynamic shapes, not per length.
    step_model = (torch.compile(ddp, dynamic=True) if t["compile"] and device.type == "cuda"
                  else ddp)
    optimizer = torch.optim.Adam(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]),
                                 eps=t["eps"], fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s + 1, t["warmup_steps"]))
    tr = Trainer(run, params, Path(run_dir), world, device, cfg, model, ddp, step_model,
                 optimizer, scheduler,
                 Batches(train_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                         shuffle=True, seed=run.seed),
                 Batches(valid_pairs, t["batch_by"], t["batch_size"], t["max_tokens"],
                         shuffle=False),
                 (len(src_codec), len(tgt_codec)),
                 resume.config_key(params, run.name, run.seed, vocab_dir, world.size),
                 checkpoint.vocab_fingerprint(vocab_dir))
    on = f"{world.size} processes ({device.type})" if world.group else str(device)
    log.info("%s: %s parameters on %s", run.name, f"{tr.n_params:,}", on)
    return tr


def check_room(run_dir: Path, n_params: int, average_last: int) -> None:
    """The run folder must take files, and its disk the resume state and checkpoints."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=run_dir) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise NmtError(f"cannot write to {run_dir}: {e.strerror} (fix: make it writable, or "
                       "pass --results a writable folder)") from None
    # float32 copies: weights, Adam's two moments, the best weights, the averaging window.
    state = 4 * n_params * (4 + average_last)
    need = 2 * state + 2 * 4 * n_params  # the old and the new resume state, best.pt, last.pt
    here = run_dir / resume.FILE
    need -= here.stat().st_size if here.exists() else 0
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise NmtError(f"{run_dir}: {free / 1e6:.1f} MB free on its disk, training needs about "
                       f"{need / 1e6:.1f} MB for its resume state and checkpoints (fix: free "
                       "disk space, or pass --results a folder on a larger disk)")


def start(tr: Trainer, restart: bool) -> Progress:
    """A fresh Progress, or the one a matching resume state holds (weights, optimizer, lr
    schedule and random generators restored with it)."""
    path, state, why = tr.resume_path, None, ""
    if path.exists():
        state, why = (None, "--restart asks for a fresh start") if restart else resume.read(path)
    if state and state["config_hash"] != resume.config_hash(tr.config):
        changed = resume.differences(state["config"], tr.config)
        why = f"it was written with other settings (changed: {', '.join(changed[:4])})"
    tr.world.barrier()  # every rank has read the state before rank 0 moves it
    if tr.world.main:
        resume.remove_temporaries(tr.run_dir, OUTPUTS + (resume.FILE,))
        for name in OUTPUTS:  # an earlier run's outputs do not describe this one
            (tr.run_dir / name).unlink(missing_ok=True)
        if why:
            resume.set_aside(path, why)
    if not state or why:
        return Progress()
    tr.model.load_state_dict(state["model"])
    tr.optimizer.load_state_dict(state["optimizer"])
    tr.scheduler.load_state_dict(state["scheduler"])
    mine = state["ranks"][tr.world.rank]
    resume.set_rng_state(mine["rng"], tr.device)
    p = Progress(**{**state["progress"], "loss_sum": mine["loss_sum"], "tokens": mine["tokens"]})
    tr.saved = p.where(tr)
    log.info("resuming from %s (batch %d of %d of the epoch), from %s", tr.saved, p.batch,
             len(tr.plan(p.epoch)), path)
    return p


def save_state(tr: Trainer, p: Progress) -> None:
    """Write the resume state (rank 0): all it takes to continue exactly where the run stands."""
    ranks = tr.world.gather({"rng": resume.rng_state(tr.device), "loss_sum": p.loss_sum,
                             "tokens": p.tokens})
    if tr.world.main:
        resume.write(tr.resume_path, {
            "format": resume.FORMAT, "config": tr.config,
            "config_hash": resume.config_hash(tr.config), "model": cpu_copy(tr.model),
            "optimizer": tr.optimizer.state_dict(), "scheduler": tr.scheduler.state_dict(),
            "ranks": ranks, "progress": {f.name: getattr(p, f.name) for f in fields(Progress)}})
    tr.saved, tr.last_save = p.where(tr), time.monotonic()


def kept(tr: Trainer) -> str:
    """What an interrupted run leaves, and how to go on (one line's end)."""
    again = (f"`nmt train --recipe {tr.run.recipe} --model {tr.run.model} --seed {tr.run.seed}` "
             "(same options) again")
    if not tr.saved:
        return f"no resume state was written yet; {again} starts afresh"
    return (f"kept {tr.resume_path} ({tr.saved}); {again} resumes from there "
            f"({', '.join(OUTPUTS)} appear when training completes)")


def stopped(tr: Trainer, p: Progress, signum: int) -> resume.Stopped:
    name = signal.Signals(signum).name
    message = f"stopped by {name} at {p.where(tr)}; {kept(tr)}"
    return resume.Stopped(128 + signum, message if tr.world.main else "")  # rank 0 tells


def long_run_note(seconds_per_update: float, updates_per_epoch: int, epochs: int) -> str | None:
    """On CPU, a warning with the run's duration when it exceeds an hour, and how to shrink it."""
    epoch = seconds_per_update * updates_per_epoch
    if epoch * epochs <= 3600:
        return None
    return (f"on the CPU this run takes about {duration(epoch)} an epoch, "
            f"{duration(epoch * epochs)} for {epochs} epochs; for a quick run use a smaller "
            "recipe (e.g. the demo recipe: make demo) or fewer pairs (data.max_train_pairs)")


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def train_epoch(tr: Trainer, p: Progress, stop: resume.StopSignals) -> bool:
    """Train the rest of epoch p.epoch, from micro-batch p.batch of its plan on; False if a
    signal stopped it first (its resume state then written)."""
    plan, k = tr.plan(p.epoch), tr.t["accumulate"]
    total_updates = tr.updates_per_epoch * tr.t["epochs"]
    tr.model.train()
    start, first_step = time.perf_counter() - p.seconds, p.step
    session = time.perf_counter()
    loss_sum = torch.tensor(p.loss_sum, dtype=torch.float64, device=tr.device)
    tokens = torch.tensor(p.tokens, dtype=torch.long, device=tr.device)
    bar = tqdm(total=len(plan), initial=p.batch, desc=f"epoch {p.epoch}/{tr.t['epochs']}",
               unit="batch", leave=False, disable=not tr.world.main)

    def sync() -> None:  # the running sums into p (reading them waits for the GPU)
        p.loss_sum, p.tokens = loss_sum.item(), int(tokens.item())
        p.seconds = time.perf_counter() - start

    while p.batch < len(plan):
        chunk = plan[p.batch : p.batch + k]
        loss, n = update(tr, [(*tr.train_batches.batch(idx), real) for idx, real in chunk])
        loss_sum += loss
        tokens += n
        p.batch += len(chunk)
        p.step += 1
        bar.update(len(chunk))
        resume.test_hook("step", p.step)
        stop.signum, save = tr.world.max([stop.signum, int(tr.save_due())])  # ranks agree
        if stop.signum or save:
            sync()
            save_state(tr, p)
            if stop.signum:
                bar.close()
                return False
        if (p.step - first_step) % 20 == 0:  # reading the loss syncs with the GPU: now and then
            per_update = (time.perf_counter() - session) / (p.step - first_step)
            bar.set_postfix(loss=f"{(loss_sum / tokens).item():.3f}",
                            run_eta=duration(per_update * (total_updates - p.step)))
            if p.step - first_step == 20 and tr.device.type == "cpu" and tr.world.main:
                note = long_run_note(per_update, tr.updates_per_epoch, tr.t["epochs"])
                if note:
                    log.warning(note)
    bar.close()
    sync()
    return True


def update(tr: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor, bool]]):
    """One optimizer update from this rank's micro-batches (src, tgt, real); returns their
    (summed token loss, target tokens).

    The update's loss is the summed token loss of all micro-batches of all ranks divided by
    their total target tokens: accumulate k on batches of B equals one batch of k*B, and N
    ranks x accumulate k equal one process x accumulate N*k. Padding micro-batches (real
    False) weigh nothing; they only keep the ranks in step.
    """
    local = sum(int((tgt[:, 1:] != PAD_ID).sum()) for _, tgt, real in micro if real)
    total = tr.world.sum(torch.tensor(float(local), dtype=torch.float64, device=tr.device))
    tr.optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64, device=tr.device)
    for i, (src, tgt, real) in enumerate(micro):
        with distributed.no_sync(tr.ddp, skip=i < len(micro) - 1):  # all-reduce on the last
            loss, _ = token_loss(tr.step_model, src, tgt, tr.device, tr.t["label_smoothing"])
            # DDP averages gradients over ranks; x world size makes it their sum.
            ((loss if real else loss * 0.0) / total * tr.world.size).backward()
        if real:
            loss_sum += loss.detach()
    if tr.t["clip_grad_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.t["clip_grad_norm"])
    tr.optimizer.step()
    tr.scheduler.step()
    return loss_sum, local


@torch.inference_mode()
def validate(tr: Trainer) -> float:
    """Per-token cross-entropy on the validation split (no label smoothing, no dropout);
    each rank takes every world.size-th batch, the sums are all-reduced."""
    tr.model.eval()
    tr.validations += 1
    total = torch.zeros((), dtype=torch.float64, device=tr.device)
    count = torch.zeros((), dtype=torch.long, device=tr.device)
    order = tr.valid_batches.indices()[tr.world.rank :: tr.world.size]
    for i, idx in enumerate(order):
        loss, n = token_loss(tr.model, *tr.valid_batches.batch(idx), tr.device)
        total += loss
        count += n
        if i == 0:
            resume.test_hook("valid", tr.validations)
    tr.model.train()
    total, count = tr.world.sum(torch.stack([total, count.double()])).tolist()
    return total / count


def end_epoch(tr: Trainer, p: Progress) -> None:
    """Validate; record the epoch's row; keep the best weights and the averaging window."""
    valid_loss = validate(tr)
    loss_sum, tokens = tr.world.sum(torch.tensor([p.loss_sum, p.tokens], dtype=torch.float64,
                                                 device=tr.device)).tolist()
    train_loss = loss_sum / tokens
    row = {"epoch": p.epoch, "train_loss": round(train_loss, 5),
           "valid_loss": round(valid_loss, 5), "lr": tr.scheduler.get_last_lr()[0],
           "seconds": round(p.seconds, 2), "tokens_per_second": round(tokens / p.seconds)}
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
                        tgt_vocab_size=tr.vocab_sizes[1],
                        params={"model": tr.params["model"], "train": tr.t},
                        n_params=tr.n_params, seed=tr.run.seed, vocab_sha256=tr.vocab_sha256,
                        **extra)

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
