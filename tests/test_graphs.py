"""CUDA graph updates (nmt.training.graphs), checked on the CPU where they cannot be captured:
what a capture needs of the update, which the CPU can show.

- The update a graph records (nmt.training.step.graph_body) is the update training makes eagerly:
  the same weights after three updates, bit for bit, for every model (a body that forgot the
  clipping or divided by another token count fails).
- It makes no host synchronization, which a capture refuses ("operation not permitted when
  stream is capturing"): every op it dispatches, forward, backward, clipping and Adam, is
  checked against the ops that read a device value back to the host (.item(), bool(),
  torch.equal, nonzero). A planted .item() is caught.
- Graphs are used only where they can run: CUDA, an eager step, one process, one micro-batch.
- A failure in the graph path costs the speed, not the run: here the real failure of a CPU
  without CUDA (pinning a batch), after which the update runs eagerly and trains as if the
  graphs had never been tried.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import REPO
from nmt.core.codecs import PAD_ID
from nmt.core.runs import Run
from nmt.training.graphs import GraphedUpdates, resolve_cuda_graphs, resolve_pad_multiple
from nmt.training.loop import setup, train
from nmt.training.step import lr_factor, updater
from train_helpers import params_file, tiny_data, tiny_params, train_paths

pytestmark = pytest.mark.usefixtures("one_thread")
MODELS = ("baseline", "scratch", "decoder_only")
# aten ops that copy a device value to the host: on CUDA each waits for the GPU.
HOST_READS = {"_local_scalar_dense", "equal", "nonzero", "is_nonzero", "masked_select",
              "unique", "_unique2"}


class HostReads(TorchDispatchMode):
    """Records every dispatched op that reads a tensor's value back to the host."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in HOST_READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def data(prepared, tmp_path_factory):
    return tiny_data(prepared, tmp_path_factory.mktemp("graphs"), train=96, val=32)


def graphed_updater(*args, **kwargs):
    """step.updater with train.cuda_graphs on, its GraphedUpdates taken away: an eager update
    with the Adam CUDA graphs replay (fused, capturable, its lr a tensor: all three run on the
    CPU too) and its lr schedule."""
    update = updater(*args, **{**kwargs, "graphs_on": True})
    update.graphs = None
    return update


def trainer_for(data, model: str, tmp_path, dropout: float = 0.1, graphs: bool = False,
                **train):
    """A tiny run's Trainer whose update step.updater built with train.cuda_graphs on: the
    Adam the graphs replay and their GraphedUpdates, kept as `trainer.graphs`; updates go
    eagerly unless `graphs` (then through the GraphedUpdates, whose first capture fails on a
    CPU)."""
    settings = tiny_params(clip_grad_norm=0.5, label_smoothing=0.1, warmup_steps=2, **train)
    settings["model"]["dropout"] = dropout
    trainer = setup(settings, train_paths(data, tmp_path, Run("published", model, 0)))
    with torch.device("meta"):  # what it makes without a device is not on the model's
        trainer.update = updater(trainer.model, trainer.config, trainer.device,
                                 precision=trainer.precision,
                                 total_updates=trainer.total_updates, graphs_on=True)
    trainer.graphs = trainer.update.graphs
    if not graphs:
        trainer.update.graphs = None
    return trainer


def body(trainer):
    """The update the trainer's graphs record (step.graph_body, as step.updater gave it)."""
    return trainer.graphs.body


def batches(trainer, n: int):
    return [trainer.train_batches.batch(idx) for idx, _ in trainer.plan(1)[:n]]


def tokens(tgt: torch.Tensor) -> int:
    return int((tgt[:, 1:] != PAD_ID).sum())


