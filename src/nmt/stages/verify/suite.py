"""run_checks: both kinds of check on one configuration.

- twin checks (equivalence.py): scratch against torch.nn.Transformer on shared weights, where
  the baseline can express the configuration (build_model("baseline", cfg) does not refuse it);
- property checks (properties.py, decoder_only.py): for every model that can be built with the
  configuration, always; a configuration without a twin (model.positions rotary) passes verify
  on its properties alone.

The result: {"passed", "checks": [{"name", "kind", "passed", "max_abs_diff", "tolerance",
"seconds"}], "twin": bool, "twin_reason", "skipped": {model: why}, "config", "trajectory"}.
"""

import dataclasses
import time

import torch

from nmt.models import ModelConfig, build_model
from nmt.stages.verify import decoder_only
from nmt.stages.verify.equivalence import (
    TRAJECTORY_ADAM,
    TRAJECTORY_STEPS,
    trajectory_model,
    twin_checks,
)
from nmt.stages.verify.measure import check_batches
from nmt.stages.verify.properties import scratch_checks

TWIN = "torch.nn.Transformer expresses this configuration: scratch checked on shared weights"


def refusal(name: str, cfg: ModelConfig, vocab: tuple, pad_id: int) -> str | None:
    """Why build_model(name, cfg) refuses the configuration, or None when it builds (on the
    meta device: no memory, no time, the RNG untouched)."""
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            build_model(name, cfg, *vocab, pad_id)
    except ValueError as e:
        return str(e)
    return None


def run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded) -> dict:
    """The result's "config": sizes, seeds and batches the checks ran with."""
    return {"model": dataclasses.asdict(cfg), "trajectory_model": dataclasses.asdict(tcfg),
            "src_vocab_size": vocab[0], "tgt_vocab_size": vocab[1],
            "pad_id": pad_id, "seed": seed, "trajectory_steps": TRAJECTORY_STEPS,
            "trajectory_adam": TRAJECTORY_ADAM,
            "decoder_only": decoder_only.sizes(cfg, *vocab),
            "check_batches": {"unpadded": list(unpadded[0].shape) + [unpadded[1].size(1)],
                              "padded": list(padded[0].shape) + [padded[1].size(1)]},
            "torch": torch.__version__}


def run_checks(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
               train_batches: list, trajectory_cfg: ModelConfig | None = None,
               seed: int = 0) -> dict:
    """Run both kinds of check on CPU; see the module docstring for the result's layout."""
    if len(train_batches) < TRAJECTORY_STEPS:
        raise ValueError(f"run_checks needs at least {TRAJECTORY_STEPS} training batches for "
                         f"the trajectory check, got {len(train_batches)}")
    tcfg = dataclasses.replace(trajectory_cfg or trajectory_model(cfg), dropout=0.0)
    vocab = (src_vocab_size, tgt_vocab_size)
    train_batches = [(s.cpu(), t.cpu()) for s, t in train_batches]
    unpadded, padded = check_batches(train_batches, pad_id)
    started, checks, curves = time.perf_counter(), [], {}
    no_twin = refusal("baseline", cfg, vocab, pad_id)
    if no_twin is None:
        checks, curves = twin_checks(cfg, vocab, pad_id, train_batches, tcfg, seed, unpadded,
                                     padded)
    checks += scratch_checks(cfg, *vocab, pad_id, train_batches, seed)
    skipped = {}
    if (why := refusal("decoder_only", cfg, vocab, pad_id)) is None:
        checks += decoder_only.decoder_only_checks(cfg, *vocab, pad_id, train_batches, seed)
    else:
        skipped["decoder_only"] = why
    config = run_config(cfg, tcfg, vocab, pad_id, seed, unpadded, padded)
    config["seconds"] = round(time.perf_counter() - started, 2)
    return {"passed": all(c["passed"] for c in checks), "checks": checks,
            "twin": no_twin is None, "twin_reason": TWIN if no_twin is None else no_twin,
            "skipped": skipped, "config": config, "trajectory": curves}
