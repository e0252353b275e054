"""Stage train's work: fit one model of one recipe; keep the best checkpoint by validation loss.

Writes results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv (one row an epoch) and
train.json (the summary the report reads), all four only when training completes. Until then
the run lives in resume.pt (nmt.core.resume): `nmt train` again continues it where it stopped,
with the numbers an uninterrupted run gives; SIGINT/SIGTERM stop after the current step.

Reading order: `train` (the stage), `fit` (the loop, on one screen), then its steps in the
order they run: `setup`, `resume_or_start`, `update`, `end_epoch` (with `validation_loss`),
`save_state`, `finish` (averaging the last epochs, writing the outputs). `TrainConfig` is the
train: section of params.yaml, `Paths` where a run reads and writes. Several processes
(train.devices, torchrun): nmt.core.distributed; the resume state's format: nmt.core.resume.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
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

from nmt.core import checkpoint, distributed, faults, resume
from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.distributed import World
from nmt.core.errors import FULL, DiskFull, NmtError, last_outputs
from nmt.core.files import make_folder, write_json, write_text
from nmt.core.graphs import (
    CaptureFailed,
    GraphedUpdates,
    capturable_adam,
    resolve_cuda_graphs,
    resolve_pad_multiple,
    update_body,
)
from nmt.core.loss import corpus_loss, token_loss
from nmt.core.precision import Choice, choices, recorded
from nmt.core.runs import Run, RunFiles
from nmt.core.runtime import (
    autocast,
    bound_gpu_memory,
    cpu_features,
    device_name,
    limit_attention_kernels,
    peak_memory,
    resolve_compile,
    seed_everything,
)
from nmt.models import ModelConfig, build_model

log = logging.getLogger("nmt.train")

HISTORY_FIELDS = ("epoch", "train_loss", "valid_loss", "lr", "seconds", "tokens_per_second")
# Wall-clock columns: they differ between two runs of identical numbers, nothing else does.
TIMING_FIELDS = ("seconds", "tokens_per_second")
SHOW_EVERY = 20  # updates between progress-bar refreshes (reading the loss waits for the GPU)


@dataclass(frozen=True)
class TrainConfig:
    """params.yaml's train: section. Its schema (workflow/schemas/params.schema.yaml) checks
    the values before any stage runs; nothing here checks them again."""

    epochs: int
    batch_by: str  # sentences: batch_size sentences a batch; tokens: up to max_tokens a batch
    batch_size: int
    bucket: bool  # sentences: similar lengths share a batch (little padding); tokens always do
    max_tokens: int
    lr: float  # the peak learning rate
    betas: tuple[float, float]  # Adam's
    eps: float  # Adam's
    max_updates: int  # 0: `epochs` epochs; else exactly this many updates (the last epoch cut)
    warmup_steps: int  # linear warmup over these updates (0: none)
    schedule: str  # after warmup: inverse_sqrt (0 warmup: constant), or linear/cosine to zero
    label_smoothing: float
    clip_grad_norm: float  # 0: off
    average_last: int  # 0: off; else also validate the mean of the last N epochs' weights
    patience: int  # 0: every epoch; else stop after N epochs without a better valid loss
    device: str  # auto (CUDA when present), cpu, cuda[:N]
    precision: str  # auto (bf16 where the device has it natively), bf16 (autocast), fp32
    compile: bool | str  # auto (off: it cost more than it saved), true, false: torch.compile
    cuda_graphs: bool | str  # auto (CUDA, eager, 1 process, accumulate 1), false: nmt.core.graphs
    # batch lengths padded up to a multiple of this (1: off); auto: 8 where updates replay as
    # CUDA graphs, else 1 (nmt.core.graphs.resolve_pad_multiple)
    pad_multiple: int | str
    accumulate: int  # micro-batches an optimizer update (gradient accumulation)
    devices: int  # processes one run trains on (DDP under torchrun)
    save_every_minutes: float  # 0: a resume state every epoch; else also every M minutes

    @classmethod
    def from_dict(cls, section: dict) -> TrainConfig:
        """From the train: section of a resolved recipe."""
        values = {f.name: section[f.name] for f in fields(cls)}
        return cls(**{**values, "betas": tuple(values["betas"])})


@dataclass(frozen=True)
class Paths:
    """Where a run reads and writes."""

    tokenized: Path  # data/tokenized
    vocab: Path  # the recipe's vocabulary folder: data/vocab/<recipe>
    run: RunFiles  # results/<recipe>-<model>-s<seed>/, whose name is the run's


def lr_factor(step: int, warmup: int, schedule: str = "inverse_sqrt", total: int = 0) -> float:
    """The lr of update `step` (1-based) as a fraction of the peak: a linear warmup over
    `warmup` updates, then inverse_sqrt decay (constant when warmup is 0), or a linear or
    cosine decay that reaches zero after update `total`."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(warmup / step) if warmup else 1.0
    left = max(total - step, 0) / max(total - warmup, 1)  # 1 at the peak, 0 at the end
    return left if schedule == "linear" else 0.5 * (1 - math.cos(math.pi * left))


