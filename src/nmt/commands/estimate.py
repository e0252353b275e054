"""`nmt estimate`: what a recipe's trainings will take on this CPU, before any of them starts.

It reads the precision calibration (nmt.training.precision_cache: an update of each model at the
recipe's sizes, timed in fp32 and in bf16, measured once a machine and cached; measured here
where it is not cached yet), takes the precision `auto` chooses from it, and gives each
model's minutes: train.max_updates x the calibrated update (its median; scaled to the
recipe's batch where that is over the calibration's MAX_CALIBRATION_TOKENS) x
WHOLE_OVER_CALIBRATED, what validation, the data and real batch shapes add (measured on whole
demo trainings). `make demo`
prints it before it trains. Before the vocabulary exists (a fresh clone), the sizes are
guessed: the BPE size, or GUESSED_WORDS words a side.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from nmt.core.codecs import load_codecs
from nmt.core.errors import NmtError
from nmt.core.runtime import device_name
from nmt.models import MODELS
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.training.precision_cache import calibration
from nmt.training.precision_record import recipe_choices, record_path
from nmt.training.precision_timing import SENTENCE_TOKENS, Workload, batch_sentences

log = logging.getLogger("nmt.estimate")

# A whole demo training over max_updates x the calibrated update of its model (validation,
# the data, real batch shapes): 1.04, 1.09 and 1.05 for the baseline, scratch and decoder-only
# trainings on the Xeon without AMX (docs/cpu-and-precision.md, CPU only).
WHOLE_OVER_CALIBRATED = 1.06
GUESSED_WORDS = 8000  # a word vocabulary's size before it is built (the demo's: 8,012 and 6,190)

HELP = ("Print what a recipe's trainings will take on this CPU, from the precision calibration "
        "(measured once a machine, cached): the precision train.precision auto chooses, and "
        "each model's minutes.")


def arguments(s: argparse.ArgumentParser) -> None:
    commandline.recipe(s)
    s.add_argument("--models", default=",".join(MODELS),
                   help="the models to estimate, comma separated (default: all)")
    s.add_argument("--vocab", type=Path, default=None,
                   help="the recipe's vocabulary, if built (default: data/vocab/<recipe>)")
    commandline.threads(s)


def command(args, params: dict) -> None:
    settings = resolve(params, args.recipe)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    print("\n".join(estimate(settings, args.recipe, models, commandline.recipe_vocab(args))))


def estimate(settings: dict, recipe: str, models: list[str], vocab: Path) -> list[str]:
    """The lines `nmt estimate` prints."""
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise NmtError(f"--models names {', '.join(unknown)}, no model of this project (fix: "
                       f"some of {', '.join(MODELS)})")
    sizes, known = vocab_sizes(settings, vocab)
    device = torch.device("cpu")
    work = Workload.of(settings, *sizes, "train")
    timings = calibration(work)
    # The choice the recipe's runs in this checkout take: decided once (here, if no run has
    # yet) and recorded (nmt.training.precision_record), so estimate and trainings agree.
    record = record_path(commandline.RESULTS, recipe)
    choice = recipe_choices(settings, device, *sizes, record)["train"]
    # The calibration's batch holds at most MAX_CALIBRATION_TOKENS: an update of the recipe's
    # batch takes about as much longer as it holds more tokens.
    scale = batch_sentences(settings) / work.sentences
    seconds = {m: {p: scale * s for p, s in timings[m].seconds.items()} for m in timings}
    lines = [f"nmt estimate: recipe {recipe} on {device_name(device)}, "
             f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}",
             f"training in {choice.precision}: {choice.reason}"]
    if settings["train"]["device"] != "cpu" and torch.cuda.is_available():
        lines.append("(a CUDA GPU is visible, and training will run there: these figures are "
                     "the CPU's; nmt train prints its own estimate after 20 updates)")
    if scale > 1:
        lines.append(f"(an update timed on {work.sentences * SENTENCE_TOKENS:,} tokens and "
                     f"scaled to the recipe's {batch_sentences(settings) * SENTENCE_TOKENS:,})")
    if not known:
        lines.append(f"(vocabularies not built yet: {sizes[0]:,} and {sizes[1]:,} entries "
                     "assumed; training measures again at their real sizes)")
    updates = settings["train"]["max_updates"]
    if not updates:
        return lines + [f"{m}: {1e3 * seconds[m][choice.precision]:,.0f} ms an update (the "
                        "recipe trains whole epochs: nmt train prints its estimate after 20 "
                        "updates)" for m in models]
    minutes = {m: updates * seconds[m][choice.precision] * WHOLE_OVER_CALIBRATED / 60
               for m in models}
    lines += [f"{m}: about {minutes[m]:.1f} minutes of training ({updates:,} updates of "
              f"{1e3 * seconds[m][choice.precision]:,.0f} ms, plus validation)" for m in models]
    if len(models) > 1:
        lines.append(f"all {len(models)} trainings: about {sum(minutes.values()):.0f} minutes")
    return lines


def vocab_sizes(settings: dict, folder: Path) -> tuple[tuple[int, int], bool]:
    """(source and target vocabulary sizes, whether read from the built vocabulary)."""
    if (folder / "meta.json").is_file():
        src, tgt = load_codecs(folder)
        return (len(src), len(tgt)), True
    vocab = settings["vocab"]
    size = vocab["bpe_size"] if vocab["kind"] == "bpe" else GUESSED_WORDS
    return (size, size), False
