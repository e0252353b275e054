"""Gradient accumulation and DDP (Gloo on CPU): the same updates however the work is split.

The update (nmt.training.step.Updater) is driven directly with real batches in float64 (dropout
0); whole runs go through `nmt train` (which starts torchrun itself for train.devices > 1).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from conftest import REPO
from nmt import cli
from nmt.core import checkpoint
from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.runs import Run
from nmt.models import ModelConfig, build_model
from nmt.training.distributed import World, shard, wrap
from nmt.training.step import UpdateConfig, Updater, lr_factor
from train_helpers import (
    TINY_MODEL,
    assert_same_outputs,
    nmt_process,
    params_file,
    tiny_data,
    train_argv,
)

pytestmark = pytest.mark.usefixtures("one_thread")
RUN = Run("published", "scratch", 0)
UPDATES = 5
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="module")
def data(prepared, tmp_path_factory):
    return tiny_data(prepared, tmp_path_factory.mktemp("ddp"))


def micro_batches(data) -> tuple[Batches, list[list[int]]]:
    """Real batches of 16 sentences in the seeded order of epoch 1: 2 x UPDATES of them."""
    src, tgt = load_codecs(data["vocab"] / "published")
    pairs = load_pairs(data["tokenized"], "train", src, tgt, 256)
    batches = Batches(pairs, "sentences", 16, 0, shuffle=True, seed=0)
    return batches, batches.indices(0)[: 2 * UPDATES]


def stepper(data, world: World, sizes: tuple[int, int]) -> Updater:
    """A float64 Updater: model, DDP, optimizer, schedule, label smoothing 0.1.

    Plain SGD without clipping: Adam and clipping forgive a gradient off by a constant factor,
    a wrong loss normalisation must show.
    """
    torch.manual_seed(0)
    cfg = ModelConfig(**{**TINY_MODEL, "dropout": 0.0})
    model = build_model("scratch", cfg, *sizes).double()
    ddp = wrap(model, world, torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s + 1, 3))
    return Updater(model=model, optimizer=opt, scheduler=sched, device=torch.device("cpu"),
                   config=UpdateConfig("fp32", label_smoothing=0.1), step_model=ddp,
                   world=world)


def vocab_sizes(data) -> tuple[int, int]:
    return tuple(len(c) for c in load_codecs(data["vocab"] / "published"))


def rank_updates(rank: int, data: dict, init: str, out: str) -> None:
    """One of 2 Gloo ranks, accumulate 1: each update takes this rank's share (shard)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    world = World(rank, 2, group=True)
    update = stepper(data, world, vocab_sizes(data))
    batches, order = micro_batches(data)
    loss, tokens = 0.0, 0
    for idx, real in shard(order, world):
        updated = update([(*batches.batch(idx), real)])
        loss, tokens = loss + updated.loss_sum.item(), tokens + updated.tokens
    totals = world.sum(torch.tensor([loss, tokens], dtype=torch.float64)).tolist()
    if world.main:
        torch.save({"state": update.model.state_dict(), "loss": totals}, out)
    dist.destroy_process_group()


def test_two_ranks_equal_one_process_accumulating_two(data, tmp_path):
    mp.spawn(rank_updates, args=(data, f"file://{tmp_path / 'rendezvous'}",
                                 str(tmp_path / "ranks.pt")), nprocs=2, join=True)
    ranks = torch.load(tmp_path / "ranks.pt", weights_only=True)

    update = stepper(data, World(), vocab_sizes(data))
    batches, order = micro_batches(data)
    loss, tokens = 0.0, 0
    for u in range(UPDATES):
        updated = update([(*batches.batch(idx), True) for idx in order[2 * u:2 * u + 2]])
        loss, tokens = loss + updated.loss_sum.item(), tokens + updated.tokens
    assert update.scheduler.last_epoch == UPDATES
    # Token-weighted loss: the same tokens, and the same float64 sum up to its summation
    # order (two ranks add their halves, one process adds batch after batch).
    assert ranks["loss"][1] == tokens and ranks["loss"][0] == pytest.approx(loss, rel=1e-14)
    initial = stepper(data, World(), vocab_sizes(data)).model.state_dict()
    assert all(not torch.equal(v, initial[k]) for k, v in update.model.named_parameters())  # moved
    for name, value in update.model.state_dict().items():
        torch.testing.assert_close(ranks["state"][name], value, rtol=0, atol=1e-10)


def pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(t, (0, length - t.shape[1]), value=PAD_ID)


def test_accumulating_two_batches_equals_one_double_batch(data):
    batches, order = micro_batches(data)
    acc = stepper(data, World(), vocab_sizes(data))
    big = stepper(data, World(), vocab_sizes(data))
    for u in range(UPDATES):
        pair = [batches.batch(idx) for idx in order[2 * u:2 * u + 2]]
        s_len = max(s.shape[1] for s, _ in pair)
        t_len = max(t.shape[1] for _, t in pair)
        pair = [(pad_to(s, s_len), pad_to(t, t_len)) for s, t in pair]  # padding is free
        a = acc([(s, t, True) for s, t in pair])
        b = big([(torch.cat([s for s, _ in pair]), torch.cat([t for _, t in pair]), True)])
        assert a.tokens == b.tokens
        # token_loss sums in float32 (logits.float()): one sum of 2B rows vs two of B rows.
        torch.testing.assert_close(a.loss_sum, b.loss_sum, rtol=1e-6, atol=0)
        # ... and the gradient norm (before clipping) is the same one update's
        torch.testing.assert_close(a.means["grad_norm"], b.means["grad_norm"], rtol=1e-6,
                                   atol=0)
    for name, value in acc.model.state_dict().items():
        torch.testing.assert_close(big.model.state_dict()[name], value, rtol=0, atol=1e-10)


