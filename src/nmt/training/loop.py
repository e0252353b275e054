"""The training loop: fit one model of one recipe; keep the best checkpoint by validation loss.

Writes results/<recipe>-<model>-s<seed>/: best.pt, last.pt, history.csv (one row an epoch) and
train.json (the summary the report reads), all four only when training completes. Until then
the run lives in resume.pt (nmt.training.resume): `nmt train` again continues it where it
stopped, with the numbers an uninterrupted run gives; SIGINT/SIGTERM stop after the current
update.

Reading order: `train` (what stage train calls), `fit` (the loop, on one screen), then its
steps in the order they run: `setup`, `resume_or_start`, the update (nmt.training.step),
`end_epoch` (with `validation_loss`), resume.save (a thread writes the state while training
goes on), `finish` (averaging the last epochs; nmt.training.outputs writes the outputs).
What a run trains with (`Trainer`), where it stands (`Progress`) and where it reads and writes
(`Paths`): nmt.training.state. Beside the loop: the train: settings (config), the epoch's
running numbers and progress bar (meter), the run folder's room, lock and set-aside outputs
(folder), several processes (train.devices, torchrun: distributed) and every decision about
the resume state: whether to continue one, what it must match, reading it back, writing it
(resume).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from nmt.core import checkpoint
from nmt.core.codecs import load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.errors import NmtError
from nmt.core.loss import corpus_loss
from nmt.core.process import process_seconds
from nmt.core.runs import Run
from nmt.core.runtime import (
    bound_gpu_memory,
    limit_attention_kernels,
    resolve_compile,
    seed_everything,
)
from nmt.models import ModelConfig, build_model
from nmt.training import distributed, faults, resume
from nmt.training.config import TrainConfig
from nmt.training.folder import check_room, previous, set_aside_outputs, sole_trainer
from nmt.training.graphs import resolve_cuda_graphs, resolve_pad_multiple
from nmt.training.meter import EpochMeter
from nmt.training.outputs import write_outputs
from nmt.training.precision import Choice
from nmt.training.precision_record import recipe_choices, record_path
from nmt.training.state import Paths, Progress, Trainer, spent
from nmt.training.step import Micro, updater

log = logging.getLogger("nmt.train")

# Wall-clock columns: they differ between two runs of identical numbers, nothing else does.
TIMING_FIELDS = ("seconds", "tokens_per_second")


def average_states(states: list[dict]) -> dict:
    """Element-wise mean of several state dicts (checkpoint averaging)."""
    return {k: sum(s[k].float() for s in states).div(len(states)).to(states[0][k].dtype)
            for k in states[0]}


def cpu_copy(model: torch.nn.Module) -> dict:
    """A detached CPU copy of the model's weights (best-so-far and averaging buffers)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def train(settings: dict, paths: Paths, *, restart: bool = False) -> dict:
    """Train the run paths.run names; returns the summary also written to train.json.

    `settings`: the resolved recipe (nmt.pipeline.recipes.resolve). Continues a matching resume
    state unless `restart`; a signal raises resume.Stopped.
    """
    faults.reached("start", 1)
    trainer, lock = setup(settings, paths, restart=restart), None
    try:
        if trainer.world.main:
            check_room(paths.run, trainer.n_params, trainer.config.average_last)
            lock = sole_trainer(paths.run)
        progress = resume_or_start(trainer)
        trainer.clock["start"] = process_seconds()
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
        trainer.writer.wait_quietly()  # a state being written is whole before the lock goes
        trainer = None  # DDP holds the process group: let it go before the group is destroyed
        distributed.leave()
        if lock is not None:
            os.close(lock)


