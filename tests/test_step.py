"""The one update (nmt.training.step): nmt bench times the update nmt train makes, and the
numbers an update reports reach history.csv.

- Same update: a Trainer (stage train's setup) and bench's make_update, from the same weights,
  seed and batch, give the same loss, gradient norm and weights, bit for bit, for every model.
  A bench update built with another label smoothing or without clipping differs, so the
  check would see a bench that timed a lighter update (as it once did).
- The gradient norm is the norm before clipping: the norm of the gradients one forward and
  backward give, above the clip (so clipping acted) and unchanged by it.
- history.csv's grad_norm column is the mean of the epoch's updates' norms.
"""

from __future__ import annotations

import copy
import csv

import pytest
import torch

from nmt.core.loss import token_loss
from nmt.core.runs import Run
from nmt.stages.bench import make_update
from nmt.training import loop
from nmt.training.loop import setup, train
from nmt.training.step import updater
from train_helpers import tiny_data, tiny_params, train_paths

pytestmark = pytest.mark.usefixtures("one_thread")
CLIP = 0.5


@pytest.fixture(scope="module")
def data(prepared, tmp_path_factory):
    return tiny_data(prepared, tmp_path_factory.mktemp("step"), train=96, val=32)


def settings(**train) -> dict:
    return tiny_params(**{"clip_grad_norm": CLIP, "label_smoothing": 0.1, "warmup_steps": 2,
                          **train})


def first_batch(trainer) -> list:
    idx, real = trainer.plan(1)[0]
    return [(*trainer.train_batches.batch(idx), real)]


def bench_twin(trainer, recipe: dict):
    """bench's update of a copy of the trainer's model (its weights as they are now)."""
    return make_update(copy.deepcopy(trainer.model), recipe, trainer.device, trainer.precision,
                       graphs=False, updates=trainer.total_updates)


def two_updates(trainer, twin, micro):
    """The trainer's and the twin's update of the same batch, each from the same seed
    (dropout draws the same masks)."""
    torch.manual_seed(7)
    ours = trainer.update(micro)
    torch.manual_seed(7)
    theirs = twin(micro)
    return ours, theirs


@pytest.mark.parametrize("model", ["baseline", "scratch", "decoder_only"])
def test_bench_times_the_update_train_makes(data, tmp_path, model):
    recipe = settings()
    trainer = setup(recipe, train_paths(data, tmp_path, Run("published", model, 0)))
    twin = bench_twin(trainer, recipe)
    micro = first_batch(trainer)
    for _ in range(3):  # Adam's first steps, the lr schedule's warmup
        ours, theirs = two_updates(trainer, twin, micro)
        assert ours.tokens == theirs.tokens
        assert torch.equal(ours.loss_sum, theirs.loss_sum)
        assert torch.equal(ours.means["grad_norm"], theirs.means["grad_norm"])
    weights = twin.model.state_dict()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert twin.scheduler.get_last_lr() == trainer.update.scheduler.get_last_lr()


@pytest.mark.parametrize("lighter", [{"label_smoothing": 0.0}, {"clip_grad_norm": 0.0}])
def test_a_lighter_bench_update_is_seen(data, tmp_path, lighter):
    """What the same-update check catches: a bench update without label smoothing (another
    loss) or without clipping (other weights)."""
    trainer = setup(settings(), train_paths(data, tmp_path, Run("published", "scratch", 0)))
    twin = bench_twin(trainer, settings(**lighter))
    ours, theirs = two_updates(trainer, twin, first_batch(trainer))
    weights = twin.model.state_dict()
    same_loss = torch.equal(ours.loss_sum, theirs.loss_sum)
    same_weights = all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())
    assert not (same_loss and same_weights)


def test_the_gradient_norm_is_taken_before_clipping(data, tmp_path):
    trainer = setup(settings(), train_paths(data, tmp_path, Run("published", "scratch", 0)))
    micro = first_batch(trainer)
    (src, tgt, _), = micro
    probe = copy.deepcopy(trainer.model)
    torch.manual_seed(7)
    loss, tokens = token_loss(probe, src, tgt, trainer.device, 0.1)
    (loss / tokens).backward()
    by_hand = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad) for p in probe.parameters()]))
    torch.manual_seed(7)
    updated = trainer.update(micro)
    assert updated.means["grad_norm"].item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert by_hand.item() > CLIP  # so clipping acted on this update


def test_history_holds_the_mean_gradient_norm_of_each_epoch(data, tmp_path, monkeypatch):
    norms = []

    def recording(*args, **kwargs):
        update = updater(*args, **kwargs)
        make = update.update

        def update_and_record(micro):
            updated = make(micro)
            norms.append(updated.means["grad_norm"].item())
            return updated

        update.update = update_and_record
        return update

    monkeypatch.setattr(loop, "updater", recording)
    run = Run("published", "scratch", 0)
    summary = train(settings(epochs=2), train_paths(data, tmp_path, run))
    with open(run.files(tmp_path).history) as f:
        rows = list(csv.DictReader(f))
    per_epoch = summary["updates"] // 2
    assert len(norms) == summary["updates"] == 2 * per_epoch and len(rows) == 2
    for row, epoch in zip(rows, (norms[:per_epoch], norms[per_epoch:]), strict=True):
        assert float(row["grad_norm"]) == pytest.approx(sum(epoch) / len(epoch), abs=1e-5)
    assert list(rows[0]) == ["epoch", "train_loss", "valid_loss", "lr", "grad_norm", "seconds",
                             "tokens_per_second"]