def average_states(states: list[dict]) -> dict:
    """Element-wise mean of several state dicts (checkpoint averaging)."""
    return {k: sum(s[k].float() for s in states).div(len(states)).to(states[0][k].dtype)
            for k in states[0]}


def cpu_copy(model: torch.nn.Module) -> dict:
    """A detached CPU copy of the model's weights (best-so-far and averaging buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass(kw_only=True)
class Trainer:
    """What a run trains with, built once by `setup`: settings, places, data, model, optimizer."""

    config: TrainConfig
    paths: Paths
    world: World  # this process's rank of how many (one process: 0 of 1)
    device: torch.device
    # train.precision on the device for "train" (an update) and "decode" (the validation
    # BLEU, as evaluate decodes): which precision each runs in, and why (nmt.core.precision)
    precisions: dict[str, Choice]
    model: torch.nn.Module  # the weights: what is validated, clipped and saved
    # What an update calls: the model, in DistributedDataParallel under torchrun, maybe
    # compiled (distributed.no_sync finds the DDP wrapper inside it)
    step_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None  # set once the Trainer knows its updates
    train_batches: Batches
    valid_batches: Batches
    valid_references: Path  # the validation split's raw target lines (for its BLEU)
    tgt_codec: object  # ids -> detokenized target text (nmt.core.codecs), for the validation BLEU
    # What best.pt and last.pt record besides the weights (checkpoint.save's keywords): the
    # model's name, config and vocabulary sizes, the model and train settings, the seed, ...
    checkpoint_meta: dict
    resume_key: dict  # what a resume state must match (resume.config_key)
    saved: str = ""  # where the last resume state written or found stands
    last_save: float = field(default_factory=time.monotonic)
    validations: int = 0  # validation passes of this process (a fault point counts them)
    compile_failed: str = ""  # why compiling failed, when this run fell back to eager
    graphs: GraphedUpdates | None = None  # updates replayed as CUDA graphs (train.cuda_graphs)
    graphs_failed: str = ""  # why a capture failed, when this run fell back to eager updates
    attention_kernels: str = "any"  # the kernels NMT_ATTENTION_KERNELS allows (runtime)

    @property
    def precision(self) -> str:
        """bf16 or fp32: what an update runs in."""
        return self.precisions["train"].precision

    @property
    def compiled(self) -> bool:
        """Whether training steps run compiled (not after a failed compile fell back)."""
        return isinstance(self.step_model, torch._dynamo.eval_frame.OptimizedModule)

    @property
    def run(self) -> Run:
        return Run.parse(self.paths.run.folder.name)

    @property
    def n_params(self) -> int:
        return self.checkpoint_meta["n_params"]

    def plan(self, epoch: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of epoch `epoch` (1-based) as (indices, real), in order:
        every world.size-th batch of the epoch's seeded order (distributed.shard)."""
        return distributed.shard(self.train_batches.indices(epoch - 1), self.world)

    @cached_property
    def updates_per_epoch(self) -> int:
        """Optimizer updates an epoch (token batches: epoch 1's count, others differ by a few)."""
        return math.ceil(len(self.plan(1)) / self.config.accumulate)

    @property
    def total_updates(self) -> int:
        """The run's optimizer updates: train.max_updates, else `epochs` full epochs."""
        return self.config.max_updates or self.updates_per_epoch * self.config.epochs

    @property
    def epochs(self) -> int:
        """The epochs the run trains (with max_updates: the last one cut short)."""
        return math.ceil(self.total_updates / self.updates_per_epoch)

    def save_due(self) -> bool:
        minutes = self.config.save_every_minutes
        return minutes > 0 and time.monotonic() - self.last_save >= 60 * minutes


@dataclass
class Progress:
    """Where a run stands: the loop's state, none of it in the model or optimizer (the resume
    state holds it as a dict)."""

    epoch: int = 1  # the epoch in progress (1-based)
    batch: int = 0  # micro-batches of this epoch's plan already trained on
    step: int = 0  # optimizer updates so far (what the lr schedule counts)
    loss_sum: float = 0.0  # this epoch's summed training token loss so far
    tokens: int = 0  # ... and its target tokens
    seconds: float = 0.0  # training time spent on this epoch so far
    valid_seconds: float = 0.0  # time spent validating, every epoch so far
    history: list[dict] = field(default_factory=list)  # one row a finished epoch
    best_loss: float = math.inf
    best_epoch: int = 0  # the epoch of the best weights (0: none yet; an average: its last)
    best_averaged: int = 0  # how many epochs' weights the best are the mean of (0: not a mean)
    best_state: dict | None = None  # the best weights (CPU)
    stale: int = 0  # epochs since the validation loss last improved
    recent: list[dict] = field(default_factory=list)  # the last average_last epochs' weights

    def done(self, config: TrainConfig) -> bool:
        """Every epoch (or max_updates update) trained, or patience ran out."""
        out_of_patience = bool(config.patience and self.stale >= config.patience)
        if config.max_updates:
            return self.step >= config.max_updates or out_of_patience
        return self.epoch > config.epochs or out_of_patience

    def where(self, trainer: Trainer) -> str:
        return f"epoch {self.epoch}, step {self.step} of {trainer.total_updates}"

    @property
    def best_name(self) -> int | str:
        """The best weights as train.json's best_epoch names them: the epoch, or avg<N>."""
        return f"avg{self.best_averaged}" if self.best_averaged else self.best_epoch

    def next_epoch(self) -> None:
        self.epoch, self.batch, self.loss_sum, self.tokens, self.seconds = (
            self.epoch + 1, 0, 0.0, 0, 0.0)


