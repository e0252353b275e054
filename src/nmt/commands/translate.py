"""`nmt translate`: German lines in, English lines out, with a trained run's checkpoint, or with
its CTranslate2 export (`--engine ctranslate2`, written by `nmt export`)."""

from __future__ import annotations

import argparse
import codecs
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.core.checkpoint import load_trained
from nmt.core.codecs import BOS_ID, EOS_ID, load_codecs
from nmt.core.decoding import MAX_BEAM, DecodeConfig, translate_batches
from nmt.core.engine import (
    check_export,
    check_export_vocab,
    damaged_export,
    open_engine,
    tokens_of,
)
from nmt.core.errors import NmtError
from nmt.core.runs import Run
from nmt.core.runtime import pick_device
from nmt.core.text import first_words, tokenize_lines
from nmt.core.unknowns import detokenize_outputs
from nmt.pipeline import commandline
from nmt.pipeline.commandline import EXPORTS, VOCAB
from nmt.pipeline.recipes import resolve

log = logging.getLogger("nmt.translate")

HELP = ("Translate German sentences given as arguments, in --file, or on standard input, with a "
        "trained run's checkpoint; prints one English line per input line.")
# What to make smaller when it runs out of memory (nmt.core.errors.out_of_memory); decoding
# names its batch and beam itself (core.errors.memory_fix).
MEMORY_FIX = "a smaller evaluate.batch_size, or fewer sentences at once"


def arguments(s: argparse.ArgumentParser) -> None:
    commandline.results(s)
    commandline.threads(s)
    s.add_argument("sentences", nargs="*")
    s.add_argument("--run", default="published-scratch-s0",
                   help="results/<run> to load (default: published-scratch-s0)")
    s.add_argument("--checkpoint", type=Path, default=None, help="a .pt file instead of --run")
    s.add_argument("--file", type=Path, default=None)
    s.add_argument("--vocab", type=Path, default=VOCAB, help="holds <recipe>/")
    s.add_argument("--beam", type=int, default=None, help="beam size (default: from params)")
    s.add_argument("--device", default="auto")
    s.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch",
                   help="torch: the checkpoint in results/<run>; ctranslate2: its export in "
                        "--exports/<run> (nmt export writes it)")
    s.add_argument("--exports", type=Path, default=EXPORTS,
                   help="with --engine ctranslate2: holds <run>/ (default: exports)")
    s.add_argument("--compute-type", default="float32", choices=("float32", "int8"),
                   help="with --engine ctranslate2: the weights' type (int8: quantized as "
                        "the engine loads them)")


# The lines are translated and printed a chunk at a time, in order, as the input arrives (a
# long input printed nothing until all of it was translated): from standard input a chunk is
# the complete lines one read returns (at a terminal, each line as it is typed), else
# CHUNK_LINES lines of --file or the arguments; at most CHUNK_LINES either way.
CHUNK_LINES = 1000


def input_chunks(args) -> Iterator[tuple[int, list[str]]]:
    """(its first line's number, its lines) for each chunk of the input: the arguments, else
    --file, else standard input; one sentence a line, UTF-8."""
    if args.sentences:
        chunks, source = chunked([utf8_bytes(s) for s in args.sentences]), "arguments"
    elif args.file is not None:
        chunks, source = chunked(split_text(read_file(args.file), args.file)), str(args.file)
    else:
        if sys.stdin.isatty():
            log.info("reading sentences from standard input, one a line (end with Ctrl-D)")
        chunks, source = stdin_chunks(), "standard input"
    first = 1
    for lines in chunks:
        yield first, decode_lines(lines, source, first)
        first += len(lines)


def chunked(lines: list[bytes]) -> Iterator[list[bytes]]:
    for start in range(0, len(lines), CHUNK_LINES):
        yield lines[start:start + CHUNK_LINES]


