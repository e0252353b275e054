"""What happens to the <unk> a model outputs: dropped (the old way), marked, or copied from the
source by cross-attention (nmt.core.unknowns), measured on the validation set only.

For one trained run, decodes the validation set greedily and with beam search (the recipe's
evaluate settings), then prints per way: BLEU against the references, how many <unk> the
outputs held, and for the copies how many of the copied tokens occur in the sentence's
reference, and how many are a source word the vocabulary lacks (the likely cause of the
<unk>: a right alignment even where the reference translates the word). Three choices of
attention are compared for the copy: the last decoder layer (what nmt.core.unknowns uses), the
first, and the mean of all layers. Produced docs/parameters-and-corpora.md's figures on unknown
words (greedy BLEU 35.44 dropped, 33.23 marked, 35.33 copied on the demo's scratch run; the
share of copies that are a word the vocabulary lacks, by layer). tests/test_tools.py runs it
on a tiny trained run whose vocabulary lacks most words, as a smoke test.

    python tools/unknowns_check.py --run results/demo-scratch-s0 [--recipe demo]
        [--vocab data/vocab/demo] [--tokenized data/tokenized] [--split val]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from nmt.core.checkpoint import load
from nmt.core.codecs import BOS_ID, SPECIALS, UNK_ID, load_codecs
from nmt.core.data import load_pairs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.text import read_lines, split_tokens
from nmt.core.unknowns import detokenize_outputs, source_surfaces
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve

REPO = Path(__file__).resolve().parents[1]


@torch.inference_mode()
def copies(model, sources, surfaces, outputs, layers: str) -> list[list[tuple[str, bool]]]:
    """For each <unk> of each output: the source token copied, and whether the vocabulary
    lacks it (the likely reason for the <unk>), choosing the source position by the attention
    of the `layers` decoder layer ("first", "last" or "mean" of all), heads averaged."""
    out = []
    for src, written, hyp in zip(sources, surfaces, outputs, strict=True):
        kept = [i for i in hyp if i >= len(SPECIALS) or i == UNK_ID]
        where = [t for t, i in enumerate(kept) if i == UNK_ID]
        if not where:
            out.append([])
            continue
        cross = model.attention_maps(torch.tensor([src]),
                                     torch.tensor([[BOS_ID, *kept]]))["decoder_cross"]
        chosen = {"first": cross[0], "last": cross[-1], "mean": torch.stack(cross).mean(0)}
        weights = chosen[layers][0].mean(0)
        best = weights[: len(kept), 1: len(src) - 1].argmax(dim=1) + 1
        out.append([(written[int(best[t]) - 1], src[int(best[t])] == UNK_ID) for t in where])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run folder holding best.pt")
    ap.add_argument("--recipe", default="demo")
    ap.add_argument("--vocab", type=Path, default=REPO / "data" / "vocab" / "demo")
    ap.add_argument("--tokenized", type=Path, default=REPO / "data" / "tokenized")
    ap.add_argument("--split", default="val")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    ev = resolve(load_params(REPO / "params.yaml"), args.recipe)["evaluate"]
    model, ckpt = load(args.run / "best.pt")
    src_codec, tgt_codec = load_codecs(args.vocab)
    cap = ckpt["model_config"]["max_len"]
    pairs = load_pairs(args.tokenized, args.split, src_codec, tgt_codec, cap)
    sources = [p[0] for p in pairs]
    surfaces = source_surfaces(args.tokenized, args.split, src_codec)
    references = read_lines(args.tokenized / f"{args.split}.{tgt_codec.lang}.txt")
    reference_words = [set(split_tokens(line)) for line in read_lines(
        args.tokenized / f"{args.split}.{tgt_codec.lang}.tok")]
    unknown_sources = sum(UNK_ID in s for s in sources)
    print(f"{args.run} on {args.split}: {len(sources)} sentences, {unknown_sources} "
          f"({unknown_sources / len(sources):.0%}) with a source word the vocabulary lacks")
    for method in ("greedy", "beam"):
        outputs = translate_batches(model, sources, DecodeConfig.from_params(ev, method, cap - 1),
                                    progress=False)
        dropped = [tgt_codec.decode(h) for h in outputs]
        print(f"\n{method}: BLEU dropped {BLEU().corpus_score(dropped, [references]).score:.2f}")
        for mode in ("mark", "copy"):
            text = detokenize_outputs(model, sources, surfaces, outputs, tgt_codec, mode)
            bleu = BLEU().corpus_score(text.lines, [references]).score
            print(f"{method}: BLEU {mode:7} {bleu:.2f} ({text.unknowns} <unk> in "
                  f"{sum(UNK_ID in h for h in outputs)} outputs)")
        for layers in ("last", "first", "mean"):
            copied = copies(model, sources, surfaces, outputs, layers)
            total = sum(map(len, copied))
            lacking = sum(unknown for ws in copied for _, unknown in ws)
            right = sum(w in ref for ws, ref in zip(copied, reference_words, strict=True)
                        for w, _ in ws)
            print(f"{method}: copies by the {layers} layer's attention: {lacking} of {total} "
                  f"({lacking / max(total, 1):.0%}) a source word the vocabulary lacks, "
                  f"{right} ({right / max(total, 1):.0%}) in the reference")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
