"""Stage verify: two kinds of check at one recipe's size on real batches, for one model whose
registry entry names check sets (nmt.models.registry); one job a model, which its trainings
wait for. Twin checks: the scratch Transformer
against torch.nn.Transformer, where the baseline can express the configuration. Property
checks: what every model must do (cached decoding = forward, fused = math, padding, causality,
gradients, the registry's parameter-count formula), for scratch and decoder_only, always; a
configuration without a twin passes on its properties alone.

- checklist.py: Checklist (records each timed check and its kind), format_table,
  print_checklist;
- measure.py: what every checklist measures with (check batches, max_abs_diff, the loss,
  tolerances, the training trajectory's size and steps);
- equivalence.py: the twin checks, scratch against the baseline on shared weights;
- properties.py: the property checks every model gets (the check set "properties");
- decoder_only.py: the decoder-only model's property checks, with its own additions;
- suite.py: run_checks, both kinds on one configuration, each model's check sets looked up by
  the names its registry entry gives (model_checks: one model's property checks); a check set
  (equivalence, properties, decoder_only) is loaded by its name only, so that a job's code is
  its own model's check sets (nmt.pipeline.code.check_code).

verify() writes run_checks's result for the model, {"passed", "checks": [{"name", "kind",
"passed", "max_abs_diff", "tolerance", "seconds"}], "models", "twin", "twin_reason",
"skipped", "config", "trajectory"}, to results/verify/<recipe>-<model>.json.
"""

import argparse
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from nmt.core.codecs import PAD_ID, load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.errors import NmtError
from nmt.core.files import write_json
from nmt.models import ModelConfig
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.stages.verify.checklist import Checklist, format_table, print_checklist
from nmt.stages.verify.measure import CHECK_ROWS, TRAJECTORY_STEPS, check_batches, max_abs_diff
from nmt.stages.verify.suite import model_checks, run_checks

__all__ = ["Paths", "verify", "run_checks", "model_checks", "Checklist",
           "format_table", "print_checklist", "max_abs_diff", "TRAJECTORY_STEPS"]

log = logging.getLogger("nmt.verify")


@dataclass(frozen=True)
class Paths:
    """What the stage reads and writes."""

    tokenized: Path  # data/tokenized
    vocab: Path  # the recipe's vocabulary folder, data/vocab/<recipe>
    out: Path  # results/verify/<recipe>-<model>.json


def real_batches(tokenized: Path, src_codec, tgt_codec, max_len: int) -> list:
    """The first TRAJECTORY_STEPS published-style batches (32 sentences, shuffled) of the
    training set: the checks need padded rows, whatever batching the recipe trains with, and
    a corpus without them is refused here in one line."""
    pairs = load_pairs(tokenized, "train", src_codec, tgt_codec, max_len)
    if len(pairs) < 32 * TRAJECTORY_STEPS:
        raise NmtError(f"the train split has {len(pairs)} pairs, and verify trains "
                       f"{TRAJECTORY_STEPS} batches of 32 (fix: a corpus of at least "
                       f"{32 * TRAJECTORY_STEPS} training pairs, or a larger "
                       "data.max_train_pairs)")
    batches = list(Batches(pairs, "sentences", 32, 0, shuffle=True, seed=0))[:TRAJECTORY_STEPS]
    try:
        check_batches(batches, PAD_ID)
    except ValueError:  # the checks' own contract; here it is the corpus's doing
        raise NmtError(f"the train split gives verify no batch with padding on both sides: "
                       f"in each of its {len(batches)} batches, the first {CHECK_ROWS} sentences "
                       "of a side are all one length (fix: a train split whose sentences vary "
                       "in length; check the corpus's train files, then re-run nmt download "
                       "and nmt tokenize)") from None
    return batches


def verify(settings: dict, paths: Paths, model: str) -> bool:
    """Run model's checklist at the size of settings (a resolved recipe); write the JSON."""
    src_codec, tgt_codec = load_codecs(paths.vocab)
    cfg = ModelConfig.from_dict(settings["model"])
    train_batches = real_batches(paths.tokenized, src_codec, tgt_codec, cfg.max_len)
    log.info("checking %s at %s's size: d_model %d, %d+%d layers, vocab %d/%d on %d real "
             "batches", model, paths.vocab.name, cfg.d_model, cfg.num_encoder_layers,
             cfg.num_decoder_layers, len(src_codec), len(tgt_codec), len(train_batches))
    result = run_checks(cfg, len(src_codec), len(tgt_codec), PAD_ID, train_batches,
                        models=(model,))
    print_checklist(result)
    for c in result["checks"]:  # strict JSON: a shape mismatch measures inf, written null
        if not math.isfinite(c["max_abs_diff"]):
            c["max_abs_diff"] = None
    write_json(paths.out, result)
    log.info("wrote %s (%s; %s)", paths.out,
             "all checks passed" if result["passed"] else "FAILED",
             "twin and property checks" if result["twin"] else
             "property checks only, no twin" if result["checks"] else "no checks of its own")
    return result["passed"]


# ---- `nmt verify`: nmt.cli builds the subcommand from HELP, arguments and command ----------------

HELP = ("Read data/tokenized and data/vocab/<recipe>, check at the recipe's size that the "
        "model has the properties the pipeline relies on and, for scratch where "
        "torch.nn.Transformer can express the configuration, that it computes what the "
        "reference computes; write results/verify/<recipe>-<model>.json; exit 1 if a check "
        "fails.")
MEMORY_FIX = "a smaller model"  # what to make smaller when it runs out of memory


def arguments(parser: argparse.ArgumentParser) -> None:
    for group in (commandline.recipe, commandline.data, commandline.threads):
        group(parser)
    parser.add_argument("--model", required=True, choices=commandline.names())
    parser.add_argument("--out", type=Path, default=None,
                        help="default: results/verify/<recipe>-<model>.json")


def command(args, params: dict) -> int:
    paths = Paths(tokenized=args.tokenized, vocab=commandline.recipe_vocab(args),
                  out=args.out or commandline.RESULTS / "verify" /
                  f"{args.recipe}-{args.model}.json")
    passed = verify(resolve(params, args.recipe), paths, args.model)
    return 0 if passed else 1  # a failed check stops the pipeline before training
