"""The training loop itself: lr schedule, checkpoint averaging, early stopping, bad input."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import rows_of_lines
from nmt import cli
from nmt.core import checkpoint
from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.errors import NmtError
from nmt.core.loss import corpus_loss
from nmt.core.runs import Run
from nmt.core.runtime import ATTENTION_KERNELS_ENV, limit_attention_kernels
from nmt.models import MODELS
from nmt.training import faults, precision_cache, precision_timing, resume
from nmt.training.loop import train
from nmt.training.meter import expected_minutes
from nmt.training.step import lr_factor
from train_helpers import (
    assert_same_outputs,
    nmt_process,
    params_file,
    tiny_data,
    tiny_params,
    train_argv,
    train_paths,
)

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = Run("published", "scratch", 0)


@pytest.fixture(scope="module")
def data(prepared, tmp_path_factory):
    return tiny_data(prepared, tmp_path_factory.mktemp("tiny"), train=200, val=60)


def fit(data, tmp_path, name: str, **train_settings) -> tuple[dict, list[dict]]:
    """Train in this process (the run's folder under tmp_path / name); (train.json, history)."""
    out = RUN.files(tmp_path / name)
    summary = train(tiny_params(**train_settings), train_paths(data, tmp_path / name, RUN))
    with open(out.history) as f:
        history = list(csv.DictReader(f))
    assert json.loads(out.summary.read_text()) == json.loads(json.dumps(summary))
    return summary, history


def valid_batches(data) -> Batches:
    """The tiny validation split in file order, as the tests compute a loss over it."""
    src, tgt = load_codecs(data["vocab"] / "published")
    return Batches(load_pairs(data["tokenized"], "val", src, tgt, 256), "sentences", 32, 0,
                   shuffle=False)


def test_max_updates_cuts_the_last_epoch_and_ends_the_decay_at_zero(data, tmp_path,
                                                                  monkeypatch):
    # 200 pairs / 32 = 7 updates an epoch: 10 updates are one epoch and 3 of the next. A stop
    # planted at the third validation never fires: a run that trained past its budget (or
    # whose update count never reaches it) fails here after one more epoch, where it would
    # otherwise train on until a timeout.
    monkeypatch.setenv(faults.ENV, "valid:3:TERM")
    summary, history = fit(data, tmp_path, "budget", epochs=1, max_updates=10, warmup_steps=2,
                           schedule="linear")
    assert summary["updates"] == 10 and summary["epochs"] == 2
    assert [float(r["lr"]) for r in history] == [1.0e-3 * lr_factor(8, 2, "linear", 10), 0.0]
    trained = sum(float(r["seconds"]) for r in history) / 60  # validation passes come on top
    assert summary["train_minutes"] >= round(trained, 4) and "valid_bleu_greedy" in summary
    seconds = summary["seconds"]  # the wall time beside the epochs, and where the rest went
    assert list(seconds) == ["wall", "epochs", "validation", "start", "saving", "end", "other"]
    assert seconds["epochs"] == pytest.approx(60 * trained, abs=0.02)
    assert all(seconds[phase] > 0 for phase in ("epochs", "validation", "end")), seconds
    assert seconds["saving"] >= 0  # a tiny state: milliseconds, 0.0 in two decimals
    assert seconds["start"] > 0.5  # the interpreter's start and torch's import at least
    assert seconds["wall"] >= seconds["start"] + seconds["epochs"] + seconds["end"]
    assert seconds["other"] >= -0.05  # the phases are parts of the wall time, not more


def test_schedule_counts_updates_not_micro_batches(data, tmp_path):
    # 200 pairs / 32 = 7 micro-batches an epoch; accumulate 2 makes 4 updates an epoch.
    summary, history = fit(data, tmp_path, "acc", epochs=2, warmup_steps=3, accumulate=2)
    assert summary["updates"] == 8
    for row, updates in zip(history, (4, 8), strict=True):
        # The lr after `updates` optimizer steps is the one the next update would use.
        assert float(row["lr"]) == 1.0e-3 * lr_factor(updates + 1, 3)


def test_average_last_is_the_mean_of_the_last_epochs(data, tmp_path):
    """The same seed trains the same trajectory, so runs of 2 and 3 epochs give the epoch-2 and
    epoch-3 weights the averaged run must have averaged."""
    fit(data, tmp_path, "e2", epochs=2)
    fit(data, tmp_path, "e3", epochs=3)
    summary, history = fit(data, tmp_path, "avg", epochs=3, average_last=2)
    w2, _ = checkpoint.load(RUN.files(tmp_path / "e2").last)
    w3, _ = checkpoint.load(RUN.files(tmp_path / "e3").last)
    s2, s3 = ({k: v.clone() for k, v in w.state_dict().items()} for w in (w2, w3))
    hand = {k: (s2[k] + s3[k]) / 2 for k in s3}

    avg_last, _ = checkpoint.load(RUN.files(tmp_path / "avg").last)
    assert all(torch.equal(v, s3[k]) for k, v in avg_last.state_dict().items())  # not averaged
    w3.load_state_dict(hand)
    valid = valid_batches(data)
    assert summary["averaged_valid_loss"] == pytest.approx(corpus_loss(w3, valid, "cpu"),
                                                           rel=1e-6)
    best, ckpt = checkpoint.load(RUN.files(tmp_path / "avg").best)
    # The averaged weights are best.pt when they beat every single epoch, else that epoch is.
    expected = {"avg2": hand, 2: s2, 3: s3}[summary["best_epoch"]]
    assert all(torch.equal(v, expected[k]) for k, v in best.state_dict().items())
    assert ckpt.get("averaged") == (2 if summary["best_epoch"] == "avg2" else None)


def expected_stop(losses: list[float], patience: int) -> int:
    """Brute force: the epoch after which `patience` epochs in a row did not beat the best."""
    best, stale = math.inf, 0
    for epoch, loss in enumerate(losses, 1):
        best, stale = (loss, 0) if loss < best else (best, stale + 1)
        if stale >= patience:
            return epoch
    return len(losses)


def test_patience_stops_the_run(data, tmp_path, caplog):
    # A high lr on 200 pairs overfits: the validation loss turns up within a few epochs.
    settings = {"epochs": 14, "lr": 1.0e-2}
    full, full_history = fit(data, tmp_path, "full", **settings, patience=0)
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        stopped, history = fit(data, tmp_path, "stopped", **settings, patience=2)
    assert "no better valid loss for 2 epochs: stopping early" in caplog.messages
    assert full["epochs"] == 14
    losses = [float(r["valid_loss"]) for r in full_history]
    stop = expected_stop(losses, 2)
    assert stop < 14, f"the validation loss never turned up: {losses}"
    assert stopped["epochs"] == len(history) == stop
    same = ("epoch", "train_loss", "valid_loss", "lr")
    assert [[r[k] for k in same] for r in history] == [[r[k] for k in same]
                                                       for r in full_history[:stop]]
    assert stopped["best_epoch"] == stop - 2
    # best.pt holds the best epoch's weights, not the last ones: its validation loss, computed
    # here, is the summary's best, and last.pt's is the last epoch's
    valid = valid_batches(data)
    files = RUN.files(tmp_path / "stopped")
    for path, epoch, loss in ((files.best, stop - 2, stopped["best_valid_loss"]),
                              (files.last, stop, float(history[-1]["valid_loss"]))):
        model, saved = checkpoint.load(path)
        assert saved["epoch"] == epoch, path
        assert corpus_loss(model, valid, "cpu") == pytest.approx(loss, abs=1e-5), path


def test_with_lr_0_every_epoch_reports_the_untrained_models_losses(data, tmp_path,
                                                                  monkeypatch):
    """An oracle for history.csv's numbers: at lr 0, without dropout or label smoothing, the
    weights never move, so each epoch's train loss is the model's loss over the whole train
    split (whatever the epoch's order) and its valid loss that over the validation split,
    both computed here from last.pt by loss.corpus_loss; its grad_norm is the mean over the
    epoch's 7 updates of the gradient norm of each batch's per-token loss, computed here
    batch by batch in the epoch's seeded order. The epoch's sums start again from 0. The run
    ends after its 14 updates: a stop planted at update 15 never fires."""
    monkeypatch.setenv(faults.ENV, "step:15:TERM")
    params = tiny_params(epochs=2, lr=0.0, label_smoothing=0.0)
    params["model"]["dropout"] = 0.0
    summary = train(params, train_paths(data, tmp_path, RUN))
    assert summary["best_epoch"] == 1  # epoch 2 ties it: only a lower loss is better
    model, _ = checkpoint.load(RUN.files(tmp_path).last)
    src, tgt = load_codecs(data["vocab"] / "published")
    pairs = {split: load_pairs(data["tokenized"], split, src, tgt, 256)
             for split in ("train", "val")}
    losses = {split: corpus_loss(model, Batches(pairs[split], "sentences", 32, 0,
                                                shuffle=False), "cpu")
              for split in ("train", "val")}
    with open(RUN.files(tmp_path).history) as f:
        history = list(csv.DictReader(f))
    assert [row["epoch"] for row in history] == ["1", "2"]
    order = Batches.for_training(pairs["train"], params["train"], RUN.seed)
    for epoch, row in enumerate(history):
        assert float(row["train_loss"]) == pytest.approx(losses["train"], abs=1e-5), row
        assert float(row["valid_loss"]) == pytest.approx(losses["val"], abs=1e-5), row
        norms = [batch_gradient_norm(model, *order.batch(idx)) for idx in order.indices(epoch)]
        assert len(norms) == 7
        assert float(row["grad_norm"]) == pytest.approx(sum(norms) / 7, abs=1e-5), row
        for name in ("train_loss", "valid_loss", "grad_norm"):  # five places, as the log reads
            assert re.fullmatch(r"\d+\.\d{1,5}", row[name]), row


def batch_gradient_norm(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> float:
    """The norm of the gradient of one batch's per-token cross-entropy (pads ignored)."""
    model.zero_grad(set_to_none=True)
    logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                                             ignore_index=PAD_ID)
    loss.backward()
    return float(torch.cat([p.grad.flatten() for p in model.parameters()
                            if p.grad is not None]).norm())


def test_setup_names_the_run_in_its_checkpoints_and_resume_key(data, tmp_path, monkeypatch,
                                                               caplog):
    """What setup gives the checkpoints (the run, its settings, vocabulary and size, which
    evaluate and a resumed run check) and the resume key, field by field; train.compile
    true wraps the update in torch.compile (compiling waits for the first update); both
    splits' batches padded to train.pad_multiple, the validation's in file order; the
    references of train.json's valid BLEU (outputs.valid_bleu) the English validation lines
    as written (val.en.txt), not the German ones nor spaCy's tokens of them; a GPU memory
    bound on a CPU is one line."""
    from nmt.core.process import GPU_MEMORY_ENV
    from nmt.core.text import read_lines
    from nmt.models import ModelConfig
    from nmt.training.loop import setup

    monkeypatch.setenv(GPU_MEMORY_ENV, "100")
    params, vocab = tiny_params(compile=True, pad_multiple=8), data["vocab"] / "published"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # what train.json reports (the bits of a CPU training follow it)
    try:
        with caplog.at_level(logging.INFO, logger="nmt"):
            trainer = setup(params, train_paths(data, tmp_path, RUN))
    finally:
        torch.set_num_threads(threads)
    src, tgt = load_codecs(vocab)
    assert trainer.checkpoint_meta == {
        "name": "scratch", "recipe": "published", "cfg": ModelConfig.from_dict(params["model"]),
        "src_vocab_size": len(src), "tgt_vocab_size": len(tgt),
        "params": {"model": params["model"], "train": params["train"]},
        "n_params": sum(p.numel() for p in trainer.model.parameters()), "seed": RUN.seed,
        "vocab_sha256": checkpoint.vocab_fingerprint(vocab)}
    assert trainer.resume_key == resume.config_key(params, RUN.name, RUN.seed, vocab, 1)
    assert trainer.update.compiled and trainer.threads == 2
    for batches in (trainer.train_batches, trainer.valid_batches):  # padded as the recipe says
        assert (batches.pad_multiple, batches.max_len) == (8, params["model"]["max_len"])
    valid = trainer.valid_batches.indices()  # validation in file order
    assert not trainer.valid_batches.shuffle and sum(valid, []) == list(range(60))
    raw = (data["tokenized"] / "val.en.txt").read_text("utf-8").split("\n")[:-1]
    assert read_lines(trainer.valid_references) == raw
    assert len(raw) == len(trainer.valid_batches.pairs) == 60
    assert raw != (data["tokenized"] / "val.en.tok").read_text("utf-8").split("\n")[:-1]
    assert f"{GPU_MEMORY_ENV}=100: no CUDA memory to bound on cpu" in caplog.messages
    assert f"{RUN.name}: {trainer.n_params:,} parameters on cpu, fp32, compiled" in \
        caplog.messages


def test_a_rank_other_than_0_logs_only_warnings_and_draws_its_own_dropout(data, tmp_path,
                                                                          monkeypatch):
    """setup as rank 2 of 3 (a stand-in World from distributed.join, no process group): the
    same initial weights as rank 0, then its own seed for dropout (seed + 1,000,003 x rank),
    and the nmt loggers quiet below warnings, so that one process reports progress."""
    from nmt.training import distributed
    from nmt.training.distributed import World
    from nmt.training.loop import setup

    monkeypatch.setattr(distributed, "join", lambda device, devices: (World(2, 3),
                                                                      torch.device("cpu")))
    logger = logging.getLogger("nmt")
    level = logger.level
    try:
        setup(tiny_params(), train_paths(data, tmp_path, RUN))
        assert logger.level == logging.WARNING
        assert torch.initial_seed() == RUN.seed + 2_000_006
    finally:
        logger.setLevel(level)


def test_an_error_of_one_process_comes_out_as_it_is(data, tmp_path, monkeypatch):
    """A RuntimeError inside the loop of a single process is no lost peer: train raises it
    unchanged (peer_lost looks only at runs of several processes)."""
    from nmt.training import loop

    def fit(trainer, progress):
        raise RuntimeError("boom")

    monkeypatch.setattr(loop, "fit", fit)
    with pytest.raises(RuntimeError) as error:
        train(tiny_params(), train_paths(data, tmp_path, RUN))
    assert type(error.value) is RuntimeError and str(error.value) == "boom"


def test_a_training_logs_what_it_read_built_and_reached_line_for_line(data, tmp_path, caplog):
    """The loop's own lines, each whole: the data read, the model built, every epoch's losses
    and speed (as history.csv has them) and the average of the last epochs (as train.json)."""
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        summary, history = fit(data, tmp_path, "logged", epochs=2, average_last=2)
    model, _ = checkpoint.load(RUN.files(tmp_path / "logged").last)
    src, tgt = load_codecs(data["vocab"] / "published")
    lines = [r.getMessage() for r in caplog.records if r.name == "nmt.train"]
    assert lines[:2] == [
        f"read 200 train / 60 valid pairs from {data['tokenized']}, vocab {len(src)}/{len(tgt)} "
        f"from {data['vocab'] / 'published'}",
        f"{RUN.name}: {sum(p.numel() for p in model.parameters()):,} parameters on cpu, fp32"]
    epoch = r"epoch (\d+): train (\d+\.\d{4}) valid (\d+\.\d{4}) \((\d+\.\d) s, ([\d,]+) tok/s\)"
    for line, row in zip(lines[2:4], history, strict=True):
        number, train_loss, valid_loss, seconds, speed = re.fullmatch(epoch, line).groups()
        assert int(number) == int(row["epoch"])
        assert float(train_loss) == pytest.approx(float(row["train_loss"]), abs=6e-5)
        assert float(valid_loss) == pytest.approx(float(row["valid_loss"]), abs=6e-5)
        assert float(seconds) == pytest.approx(float(row["seconds"]), abs=0.06)
        assert int(speed.replace(",", "")) == int(row["tokens_per_second"])
    averaged, best = re.fullmatch(r"average of the last 2 epochs: valid (\d+\.\d{4}) \(best "
                                  r"single (\d+\.\d{4})\)", lines[4]).groups()
    assert float(averaged) == pytest.approx(summary["averaged_valid_loss"], abs=6e-5)
    assert float(best) == pytest.approx(min(float(r["valid_loss"]) for r in history), abs=6e-5)
    assert len(lines) == 6 and lines[5].startswith(f"wrote {RUN.dir(tmp_path / 'logged')} ")


def test_the_best_and_averaged_weights_are_copies_the_training_cannot_change():
    """loop.cpu_copy: a CPU copy of each weight that a later update (in place) leaves as it
    was; average_states: the element-wise mean, in each weight's own dtype."""
    from nmt.training.loop import average_states, cpu_copy

    model = torch.nn.Linear(3, 2)
    kept = cpu_copy(model)
    before = {k: v.clone() for k, v in kept.items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    assert all(torch.equal(kept[k], before[k]) for k in before) and not kept["weight"].requires_grad
    states = [{"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([1, 2])},
              {"w": torch.tensor([3.0, 5.0]), "n": torch.tensor([3, 5])},
              {"w": torch.tensor([5.0, 8.0]), "n": torch.tensor([5, 8])}]
    mean = average_states(states)
    assert torch.equal(mean["w"], torch.tensor([3.0, 5.0])) and mean["n"].dtype == torch.int64
    assert torch.equal(mean["n"], torch.tensor([3, 5]))
    alone = average_states(states[:1])  # the mean of one state is that state
    assert alone.keys() == states[0].keys()
    assert all(torch.equal(alone[k], states[0][k]) for k in alone)


class TwoEqualRanks:
    """A stand-in World of two ranks that hold the same numbers: a sum over them is twice
    this rank's. It keeps each tensor it was given, as an all-reduce receives it."""

    rank, size, main = 0, 2, True

    def __init__(self):
        self.given = []

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        self.given.append(values)
        return values * 2


def test_an_epochs_row_is_its_means_over_updates_and_ranks_in_five_places():
    """loop.epoch_row against numbers worked out by hand, two ranks of 7 micro-batches,
    accumulate 2 (4 updates each): the train loss is the loss over both ranks' tokens; each
    update number (grad_norm) the mean over 4 updates x 2 ranks; losses and means in five
    places. The sums are reduced in float64 on the run's device (NCCL reduces GPU tensors,
    and an epoch's loss sum outgrows float32's 24 bits: 2**25 + 2 is 2**25 there)."""
    from nmt.training.loop import epoch_row
    from nmt.training.state import Progress

    def trainer(device: str) -> SimpleNamespace:
        scheduler = SimpleNamespace(get_last_lr=lambda: [torch.tensor(5e-4)])  # graphs: a tensor
        return SimpleNamespace(world=TwoEqualRanks(), device=torch.device(device),
                               config=SimpleNamespace(accumulate=2),
                               update=SimpleNamespace(scheduler=scheduler))

    progress = Progress(epoch=3, batch=7, loss_sum=2.0**24 + 1, tokens=3000,
                        sums={"grad_norm": 4 / 3}, seconds=12.3456)
    on_cpu = trainer("cpu")
    row = epoch_row(on_cpu, progress, valid_loss=1 / 7)
    assert row == {"epoch": 3, "train_loss": 5592.40567, "valid_loss": 0.14286,
                   "lr": float(torch.tensor(5e-4)), "grad_norm": 0.33333, "seconds": 12.35,
                   "tokens_per_second": 486}
    assert list(row) == ["epoch", "train_loss", "valid_loss", "lr", "grad_norm", "seconds",
                         "tokens_per_second"]  # history.csv's columns, in order
    assert [t.dtype for t in on_cpu.world.given] == [torch.float64]
    on_meta = trainer("meta")  # a device that is not the CPU, as a GPU is
    with pytest.raises(NotImplementedError):  # a meta tensor has no numbers to read back
        epoch_row(on_meta, progress, valid_loss=1 / 7)
    assert [t.device for t in on_meta.world.given] == [torch.device("meta")]


def test_each_validation_pass_adds_its_seconds_and_patience_0_never_says_it_stops(monkeypatch,
                                                                                  caplog):
    """loop.end_epoch with a clock that moves 1.5 s between readings: each of 4 validation
    passes adds 1.5 s to the earlier processes' 10 s; the best is the lowest loss and the
    epochs after it are counted (stale). Without patience (0) no line says the run stops;
    with patience 2 one does, once, at the second epoch without a better loss."""
    from nmt.training import loop
    from nmt.training.state import Progress

    readings = itertools.count(100.0, 1.5)
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    monkeypatch.setattr(loop, "epoch_row", lambda trainer, progress, loss: {
        "epoch": progress.epoch, "valid_loss": loss})

    def epochs(patience: int) -> Progress:
        losses = iter([2.0, 1.0, 3.0, 4.0])
        monkeypatch.setattr(loop, "validation_loss", lambda trainer: next(losses))
        trainer = SimpleNamespace(config=SimpleNamespace(average_last=0, patience=patience),
                                  model=torch.nn.Linear(2, 2))
        progress = Progress(valid_seconds=10.0)  # the earlier processes' (a resumed run)
        for _ in range(4):
            loop.end_epoch(trainer, progress)
        return progress

    with caplog.at_level(logging.INFO, logger="nmt.train"):
        progress = epochs(patience=0)
    assert progress.valid_seconds == 16.0
    assert [row["epoch"] for row in progress.history] == [1, 2, 3, 4] and progress.epoch == 5
    assert (progress.best_loss, progress.best_epoch, progress.stale) == (1.0, 2, 2)
    assert caplog.messages == []
    with caplog.at_level(logging.INFO, logger="nmt.train"):
        epochs(patience=2)
    assert caplog.messages == ["no better valid loss for 2 epochs: stopping early"]


def test_a_stop_or_a_lost_peer_is_one_line_that_rank_0_says(tmp_path):
    """loop.stopped and loop.peer_lost with stand-in ranks: a signal's line names it, where
    the run stood and what is kept, from rank 0 alone (another rank's Stopped is silent);
    a collective that failed because another rank went away is one NmtError naming the
    rank, and torchrun's SIGTERM to the survivors is ignored so that the line gets out. One
    process has no peers: its errors, a Gloo-like one included, are not turned into that
    line; nor is a rank's error that is not a lost peer."""
    from nmt.training.distributed import World
    from nmt.training.loop import peer_lost, stopped
    from nmt.training.state import Progress

    def trainer(world: World) -> SimpleNamespace:
        return SimpleNamespace(world=world, run=RUN, paths=SimpleNamespace(run=RUN.files(tmp_path)),
                               saved="", total_updates=10)

    again = ("`nmt train --recipe published --model scratch --seed 0` (same options) again "
             "starts afresh")
    progress = Progress(epoch=2, step=9)
    first, second = (stopped(trainer(World(rank, 2, group=True)), progress, signal.SIGTERM)
                     for rank in (0, 1))
    assert (first.code, str(first)) == (143, "stopped by SIGTERM at epoch 2, step 9 of 10; "
                                             "no resume state was written yet; " + again)
    assert (second.code, str(second)) == (143, "")

    gone = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                        "[127.0.0.1]:29500\nmore")
    before = signal.getsignal(signal.SIGTERM)
    try:
        lost = peer_lost(trainer(World(1, 2, group=True)), gone)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
    assert isinstance(lost, NmtError)
    assert str(lost) == ("rank 1: another training process failed or vanished (Connection "
                         "closed by peer [127.0.0.1]:29500); no resume state was written yet; "
                         + again)
    assert peer_lost(trainer(World()), gone) is None
    assert peer_lost(trainer(World(1, 2, group=True)), RuntimeError("shape mismatch")) is None
    assert signal.getsignal(signal.SIGTERM) == before  # only a lost peer ignores SIGTERM


def test_the_last_epochs_mean_becomes_best_only_when_its_loss_is_lower(monkeypatch):
    """loop.average_last_epochs with a stand-in validation: it validates the mean of the last
    epochs' weights; a lower loss makes that mean the best (its loss, its weights, named by
    the last epoch it averages, as avg2), a tie keeps the single epoch; either way the model
    goes back to its trained weights (last.pt is written from them). Fewer than two epochs to
    average: nothing is validated."""
    from nmt.training import loop
    from nmt.training.state import Progress

    model = torch.nn.Linear(2, 1)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    recent = [{k: v + shift for k, v in trained.items()} for shift in (1.0, 3.0)]
    mean = {k: v + 2.0 for k, v in trained.items()}
    validated = []

    def average(loss: float) -> tuple[float | None, Progress]:
        def validation_loss(trainer):
            validated.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
            return loss

        monkeypatch.setattr(loop, "validation_loss", validation_loss)
        progress = Progress(history=[{"epoch": e} for e in (1, 2, 3)], best_loss=1.0,
                            best_epoch=2, best_state=trained, recent=list(recent))
        found = loop.average_last_epochs(SimpleNamespace(model=model), progress)
        assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
        return found, progress

    found, better = average(0.5)
    assert found == 0.5 and len(validated) == 1
    assert all(torch.allclose(validated[0][k], mean[k]) for k in mean)
    assert (better.best_loss, better.best_epoch, better.best_averaged, better.best_name) == (
        0.5, 3, 2, "avg2")
    assert all(torch.allclose(better.best_state[k], mean[k]) for k in mean)
    found, tie = average(1.0)
    assert found == 1.0
    assert (tie.best_loss, tie.best_epoch, tie.best_averaged, tie.best_state) == (
        1.0, 2, 0, trained)
    lone = Progress(recent=recent[:1], best_loss=1.0)
    assert loop.average_last_epochs(SimpleNamespace(model=model), lone) is None
    assert len(validated) == 2


class Reached(Exception):
    """A fault point fired (the test's SIGUSR1 handler raises it)."""


@pytest.mark.parametrize(("point", "before_any_file"), [("start:1", True), ("valid:1", False)])
def test_the_fault_points_fire_where_faults_says(prepared, tmp_path, monkeypatch, point,
                                                 before_any_file):
    """The points the resume tests kill at, in this process (a signal of the test's own
    instead of a kill): `start` as train begins, before its folder is touched; `valid`
    after the first batch of the first validation, here a split of one batch (20 pairs)."""
    data = tiny_data(prepared, tmp_path / "data", train=64, val=20)

    def reached(signum, frame):
        raise Reached(point)

    before = signal.signal(signal.SIGUSR1, reached)
    monkeypatch.setenv(faults.ENV, f"{point}:USR1")
    try:
        with pytest.raises(Reached):
            train(tiny_params(epochs=1), train_paths(data, tmp_path, RUN))
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert RUN.files(tmp_path).folder.exists() != before_any_file


def test_validation_runs_in_the_runs_precision(data, tmp_path):
    """A bf16 run validates under bf16 autocast: history.csv's valid loss is the bf16 corpus
    loss of last.pt over the validation split, which differs from the fp32 one."""
    _, history = fit(data, tmp_path, "bf16", epochs=1, precision="bf16")
    model, _ = checkpoint.load(RUN.files(tmp_path / "bf16").last)
    valid = valid_batches(data)
    bf16, fp32 = (corpus_loss(model, valid, "cpu", precision=p) for p in ("bf16", "fp32"))
    assert float(history[0]["valid_loss"]) == pytest.approx(bf16, abs=1e-5)
    assert abs(bf16 - fp32) > 2e-5  # 7e-5 on an AMD EPYC: bf16 rounds every matmul's inputs


def test_each_epoch_trains_on_its_own_seeded_order():
    """Trainer.plan(epoch) is the epoch's order (Batches.indices(epoch - 1): seeded by the
    run's seed and the epoch), sharded for this rank: not one order every epoch."""
    from nmt.training.distributed import World
    from nmt.training.state import Trainer

    pairs = [([1] * (3 + i % 7), [2] * (2 + i % 5)) for i in range(40)]
    batches = Batches(pairs, "sentences", 4, 0, shuffle=True, seed=3)
    plans = [Trainer.plan(SimpleNamespace(train_batches=batches, world=World()), epoch)
             for epoch in (1, 2)]
    assert plans[0] == [(idx, True) for idx in batches.indices(0)]
    assert plans[1] == [(idx, True) for idx in batches.indices(1)]
    assert plans[0] != plans[1]
    second = Trainer.plan(SimpleNamespace(train_batches=batches, world=World(1, 2)), 2)
    assert second == [(idx, True) for idx in batches.indices(1)[1::2]]


def test_a_resumed_runs_seconds_add_this_process_to_the_earlier_ones(monkeypatch):
    """state.spent: each phase's seconds, the earlier processes' (from the resume state) plus
    this one's; a phase only one side has counts as it is there."""
    from nmt.training import state

    monkeypatch.setattr(state, "process_seconds", lambda: 5.0)  # this process's wall
    trainer = SimpleNamespace(clock={"start": 1.0, "end": 2.0})
    progress = SimpleNamespace(earlier={"wall": 10.0, "start": 3.0, "saving": 0.5})
    assert state.spent(trainer, progress) == {"end": 2.0, "saving": 0.5, "start": 4.0,
                                              "wall": 15.0}


def test_a_resume_state_is_due_once_save_every_minutes_have_passed(monkeypatch):
    """save_due against a clock set by hand: due at the minute, not a moment before; never
    with save_every_minutes 0; a fraction of a minute counts."""
    from nmt.training import state

    def due(minutes: float, now: float) -> bool:
        trainer = SimpleNamespace(config=SimpleNamespace(save_every_minutes=minutes),
                                  last_save=100.0)
        with monkeypatch.context() as clock:
            clock.setattr(state.time, "monotonic", lambda: now)
            return state.Trainer.save_due(trainer)

    assert (due(1.5, 189.99), due(1.5, 190.0), due(1.5, 400.0)) == (False, True, True)
    assert (due(0.5, 129.99), due(0.5, 130.0)) == (False, True)
    assert not due(0, 1e9)


def test_misaligned_split_is_one_error_line(data, tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    for path in data["tokenized"].iterdir():
        (tok / path.name).write_bytes(path.read_bytes())
    lines = (tok / "val.en.tok").read_text().split("\n")
    (tok / "val.en.tok").write_text("\n".join(lines[:-3]) + "\n")
    src, tgt = load_codecs(data["vocab"] / "published")
    with pytest.raises(NmtError) as err:
        load_pairs(tok, "val", src, tgt, 256)
    msg = str(err.value)
    assert "\n" not in msg and "val.de.tok has 60 lines but" in msg and "has 58" in msg
    assert "fix: re-run nmt tokenize" in msg


def unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not unshare_works(), reason="needs unshare -rm (a private mount namespace)")
@pytest.mark.parametrize("mount, code, cause", [
    ("ro,size=1m", 2, "cannot write to {run}: Read-only file system (fix: make it writable"),
    # A disk too small: EX_IOERR (74), as a disk that fills during training (test_disk_full).
    ("size=64k", 74, "{run}: 0.1 MB free on its disk, training needs about 12.9 MB for its "
                     "resume state and checkpoints (fix: free disk space"),
])
def test_unwritable_or_full_results_folder_is_one_line(data, tmp_path, mount, code, cause):
    """A real read-only and a real nearly full file system (tmpfs in a private namespace)."""
    results = tmp_path / "results"
    results.mkdir()
    argv = train_argv(params_file(tmp_path), {**data, "results": results})
    proc = nmt_process(argv, launcher=["unshare", "-rm", "sh", "-c",
                                       f'mount -t tmpfs -o {mount} tmpfs {results} && exec "$@"',
                                       "sh", sys.executable])
    assert proc.returncode == code, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("nmt train: error: " + cause.format(run=RUN.dir(results))), last
    assert "epoch 1" not in proc.stderr  # stopped before training


def test_a_line_logged_while_the_bar_is_drawn_has_a_row_of_its_own(data, tmp_path):
    """On the CPU the run's minutes are logged after its first 20 updates, while the epoch's
    bar is drawn (25 batches of 8): on the terminal the line is written above the bar, not
    after it on the bar's row."""
    argv = train_argv(params_file(tmp_path, batch_size=8), {**data, "results": tmp_path / "r"})
    proc = nmt_process(argv, kill_at="step:21")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    rows = rows_of_lines(proc.stderr)
    assert [row for row in rows if row.startswith("nmt.train: training takes about ")], rows


def test_expected_minutes_line():
    def line(per_update, step, total, per_epoch):
        trainer = SimpleNamespace(total_updates=total, updates_per_epoch=per_epoch,
                                  epochs=math.ceil(total / per_epoch))
        return expected_minutes(per_update, trainer, SimpleNamespace(step=step))

    assert line(0.5, 20, 1500, 100) == ("training takes about 50 s an epoch here, 12 min for "
                                        "the 1480 updates left (1500 in all, 15 epochs)")
    note = line(2.0, 20, 907 * 15, 907)
    assert note.startswith("training takes about 30 min an epoch here, 7.5 h for the 13585 "
                           "updates left (13605 in all, 15 epochs); for a quick run use a "
                           "smaller recipe")
    assert "make demo" in note and "train.max_updates" in note


def calibration_preferring(winner: str):
    """A stand-in for the CPU's fp32-against-bf16 measurement that finds `winner` faster, and
    draws from torch's generator as the real one does (it seeds and builds models)."""
    def measure(workload):
        torch.manual_seed(0)
        torch.randn(1000)
        pair = (1.0, 0.5 if winner == "bf16" else 2.0)
        return {m: precision_timing.Timing((pair,) * precision_timing.MIN_PAIRS) for m in MODELS}
    return measure


def test_a_resumed_run_keeps_the_precision_it_began_with(data, tmp_path, monkeypatch):
    """Between a stop and the resume the machine's measurement changes (another cache, the
    other verdict): the run goes on in the precision it began with, says why as it began, and
    ends where an uninterrupted run in that precision ends."""
    monkeypatch.setattr(precision_timing, "measure", calibration_preferring("fp32"))
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path / "cache"))
    whole, _ = fit(data, tmp_path, "whole", precision="auto")
    with monkeypatch.context() as planted, pytest.raises(resume.Stopped) as stop:
        planted.setenv(faults.ENV, "step:10:TERM")  # SIGTERM after update 10 (of 21)
        fit(data, tmp_path, "stopped", precision="auto")
    state = RUN.files(tmp_path / "stopped").resume
    assert stop.value.code == 143 and str(stop.value) == (
        f"stopped by SIGTERM at epoch 2, step 10 of 21; kept {state} (epoch 2, step 10 of "
        "21); `nmt train --recipe published --model scratch "
        "--seed 0` (same options) again resumes from there (best.pt, last.pt, history.csv, "
        "train.json appear when training completes)")
    monkeypatch.setattr(precision_timing, "measure", calibration_preferring("bf16"))
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path / "another cache"))
    resumed, _ = fit(data, tmp_path, "stopped", precision="auto")
    assert resumed["precision"] == whole["precision"] == "fp32"
    assert resumed["precision_reason"] == whole["precision_reason"]
    assert_same_outputs(RUN.dir(tmp_path / "whole"), RUN.dir(tmp_path / "stopped"))


