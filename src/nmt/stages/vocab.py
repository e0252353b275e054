"""Stage vocab: word vocabularies from spaCy tokens, or one joint SentencePiece BPE model.

Both kinds put the specials <unk> <pad> <bos> <eos> at ids 0..3; nmt.core.codecs reads them
back (`load_codecs`) for every stage that encodes or decodes.
"""

from __future__ import annotations

import argparse
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, Vocab
from nmt.core.errors import NmtError
from nmt.core.files import atomic_dir, write_json
from nmt.core.records import write_record
from nmt.core.runs import dvc_stage
from nmt.core.text import count_lines, iter_lines, no_text, split_tokens, token_file
from nmt.pipeline import commandline
from nmt.pipeline.recipes import resolve

log = logging.getLogger("nmt.vocab")


def build_vocab(sentences: Iterable[list[str]], min_freq: int) -> Vocab:
    """Specials first, then tokens by descending count, ties in order of first appearance."""
    counts = Counter()
    for tokens in sentences:
        counts.update(tokens)
    # Counter keeps insertion (first-appearance) order and sorted() is stable.
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    return Vocab(list(SPECIALS) + [t for t, c in ranked if c >= min_freq and t not in SPECIALS])


@dataclass(frozen=True)
class Paths:
    tokenized: Path  # data/tokenized (its train split is read)
    out: Path  # data/vocab/<recipe>


def build(settings: dict, paths: Paths, stage: str = "vocab") -> dict:
    """Stage vocab: write one recipe's vocabulary to paths.out; return its summary (also
    meta.json). settings: the resolved recipe (vocab, data.source_lang/target_lang); stage:
    the DVC stage that runs it (vocab@<recipe>), which SHA256SUMS names.

    The train split is streamed, line by line, never held whole: word counts grow a line at
    a time, and SentencePiece reads the raw lines as they come (vocab.bpe_sample: a random
    sample of them)."""
    vocab_cfg, tokenized_dir, out_dir = settings["vocab"], Path(paths.tokenized), paths.out
    src, tgt = settings["data"]["source_lang"], settings["data"]["target_lang"]
    word = vocab_cfg["kind"] == "word"  # spaCy tokens; BPE reads the raw text
    files = aligned(*(token_file(tokenized_dir, "train", lang) if word
                      else tokenized_dir / f"train.{lang}.txt" for lang in (src, tgt)))
    with atomic_dir(out_dir) as tmp:
        if word:
            sizes = {}
            for side, path in zip(("src", "tgt"), files, strict=True):
                v = build_vocab(map(split_tokens, iter_lines(path)), vocab_cfg["min_freq"])
                write_json(tmp / f"{side}.json", v.itos)
                sizes[side] = len(v)
            sample = 0
        else:
            sample = vocab_cfg["bpe_sample"]
            sizes = _train_bpe(files, tmp, vocab_cfg["bpe_size"], sample)
        # Only the settings this kind reads, so an unrelated change leaves the bytes alike
        # and DVC skips what follows (bpe_sample only when it samples: 0 keeps the old bytes).
        setting = "min_freq" if word else "bpe_size"
        meta = {"kind": vocab_cfg["kind"], setting: vocab_cfg[setting],
                **({"bpe_sample": sample} if sample else {}), "source_lang": src,
                "target_lang": tgt, "src_size": sizes["src"], "tgt_size": sizes["tgt"]}
        write_json(tmp / "meta.json", meta)
        write_record(tmp, stage)
    log.info("%s vocabulary: source %d, target %d -> %s",
             vocab_cfg["kind"], sizes["src"], sizes["tgt"], out_dir)
    return meta


def aligned(src_path: Path, tgt_path: Path) -> tuple[Path, Path]:
    """Both sides of the train split, refused unless they pair up line by line and each holds
    text (as verify and train refuse them): a vocabulary of such a split would be built in
    vain, and SentencePiece would blame its size. Checked first (seconds for a million lines,
    the text check stops at the first line with text), before the long work."""
    src, tgt = count_lines(src_path), count_lines(tgt_path)
    if src != tgt:
        raise NmtError(f"{src_path} has {src} lines but {tgt_path} has {tgt}: the "
                       "train split is not aligned (fix: re-run nmt tokenize)")
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not any(map(str.strip, iter_lines(path))):
            raise no_text(path, "train", lines)
    return src_path, tgt_path


# SentencePiece's sampling (vocab.bpe_sample) draws from this seed: the same data and
# settings give the same model bytes, run after run.
SAMPLE_SEED = 0


def _train_bpe(files: tuple[Path, Path], out: Path, size: int, sample: int) -> dict:
    """One joint model over the source lines, then the target lines, of the train split;
    sample > 0 trains on that many of them, drawn at random (input_sentence_size)."""
    import io

    import sentencepiece as spm

    lines = chain.from_iterable(iter_lines(path) for path in files)
    sampling = {}
    if sample:
        spm.set_random_generator_seed(SAMPLE_SEED)
        sampling = {"input_sentence_size": sample, "shuffle_input_sentence": True}
    model = io.BytesIO()
    try:
        # From memory into memory: the model then records no file paths, so the same data
        # gives the same bytes and DVC sees an unchanged vocabulary.
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines, model_writer=model, model_type="bpe",
            vocab_size=size, character_coverage=1.0, num_threads=1,
            unk_id=UNK_ID, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            unk_piece=SPECIALS[0], pad_piece=SPECIALS[1], bos_piece=SPECIALS[2],
            eos_piece=SPECIALS[3], minloglevel=2, **sampling,
        )
    except RuntimeError as e:
        raise NmtError(f"SentencePiece could not train a {size}-piece model ({e}) "
                       "(fix: lower vocab.bpe_size)") from None
    (out / "spm.model").write_bytes(model.getvalue())
    return {"src": size, "tgt": size}


# ---- `nmt vocab`: nmt.cli builds the subcommand from HELP, arguments and command -----------------

HELP = ("Read data/tokenized (train split only) and write one recipe's vocabulary to "
        "data/vocab/<recipe>/ (word: src.json, tgt.json; bpe: spm.model) with meta.json.")


def arguments(parser: argparse.ArgumentParser) -> None:
    commandline.recipe(parser)
    parser.add_argument("--tokenized", type=Path, default=commandline.TOKENIZED)
    parser.add_argument("--out", type=Path, default=None, help="default: data/vocab/<recipe>")


def command(args, params: dict) -> None:
    build(resolve(params, args.recipe),
          Paths(tokenized=args.tokenized, out=args.out or commandline.VOCAB / args.recipe),
          stage=dvc_stage("vocab", args.recipe))
