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
import math

import pytest
import torch

from nmt.core.loss import token_loss
from nmt.core.runs import Run
from nmt.stages.bench import make_update
from nmt.training import loop
from nmt.training.loop import setup, train
from nmt.training.step import lr_factor, updater
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


def micro_batch_model():
    """A seeded tiny scratch model without dropout, and one padded batch of it."""
    from nmt.models import ModelConfig, build_model

    torch.manual_seed(0)
    cfg = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                      dim_feedforward=32, dropout=0.0, max_len=32)
    model = build_model("scratch", cfg, 30, 30)
    src, tgt = torch.randint(4, 30, (3, 7)), torch.randint(4, 30, (3, 6))
    src[0, -2:], tgt[1, -3:], tgt[:, 0] = 1, 1, 2
    return model, src, tgt


def gradients(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_a_micro_batch_backpropagates_its_share_of_the_update():
    """forward_backward against its loss by hand: the gradient of the summed token loss over
    the update's tokens (`total`), times the ranks (DDP's mean over ranks made their sum); a
    padding micro-batch (not real) adds nothing, and nothing that is not finite; the update's
    precision reaches the loss."""
    from nmt.training.step import UpdateConfig, forward_backward

    model, src, tgt = micro_batch_model()
    cpu, config, total = torch.device("cpu"), UpdateConfig(label_smoothing=0.1), torch.tensor(40.0)
    loss, _ = token_loss(model, src, tgt, cpu, 0.1)
    (loss / total).backward()
    by_hand = gradients(model)
    for ranks in (1, 2):
        model.zero_grad()
        returned = forward_backward(model, src, tgt, cpu, config, total,
                                    **({"ranks": ranks} if ranks > 1 else {}))
        assert returned.item() == loss.item() and not returned.requires_grad
        for got, want in zip(gradients(model), by_hand, strict=True):
            torch.testing.assert_close(got, want * ranks)
    model.zero_grad()
    forward_backward(model, src, tgt, cpu, config, total, real=False)
    assert all(g.isfinite().all() and not g.any() for g in gradients(model))
    bf16 = UpdateConfig(precision="bf16", label_smoothing=0.1)
    want = token_loss(model, src, tgt, cpu, 0.1, precision="bf16")[0]
    assert forward_backward(model, src, tgt, cpu, bf16, total).item() == want.item() != loss.item()


def test_a_clip_of_0_leaves_the_gradients_alone():
    """clip_and_step with train.clip_grad_norm 0 steps as the optimizer does unclipped; a clip
    below the norm scales the step down."""
    from nmt.training.step import clip_and_step

    model, src, tgt = micro_batch_model()
    steps = {}
    for clip in (None, 0.0, 1e-3):
        twin = copy.deepcopy(model)
        loss, tokens = token_loss(twin, src, tgt, torch.device("cpu"))
        (loss / tokens).backward()
        before = [p.detach().clone() for p in twin.parameters()]
        optimizer = torch.optim.SGD(twin.parameters(), lr=1.0)
        if clip is None:
            optimizer.step()
        else:
            norm = clip_and_step(twin, optimizer, clip)["grad_norm"]
        steps[clip] = torch.cat([(p.detach() - b).flatten()
                                 for p, b in zip(twin.parameters(), before, strict=True)])
    assert steps[0.0].equal(steps[None]) and steps[None].any()
    torch.testing.assert_close(steps[1e-3].norm(), torch.tensor(1e-3), rtol=1e-3, atol=0)
    assert norm > 1e-3


class TwoInputs(torch.nn.Module):
    """A stand-in for a model's forward(src, tgt) whose code is the test's own: dynamo traces
    it alone (a model of nmt.models, under make mutate, reads mutmut's trampolines too, and
    every mutant compiled fifteen graphs)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(30, 8)

    def forward(self, src, tgt):
        return self.embed(src).mean(1) @ self.embed(tgt).mean(1).T


def test_compiled_makes_one_graph_for_batches_of_other_sizes():
    """step.compiled as train calls it, with dynamo's eager backend (no code generated), over
    batches of other sizes, the first square (duck shaping gave its sizes one symbol and
    compiled again when they parted; without dynamic shapes, each size compiled): one graph,
    counted from compiled()'s call on. tests/test_gpu_path.py compiles the model itself."""
    from torch._dynamo.utils import counters

    from nmt.training.step import compiled

    # train's own call, with the default backend: one torch.compile knows (it refuses others)
    assert isinstance(compiled(TwoInputs()), torch._dynamo.eval_frame.OptimizedModule)
    counters["stats"]["unique_graphs"] += 5  # an earlier model's, which compiled() clears
    step_model = compiled(TwoInputs(), backend="eager")
    for batch, source, target in ((4, 4, 4), (3, 7, 5), (2, 9, 3)):
        step_model(torch.randint(4, 30, (batch, source)), torch.randint(4, 30, (batch, target)))
    assert counters["stats"]["unique_graphs"] == 1


def test_a_failed_compile_updates_eagerly_from_there_and_says_why(caplog):
    """A compiler that fails (here a backend that raises; dynamo wraps its error) costs the
    speed, not the update: the update is the eager one, compile_failed names the compiler's
    own error, and the run stays eager. Under DDP (2 ranks) it is raised: the ranks would have
    to fall back together."""
    import logging

    from nmt.training.distributed import World
    from nmt.training.step import UpdateConfig, Updater, compiled, root_cause

    def failing(graph, inputs):
        raise RuntimeError("no working C++ compiler\nwhat it tried")

    model, src, tgt = micro_batch_model()
    micro, cpu = [(src, tgt, True)], torch.device("cpu")

    def make(step=None, world=None):
        twin = copy.deepcopy(model)
        return Updater(model=twin, optimizer=torch.optim.SGD(twin.parameters(), lr=0.1),
                       scheduler=None, device=cpu, config=UpdateConfig(), world=world or World(),
                       **({"step_model": step(twin)} if step else {}))

    eager, failed = make(), make(lambda m: compiled(m, backend=failing))
    assert failed.compiled and not eager.compiled and eager.step_model is eager.model
    with caplog.at_level(logging.WARNING, logger="nmt"):
        ours, theirs = eager(micro), failed(micro)
    assert failed.compile_failed == "RuntimeError: no working C++ compiler"
    assert caplog.messages == ["torch.compile failed (RuntimeError: no working C++ compiler): "
                               "training eagerly from here"]
    assert not failed.compiled and failed.step_model is failed.model
    assert ours.loss_sum.item() == theirs.loss_sum.item() and ours.tokens == theirs.tokens
    for a, b in zip(eager.model.parameters(), failed.model.parameters(), strict=True):
        assert a.equal(b)
    with pytest.raises(Exception, match="no working C"):
        make(lambda m: compiled(m, backend=failing), World(size=2))(micro)
    try:
        raise ValueError("the cause\nmore") from OSError()
    except ValueError as error:
        assert root_cause(error) == "OSError: "
    assert len(root_cause(ValueError("x" * 400))) <= 300


def test_the_updater_steps_as_adam_by_hand_on_its_schedule():
    """updater() against an update written out: the gradient of two micro-batches' summed
    token loss (label smoothing 0.1) over their tokens, a padding micro-batch adding nothing,
    clipped to train.clip_grad_norm, then Adam's bias-corrected moments at the recipe's lr,
    betas and eps on train's schedule: 2 warmup updates then linear decay to zero after update
    6, so the lr factors of updates 1, 2, 3 are 1/2, 1 and 3/4. It runs neither compiled nor
    as CUDA graphs unless asked."""
    from dataclasses import replace

    from nmt.training.config import TrainConfig

    config = replace(TrainConfig.from_dict(tiny_params()["train"]), lr=0.01, betas=(0.8, 0.95),
                     eps=1e-6, warmup_steps=2, schedule="linear", clip_grad_norm=0.05,
                     label_smoothing=0.1)
    model, src, tgt = micro_batch_model()
    cpu = torch.device("cpu")
    micro = [(src[:2], tgt[:2], True), (src[2:], tgt[2:], True), (src, tgt, False)]
    assert updater(copy.deepcopy(model), config, cpu, precision="fp32", total_updates=6,
                   compile_on=True).compiled  # (it compiles at its first update)
    update = updater(model, config, cpu, precision="fp32", total_updates=6)
    assert not update.compiled and update.graphs is None
    (b1, b2), eps = config.betas, config.eps
    m = [torch.zeros_like(p) for p in model.parameters()]
    v = [torch.zeros_like(p) for p in model.parameters()]
    for t, factor in enumerate((0.5, 1.0, 0.75), start=1):
        probe = copy.deepcopy(model)
        losses = [token_loss(probe, s, g, cpu, 0.1) for s, g, _ in micro[:2]]
        (sum(loss for loss, _ in losses) / sum(n for _, n in losses)).backward()
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in probe.parameters()]))
        assert norm.item() > 0.05  # so clipping acts
        before = [p.detach().clone() for p in model.parameters()]
        updated = update(micro)
        assert updated.loss_sum.item() == sum(loss.double() for loss, _ in losses).item()
        assert updated.means["grad_norm"].item() == pytest.approx(norm.item(), rel=1e-5)
        for p, w, g, m_i, v_i in zip(model.parameters(), before, probe.parameters(), m, v,
                                     strict=True):
            g = g.grad * min(1.0, 0.05 / norm.item())  # clipped
            m_i.mul_(b1).add_((1 - b1) * g)
            v_i.mul_(b2).add_((1 - b2) * g * g)
            step = 0.01 * factor * (m_i / (1 - b1**t)) / ((v_i / (1 - b2**t)).sqrt() + eps)
            torch.testing.assert_close(p.detach(), w - step, rtol=1e-4, atol=1e-6)


