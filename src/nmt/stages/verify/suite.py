"""run_checks: both kinds of check on one configuration, for the models the registry names
checks for (nmt.models.registry: each entry's `checks`, check sets by name).

- twin checks (equivalence.py, the check set "equivalence"): scratch against
  torch.nn.Transformer on shared weights, where the reference can express the configuration
  (build_model("baseline", cfg) does not refuse it);
- property checks (properties.py, "properties"; a model's own module, decoder_only.py): for
  every model with a check set that can be built with the configuration, always; a
  configuration without a twin (model.positions rotary) passes verify on its properties alone.
A check set is the module of nmt.stages.verify of its name, loaded by that name (so a verify
job runs its own model's check sets only, nmt.pipeline.code.check_code), with `checks(name,
cfg, src_vocab_size, tgt_vocab_size, pad_id, batches, seed)` (the twin check set:
`twin_checks`) and, where the result's "config" records the model's sizes, `sizes(cfg,
src_vocab_size, tgt_vocab_size)`.

The result: {"passed", "checks": [{"name", "kind", "passed", "max_abs_diff", "tolerance",
"seconds"}], "models": the models checked, "twin": whether the twin checks ran (None: no
model checked has them), "twin_reason",
"skipped": {model: why}, "config", "trajectory"}. nmt verify checks one model a job (its
record: results/verify/<recipe>-<model>.json), so that an edit of one model's code re-runs
its own checks and trainings only.
"""

import dataclasses
import importlib
import time

import torch

from nmt.models import ModelConfig, build_model
from nmt.models.registry import MODELS, REFERENCE, TWIN_CHECKS, entry
from nmt.stages.verify.measure import (
    TRAJECTORY_ADAM,
    TRAJECTORY_STEPS,
    check_batches,
    trajectory_model,
)

TWIN = "torch.nn.Transformer expresses this configuration: scratch checked on shared weights"


def check_set(name: str):
    """The module of nmt.stages.verify that a registry entry's check set names."""
    return importlib.import_module(f"{__package__}.{name}")


def model_checks(name: str, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int, batches: list, seed: int = 0) -> list[dict]:
    """Model `name`'s property checks: every check set of its registry entry but the twin's."""
    return [check for check_name in entry(name).checks if check_name != TWIN_CHECKS
            for check in check_set(check_name).checks(name, cfg, src_vocab_size,
                                                      tgt_vocab_size, pad_id, batches, seed)]


def refusal(name: str, cfg: ModelConfig, vocab: tuple, pad_id: int) -> str | None:
    """Why build_model(name, cfg) refuses the configuration, or None when it builds (on the
    meta device: no memory, no time, the RNG untouched)."""
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            build_model(name, cfg, *vocab, pad_id)
    except ValueError as e:
        return str(e)
    return None


def model_sizes(cfg: ModelConfig, vocab: tuple, models: list[str]) -> dict:
    """{model: its sizes} for each of `models` whose check sets record them (decoder_only:
    layers)."""
    return {name: check_set(check_name).sizes(cfg, *vocab)
            for name in models for check_name in MODELS[name].checks
            if hasattr(check_set(check_name), "sizes")}


def run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded, models) -> dict:
    """The result's "config": sizes, seeds and batches the checks ran with."""
    return {"model": dataclasses.asdict(cfg), "trajectory_model": dataclasses.asdict(tcfg),
            "src_vocab_size": vocab[0], "tgt_vocab_size": vocab[1],
            "pad_id": pad_id, "seed": seed, "trajectory_steps": TRAJECTORY_STEPS,
            "trajectory_adam": TRAJECTORY_ADAM, **model_sizes(cfg, vocab, models),
            "check_batches": {"unpadded": list(unpadded[0].shape) + [unpadded[1].size(1)],
                              "padded": list(padded[0].shape) + [padded[1].size(1)]},
            "torch": torch.__version__}


def run_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
               train_batches: list, trajectory_cfg: ModelConfig | None = None,
               seed: int = 0, models: tuple[str, ...] | None = None) -> dict:
    """Run both kinds of check on CPU for `models` (None: every registered one), model by
    model in the registry's order; see the module docstring for the result's layout. A
    model without check sets (the reference, which scratch's twin checks hold to) passes on
    none."""
    if len(train_batches) < TRAJECTORY_STEPS:
        raise ValueError(f"run_checks needs at least {TRAJECTORY_STEPS} training batches for "
                         f"the trajectory check, got {len(train_batches)}")
    tcfg = dataclasses.replace(trajectory_cfg or trajectory_model(cfg), dropout=0.0)
    vocab = (src_vocab_size, tgt_vocab_size)
    train_batches = [(s.cpu(), t.cpu()) for s, t in train_batches]
    unpadded, padded = check_batches(train_batches, pad_id)
    started, checks, curves, skipped = time.perf_counter(), [], {}, {}
    checked = [name for name in MODELS if models is None or name in models]
    twinned = [name for name in checked if TWIN_CHECKS in MODELS[name].checks]
    no_twin = (refusal(REFERENCE, cfg, vocab, pad_id) if twinned
               else f"{', '.join(checked)}: no twin check set")
    for name in checked:
        if not MODELS[name].checks:
            continue
        if (why := refusal(name, cfg, vocab, pad_id)) is not None:
            skipped[name] = why
            continue
        if name in twinned and no_twin is None:
            twins, curves = check_set(TWIN_CHECKS).twin_checks(
                cfg, vocab, pad_id, train_batches, tcfg, seed, unpadded, padded)
            checks += twins
        checks += model_checks(name, cfg, *vocab, pad_id, train_batches, seed)
    config = run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded, checked)
    config["seconds"] = round(time.perf_counter() - started, 2)
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "models": checked,
            "twin": (no_twin is None) if twinned else None,
            "twin_reason": TWIN if no_twin is None else no_twin,
            "skipped": skipped, "config": config, "trajectory": curves}
