"""Stage evaluate: test loss, perplexity, and BLEU/chrF of greedy and beam-search translations.

Scores are sacreBLEU's corpus BLEU (13a tokenizer, cased) and chrF of the detokenized output
against the raw reference lines, the way published Multi30k numbers are computed.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU, CHRF

from nmt.core.checkpoint import load_trained
from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID
from nmt.core.data import Batches, Pairs, load_pairs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.errors import NmtError, last_outputs
from nmt.core.files import atomic_dir, write_json, write_text
from nmt.core.loss import token_loss
from nmt.core.records import write_record
from nmt.core.runs import Run, RunFiles
from nmt.core.runtime import (
    autocast,
    bound_gpu_memory,
    limit_attention_kernels,
    pick_device,
)
from nmt.core.text import read_lines
from nmt.core.unknowns import detokenize_outputs, source_surfaces
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve
from nmt.training.precision_record import recipe_choices, record_path

log = logging.getLogger("nmt.evaluate")


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF of detokenized lines (sacreBLEU defaults: 13a, cased)."""
    return {"bleu": BLEU().corpus_score(hypotheses, [references]).score,
            "chrf": CHRF().corpus_score(hypotheses, [references]).score}


def signatures() -> dict:
    """sacreBLEU's signatures of the two metrics (one reference), as the report prints them."""
    out = {}
    for name, metric in (("bleu", BLEU()), ("chrf", CHRF())):
        metric.corpus_score(["a"], [["a"]])  # the signature names the reference count
        out[name] = str(metric.get_signature())
    return out


@torch.inference_mode()
def attention_example(model, src_ids: list[int], out_ids: list[int], translation: str,
                      codecs: tuple) -> dict:
    """Cross-attention of the last decoder layer (mean of heads) while producing out_ids."""
    src_codec, tgt_codec = codecs
    src = torch.tensor([src_ids], device=next(model.parameters()).device)
    tgt_in = torch.tensor([[BOS_ID, *out_ids]], device=src.device)
    # scratch reads its explicit math path; the baseline asks nn.MultiheadAttention.
    weights = model.attention_maps(src, tgt_in)["decoder_cross"][-1][0].mean(0)  # (T, S)
    return {"what": "last decoder layer, cross-attention, mean of heads",
            "source": src_codec.pieces(src_ids), "output": tgt_codec.pieces(out_ids + [EOS_ID]),
            "translation": translation,
            "weights": [[round(w, 4) for w in row] for row in weights.cpu().tolist()]}


@dataclass(frozen=True)
class TestSet:
    """One test set as evaluate reads it."""

    name: str
    pairs: Pairs  # (source ids, reference ids), each <bos> ... <eos>
    references: list[str]  # the raw reference lines BLEU is computed against
    surfaces: list[list[str]]  # each source as written, token by token (nmt.core.unknowns)


@dataclass(frozen=True)
class Decoded:
    """One decoding of a test set: the output ids, their text, and its <unk> count."""

    ids: list[list[int]]
    lines: list[str]
    unknowns: int


def score_testset(model, testset: TestSet, tgt_codec, ev: dict, cap: int, out: Path,
                  precision: str) -> tuple[dict, dict, Decoded]:
    """Loss, greedy and beam scores of one test set under `precision` (bf16 or fp32); writes
    its translations (each <unk> copied from the source or marked: evaluate.unknown_words)
    and the per-sentence losses (for the report's paired bootstrap).
    (metrics, timings with the <unk> counts, the beam decoding)"""
    device = next(model.parameters()).device
    batches = Batches(testset.pairs, "sentences", ev["batch_size"], 0, shuffle=False)
    losses, tokens = sentence_losses(model, batches, device, precision)
    loss = sum(losses) / sum(tokens)
    write_text(out / f"{testset.name}.loss.tsv",
               "".join(f"{x!r}\t{n}\n" for x, n in zip(losses, tokens, strict=True)))
    metrics = {"loss": loss, "ppl": math.exp(loss)}
    timings = {"sentences": len(testset.pairs), "references": lines_record(testset.references)}
    sources = [pair[0] for pair in testset.pairs]
    for method in ("greedy", "beam"):
        start = time.perf_counter()
        with autocast(device, precision):  # search scores in float32 (log_softmax of .float())
            ids = translate_batches(model, sources, DecodeConfig.from_params(ev, method, cap),
                                    desc=f"{testset.name} {method}")
        timings[f"seconds_{method}"] = round(time.perf_counter() - start, 3)
        text = detokenize_outputs(model, sources, testset.surfaces, ids, tgt_codec,
                                  ev["unknown_words"])
        timings[f"unknowns_{method}"] = text.unknowns
        write_text(out / f"{testset.name}.{method}.txt", "".join(h + "\n" for h in text.lines))
        s = score(text.lines, testset.references)
        suffix = "" if method == "beam" else "_greedy"
        metrics |= {f"bleu{suffix}": s["bleu"], f"chrf{suffix}": s["chrf"]}
    return metrics, timings, Decoded(ids, text.lines, text.unknowns)


def lines_record(lines: list[str]) -> dict:
    """What BLEU and chrF were scored against: the line count and the sha256 of the lines, each
    ended by a newline (so it is the file's own sha256 where the file holds just those lines)."""
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode("utf-8"))
    return {"lines": len(lines), "sha256": digest.hexdigest()}


@torch.inference_mode()
def sentence_losses(model, batches, device, precision: str = "fp32") -> tuple[list[float],
                                                                             list[int]]:
    """Summed cross-entropy (nats) and target tokens of every sentence, in order."""
    model.eval()
    losses, tokens = [], []
    for src, tgt in batches:
        loss, _ = token_loss(model, src, tgt, device, reduction="none", precision=precision)
        losses += loss.double().cpu().tolist()
        tokens += (tgt[:, 1:] != PAD_ID).sum(dim=1).tolist()
    return losses, tokens