def test_a_second_ctrl_c_before_any_state_stops_at_once_and_says_nothing_is_kept(
        data, tmp_path, monkeypatch, capsys):
    """Two Ctrl-Cs at update 3, before any resume state was written: exit 130 at once, and
    the line says a rerun starts afresh (the planted SIGINT is the second: the first is sent
    just before it, as faults.before_kill runs its functions first). On the terminal each
    line has a row of its own: the epoch's bar, drawn when the first came, is cleared."""
    import os

    def first_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(faults, "_before_kill", [*faults._before_kill, first_ctrl_c])
    monkeypatch.setenv(faults.ENV, "step:3:INT")
    params = params_file(tmp_path)
    assert cli.main(train_argv(params, {**data, "results": tmp_path / "interrupted"})) == 130
    assert rows_of_lines(capsys.readouterr().err) == [
        "nmt train: SIGINT: finishing this step, then saving the resume state (Ctrl-C again: "
        "stop at once)",
        "nmt train: interrupted at once; no resume state was written yet; `nmt train --recipe "
        "published --model scratch --seed 0` (same options) again starts afresh"]
    assert not RUN.files(tmp_path / "interrupted").resume.exists()


def test_a_run_trains_alike_whether_its_precision_was_measured_or_cached(data, tmp_path,
                                                                         monkeypatch):
    """Measuring draws from torch's generators; the run's dropout masks must not see it."""
    monkeypatch.setattr(precision_timing, "measure", calibration_preferring("fp32"))
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path / "cache"))
    measured, _ = fit(data, tmp_path, "measured", precision="auto", epochs=1)  # fills the cache
    record = json.loads((tmp_path / "measured" / "precision" / "published.json").read_text())
    assert record["train"]["precision"] == measured["precision"]  # the recipe's, recorded
    fit(data, tmp_path, "cached", precision="auto", epochs=1)  # reads it: nothing drawn
    assert_same_outputs(RUN.dir(tmp_path / "measured"), RUN.dir(tmp_path / "cached"))