def train(settings: dict, paths: Paths, *, restart: bool = False) -> dict:
    """Train the run paths.run names; returns the summary also written to train.json.

    `settings`: the resolved recipe (nmt.pipeline.recipes.resolve). Continues a matching resume
    state unless `restart`; a signal raises resume.Stopped.
    """
    faults.reached("start", 1)
    trainer, lock = setup(settings, paths), None
    try:
        if trainer.world.main:
            check_room(paths.run, trainer.n_params, trainer.config.average_last)
            lock = sole_trainer(paths.run)
        progress = resume_or_start(trainer, restart)
        fit(trainer, progress)
        summary = finish(trainer, progress)
        trainer.world.barrier()  # the ranks leave together, once rank 0 has written the run
        return summary
    except (dist.DistError, RuntimeError) as e:
        lost = peer_lost(trainer, e)
        if lost is None:
            raise
        raise lost from None
    finally:
        trainer = None  # DDP holds the process group: let it go before the group is destroyed
        distributed.leave()
        if lock is not None:
            os.close(lock)


def fit(trainer: Trainer, progress: Progress) -> None:
    """The loop: the epochs' optimizer updates, each epoch then validated and saved. After
    every update the ranks agree (world.max) whether a signal asked to stop and whether a
    save is due; a stop writes the resume state, then raises Stopped."""
    config, world = trainer.config, trainer.world
    with stop_signals(trainer) as stop:
        while not progress.done(config):
            trainer.model.train()
            meter = EpochMeter(trainer, progress)  # running loss and tokens, clock, bar
            for micro in micro_batches(trainer, progress):  # the rest of this epoch
                meter.add(*update_or_fall_back(trainer, micro), batches=len(micro))
                progress.batch += len(micro)
                progress.step += 1
                faults.reached("step", progress.step)
                stop.signum, due = world.max([stop.signum, int(trainer.save_due())])  # agree
                if stop.signum or due:
                    save_state(trainer, meter.read(progress))
                if stop.signum:
                    meter.close()
                    break  # the epoch unfinished; its resume state is written
                meter.show(progress)
                if progress.step == config.max_updates:
                    break  # the budget ends this epoch early; it is validated below
            if not stop.signum:  # every update of the epoch (or of the budget) done
                meter.close()
                end_epoch(trainer, meter.read(progress))  # validation, best weights, patience
                save_state(trainer, progress)
            stop.signum = world.max([stop.signum])[0]  # ranks agree
            if stop.signum:
                raise stopped(trainer, progress, stop.signum)


def setup(settings: dict, paths: Paths) -> Trainer:
    """Read the data and vocabulary, build the seeded model, its optimizer and lr schedule."""
    config, run = TrainConfig.from_dict(settings["train"]), Run.parse(paths.run.folder.name)
    world, device = distributed.join(config.device, config.devices)
    bound_gpu_memory(device)  # several runs on one GPU (nmt --gpu-mem-mb)
    attention_kernels = limit_attention_kernels()  # around a kernel preflight found wrong
    if not world.main:  # one process reports progress
        logging.getLogger("nmt").setLevel(logging.WARNING)
    seed_everything(run.seed)  # the same initial weights on every rank
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 leftovers (optimizer) on tensor cores
        torch.cuda.reset_peak_memory_stats(device)  # train.json's peak is this run's

    compile_on = resolve_compile(config.compile, device)
    graphs_on = resolve_cuda_graphs(config.cuda_graphs, device, compiled=compile_on,
                                    processes=world.size, accumulate=config.accumulate)
    src_codec, tgt_codec = load_codecs(paths.vocab)
    model_config = ModelConfig.from_dict(settings["model"])
    train_batches, valid_batches = read_batches(
        paths, config, (src_codec, tgt_codec), model_config.max_len, run.seed,
        pad_multiple=resolve_pad_multiple(config.pad_multiple, graphs_on))
    vocab_sizes = (len(src_codec), len(tgt_codec))
    model = build_model(run.model, model_config, *vocab_sizes).to(device)
    if world.rank:  # other dropout masks on other ranks
        torch.manual_seed(run.seed + 1_000_003 * world.rank)
    step_model = distributed.wrap(model, world, device)
    # Batch shapes vary with sentence length: compile once for dynamic shapes, not per length.
    if compile_on:
        step_model = compiled(step_model)
    optimizer = adam(model, config, device, graphs_on)
    checkpoint_meta = {
        "name": run.model, "recipe": run.recipe, "cfg": model_config,
        "src_vocab_size": vocab_sizes[0], "tgt_vocab_size": vocab_sizes[1],
        "params": {"model": settings["model"], "train": settings["train"]},
        "n_params": sum(p.numel() for p in model.parameters()), "seed": run.seed,
        "vocab_sha256": checkpoint.vocab_fingerprint(paths.vocab)}
    trainer = Trainer(
        config=config, paths=paths, world=world, device=device,
        precisions=choices(settings, device, *vocab_sizes), model=model,
        step_model=step_model, optimizer=optimizer, scheduler=None,
        train_batches=train_batches, valid_batches=valid_batches,
        valid_references=paths.tokenized / f"val.{settings['data']['target_lang']}.txt",
        tgt_codec=tgt_codec, attention_kernels=attention_kernels,
        checkpoint_meta=checkpoint_meta,
        resume_key=resume.config_key(settings, run.name, run.seed, paths.vocab, world.size))
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(  # over the run's total updates
        optimizer, lambda s: lr_factor(s + 1, config.warmup_steps, config.schedule,
                                       trainer.total_updates))
    if graphs_on:
        trainer.graphs = GraphedUpdates(graph_body(trainer), optimizer, device)
    on = f"{world.size} processes ({device.type})" if world.group else str(device)
    log.info("%s: %s parameters on %s, %s%s", run.name, f"{trainer.n_params:,}", on,
             trainer.precision,
             ", compiled" if compile_on else ", CUDA graphs" if graphs_on else "")
    return trainer


