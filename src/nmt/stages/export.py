"""Stage export: a trained run as a CTranslate2 model folder, checked before it is kept.

exports/<run>/ is a CTranslate2 model (model.bin, config.json, its vocabulary files), so
`ctranslate2.Translator("exports/<run>")` loads it, plus what `nmt translate --engine
ctranslate2` needs to read and write text exactly as the pipeline does: vocab/ (a copy of the
recipe's vocabulary folder) and nmt.json (the run, its languages and the check's figures),
and SHA256SUMS of every file, which `nmt translate` checks together with nmt.json's run.

The export is checked, not trusted: the engine scores validation pairs and every per-token
log-probability must be within TOLERANCE of our model's, else nothing is written.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.core.checkpoint import load_trained
from nmt.core.data import load_pairs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.engine import Engine, max_abs_difference, model_spec, tokens_of
from nmt.core.errors import NmtError
from nmt.core.files import atomic_dir, write_json
from nmt.core.records import write_record
from nmt.core.runs import Run, RunFiles
from nmt.models import registry
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve

log = logging.getLogger("nmt.export")

TOLERANCE = 1e-4  # largest per-token log-probability difference an export may have
CHECK_PAIRS = 32  # validation pairs scored by both


@dataclass(frozen=True)
class Paths:
    run: RunFiles  # results/<run>/: reads best.pt
    vocab: Path  # data/vocab/<recipe>
    tokenized: Path  # data/tokenized: the validation pairs of the check
    out: Path  # exports/<run>


def export(settings: dict, paths: Paths, check_pairs: int = CHECK_PAIRS) -> dict:
    """Write the run's best.pt as a CTranslate2 model to paths.out, after checking that the
    engine computes our model's log-probabilities. settings: the resolved recipe."""
    run = Run.parse(paths.run.folder.name)
    if not registry.entry(run.model).exports:
        raise NmtError(f"{run.name}: CTranslate2 cannot express the {run.model} model's "
                       "attention: it runs encoder-decoders whose decoders attend causally "
                       f"(fix: export a run of {' or '.join(registry.exportable())})")
    trained = load_trained(paths.run.best, paths.vocab, "cpu", expect=run, settings=settings)
    model, (src_codec, tgt_codec), cfg = trained.model, trained.codecs, trained.config
    src_tokens, tgt_tokens = tokens_of(src_codec), tokens_of(tgt_codec)
    spec = model_spec(run.model, model.state_dict(), cfg, src_tokens, tgt_tokens)
    spec.optimize(quantization="float32")
    pairs = load_pairs(paths.tokenized, "val", src_codec, tgt_codec, cfg.max_len)
    pairs = [pairs[i] for i in range(min(check_pairs, len(pairs)))]
    with atomic_dir(paths.out) as folder:
        spec.save(str(folder))
        shutil.copytree(paths.vocab, folder / "vocab")
        engine = Engine(folder, src_tokens, tgt_tokens, threads=torch.get_num_threads())
        check = compare(model, engine, pairs, settings["evaluate"], cfg.max_len - 1)
        if check["max_abs_logprob_diff"] > TOLERANCE:
            raise NmtError(f"{run.name}: the exported model's log-probabilities differ from "
                           f"ours by up to {check['max_abs_logprob_diff']:.2e} on "
                           f"{len(pairs)} validation pairs, over the {TOLERANCE:.0e} allowed; "
                           "nothing was written (fix: the conversion in nmt/core/engine.py is "
                           "wrong for this model; report it)")
        write_json(folder / "nmt.json", {
            "run": run.name, "recipe": run.recipe, "model": run.model, "seed": run.seed,
            "source_lang": settings["data"]["source_lang"],
            "target_lang": settings["data"]["target_lang"],
            "max_len": cfg.max_len, "check": check})
        write_record(folder, run.dvc_stage("export"))  # nmt translate checks it all
    log.info("wrote %s: %d validation pairs, log-probabilities within %.1e of ours, greedy "
             "identical on %d of them", paths.out, len(pairs), check["max_abs_logprob_diff"],
             check["greedy_identical"])
    return check


@torch.inference_mode()
def our_log_probs(model, pairs) -> list[list[float]]:
    """Per-token log-probabilities of each target (its tokens and <eos>) under our model."""
    out = []
    for src, tgt in pairs:
        logits = model(torch.tensor([src]), torch.tensor([tgt[:-1]]))[0]  # (T, V)
        logp = logits.float().log_softmax(dim=-1)
        out.append(logp.gather(1, torch.tensor(tgt[1:])[:, None])[:, 0].tolist())
    return out


def compare(model, engine: Engine, pairs: list, ev: dict, cap: int) -> dict:
    """The check's figures: the largest per-token log-probability difference on pairs, and how
    many greedy outputs are identical."""
    diff = max_abs_difference(our_log_probs(model, pairs), engine.score(pairs))
    dc = DecodeConfig.from_params(ev, "greedy", cap)
    ours = translate_batches(model, pairs, dc, progress=False)
    theirs = engine.translate(pairs, dc)
    return {"pairs": len(pairs), "max_abs_logprob_diff": diff, "tolerance": TOLERANCE,
            "greedy_identical": sum(a == b for a, b in zip(ours, theirs, strict=True))}


# ---- `nmt export`: nmt.cli builds the subcommand from HELP, arguments and command ----------------

HELP = ("Read results/<recipe>-<model>-s<seed>/best.pt and write it as a CTranslate2 "
        "model folder, exports/<recipe>-<model>-s<seed>/ (with vocab/ and nmt.json), "
        "after checking on validation pairs that the engine's per-token "
        "log-probabilities are within 1e-4 of ours; baseline and scratch runs.")
MEMORY_FIX = "a smaller evaluate.batch_size"  # what to make smaller when it runs out of memory


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.run_options(parser, gpu_bound=False)
    parser.add_argument("--out", type=Path, default=None,
                        help="default: exports/<recipe>-<model>-s<seed>")


def command(args, params: dict) -> None:
    run = Run(args.recipe, args.model, args.seed)
    export(resolve(params, args.recipe), Paths(
        run=run.files(args.results), vocab=commandline.recipe_vocab(args),
        tokenized=args.tokenized, out=args.out or commandline.EXPORTS / run.name))
