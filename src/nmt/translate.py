"""`nmt translate`: German lines in, English lines out, with a trained run's checkpoint."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from nmt.checkpoint import check_vocab, load
from nmt.config import NmtError, Run
from nmt.runtime import pick_device
from nmt.search import DecodeConfig, translate_batches
from nmt.text import tokenize_lines
from nmt.vocab import BOS_ID, EOS_ID, load_codecs

log = logging.getLogger("nmt.translate")


def read_input(args) -> list[str]:
    """Sentences from the arguments, else --file, else standard input; one per line."""
    if args.sentences:
        return list(args.sentences)
    if args.file is not None:
        if not args.file.is_file():
            raise NmtError(f"{args.file} not found (fix: give a text file, one sentence a line)")
        return args.file.read_text("utf-8").splitlines()
    return sys.stdin.read().splitlines()


def checkpoint_path(args) -> Path:
    if args.checkpoint is not None:
        path = args.checkpoint
        hint = "pass the .pt file of a trained run, e.g. results/published-scratch-s0/best.pt"
    else:
        path = args.results / args.run / "best.pt"
        run = Run.parse(args.run)
        hint = (f"train it with `nmt train --recipe {run.recipe} --model {run.model} --seed "
                f"{run.seed}`, or choose another run with --run")
    if not path.is_file():
        raise NmtError(f"{path} not found (fix: {hint})")
    return path


def encode_lines(lines: list[str], src_codec, max_len: int) -> list[list[int] | None]:
    """<bos> ids <eos> per line, None for an empty line; over-long lines are cut with a warning."""
    texts = [line.strip() for line in lines]
    nonempty = [t for t in texts if t]
    # Word vocabularies hold spaCy tokens; SentencePiece reads raw text.
    if src_codec.kind == "word":
        nonempty = tokenize_lines(nonempty, src_codec.lang)
    encoded = iter(src_codec.encode(x) for x in nonempty)
    out = []
    for n, text in enumerate(texts, 1):
        ids = next(encoded) if text else []
        if len(ids) > max_len - 2:
            log.warning("line %d: %d tokens, cut to the model's limit of %d", n, len(ids),
                        max_len - 2)
            ids = ids[: max_len - 2]
        out.append([BOS_ID, *ids, EOS_ID] if ids else None)
    return out


def translate_cli(args) -> None:
    path = checkpoint_path(args)
    model, ckpt = load(path, pick_device(args.device))
    vocab_dir = Path(args.vocab) / ckpt["recipe"]
    src_codec, tgt_codec = load_codecs(vocab_dir)
    check_vocab(ckpt, src_codec, tgt_codec, vocab_dir)
    ev, max_len = ckpt["params"]["evaluate"], ckpt["model_config"]["max_len"]
    beam = ev["beam_size"] if args.beam is None else args.beam
    if beam < 1:
        raise NmtError(f"--beam {beam}: a beam holds at least one hypothesis "
                       "(fix: --beam 1 or more)")

    sources = encode_lines(read_input(args), src_codec, max_len)
    todo = [s for s in sources if s is not None]
    log.info("translating %d lines with %s (beam %d)", len(todo), path, beam)
    dc = DecodeConfig.from_params(ev, "beam" if beam > 1 else "greedy", max_len - 1,
                                  beam_size=beam)
    ids = iter(translate_batches(model, todo, dc, progress=False))
    for s in sources:
        print(tgt_codec.decode(next(ids)) if s is not None else "")