def adam(model: torch.nn.Module, config: TrainConfig, device: torch.device,
         graphs: bool) -> torch.optim.Adam:
    """Adam as a run trains with it: fused on CUDA; for CUDA graphs, the one they can replay."""
    if graphs:
        return capturable_adam(model.parameters(), config.lr, config.betas, config.eps, device)
    return torch.optim.Adam(model.parameters(), lr=config.lr, betas=config.betas,
                            eps=config.eps, fused=device.type == "cuda")


def graph_body(trainer: Trainer):
    """The update nmt.core.graphs captures: what update() does for one process and one
    micro-batch (graphs run only there), with this run's loss settings and clipping."""
    config = trainer.config
    return update_body(trainer.model, trainer.optimizer, trainer.device,
                       precision=trainer.precision, label_smoothing=config.label_smoothing,
                       clip=config.clip_grad_norm)


def compiled(model: torch.nn.Module, backend: str = "inductor") -> torch.nn.Module:
    """torch.compile for dynamic shapes (inductor: Triton on CUDA, C++ via gcc on the CPU):
    one graph for every batch shape. Duck shaping is off: it gives two sizes that happen to
    be equal in the first batch (32 sentences of 32 tokens) one symbol, and the first batch
    where they differ recompiles. Dynamo's caches and counters are cleared first, so
    machine_report counts this run's compiles."""
    import torch.fx.experimental._config as shape_config
    from torch._dynamo.utils import compilation_time_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    compilation_time_metrics.clear()
    shape_config.use_duck_shape = False  # read when the first batch compiles
    return torch.compile(model, dynamic=True, backend=backend)


def read_batches(paths: Paths, config: TrainConfig, codecs: tuple, max_len: int, seed: int,
                 pad_multiple: int) -> tuple[Batches, Batches]:
    """The train split's batches (reshuffled every epoch; bucketed by length with
    train.bucket) and the validation split's (in file order, as validation always was), their
    lengths padded to a multiple of `pad_multiple` (train.pad_multiple resolved)."""
    train_pairs, valid_pairs = (load_pairs(paths.tokenized, split, *codecs, max_len)
                                for split in ("train", "val"))
    log.info("read %d train / %d valid pairs from %s, vocab %d/%d from %s", len(train_pairs),
             len(valid_pairs), paths.tokenized, len(codecs[0]), len(codecs[1]), paths.vocab)
    sizes = (config.batch_by, config.batch_size, config.max_tokens)
    padding = {"pad_multiple": pad_multiple, "max_len": max_len}
    return (Batches.for_training(train_pairs, vars(config), seed, **padding),
            Batches(valid_pairs, *sizes, shuffle=False, **padding))


def check_room(files: RunFiles, n_params: int, average_last: int) -> None:
    """The run folder must take files, and its disk the resume state and checkpoints."""
    try:
        make_folder(files.folder)  # a file in its place: make_folder's own line
        with tempfile.TemporaryFile(dir=files.folder) as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno in FULL:
            raise DiskFull.at(files.folder) from None
        raise NmtError(f"cannot write to {files.folder}: {e.strerror} (fix: make it writable, "
                       "or pass --results a writable folder)") from None
    # float32 copies: weights, Adam's two moments, the best weights, the averaging window.
    state = 4 * n_params * (4 + average_last)
    need = 2 * state + 2 * 4 * n_params  # the old and the new resume state, best.pt, last.pt
    need -= files.resume.stat().st_size if files.resume.exists() else 0
    free = shutil.disk_usage(files.folder).free
    if free < need:
        raise DiskFull(f"{files.folder}: {free / 1e6:.1f} MB free on its disk, training needs "
                       f"about {need / 1e6:.1f} MB for its resume state and checkpoints (fix: "
                       "free disk space, or pass --results a folder on a larger disk)")