@pytest.mark.parametrize("model", MODELS)
def test_the_captured_update_is_the_eager_update(data, tmp_path, model):
    """Three updates through graph_body (gradients set to None first, lr schedule stepped
    after, as nmt.training.graphs replays them) leave the weights update() leaves, bit for bit.
    Both run with `meta` as torch's default device: a tensor either makes without a device
    (the lr Adam replays, the summed loss) would not be on the model's, as on a GPU."""
    eager = trainer_for(data, model, tmp_path / "eager", dropout=0.0)
    graphed = trainer_for(data, model, tmp_path / "graphed", dropout=0.0)
    recorded, update = body(graphed), graphed.update
    assert graphed.graphs.optimizer is update.optimizer and graphed.graphs.device == update.device
    with torch.device("meta"):
        for src, tgt in batches(eager, 3):
            updated = eager.update([(src, tgt, True)])
            update.optimizer.zero_grad(set_to_none=True)
            loss, _ = recorded(src, tgt, torch.tensor(float(tokens(tgt)), dtype=torch.float64,
                                                      device="cpu"))
            update.scheduler.step()
            assert float(updated.loss_sum) == float(loss) and updated.tokens == tokens(tgt)
    weights = eager.model.state_dict()
    for name, value in graphed.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    # The schedule filled the lr tensor in place: after 3 updates, 2 of warmup, sqrt(2/4) x lr.
    expected = graphed.config.lr * lr_factor(4, 2, "inverse_sqrt")
    for trainer in (eager, graphed):
        assert abs(float(trainer.update.optimizer.param_groups[0]["lr"]) - expected) < 1e-10


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model", MODELS)
def test_the_captured_update_reads_nothing_back_to_the_host(data, tmp_path, model, precision):
    trainer = trainer_for(data, model, tmp_path, precision=precision)
    recorded = body(trainer)
    (src, tgt), = batches(trainer, 1)
    total = torch.tensor(float(tokens(tgt)), dtype=torch.float64)
    recorded(src, tgt, total)  # Adam's state made, as the eager warm-up updates make it
    trainer.update.optimizer.zero_grad(set_to_none=True)
    with HostReads() as reads:
        loss, means = recorded(src, tgt, total)
    assert reads.seen == [] and set(means) == {"grad_norm"}
    with HostReads() as planted:  # what the check catches: the loss read for a log line
        loss.item()
    assert planted.seen == ["aten._local_scalar_dense.default"]


def test_cuda_graphs_run_only_where_they_can():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    alone = {"compiled": False, "processes": 1, "accumulate": 1}
    assert resolve_cuda_graphs("auto", cuda, **alone) is True
    assert resolve_cuda_graphs(False, cuda, **alone) is False
    assert resolve_cuda_graphs("auto", cpu, **alone) is False
    for other in ({"compiled": True}, {"processes": 2}, {"accumulate": 2}):
        assert resolve_cuda_graphs("auto", cuda, **(alone | other)) is False, other


def test_pad_multiple_auto_pads_to_8_only_where_updates_are_graphed():
    """223 batch shapes of the published recipe, one graph each, become 16 padded to 8."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    alone = {"compiled": False, "processes": 1, "accumulate": 1}
    graphed = resolve_cuda_graphs("auto", cuda, **alone)
    assert resolve_pad_multiple("auto", graphed) == 8
    for eager in (resolve_cuda_graphs("auto", cpu, **alone),
                  resolve_cuda_graphs(False, cuda, **alone),
                  resolve_cuda_graphs("auto", cuda, **(alone | {"accumulate": 2}))):
        assert resolve_pad_multiple("auto", eager) == 1
    assert resolve_pad_multiple(4, graphed) == 4 and resolve_pad_multiple(3, False) == 3


@pytest.mark.parametrize(("setting", "multiple"), [("auto", 1), (8, 8)])
def test_training_batches_are_padded_to_the_resolved_multiple(data, tmp_path, setting,
                                                               multiple):
    trainer = setup(tiny_params(pad_multiple=setting),
                    train_paths(data, tmp_path, Run("published", "scratch", 0)))
    shapes = {tensor.shape[1] for idx, _ in trainer.plan(1)
              for tensor in trainer.train_batches.batch(idx)}
    assert trainer.train_batches.pad_multiple == trainer.valid_batches.pad_multiple == multiple
    assert all(length % multiple == 0 for length in shapes)
    assert multiple == 8 or any(length % 8 for length in shapes)  # auto on a CPU: unpadded


def test_a_cpu_run_has_no_graphs_and_a_plain_lr(data, tmp_path):
    trainer = setup(tiny_params(), train_paths(data, tmp_path, Run("published", "scratch", 0)))
    assert trainer.config.cuda_graphs == "auto" and trainer.update.graphs is None
    group = trainer.update.optimizer.param_groups[0]
    assert isinstance(group["lr"], float) and not group["capturable"]


def test_a_failed_capture_updates_eagerly_and_says_why(data, tmp_path, caplog):
    eager = trainer_for(data, "scratch", tmp_path / "eager", dropout=0.0)
    failing = trainer_for(data, "scratch", tmp_path / "failing", dropout=0.0, graphs=True)
    for src, tgt in batches(eager, 2):
        eager.update([(src, tgt, True)])
        failing.update([(src, tgt, True)])
    assert failing.update.graphs is None and "accelerator" in failing.update.graphs_failed
    warnings = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert warnings == [f"a CUDA graph capture failed ({failing.update.graphs_failed}): "
                        "updating eagerly from here"]
    weights = eager.model.state_dict()
    for name, value in failing.model.state_dict().items():
        assert torch.equal(value, weights[name]), name


def out_of_memory(*args, **kwargs):
    """What a capture meets when the new shape's graph does not fit beside the others."""
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")