@dataclass(frozen=True)
class Paths:
    tokenized: Path  # data/tokenized: the test sets and their references
    vocab: Path  # data/vocab/<recipe>
    run: RunFiles  # results/<recipe>-<model>-s<seed>/: reads best.pt, writes the rest


def evaluate(settings: dict, paths: Paths) -> dict:
    """Stage evaluate: score the run's best.pt on every test set; write metrics.json (numbers
    people compare), evaluation.json (what produced them), translations/ and attention.json.
    settings: the resolved recipe (evaluate, data.target_lang; model and train, which best.pt
    must have been trained with). The loss and the decoding run in train.precision resolved
    for decoding: under `auto` a CPU decodes in the faster, measured (nmt.training.precision)."""
    run, files = Run.parse(paths.run.folder.name), paths.run
    device = pick_device(settings["train"]["device"])
    bound_gpu_memory(device)
    kernels = limit_attention_kernels()
    trained = load_trained(files.best, paths.vocab, device, expect=run, settings=settings)
    model, ckpt, (src_codec, tgt_codec) = trained.model, trained.checkpoint, trained.codecs
    choice = recipe_choices(settings, device, len(src_codec), len(tgt_codec),
                            record_path(files.folder.parent, run.recipe))["decode"]
    precision = choice.precision
    n_params = sum(p.numel() for p in model.parameters())
    log.info("read %s: %s model of recipe %s, %d parameters, on %s in %s", files.best,
             ckpt["model"], ckpt["recipe"], n_params, device, precision)
    codecs = (src_codec, tgt_codec)
    with atomic_dir(files.translations) as out:
        metrics, timings, attention = score_testsets(model, codecs, settings, paths.tokenized,
                                                     ckpt["model_config"]["max_len"], out,
                                                     precision)
        write_record(out, run.dvc_stage("evaluate"))  # the report checks what it reads
    log.info("wrote %s", files.translations)
    with last_outputs():  # a SIGTERM from here on waits, then finds every output in place
        write_json(files.attention, attention)
        write_json(files.evaluation, {
            "run": run.name, "recipe": run.recipe, "model": run.model, "seed": run.seed,
            "params": n_params, "device": str(device), **choice.record(),
            "attention_kernels": kernels,
            "unknown_words": settings["evaluate"]["unknown_words"],
            "signature": signatures(), "testsets": timings})
        write_json(files.metrics, metrics)
    log.info("wrote %s and evaluation.json", files.metrics)
    return metrics


def score_testsets(model, codecs: tuple, settings: dict, tokenized: Path, max_len: int,
                   out: Path, precision: str) -> tuple[dict, dict, dict]:
    """score_testset for each of evaluate.testsets, and the attention example from the first:
    (metrics, timings, attention), both dicts by test set."""
    tgt_codec, ev = codecs[1], settings["evaluate"]
    tgt_lang = settings["data"]["target_lang"]
    metrics, timings, attention = {}, {}, None
    for name in ev["testsets"]:
        testset = read_testset(tokenized, name, codecs, tgt_lang, max_len)
        log.info("read %s: %d sentences", name, len(testset.pairs))
        m, timings[name], beam = score_testset(model, testset, tgt_codec, ev, max_len - 1, out,
                                               precision)
        metrics[name] = m
        if name == ev["testsets"][0]:  # the report draws this sentence's attention
            i = min(ev["attention_example"], len(testset.pairs) - 1)
            with autocast(next(model.parameters()).device, precision):
                attention = attention_example(model, testset.pairs[i][0], beam.ids[i],
                                              beam.lines[i], codecs)
        log.info("%s: loss %.4f, ppl %.2f, BLEU %.2f (greedy %.2f), chrF %.2f; %d <unk> in "
                 "the beam output (%s)", name, m["loss"], m["ppl"], m["bleu"],
                 m["bleu_greedy"], m["chrf"], beam.unknowns, ev["unknown_words"])
    return metrics, timings, attention


def read_testset(tokenized: Path, name: str, codecs: tuple, tgt_lang: str,
                 max_len: int) -> TestSet:
    """A test set's pairs, raw references and written sources, checked to line up."""
    src_codec, tgt_codec = codecs
    pairs = load_pairs(tokenized, name, src_codec, tgt_codec, max_len)
    ref_path = tokenized / f"{name}.{tgt_lang}.txt"
    references = read_lines(ref_path)
    if len(references) != len(pairs):
        raise NmtError(f"{ref_path}: {len(references)} references for {len(pairs)} "
                       "sources (fix: re-run `nmt tokenize`)")
    return TestSet(name, pairs, references, source_surfaces(tokenized, name, src_codec))


# ---- `nmt evaluate`: nmt.cli builds the subcommand from HELP, arguments and command --------------

HELP = ("Read results/<recipe>-<model>-s<seed>/best.pt and the test sets, write "
        "metrics.json (loss, perplexity, BLEU greedy and beam, chrF), evaluation.json, "
        "translations/ and attention.json (one sentence's attention weights) to the same "
        "folder.")
MEMORY_FIX = "a smaller evaluate.batch_size"  # what to make smaller when it runs out of memory


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.run_options(parser)


def command(args, params: dict) -> None:
    run = Run(args.recipe, args.model, args.seed)
    evaluate(resolve(params, args.recipe), Paths(
        tokenized=args.tokenized, vocab=commandline.recipe_vocab(args),
        run=run.files(args.results)))