def sole_trainer(files: RunFiles) -> int:
    """A lock on the run folder, held while this process trains it (the descriptor, closed at
    the end); one line if another process holds it. flock: the kernel releases it when its
    process ends, killed or not, so no stale lock is ever left to remove."""
    folder = os.open(files.folder, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(folder)
        raise NmtError(f"another nmt train is training {files.folder} now (fix: wait until it "
                       "ends, or stop it first)") from None
    return folder


def resume_or_start(trainer: Trainer, restart: bool) -> Progress:
    """The Progress a matching resume state holds (weights, optimizer, lr schedule and random
    generators restored with it), else a fresh one. Rank 0 clears an earlier run's outputs."""
    files, world = trainer.paths.run, trainer.world
    state, why = usable_state(trainer, restart)
    world.barrier()  # every rank has read the state before rank 0 moves it
    if world.main:
        resume.remove_temporaries((*files.trained, files.resume))
        set_aside_outputs(files)  # an earlier run's outputs do not describe this one
        if why:
            resume.set_aside(files.resume, why)
    if state is None:
        return Progress()
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.graphs is not None:  # the loaded lr (a number, or a tensor read to the CPU)
        for group in trainer.optimizer.param_groups:  # back on the device, for the graphs
            group["lr"] = torch.tensor(float(group["lr"]), device=trainer.device)
    trainer.scheduler.load_state_dict(state["scheduler"])
    mine = state["ranks"][world.rank]
    resume.set_rng_state(mine["rng"], trainer.device)
    progress = Progress(**{**state["progress"], "loss_sum": mine["loss_sum"],
                           "tokens": mine["tokens"]})
    trainer.saved = progress.where(trainer)
    log.info("resuming from %s (batch %d of %d of the epoch), from %s", trainer.saved,
             progress.batch, len(trainer.plan(progress.epoch)), files.resume)
    return progress


def set_aside_outputs(files: RunFiles) -> None:
    """A finished run's outputs (train.json, written last, marks one) renamed <name>.previous
    until this run has written its own (finish deletes them then), so that a kill or a failure
    of the new run leaves the finished model. Outputs of an unfinished write are deleted."""
    present = [path for path in files.trained if path.exists()]
    if not files.summary.exists():
        for path in present:
            path.unlink()
        return
    for path in present:
        os.replace(path, previous(path))
    log.warning("set aside the finished run's %s in %s as *%s until this run has written its "
                "own (then they are deleted; `rm %s/*%s` deletes them sooner)",
                ", ".join(p.name for p in present), files.folder, PREVIOUS, files.folder,
                PREVIOUS)


PREVIOUS = ".previous"


def previous(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS)


def usable_state(trainer: Trainer, restart: bool) -> tuple[dict | None, str]:
    """(the resume state to continue, "") or (None, why it is set aside; "" if there is none)."""
    path = trainer.paths.run.resume
    if not path.exists():
        return None, ""
    if restart:
        return None, "--restart asks for a fresh start"
    state, why = resume.read(path)
    if state and state["config_hash"] != resume.config_hash(trainer.resume_key):
        changed = resume.differences(state["config"], trainer.resume_key)
        return None, f"it was written with other settings (changed: {', '.join(changed[:4])})"
    return state, why


@contextlib.contextmanager
def stop_signals(trainer: Trainer):
    """resume.StopSignals around the loop: SIGINT/SIGTERM ask it to stop after the current
    update; a second Ctrl-C stops at once (Stopped, exit 130)."""
    world = trainer.world
    with resume.StopSignals(echo=1.0 if world.group else 0.0, announce=world.main) as stop:
        try:
            yield stop
        except KeyboardInterrupt:
            raise resume.Stopped(130, f"interrupted at once; {kept(trainer)}"
                                 if world.main else "") from None


def micro_batches(trainer: Trainer, progress: Progress):
    """The rest of epoch progress.epoch: this rank's micro-batches (src, tgt, real) from
    progress.batch of its plan on, `accumulate` of them for each optimizer update."""
    plan, per_update = trainer.plan(progress.epoch), trainer.config.accumulate
    for first in range(progress.batch, len(plan), per_update):
        yield [(*trainer.train_batches.batch(idx), real)
               for idx, real in plan[first : first + per_update]]


class EpochMeter:
    """An epoch's running training loss and target tokens (on the device: reading them waits
    for the GPU), its clock (resumed from progress.seconds) and its progress bar."""

    def __init__(self, trainer: Trainer, progress: Progress):
        self.trainer, self.first_step = trainer, progress.step
        self.began = time.perf_counter() - progress.seconds  # the epoch's start, as if unbroken
        self.session = time.perf_counter()  # when this process took the epoch up
        self.loss_sum = torch.tensor(progress.loss_sum, dtype=torch.float64, device=trainer.device)
        self.tokens = torch.tensor(progress.tokens, dtype=torch.long, device=trainer.device)
        self.bar = tqdm(total=len(trainer.plan(progress.epoch)), initial=progress.batch,
                        desc=f"epoch {progress.epoch}/{trainer.epochs}", unit="batch",
                        leave=False, disable=not trainer.world.main)

    def add(self, loss: torch.Tensor, tokens: int, batches: int) -> None:
        self.loss_sum += loss
        self.tokens += tokens
        self.bar.update(batches)

    def read(self, progress: Progress) -> Progress:
        """progress with the running sums and the epoch's time so far."""
        progress.loss_sum, progress.tokens = self.loss_sum.item(), int(self.tokens.item())
        progress.seconds = time.perf_counter() - self.began
        return progress

    def show(self, progress: Progress) -> None:
        """Every SHOW_EVERY updates: the running loss and the run's time left on the bar; on
        the CPU, the first time, a warning when the run takes more than an hour."""
        updates, trainer = progress.step - self.first_step, self.trainer
        if updates % SHOW_EVERY:
            return
        per_update = (time.perf_counter() - self.session) / updates
        self.bar.set_postfix(loss=f"{(self.loss_sum / self.tokens).item():.3f}",
                             run_eta=duration(per_update * (trainer.total_updates - progress.step)))
        if updates == SHOW_EVERY and trainer.device.type == "cpu" and trainer.world.main:
            log.info(expected_minutes(per_update, trainer, progress))

    def close(self) -> None:
        self.bar.close()


def expected_minutes(seconds_per_update: float, trainer: Trainer, progress: Progress) -> str:
    """What the run's training will take, measured on its first updates (validation passes
    not counted); over an hour, how to shrink it."""
    left = seconds_per_update * (trainer.total_updates - progress.step)
    line = (f"training takes about {duration(seconds_per_update * trainer.updates_per_epoch)} "
            f"an epoch here, {duration(left)} for the {trainer.total_updates - progress.step} "
            f"updates left ({trainer.total_updates} in all, {trainer.epochs} epochs)")
    if left > 3600:
        line += ("; for a quick run use a smaller recipe (e.g. the demo recipe: make demo), "
                 "fewer updates (train.max_updates) or fewer pairs (data.max_train_pairs)")
    return line


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def update_or_fall_back(trainer: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor, bool]]):
    """update(), and where a compiled step fails (inductor, Triton, the C++ compiler), one line
    says why and this update and the rest of the run go eagerly: compiling changes the speed,
    not what is learnt, and train.json records the failure (compile_failed). A failure that is
    the model's own fails eagerly too and is raised from there. Likewise where the CUDA graph
    path fails (train.json: cuda_graphs_failed); a capture that runs out of memory releases
    the graphs' memory to the eager updates (drop_graphs). Any other out of memory, in an
    eager update or a graph's replay, is raised as it is; so is any failure under DDP, where
    the ranks would have to fall back together."""
    try:
        return update(trainer, micro)
    except CaptureFailed as error:  # out of memory included
        drop_graphs(trainer, error)
    except (torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - the eager retry raises any model error again
        if trainer.graphs is not None:
            drop_graphs(trainer, error)
        elif trainer.compiled and trainer.world.size == 1:
            trainer.compile_failed, trainer.step_model = root_cause(error), trainer.model
            log.warning("torch.compile failed (%s): training eagerly from here",
                        trainer.compile_failed)
        else:
            raise
    return update(trainer, micro)


def drop_graphs(trainer: Trainer, error: Exception) -> None:
    """Update eagerly from here on: release the graphs and their memory; one line says why."""
    trainer.graphs_failed = root_cause(error)
    trainer.graphs.release()
    trainer.graphs = None
    log.warning("a CUDA graph capture failed (%s): updating eagerly from here",
                trainer.graphs_failed)


def root_cause(error: BaseException) -> str:
    """`Type: first line` of the innermost exception (a compiler's own error, not dynamo's
    wrapper around it: BackendCompilerFailed holds it as inner_exception)."""
    while (inner := getattr(error, "inner_exception", None) or error.__cause__) is not None:
        error = inner
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def update(trainer: Trainer, micro: list[tuple[torch.Tensor, torch.Tensor, bool]]):
    """One optimizer update from this rank's micro-batches (src, tgt, real); returns their
    (summed token loss, target tokens).

    The update's loss is the summed token loss of all micro-batches of all ranks divided by
    their total target tokens: accumulate k on batches of B equals one batch of k*B, and N
    ranks x accumulate k equal one process x accumulate N*k. Padding micro-batches (real
    False) weigh nothing; they only keep the ranks in step.
    """
    config, world, device = trainer.config, trainer.world, trainer.device
    local = sum(int((tgt[:, 1:] != PAD_ID).sum()) for _, tgt, real in micro if real)
    if trainer.graphs is not None:  # one process, one micro-batch: replayed (nmt.core.graphs)
        src, tgt, _ = micro[0]
        loss_sum = trainer.graphs(src, tgt, float(local))
        trainer.scheduler.step()
        return loss_sum, local
    # One process keeps the divisor on the CPU (a CUDA kernel takes it as a number): a device
    # tensor made from it would copy from pageable memory, which waits for the GPU to finish
    # the last update, and the CPU could no longer queue this one's kernels ahead of it.
    total = torch.tensor(float(local), dtype=torch.float64)
    if world.group:
        total = world.sum(total.to(device))
    trainer.optimizer.zero_grad(set_to_none=True)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for i, (src, tgt, real) in enumerate(micro):
        if device.type == "cuda":  # pinned, so that copying the batch does not wait either
            src, tgt = src.pin_memory(), tgt.pin_memory()
        with distributed.no_sync(trainer.step_model, skip=i < len(micro) - 1):  # all-reduce last
            loss, _ = token_loss(trainer.step_model, src, tgt, device, config.label_smoothing,
                                 precision=trainer.precision)
            # DDP averages gradients over ranks; x world size makes it their sum.
            ((loss if real else loss * 0.0) / total * world.size).backward()
        if real:
            loss_sum += loss.detach()
    if config.clip_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), config.clip_grad_norm)
    trainer.optimizer.step()
    trainer.scheduler.step()
    return loss_sum, local