def stdin_chunks() -> Iterator[list[bytes]]:
    """Standard input's complete lines as they arrive, each read's (split as split_text splits
    a whole text), then what follows the last newline."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream with no bytes beneath it (a test's StringIO)
        yield from chunked(split_text(utf8_bytes(sys.stdin.read()), "standard input"))
        return
    pending, start = b"", True
    while block := stream.read1(1 << 16):
        head, newline, pending = (pending + block).rpartition(b"\n")
        if newline:
            yield from chunked(split_text(head + newline, "standard input", start))
            start = False
    if pending:
        yield split_text(pending, "standard input", start)


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


def split_text(data: bytes, source, start: bool = True) -> list[bytes]:
    """A text's lines as `wc -l` and every line-by-line tool count them: each ended by LF (a CR
    before it dropped: CRLF); a CR anywhere else is a space in its line, so that there is one
    output line for each input line (splitting at it too made one line two or three); a UTF-8
    BOM dropped. Binary and UTF-16 text are refused. start: data opens the text (where a BOM
    can be); False for a later piece of a stream."""
    if b"\0" in data or start and data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise NmtError(f"{source} is binary or UTF-16, not UTF-8 text (fix: give UTF-8 text, "
                       "one sentence a line; convert with iconv -t UTF-8)")
    lines = (data.removeprefix(codecs.BOM_UTF8) if start else data).split(b"\n")
    if lines[-1] == b"":  # what follows the last LF (nothing, or an empty input)
        lines.pop()
    return [line.removesuffix(b"\r").replace(b"\r", b" ") for line in lines]


def decode_lines(lines: list[bytes], source: str, first: int = 1) -> list[str]:
    """UTF-8 lines (numbered from `first`); bytes that are not UTF-8 become U+FFFD, with one
    warning naming the lines, so every input line still gets its output line."""
    bad = []
    for n, line in enumerate(lines, first):
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


@dataclass(frozen=True)
class Source:
    """One input line as the model reads it."""

    ids: list[int]  # <bos> ids <eos>
    surfaces: list[str]  # each id's token as written (an unknown word keeps its own)


def encode_lines(lines: list[str], src_codec, max_len: int,
                 first: int = 1) -> list[Source | None]:
    """Each line (numbered from `first`) as a Source, None for an empty line; over-long lines
    are cut with a warning.
    Only the words that the tokens kept can come from are tokenized (first_words): a line of
    megabytes costs what one of max_len words does, and gives the same tokens."""
    limit = max_len - 2  # positions beside <bos> and <eos>
    texts = [line.strip() for line in lines]
    heads = [first_words(text, limit) for text in texts]
    nonempty = [head for head in heads if head]
    if src_codec.kind == "word":  # word vocabularies hold spaCy tokens
        written = tokenize_lines(nonempty, src_codec.lang, progress=False)
        encoded = iter(zip([src_codec.encode(tokens) for tokens in written], written,
                           strict=True))
    else:  # SentencePiece reads raw text
        encoded = iter(zip([src_codec.encode(text) for text in nonempty],
                           [src_codec.surfaces(text) for text in nonempty], strict=True))
    out = []
    for n, (text, head) in enumerate(zip(texts, heads, strict=True), first):
        ids, surfaces = next(encoded) if head else ([], [])
        if len(head) < len(text):  # words past the limit were never tokenized
            log.warning("line %d: over %d tokens (%d characters), cut to the model's limit of "
                        "%d", n, limit, len(text), limit)
        elif len(ids) > limit:
            log.warning("line %d: %d tokens, cut to the model's limit of %d", n, len(ids), limit)
        ids, surfaces = ids[:limit], surfaces[:limit]
        out.append(Source([BOS_ID, *ids, EOS_ID], list(surfaces)) if ids else None)
    return out


def command(args, params: dict) -> None:
    translator = engine_translator(args) if args.engine == "ctranslate2" else \
        torch_translator(args, params)
    # Decoding settings come from params.yaml (the recipe's there), not from the checkpoint:
    # training does not depend on them, so checkpoints do not record them.
    recipe = translator.recipe
    ev = resolve(params, recipe)["evaluate"] if recipe in params["recipes"] else params["evaluate"]
    beam = ev["beam_size"] if args.beam is None else args.beam
    if not 1 <= beam <= MAX_BEAM:
        raise NmtError(f"--beam {beam}: a beam holds 1 to {MAX_BEAM} hypotheses (fix: --beam 1 "
                       f"to {MAX_BEAM}; 1 is greedy)")
    # Copying an <unk> from the source reads our model's attention; an export has none to give.
    unknown_words = ev["unknown_words"] if translator.model is not None else "mark"

    log.info("translating with %s (beam %d; unknown words: %s)", translator.name, beam,
             unknown_words)
    dc = DecodeConfig.from_params(ev, "beam" if beam > 1 else "greedy", translator.max_len - 1,
                                  beam_size=beam,
                                  beam_key="evaluate.beam_size" if args.beam is None else "--beam")
    lines = unknowns = 0
    for first, chunk in input_chunks(args):
        sources = encode_lines(chunk, translator.src_codec, translator.max_len, first)
        todo = [s for s in sources if s is not None]
        source_ids = [s.ids for s in todo]
        text = detokenize_outputs(translator.model, source_ids, [s.surfaces for s in todo],
                                  translator.translate(source_ids, dc), translator.tgt_codec,
                                  unknown_words)
        outputs = iter(text.lines)
        for s in sources:
            print(next(outputs) if s is not None else "")
        sys.stdout.flush()  # each chunk's lines as soon as they are done
        lines, unknowns = lines + len(sources), unknowns + text.unknowns
    log.info("translated %d line%s", lines, "" if lines == 1 else "s")
    if unknowns:
        log.info("%d word%s the vocabulary lacks: %s", unknowns, "" if unknowns == 1 else "s",
                 "copied from the source" if unknown_words == "copy" else "marked <unk>")


@dataclass(frozen=True)
class Translator:
    """What translating needs, whichever engine decodes: its codecs and a function from source
    id lists to output id lists."""

    name: str  # what is shown: the checkpoint or export folder
    recipe: str  # whose evaluate: settings decode
    src_codec: object
    tgt_codec: object
    max_len: int  # the model's positions: inputs are cut to it
    translate: Callable  # (sources, DecodeConfig) -> id lists
    model: torch.nn.Module | None  # ours, whose attention copies an <unk>; None for an export


def torch_translator(args, params: dict) -> Translator:
    """Our model from a run's best.pt (or --checkpoint), on --device."""
    path, run = checkpoint_path(args)
    # A run's best.pt must hold what its recipe in params.yaml trains; a file named with
    # --checkpoint is taken as it is.
    settings = resolve(params, run.recipe) if run and run.recipe in params["recipes"] else None
    trained = load_trained(path, lambda recipe: Path(args.vocab) / recipe,
                           pick_device(args.device), expect=run, settings=settings)
    model = trained.model
    return Translator(str(path), trained.checkpoint["recipe"], *trained.codecs, trained.max_len,
                      lambda todo, dc: translate_batches(model, todo, dc, progress=False), model)


def engine_translator(args) -> Translator:
    """The run's CTranslate2 export (nmt export), as --compute-type, on the CPU."""
    if args.checkpoint is not None:
        raise NmtError("--checkpoint reads a PyTorch checkpoint; the ctranslate2 engine reads "
                       "an export (fix: --run <run> with --exports, or leave out --engine)")
    run = Run.parse(args.run)
    folder = Path(args.exports) / run.name
    meta = check_export(folder, run)
    try:
        src_codec, tgt_codec = load_codecs(folder / "vocab")
    except NmtError:  # a line of its own already (a ValueError too)
        raise
    except (ValueError, KeyError, TypeError) as e:  # a vocabulary file that is no JSON, or odd
        raise damaged_export(folder, run, e) from None
    src_tokens, tgt_tokens = tokens_of(src_codec), tokens_of(tgt_codec)
    check_export_vocab(folder, run, src_tokens, tgt_tokens)
    engine = open_engine(folder, run, src_tokens, tgt_tokens, args.compute_type,
                         threads=torch.get_num_threads())
    return Translator(f"{folder} ({args.compute_type})", meta["recipe"], src_codec, tgt_codec,
                      meta["max_len"], engine.translate, None)