def test_lr_factor_values():
    assert [lr_factor(s, 0) for s in (0, 1, 5, 10_000)] == [1.0] * 4
    # Linear warmup over 4 updates, peak 1.0 at update 4, then sqrt(4 / step).
    assert [lr_factor(s, 4) for s in range(1, 9)] == [
        0.25, 0.5, 0.75, 1.0, math.sqrt(4 / 5), math.sqrt(4 / 6), math.sqrt(4 / 7), 0.5 ** 0.5]
    assert lr_factor(0, 4) == lr_factor(1, 4) == 0.25  # the first update never runs at lr 0
    assert lr_factor(400, 100) == 0.5


def test_linear_and_cosine_decay_to_zero_over_the_run():
    for schedule in ("linear", "cosine"):
        curve = [lr_factor(s, 4, schedule, total=20) for s in range(1, 21)]
        assert curve[:4] == [0.25, 0.5, 0.75, 1.0]  # the same warmup
        assert all(a > b for a, b in zip(curve[3:], curve[4:], strict=False))  # then falls
        assert curve[-1] == 0.0 and lr_factor(25, 4, schedule, total=20) == 0.0
    assert lr_factor(12, 4, "linear", total=20) == 0.5  # halfway from the peak to the end
    assert lr_factor(12, 4, "cosine", total=20) == pytest.approx(0.5)
    assert lr_factor(8, 4, "cosine", total=20) > lr_factor(8, 4, "linear", total=20)
    assert [lr_factor(s, 0, "linear", total=4) for s in (1, 2, 3, 4)] == [0.75, 0.5, 0.25, 0.0]
    # one update after the warmup: the peak, then zero
    assert [lr_factor(s, 3, "linear", total=4) for s in (2, 3, 4)] == [2 / 3, 1.0, 0.0]
