"""Stage evaluate: test loss, perplexity, and BLEU/chrF of greedy and beam-search translations.

Scores are sacreBLEU's corpus BLEU (13a tokenizer, cased) and chrF of the detokenized output
against the raw reference lines, the way published Multi30k numbers are computed.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU, CHRF

from nmt.checkpoint import check_vocab, load
from nmt.config import NmtError
from nmt.data import Batches, load_pairs
from nmt.files import atomic_dir, write_json
from nmt.runtime import corpus_loss, pick_device
from nmt.search import translate_batches
from nmt.text import read_lines
from nmt.vocab import BOS_ID, EOS_ID, load_codecs

log = logging.getLogger("nmt.evaluate")
ATTENTION_TESTSET = "test_2016_flickr"


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF of detokenized lines, with sacreBLEU's signatures."""
    bleu, chrf = BLEU(), CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "signature": {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}}


@torch.inference_mode()
def attention_example(model, src_ids: list[int], out_ids: list[int], src_codec,
                      tgt_codec) -> dict:
    """Cross-attention of the last decoder layer (mean of heads) while producing out_ids."""
    src = torch.tensor([src_ids], device=next(model.parameters()).device)
    tgt_in = torch.tensor([[BOS_ID, *out_ids]], device=src.device)
    # scratch reads its explicit math path; the baseline asks nn.MultiheadAttention.
    weights = model.attention_maps(src, tgt_in)["decoder_cross"][-1][0].mean(0)  # (T, S)
    return {"what": "last decoder layer, cross-attention, mean of heads",
            "source": src_codec.pieces(src_ids), "output": tgt_codec.pieces(out_ids + [EOS_ID]),
            "translation": tgt_codec.decode(out_ids),
            "weights": [[round(w, 4) for w in row] for row in weights.cpu().tolist()]}


def evaluate(params: dict, tokenized_dir: Path, vocab_dir: Path, run_dir: Path) -> dict:
    """Score run_dir/best.pt on every test set; write metrics.json and translations/."""
    tokenized_dir, run_dir = Path(tokenized_dir), Path(run_dir)
    ev, tgt_lang = params["evaluate"], params["data"]["target_lang"]
    device = pick_device(params["train"]["device"])
    model, ckpt = load(run_dir / "best.pt", device)
    src_codec, tgt_codec = load_codecs(vocab_dir)
    check_vocab(ckpt, src_codec, tgt_codec, vocab_dir)
    max_len = ckpt["model_config"]["max_len"]
    n_params = sum(p.numel() for p in model.parameters())
    log.info("read %s: %s model of recipe %s, %d parameters, on %s", run_dir / "best.pt",
             ckpt["model"], ckpt["recipe"], n_params, device)
    decode = dict(beam_size=ev["beam_size"], length_penalty=ev["length_penalty"],
                  max_len_a=ev["max_len_a"], max_len_b=ev["max_len_b"], cap=max_len - 1)

    results, signature, attention = {}, {}, None
    with atomic_dir(run_dir / "translations") as out:
        for testset in ev["testsets"]:
            pairs = load_pairs(tokenized_dir, testset, src_codec, tgt_codec, max_len)
            ref_path = tokenized_dir / f"{testset}.{tgt_lang}.txt"
            references = read_lines(ref_path)
            if len(references) != len(pairs):
                raise NmtError(f"{ref_path}: {len(references)} references for {len(pairs)} "
                               "sources (fix: re-run `nmt tokenize`)")
            log.info("read %s: %d sentences", testset, len(pairs))
            batches = Batches(pairs, "sentences", ev["batch_size"], 0, shuffle=False)
            loss = corpus_loss(model, batches, device)
            row = {"loss": loss, "ppl": math.exp(loss)}
            for method in ("greedy", "beam"):
                start = time.perf_counter()
                ids = translate_batches(model, pairs, ev["batch_size"], method,
                                        desc=f"{testset} {method}", **decode)
                seconds = time.perf_counter() - start
                hypotheses = [tgt_codec.decode(h) for h in ids]
                (out / f"{testset}.{method}.txt").write_text(
                    "".join(h + "\n" for h in hypotheses), "utf-8")
                s = score(hypotheses, references)
                suffix = "" if method == "beam" else "_greedy"
                row |= {f"bleu{suffix}": s["bleu"], f"chrf{suffix}": s["chrf"],
                        f"seconds_{method}": seconds}
                signature = s["signature"]
            if testset == ATTENTION_TESTSET:  # the report draws this sentence's attention
                i = min(ev["attention_example"], len(pairs) - 1)
                attention = attention_example(model, pairs[i][0], ids[i], src_codec, tgt_codec)
            row["sentences"] = len(pairs)
            results[testset] = row
            log.info("%s: loss %.4f, ppl %.2f, BLEU %.2f (greedy %.2f), chrF %.2f, "
                     "%.1f sent/s beam", testset, loss, row["ppl"], row["bleu"],
                     row["bleu_greedy"], row["chrf"], len(pairs) / row["seconds_beam"])
    log.info("wrote %s", run_dir / "translations")

    if attention is not None:
        write_json(run_dir / "attention.json", attention)
    metrics = {"run": run_dir.name, "recipe": ckpt["recipe"], "model": ckpt["model"],
               "params": n_params, "testsets": results, "signature": signature}
    write_json(run_dir / "metrics.json", metrics)
    log.info("wrote %s", run_dir / "metrics.json")
    return metrics