def test_a_resumed_run_records_each_route_of_attention_kernels_it_took(data, tmp_path,
                                                                       monkeypatch, caplog):
    """The kernels are not kept across a resume (a route leaves out one found wrong on this
    machine), but train.json says the run took both routes, and from which update on."""
    monkeypatch.setenv(ATTENTION_KERNELS_ENV, "efficient,math")
    try:
        with monkeypatch.context() as planted, pytest.raises(resume.Stopped):
            planted.setenv(faults.ENV, "step:10:TERM")
            fit(data, tmp_path, "stopped", epochs=2)
        monkeypatch.setenv(ATTENTION_KERNELS_ENV, "flash,math")
        with caplog.at_level(logging.WARNING, logger="nmt.train"):
            resumed, _ = fit(data, tmp_path, "stopped", epochs=2)
    finally:
        limit_attention_kernels("any")  # every kernel again, for the tests after this one
    assert resumed["attention_kernels"] == "efficient,math, then flash,math from step 10"
    assert caplog.messages == ["attention kernels: the run began with efficient,math and goes "
                               "on with flash,math (train.json records both)"]


def test_a_sentence_batch_larger_than_the_train_split_is_refused_before_any_work(prepared,
                                                                                tmp_path):
    """train.batch_size 5000 on a 1,000-pair split peaked at 5.8 GB and measured precision for
    53 s before its first update, with no line (issue 69 item 6): one line, before the
    precision is decided or anything is written; the whole split in one batch is allowed."""
    from nmt.training.loop import check_batch_size

    data = tiny_data(prepared, tmp_path, train=300)
    with pytest.raises(NmtError) as refused:
        train(tiny_params(batch_by="sentences", batch_size=5000, precision="auto"),
              train_paths(data, data["results"], RUN))
    assert str(refused.value) == (
        "train.batch_size 5000: more sentences than the train split holds (300), so each "
        "update would hold all of it (fix: a batch_size of at most 300; the recipes use 32 "
        "to 128, or batch_by: tokens)")
    assert not list(data["results"].rglob("*.*"))  # no precision record, no run files
    check_batch_size(SimpleNamespace(batch_by="sentences", batch_size=300), 300)  # the split
    check_batch_size(SimpleNamespace(batch_by="tokens", batch_size=5000), 300)  # not sentences