def fit(trainer: Trainer, progress: Progress) -> None:
    """The loop: the epochs' optimizer updates, each epoch then validated and saved. After
    every update the ranks agree (world.max) whether a signal asked to stop and whether a
    save is due; a stop writes the resume state, waits until it is on disk, then raises
    Stopped."""
    config, world = trainer.config, trainer.world
    with stop_signals(trainer) as stop:
        while not progress.done(config):
            trainer.model.train()
            # running loss and tokens, clock, bar (cleared however the epoch ends)
            with EpochMeter(trainer, progress) as meter:
                for micro in micro_batches(trainer, progress):  # the rest of this epoch
                    meter.add(trainer.update(micro), batches=len(micro))
                    progress.batch += len(micro)
                    progress.step += 1
                    faults.reached("step", progress.step)
                    stop.signum, due = world.max([stop.signum, int(trainer.save_due())])
                    if stop.signum or due:  # the ranks agreed on both
                        resume.save(trainer, meter.read(progress))
                    if stop.signum:
                        break  # the epoch unfinished; its resume state is written
                    meter.show(progress)
                    if progress.step == config.max_updates:
                        break  # the budget ends this epoch early; it is validated below
            if not stop.signum:  # every update of the epoch (or of the budget) done
                end_epoch(trainer, meter.read(progress))  # validation, best weights, patience
                resume.save(trainer, progress)
            stop.signum = world.max([stop.signum])[0]  # ranks agree
            if stop.signum:
                trainer.writer.wait()  # the state is on disk before the line says it is kept
                raise stopped(trainer, progress, stop.signum)


def setup(settings: dict, paths: Paths, *, restart: bool = False) -> Trainer:
    """Read the data and vocabulary, build the seeded model and how it is updated (its
    optimizer and lr schedule: nmt.training.step.updater) in the run's precision, and read the
    resume state to continue unless `restart`."""
    config, run = TrainConfig.from_dict(settings["train"]), Run.parse(paths.run.folder.name)
    world, device = distributed.join(config.device, config.devices)
    bound_gpu_memory(device)  # several runs on one GPU (nmt --gpu-mem-mb)
    attention_kernels = limit_attention_kernels(settings["train"]["attention_kernels"])
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
    checkpoint_meta = {
        "name": run.model, "recipe": run.recipe, "cfg": model_config,
        "src_vocab_size": vocab_sizes[0], "tgt_vocab_size": vocab_sizes[1],
        "params": {"model": settings["model"], "train": settings["train"]},
        "n_params": sum(p.numel() for p in model.parameters()), "seed": run.seed,
        "vocab_sha256": checkpoint.vocab_fingerprint(paths.vocab)}
    resume_key = resume.config_key(settings, run.name, run.seed, paths.vocab, world.size)
    found = resume.usable_state(paths.run.resume, resume_key, restart)
    trainer = Trainer(
        config=config, paths=paths, world=world, device=device,
        precisions=run_precisions(settings, device, vocab_sizes, found[0],
                                  record_path(paths.run.folder.parent, run.recipe)), update=None,
        train_batches=train_batches, valid_batches=valid_batches,
        valid_references=paths.tokenized / f"val.{settings['data']['target_lang']}.txt",
        tgt_codec=tgt_codec, attention_kernels=attention_kernels,
        threads=torch.get_num_threads(), checkpoint_meta=checkpoint_meta,
        resume_key=resume_key, found=found)
    trainer.update = updater(model, config, device, precision=trainer.precision,
                             total_updates=trainer.total_updates, world=world,
                             compile_on=compile_on, graphs_on=graphs_on)
    on = f"{world.size} processes ({device.type})" if world.group else str(device)
    log.info("%s: %s parameters on %s, %s%s", run.name, f"{trainer.n_params:,}", on,
             trainer.precision,
             ", compiled" if compile_on else ", CUDA graphs" if graphs_on else "")
    return trainer


def run_precisions(settings: dict, device: torch.device, vocab_sizes: tuple[int, int],
                   state: dict | None, record: Path) -> dict[str, Choice]:
    """train.precision's choices for the run (nmt.training.precision): the ones its resume
    state recorded at the run's start (resume.precisions), so that a resumed run trains and
    decodes as it began whatever the machine's measurement says now; else the recipe's, decided
    once in the checkout (`record`, nmt.training.precision_record) or now. Choosing
    may measure, which draws from torch's generators: they are left as they were (fork_rng), so
    a run's numbers do not depend on whether this machine's measurement was cached."""
    kept = resume.precisions(state)
    if kept is not None:
        return kept
    with torch.random.fork_rng(devices=[]):
        return recipe_choices(settings, device, *vocab_sizes, record)


