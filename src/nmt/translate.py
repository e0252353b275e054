"""`nmt translate`: German lines in, English lines out, with a trained run's checkpoint."""

from __future__ import annotations

import codecs
import logging
import sys
from pathlib import Path

from nmt.checkpoint import check_vocab, load
from nmt.errors import NmtError
from nmt.recipes import resolve
from nmt.runs import Run
from nmt.runtime import pick_device
from nmt.search import DecodeConfig, translate_batches
from nmt.text import tokenize_lines
from nmt.vocab import BOS_ID, EOS_ID, load_codecs

log = logging.getLogger("nmt.translate")


def read_input(args) -> list[str]:
    """Sentences from the arguments, else --file, else standard input; one per line, UTF-8."""
    if args.sentences:
        return decode_lines([utf8_bytes(s) for s in args.sentences], "arguments")
    if args.file is not None:
        return decode_lines(split_text(read_file(args.file), args.file), str(args.file))
    if sys.stdin.isatty():
        log.info("reading sentences from standard input, one a line (end with Ctrl-D)")
    stdin = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else utf8_bytes(
        sys.stdin.read())
    return decode_lines(split_text(stdin, "standard input"), "standard input")


def read_file(path: Path) -> bytes:
    """The bytes of --file (a pipe such as /dev/stdin too); a folder or a missing or unreadable
    file is one line that says which."""
    fix = "(fix: give a text file, one sentence a line)"
    if path.is_dir():
        raise NmtError(f"{path} is a folder, not a file {fix}")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path} not found {fix}") from None
    except OSError as e:
        raise NmtError(f"{path} cannot be read ({e.strerror}) {fix}") from None


def utf8_bytes(text: str) -> bytes:
    """The bytes behind a str from argv or a text stream: undecodable bytes arrive as
    surrogate escapes, which surrogateescape turns back into those bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no escape: keep it undecodable
        return text.encode("utf-8", "surrogatepass")


def split_text(data: bytes, source) -> list[bytes]:
    """A text's lines (ended by LF, CRLF or CR; a UTF-8 BOM dropped); binary and UTF-16 refused."""
    if b"\0" in data or data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise NmtError(f"{source} is binary or UTF-16, not UTF-8 text (fix: give UTF-8 text, "
                       "one sentence a line; convert with iconv -t UTF-8)")
    return data.removeprefix(codecs.BOM_UTF8).splitlines()


def decode_lines(lines: list[bytes], source: str) -> list[str]:
    """UTF-8 lines; bytes that are not UTF-8 become U+FFFD, with one warning naming the lines,
    so every input line still gets its output line."""
    bad = []
    for n, line in enumerate(lines, 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(n)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if bad[5:] else "")
        log.warning("%s: %s not UTF-8; undecodable bytes replaced with U+FFFD", source,
                    f"line {shown} is" if len(bad) == 1 else f"lines {shown} are")
    return [line.decode("utf-8", "replace") for line in lines]


def checkpoint_path(args) -> tuple[Path, Run | None]:
    """The checkpoint to load, and the run it must hold (None for an explicit --checkpoint)."""
    run = None
    if args.checkpoint is not None:
        path = args.checkpoint
        hint = "pass the .pt file of a trained run, e.g. results/published-scratch-s0/best.pt"
    else:
        run = Run.parse(args.run)
        path = run.files(args.results).best
        hint = (f"train it with `nmt train --recipe {run.recipe} --model {run.model} --seed "
                f"{run.seed}`, or choose another run with --run")
    if not path.is_file():
        raise NmtError(f"{path} not found (fix: {hint})")
    return path, run


def encode_lines(lines: list[str], src_codec, max_len: int) -> list[list[int] | None]:
    """<bos> ids <eos> per line, None for an empty line; over-long lines are cut with a warning."""
    texts = [line.strip() for line in lines]
    nonempty = [t for t in texts if t]
    # Word vocabularies hold spaCy tokens; SentencePiece reads raw text.
    if src_codec.kind == "word":
        nonempty = tokenize_lines(nonempty, src_codec.lang, progress=False)
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


def translate_cli(args, params: dict) -> None:
    path, run = checkpoint_path(args)
    # A run's best.pt must hold what its recipe in params.yaml trains; a file named with
    # --checkpoint is taken as it is.
    settings = resolve(params, run.recipe) if run and run.recipe in params["recipes"] else None
    model, ckpt = load(path, pick_device(args.device), expect=run, settings=settings)
    vocab_dir = Path(args.vocab) / ckpt["recipe"]
    src_codec, tgt_codec = load_codecs(vocab_dir)
    check_vocab(ckpt, src_codec, tgt_codec, vocab_dir)
    # Decoding settings come from params.yaml (the checkpoint's recipe there), not from the
    # checkpoint: training does not depend on them, so checkpoints do not record them.
    ev = resolve(params, ckpt["recipe"])["evaluate"] if ckpt["recipe"] in params["recipes"] \
        else params["evaluate"]
    max_len = ckpt["model_config"]["max_len"]
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