def end_epoch(trainer: Trainer, progress: Progress) -> None:
    """Validate; record the epoch's row; keep the averaging window and the best weights; count
    the epochs without a better validation loss (patience); move on to the next epoch."""
    config, started = trainer.config, time.perf_counter()
    valid_loss = validation_loss(trainer)
    progress.valid_seconds += time.perf_counter() - started
    progress.history.append(epoch_row(trainer, progress, valid_loss))
    if config.average_last:
        progress.recent = (progress.recent + [cpu_copy(trainer.model)])[-config.average_last:]
    if valid_loss < progress.best_loss:
        progress.best_loss, progress.best_epoch, progress.stale = valid_loss, progress.epoch, 0
        progress.best_state = cpu_copy(trainer.model)
    else:
        progress.stale += 1
        if config.patience and progress.stale >= config.patience:
            log.info("no better valid loss for %d epochs: stopping early", progress.stale)
    progress.next_epoch()


def validation_loss(trainer: Trainer) -> float:
    """Per-token cross-entropy on the validation split (loss.corpus_loss): each rank takes
    every world.size-th batch, the sums are all-reduced."""
    trainer.validations += 1
    batches, world = trainer.valid_batches, trainer.world
    mine = (batches.batch(idx) for idx in batches.indices()[world.rank :: world.size])
    return corpus_loss(trainer.model, after_first(mine, "valid", trainer.validations),
                       trainer.device, reduce=world.sum, precision=trainer.precision)


