"""`nmt bench --decoding`: our searches against CTranslate2's on one trained run's weights.

The same test sentences (the recipe's first test set), the same decoding settings and the
same number of CPU threads for each: our greedy and beam search (nmt.core.decoding) on the run's
best.pt, and the engine's (nmt.core.engine) on its export (nmt export) in fp32 and in int8. Each
is timed over repeats that alternate between them, after an untimed warm-up pass; the table
gives sentences and output tokens a second (medians), BLEU on those sentences (sacreBLEU),
and how many outputs are identical to our search's with the same method.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch

from nmt.core.checkpoint import load_trained
from nmt.core.data import load_pairs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.engine import check_export, check_export_vocab, open_engine, tokens_of
from nmt.core.files import read_json, write_json
from nmt.core.runs import Run, RunFiles
from nmt.core.text import read_lines

log = logging.getLogger("nmt.bench")

DECODERS = (("nmt", "float32"), ("ctranslate2", "float32"), ("ctranslate2", "int8"))


@dataclass(frozen=True)
class Paths:
    run: RunFiles  # results/<run>/: best.pt
    export: Path  # exports/<run>: its CTranslate2 model
    vocab: Path  # data/vocab/<recipe>
    tokenized: Path  # data/tokenized: the test set and its references
    json: Path | None = None  # the figures, if given


@dataclass(frozen=True)
class DecodingPlan:
    repeats: int  # timed passes of each decoder; the median is reported
    sentences: int  # test sentences decoded (0: all)
    threads: int  # CPU threads of torch and of the engine alike


def bench_decoding(settings: dict, paths: Paths, plan: DecodingPlan) -> dict:
    """Time and score every decoder of DECODERS with greedy and beam search; print the table and
    write paths.json. settings: the run's resolved recipe."""
    run = Run.parse(paths.run.folder.name)
    check_export(paths.export, run)
    torch.set_num_threads(plan.threads)
    trained = load_trained(paths.run.best, paths.vocab, "cpu", expect=run, settings=settings)
    model, (src_codec, tgt_codec) = trained.model, trained.codecs
    check_export_vocab(paths.export, run, tokens_of(src_codec), tokens_of(tgt_codec))
    max_len, ev = trained.max_len, settings["evaluate"]
    testset = ev["testsets"][0]
    pairs = load_pairs(paths.tokenized, testset, src_codec, tgt_codec, max_len)
    references = read_lines(paths.tokenized / f"{testset}.{settings['data']['target_lang']}.txt")
    count = plan.sentences or len(pairs)
    sources, references = [pairs[i][0] for i in range(min(count, len(pairs)))], references[:count]
    decode = {("nmt", "float32"): lambda dc: translate_batches(model, sources, dc, progress=False)}
    for engine, compute_type in DECODERS[1:]:
        eng = open_engine(paths.export, run, tokens_of(src_codec), tokens_of(tgt_codec),
                          compute_type, threads=plan.threads)
        decode[(engine, compute_type)] = lambda dc, eng=eng: eng.translate(sources, dc)
    rows = []
    for method in ("greedy", "beam"):
        dc = DecodeConfig.from_params(ev, method, max_len - 1)
        outputs, seconds = timed(decode, dc, plan.repeats)
        ours = outputs[("nmt", "float32")]
        for key, ids in outputs.items():
            hypotheses = [tgt_codec.decode(h) for h in ids]
            rows.append({
                "engine": key[0], "compute_type": key[1], "method": method,
                "sentences_per_s": round(len(sources) / seconds[key], 1),
                "tokens_per_s": round(sum(len(h) + 1 for h in ids) / seconds[key], 1),
                "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
                "identical_to_nmt": sum(a == b for a, b in zip(ids, ours, strict=True))})
    out = {"run": run.name, "testset": testset, "sentences": len(sources),
           "threads": plan.threads, "repeats": plan.repeats, "beam_size": ev["beam_size"],
           "export_check": read_json(paths.export / "nmt.json").get("check"), "rows": rows}
    print_decoders(out)
    if paths.json:
        write_json(paths.json, out)
    return out


def timed(decode: dict, dc: DecodeConfig, repeats: int) -> tuple[dict, dict]:
    """(each decoder's outputs, its median seconds): a warm-up pass, then repeats alternating
    between the decoders, so that drift in the machine's speed hits all of them alike."""
    outputs = {key: run(dc) for key, run in decode.items()}
    times = {key: [] for key in decode}
    for _ in range(repeats):
        for key, run in decode.items():
            start = time.perf_counter()
            run(dc)
            times[key].append(time.perf_counter() - start)
    return outputs, {key: statistics.median(t) for key, t in times.items()}


def print_decoders(out: dict) -> None:
    print(f"\nnmt bench --decoding: {out['run']}, {out['sentences']} sentences of "
          f"{out['testset']}, {out['threads']} CPU threads, median of {out['repeats']}")
    print(f"{'decoder':26}{'method':>8}{'sent/s':>10}{'tokens/s':>10}{'BLEU':>8}"
          f"{'same as nmt':>13}")
    for r in out["rows"]:
        name = f"{r['engine']} {r['compute_type']}"
        print(f"{name:26}{r['method']:>8}{r['sentences_per_s']:>10,.1f}"
              f"{r['tokens_per_s']:>10,.1f}{r['bleu']:>8.2f}"
              f"{r['identical_to_nmt']:>8}/{out['sentences']}")


def command(args, params: dict) -> None:
    """`nmt bench --decoding` (nmt.stages.bench's options; nmt.cli runs this instead of the
    stage): one trained run's decoding, ours against its CTranslate2 export's."""
    from nmt.pipeline.commandline import VOCAB
    from nmt.pipeline.recipes import resolve

    run = Run.parse(args.run)
    files = run.files(args.results)
    bench_decoding(resolve(params, run.recipe), Paths(
        run=files, export=args.exports / run.name, vocab=args.vocab or VOCAB / run.recipe,
        tokenized=args.tokenized, json=args.json or files.decoding),
        DecodingPlan(repeats=args.repeats or params["bench"]["repeats"],
                     sentences=args.sentences or 0, threads=torch.get_num_threads()))
