"""run_checks: both kinds of check on one configuration, for the models the registry names
checks for (nmt.models.registry: each entry's `checks`, check sets by name).

- twin checks (equivalence.py, the check set "equivalence"): scratch against
  torch.nn.Transformer on shared weights, where the reference can express the configuration
  (build_model("baseline", cfg) does not refuse it);
- property checks (properties.py, "properties"; a model's own module, decoder_only.py): for
  every model with a check set that can be built with the configuration, always; a
  configuration without a twin (model.positions rotary) passes verify on its properties alone.
A check set is the module of nmt.stages.verify of its name, with `checks(name, cfg,
src_vocab_size, tgt_vocab_size, pad_id, batches, seed)` and, where the result's "config"
records the model's sizes, `sizes(cfg, src_vocab_size, tgt_vocab_size)`.

The result: {"passed", "checks": [{"name", "kind", "passed", "max_abs_diff", "tolerance",
"seconds"}], "twin": bool, "twin_reason", "skipped": {model: why}, "config", "trajectory"}.
"""

import dataclasses
import importlib
import time

import torch

from nmt.models import ModelConfig, build_model
from nmt.models.registry import MODELS, REFERENCE, TWIN_CHECKS, entry
from nmt.stages.verify.equivalence import (
    TRAJECTORY_ADAM,
    TRAJECTORY_STEPS,
    trajectory_model,
    twin_checks,
)
from nmt.stages.verify.measure import check_batches

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


def model_sizes(cfg: ModelConfig, vocab: tuple) -> dict:
    """{model: its sizes} for each model whose check sets record them (decoder_only: layers)."""
    return {name: check_set(check_name).sizes(cfg, *vocab)
            for name, model in MODELS.items() for check_name in model.checks
            if hasattr(check_set(check_name), "sizes")}


def run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded) -> dict:
    """The result's "config": sizes, seeds and batches the checks ran with."""
    return {"model": dataclasses.asdict(cfg), "trajectory_model": dataclasses.asdict(tcfg),
            "src_vocab_size": vocab[0], "tgt_vocab_size": vocab[1],
            "pad_id": pad_id, "seed": seed, "trajectory_steps": TRAJECTORY_STEPS,
            "trajectory_adam": TRAJECTORY_ADAM, **model_sizes(cfg, vocab),
            "check_batches": {"unpadded": list(unpadded[0].shape) + [unpadded[1].size(1)],
                              "padded": list(padded[0].shape) + [padded[1].size(1)]},
            "torch": torch.__version__}


def run_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
               train_batches: list, trajectory_cfg: ModelConfig | None = None,
               seed: int = 0) -> dict:
    """Run both kinds of check on CPU, model by model in the registry's order; see the module
    docstring for the result's layout."""
    if len(train_batches) < TRAJECTORY_STEPS:
        raise ValueError(f"run_checks needs at least {TRAJECTORY_STEPS} training batches for "
                         f"the trajectory check, got {len(train_batches)}")
    tcfg = dataclasses.replace(trajectory_cfg or trajectory_model(cfg), dropout=0.0)
    vocab = (src_vocab_size, tgt_vocab_size)
    train_batches = [(s.cpu(), t.cpu()) for s, t in train_batches]
    unpadded, padded = check_batches(train_batches, pad_id)
    started, checks, curves, skipped = time.perf_counter(), [], {}, {}
    no_twin = refusal(REFERENCE, cfg, vocab, pad_id)
    for name, model in MODELS.items():
        if not model.checks:
            continue
        if (why := refusal(name, cfg, vocab, pad_id)) is not None:
            skipped[name] = why
            continue
        if TWIN_CHECKS in model.checks and no_twin is None:
            twins, curves = twin_checks(cfg, vocab, pad_id, train_batches, tcfg, seed,
                                        unpadded, padded)
            checks += twins
        checks += model_checks(name, cfg, *vocab, pad_id, train_batches, seed)
    config = run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded)
    config["seconds"] = round(time.perf_counter() - started, 2)
    return {"passed": all(c["passed"] for c in checks), "checks": checks,
            "twin": no_twin is None, "twin_reason": TWIN if no_twin is None else no_twin,
            "skipped": skipped, "config": config, "trajectory": curves}