def after_first(items, point: str, count: int):
    """items, reaching the fault point (point, count) once the first has been used."""
    for i, item in enumerate(items):
        yield item
        if i == 0:
            faults.reached(point, count)


def epoch_row(trainer: Trainer, progress: Progress, valid_loss: float) -> dict:
    """The epoch's history.csv row (its training loss over all ranks), logged."""
    loss_sum, tokens = trainer.world.sum(torch.tensor(
        [progress.loss_sum, progress.tokens], dtype=torch.float64, device=trainer.device)).tolist()
    train_loss = loss_sum / tokens
    row = {"epoch": progress.epoch, "train_loss": round(train_loss, 5),
           "valid_loss": round(valid_loss, 5),
           "lr": float(trainer.scheduler.get_last_lr()[0]),  # with CUDA graphs a device tensor
           "seconds": round(progress.seconds, 2),
           "tokens_per_second": round(tokens / progress.seconds)}
    log.info("epoch %d: train %.4f valid %.4f (%.1f s, %s tok/s)", progress.epoch, train_loss,
             valid_loss, progress.seconds, f"{row['tokens_per_second']:,}")
    return row


def save_state(trainer: Trainer, progress: Progress) -> None:
    """Write the resume state (rank 0): all it takes to continue exactly where the run stands."""
    ranks = trainer.world.gather({"rng": resume.rng_state(trainer.device),
                                  "loss_sum": progress.loss_sum, "tokens": progress.tokens})
    if trainer.world.main:
        resume.write(trainer.paths.run.resume, {
            "format": resume.FORMAT, "config": trainer.resume_key,
            "config_hash": resume.config_hash(trainer.resume_key),
            "model": cpu_copy(trainer.model), "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(), "ranks": ranks,
            "progress": {f.name: getattr(progress, f.name) for f in fields(Progress)}})
    trainer.saved, trainer.last_save = progress.where(trainer), time.monotonic()


def kept(trainer: Trainer) -> str:
    """What an interrupted run leaves, and how to go on (one line's end)."""
    run, files = trainer.run, trainer.paths.run
    again = (f"`nmt train --recipe {run.recipe} --model {run.model} --seed {run.seed}` "
             "(same options) again")
    if not trainer.saved:
        return f"no resume state was written yet; {again} starts afresh"
    return (f"kept {files.resume} ({trainer.saved}); {again} resumes from there "
            f"({', '.join(path.name for path in files.trained)} appear when training completes)")