def test_shard_pads_so_every_rank_steps_alike():
    order = [[i] for i in range(7)]
    parts = [shard(order, World(r, 3, group=True)) for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert sorted(i for p in parts for (i,), real in p if real) == list(range(7))
    assert [real for _, real in parts[1]] == [True, True, False]  # batch 7 does not exist
    assert shard(order, World()) == [(b, True) for b in order]


def test_torchrun_with_one_process_is_bit_identical(data, tmp_path):
    params = params_file(tmp_path, epochs=2)
    plain = {**data, "results": tmp_path / "plain"}
    assert cli.main(train_argv(params, plain)) == 0
    under = {**data, "results": tmp_path / "torchrun"}
    proc = nmt_process(train_argv(params, under), launcher=TORCHRUN + ["--nproc-per-node=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on 1 processes (cpu)" in proc.stderr  # DDP and the Gloo collectives did run
    assert_same_outputs(RUN.dir(plain["results"]), RUN.dir(under["results"]))


def history(run_dir) -> list[dict]:
    with open(run_dir / "history.csv") as f:
        return [{k: r[k] for k in ("epoch", "train_loss", "valid_loss", "lr")}
                for r in csv.DictReader(f)]


def test_devices_two_trains_like_accumulate_two_and_resumes(data, tmp_path):
    """nmt train with train.devices: 2 starts torchrun itself. 300 pairs / 32 = 10 batches:
    5 each; the same global updates as one process accumulating 2 (dropout 0)."""
    (tmp_path / "one").mkdir()
    one = params_file(tmp_path / "one", {"dropout": 0.0}, epochs=2, accumulate=2)
    two = params_file(tmp_path, {"dropout": 0.0}, epochs=2, devices=2, save_every_minutes=1e-9)
    ref = {**data, "results": tmp_path / "one" / "results"}
    assert cli.main(train_argv(one, ref)) == 0
    ddp = {**data, "results": tmp_path / "two"}
    # Rank 1 dies if it ever begins to write a resume state: only rank 0 writes.
    proc = nmt_process(train_argv(two, ddp), kill_at="save:1@1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = RUN.dir(ddp["results"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in RUN.files(ddp["results"]).trained)
    assert history(out) == history(RUN.dir(ref["results"]))
    a, _ = checkpoint.load(out / "best.pt")
    b, _ = checkpoint.load(RUN.dir(ref["results"]) / "best.pt")
    for name, value in a.state_dict().items():
        torch.testing.assert_close(value, b.state_dict()[name], rtol=0, atol=1e-5)

    # SIGTERM to rank 0 after update 3: both ranks stop there, rank 0 keeps the state.
    again = {**data, "results": tmp_path / "again"}
    proc = nmt_process(train_argv(two, again), kill_at="step:3:TERM@0")
    assert proc.returncode != 0
    assert "stopped by SIGTERM at epoch 1, step 3 of 10" in proc.stderr
    assert sorted(p.name for p in RUN.dir(again["results"]).iterdir()) == ["resume.pt"]
    proc = nmt_process(train_argv(two, again))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from epoch 1, step 3 of 10" in proc.stderr
    assert_same_outputs(out, RUN.dir(again["results"]))


def test_the_launcher_waits_without_torch_and_shares_its_threads(data, tmp_path):
    """`nmt train` with train.devices: 2 only starts torchrun and waits for it: it imports no
    torch (about 2 s of CPU a launch) and hands torchrun its own thread count to share out
    (--threads 2: one each)."""
    params = params_file(tmp_path, devices=2)
    argv = train_argv(params, {**data, "results": tmp_path / "r"}, "--threads", "2")
    probe = ("import sys, nmt.training.launch as launch; from nmt.cli import main\n"
             "launch.launch = lambda n, argv, threads: print(n, threads, 'torch' in sys.modules)"
             f"\nsys.exit(main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", str(min(2, len(os.sched_getaffinity(0)))), "False"]


def test_a_dead_rank_ends_the_job(data, tmp_path):
    params = params_file(tmp_path, epochs=50, devices=2)
    begin = time.monotonic()
    proc = nmt_process(train_argv(params, {**data, "results": tmp_path / "r"}),
                       kill_at="step:3@1", timeout=100)
    assert time.monotonic() - begin < 60
    assert proc.returncode != 0
    assert f"exitcode  : -{int(signal.SIGKILL)}" in proc.stderr  # torchrun names the dead rank
    assert "nmt train: error: rank 0: another training process failed or vanished" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "nmt train: training under torchrun failed (exit 1;")