def test_a_capture_out_of_memory_frees_the_graphs_and_updates_eagerly(data, tmp_path, caplog,
                                                                       monkeypatch):
    """The capture itself is what fails (the CPU cannot record a graph; recording raises out of
    memory here): pinning is let through and the warm-up counted as done, so the first update
    goes straight to the capture. The run goes on eagerly, as an eager run would, with the
    graphs, their pool and the gradients recorded into it released."""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: tensor)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", out_of_memory)
    eager = trainer_for(data, "scratch", tmp_path / "eager", dropout=0.0)
    failing = trainer_for(data, "scratch", tmp_path / "failing", dropout=0.0, graphs=True)
    graphs = failing.update.graphs
    graphs.warmup_left, graphs.pool = 0, object()  # as if earlier shapes had been captured
    for src, tgt in batches(eager, 2):
        eager.update([(src, tgt, True)])
        failing.update([(src, tgt, True)])
    assert (failing.update.graphs is None
            and failing.update.graphs_failed.startswith("OutOfMemoryError: CUDA"))
    assert graphs.graphs == {} and graphs.pool is None
    warnings = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(warnings) == 1 and "updating eagerly from here" in warnings[0]
    weights = eager.model.state_dict()
    for name, value in failing.model.state_dict().items():
        assert torch.equal(value, weights[name]), name


@pytest.mark.parametrize("graphed", [True, False])
def test_out_of_memory_outside_a_capture_is_raised(data, tmp_path, monkeypatch, graphed):
    """Only a capture falls back: out of memory in an eager update, or in a graphed update that
    captures nothing (here the warm-up), stops the run as before, graphs kept."""
    trainer = trainer_for(data, "scratch", tmp_path, graphs=graphed)
    if graphed:
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor: tensor)
        monkeypatch.setattr(GraphedUpdates, "warm_up", out_of_memory)
    else:
        monkeypatch.setattr(trainer.update.optimizer, "step", out_of_memory)
    (src, tgt), = batches(trainer, 1)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.update([(src, tgt, True)])
    assert (trainer.update.graphs is not None) == graphed and trainer.update.graphs_failed == ""


def numbers_in(value) -> list:
    """Every leaf of a JSON value that is not a string, a boolean or null, however deep."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in numbers_in(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in numbers_in(item)]
    return [] if isinstance(value, str | bool) or value is None else [value]


def test_a_tensor_lr_is_written_as_a_number(data, tmp_path, monkeypatch):
    """With CUDA graphs the lr is a device tensor (capturable Adam): history.csv and train.json
    still hold plain numbers, never `tensor(0.0005, device='cuda:0')`."""
    monkeypatch.setattr("nmt.training.loop.updater", graphed_updater)
    run = Run("published", "scratch", 0)
    summary = train(tiny_params(epochs=2, warmup_steps=2),
                    train_paths(data, tmp_path, run))
    files = run.files(tmp_path)
    with open(files.history) as f:
        rows = list(csv.DictReader(f))
    columns = {"epoch", "train_loss", "valid_loss", "lr", "grad_norm", "seconds",
               "tokens_per_second"}
    assert len(rows) == 2 and all(set(row) == columns for row in rows)
    for row in rows:
        for name, text in row.items():
            assert float(text) == float(text), f"history.csv {name}: {text!r}"  # parses, no NaN
    written = json.loads(files.summary.read_text())
    assert written == summary and written["pad_multiple"] == 1  # auto, resolved on a CPU
    for key in ("params", "epochs", "best_valid_loss", "updates", "seconds_per_epoch",
                "tokens_per_second", "train_pairs", "valid_bleu_greedy"):
        assert type(written[key]) in (int, float), key
    assert all(type(leaf) in (int, float) for leaf in numbers_in(written))
    assert not [text for text in json.dumps(written).split('"') if "tensor(" in text]


def test_check_graphs_dry_runs_on_the_cpu(data, tmp_path):
    """tools/gpu/check_graphs.py at tiny size: without CUDA every update is eager, and each
    check, the dropout ones included (fresh masks, their mean, the kept share), runs and
    passes on eager updates."""
    params = params_file(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        [sys.executable, str(REPO / "tools/gpu/check_graphs.py"), "--params", str(params),
         "--data", str(data["tokenized"].parent), "--updates", "10"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no CUDA: a dry run" in done.stdout
    report = json.loads((tmp_path / "out" / "check_graphs.json").read_text())
    checks = ("equivalence", "dropout_fresh_masks", "dropout_mean", "dropout_kept")
    assert report["ok"] and all(report[check]["ok"] for check in checks)
    assert report["dry_run"] and not report["dropout_graphed"] and report["dropout"] == 0.1
    assert len(set(report["dropout_fresh_masks"]["losses_on"])) == 8
    assert abs(report["dropout_kept"]["kept_share"] - 0.9) <= report["dropout_kept"]["tolerance"]