def stopped(trainer: Trainer, progress: Progress, signum: int) -> resume.Stopped:
    where = progress.where(trainer)
    message = f"stopped by {signal.Signals(signum).name} at {where}; {kept(trainer)}"
    return resume.Stopped(128 + signum, message if trainer.world.main else "")  # rank 0 tells


def peer_lost(trainer: Trainer, error: Exception) -> NmtError | None:
    """The one-line error for a collective that failed because another rank died or stopped
    answering; None for any other error."""
    why = distributed.lost_peer(error) if trainer.world.group else None
    if why is None:
        return None
    if resume.threading_main():  # torchrun SIGTERMs the survivors: let this line out first
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return NmtError(f"rank {trainer.world.rank}: another training process failed or vanished "
                    f"({why}); {kept(trainer)}")


def finish(trainer: Trainer, progress: Progress) -> dict:
    """After the loop: validate the average of the last epochs; rank 0 writes the outputs and
    removes the resume state. Returns the summary (other ranks: {})."""
    if not math.isfinite(progress.best_loss):
        raise NmtError(f"{trainer.run.name}: the validation loss never became finite "
                       "(fix: lower train.lr or set train.clip_grad_norm)")
    averaged = average_last_epochs(trainer, progress)
    if not trainer.world.main:
        return {}
    summary = write_outputs(trainer, progress, averaged)
    trainer.paths.run.resume.unlink(missing_ok=True)  # the stage is complete
    for path in trainer.paths.run.trained:  # and replaces the finished run set aside
        previous(path).unlink(missing_ok=True)
    return summary


def average_last_epochs(trainer: Trainer, progress: Progress) -> float | None:
    """Validate the mean of the last average_last epochs' weights; it becomes best if better.
    Returns its validation loss (None when there is no average)."""
    if len(progress.recent) < 2:
        return None
    trained = cpu_copy(trainer.model)
    trainer.model.load_state_dict(average_states(progress.recent))
    averaged = validation_loss(trainer)
    log.info("average of the last %d epochs: valid %.4f (best single %.4f)",
             len(progress.recent), averaged, progress.best_loss)
    if averaged < progress.best_loss:
        progress.best_loss, progress.best_state = averaged, cpu_copy(trainer.model)
        progress.best_epoch = progress.history[-1]["epoch"]
        progress.best_averaged = len(progress.recent)
    trainer.model.load_state_dict(trained)
    return averaged


def write_outputs(trainer: Trainer, progress: Progress, averaged: float | None) -> dict:
    """Write last.pt, best.pt, history.csv and train.json (last: it marks a finished run)."""
    files, last, meta = trainer.paths.run, progress.history[-1], trainer.checkpoint_meta
    checkpoint.save(files.last, trainer.model, **meta, epoch=last["epoch"],
                    valid_loss=last["valid_loss"])
    trainer.model.load_state_dict(progress.best_state)
    summary = summarize(trainer, progress, averaged)  # (its greedy BLEU: the best weights)
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
        "train_minutes": round((sum(r["seconds"] for r in history) + progress.valid_seconds)
                               / 60, 2),
        "tokens_per_second": round(sum(r["tokens_per_second"] for r in history) / len(history)),
        "train_pairs": len(trainer.train_batches.pairs),
        "pad_multiple": trainer.train_batches.pad_multiple,  # train.pad_multiple resolved
        "valid_bleu_greedy": valid_bleu(trainer),
        **machine_report(trainer),
        "config": trainer.checkpoint_meta["params"],  # the settings the checkpoints record
    }


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
    """What a result needs to explain its speed and its digits: the device's name (on a CPU
    also its instruction set, runtime.cpu_features), the precision, compile on/off and its
    cost, the peak memory (runtime.peak_memory says what is measured). The
    compile figures are dynamo's own (torch._dynamo.utils, not a public API): this process's
    seconds compiling (forward and backward graphs, every recompile; a resumed run counts its
    own) and the graphs compiled (1 when dynamic shapes cover every batch, more on a
    recompile or a graph break). Epoch 1's seconds include the compile time."""
    report = {"device_name": device_name(trainer.device), **recorded(trainer.precisions),
              "compile": trainer.compiled, "attention_kernels": trainer.attention_kernels}
    if trainer.device.type == "cpu":
        report |= cpu_features()
    if trainer.compile_failed:
        report["compile_failed"] = trainer.compile_failed
    if trainer.device.type == "cuda":  # CUDA graphs captured by this process (0: none)
        report["cuda_graphs"] = len(trainer.graphs.graphs) if trainer.graphs else 0
    if trainer.graphs_failed:
        report["cuda_graphs_failed"] = trainer.graphs_failed
    if trainer.compiled:
        from torch._dynamo.utils import compilation_time_metrics, counters

        report["compile_seconds"] = round(
            sum(compilation_time_metrics.get("_compile.compile_inner", [])), 2)
        report["compiled_graphs"] = counters["stats"]["unique_graphs"]
    return report | peak_memory(trainer.device)


def write_history(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buf.getvalue())