def read_batches(paths: Paths, config: TrainConfig, codecs: tuple, max_len: int, seed: int,
                 pad_multiple: int) -> tuple[Batches, Batches]:
    """The train split's batches (reshuffled every epoch; bucketed by length with
    train.bucket) and the validation split's (in file order, as validation always was), their
    lengths padded to a multiple of `pad_multiple` (train.pad_multiple resolved)."""
    train_pairs, valid_pairs = (load_pairs(paths.tokenized, split, *codecs, max_len)
                                for split in ("train", "val"))
    log.info("read %d train / %d valid pairs from %s, vocab %d/%d from %s", len(train_pairs),
             len(valid_pairs), paths.tokenized, len(codecs[0]), len(codecs[1]), paths.vocab)
    check_batch_size(config, len(train_pairs))
    sizes = (config.batch_by, config.batch_size, config.max_tokens)
    padding = {"pad_multiple": pad_multiple, "max_len": max_len}
    return (Batches.for_training(train_pairs, vars(config), seed, **padding),
            Batches(valid_pairs, *sizes, shuffle=False, **padding))


def check_batch_size(config: TrainConfig, train_pairs: int) -> None:
    """A sentence batch larger than the train split is refused before any work: every update
    would hold the whole split (train.batch_size 5000 on a 1,000-pair split peaked at 5.8 GB
    and measured for 53 s before its first update, with no line)."""
    if config.batch_by == "sentences" and config.batch_size > train_pairs:
        raise NmtError(f"train.batch_size {config.batch_size}: more sentences than the train "
                       f"split holds ({train_pairs:,}), so each update would hold all of it "
                       f"(fix: a batch_size of at most {train_pairs:,}; the recipes use 32 to "
                       "128, or batch_by: tokens)")


def resume_or_start(trainer: Trainer) -> Progress:
    """The Progress the resume state setup found holds (weights, optimizer, lr schedule and
    random generators restored with it), else a fresh one. Rank 0 clears an earlier run's
    outputs."""
    files, world = trainer.paths.run, trainer.world
    (state, why), trainer.found = trainer.found, (None, "")
    world.barrier()  # every rank has read the state before rank 0 moves it
    if world.main:
        resume.remove_temporaries((*files.trained, files.resume))
        set_aside_outputs(files)  # an earlier run's outputs do not describe this one
        if why:
            resume.set_aside(files.resume, why)
    return Progress() if state is None else resume.restore(trainer, state)


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


def micro_batches(trainer: Trainer, progress: Progress) -> list[Micro]:
    """The rest of epoch progress.epoch: this rank's micro-batches (src, tgt, real) from
    progress.batch of its plan on, `accumulate` of them for each optimizer update."""
    plan, per_update = trainer.plan(progress.epoch), trainer.config.accumulate
    for first in range(progress.batch, len(plan), per_update):
        yield [(*trainer.train_batches.batch(idx), real)
               for idx, real in plan[first : first + per_update]]


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
    """The epoch's history.csv row, logged: its training loss over all ranks, and the mean of
    each of the updates' numbers (Updated.means: grad_norm, ...) over its updates and ranks."""
    world, names = trainer.world, list(progress.sums)
    loss_sum, tokens, *sums = world.sum(torch.tensor(
        [progress.loss_sum, progress.tokens, *progress.sums.values()], dtype=torch.float64,
        device=trainer.device)).tolist()
    train_loss, updates = loss_sum / tokens, math.ceil(progress.batch / trainer.config.accumulate)
    row = {"epoch": progress.epoch, "train_loss": round(train_loss, 5),
           "valid_loss": round(valid_loss, 5),
           "lr": float(trainer.update.scheduler.get_last_lr()[0]),  # graphs: a device tensor
           **{name: round(total / updates / world.size, 5)
              for name, total in zip(names, sums, strict=True)},
           "seconds": round(progress.seconds, 2),
           "tokens_per_second": round(tokens / progress.seconds)}
    log.info("epoch %d: train %.4f valid %.4f (%.1f s, %s tok/s)", progress.epoch, train_loss,
             valid_loss, progress.seconds, f"{row['tokens_per_second']:,}")
    return row


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
    began = time.perf_counter()
    averaged = average_last_epochs(trainer, progress)
    if not trainer.world.main:
        return {}
    trainer.writer.wait()  # the last state is written (or its failure raised) before it goes

    def seconds() -> dict:  # write_outputs reads it once the summary's valid BLEU is decoded
        trainer.clock["end"] = time.perf_counter() - began
        return spent(trainer, progress)
    summary = write_outputs(trainer, progress, averaged, seconds)
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
