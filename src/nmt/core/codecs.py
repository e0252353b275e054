"""How a recipe's vocabulary turns text into ids and back: the specials, the word and BPE
codecs, and `load_codecs`, which reads the folder the vocab stage wrote.

Both kinds put the specials <unk> <pad> <bos> <eos> at ids 0..3; `load_codecs` gives each side
an object that turns a sentence into ids and ids back into a detokenized sentence.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from nmt.core.errors import NmtError
from nmt.core.files import read_json
from nmt.core.records import verified
from nmt.core.text import detokenize, split_tokens

SPECIALS = ("<unk>", "<pad>", "<bos>", "<eos>")
UNK_ID, PAD_ID, BOS_ID, EOS_ID = range(4)


class Vocab:
    """Token <-> id for one language; unknown tokens map to <unk>."""

    def __init__(self, itos: list[str]):
        if tuple(itos[:4]) != SPECIALS:
            raise NmtError(f"vocabulary must start with {SPECIALS} (fix: re-run `nmt vocab`)")
        self.itos = itos
        self.stoi = {t: i for i, t in enumerate(itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def ids(self, tokens: list[str]) -> list[int]:
        return [self.stoi.get(t, UNK_ID) for t in tokens]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]


class WordCodec:
    """Sentences as spaCy tokens; output detokenized by rule."""

    kind = "word"

    def __init__(self, vocab: Vocab, lang: str):
        self.vocab, self.lang = vocab, lang

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, tokens: list[str]) -> list[int]:
        return self.vocab.ids(tokens)

    def encode_lines(self, lines: list[str]) -> list[list[int]]:
        """The ids of lines of a .tok file (space-joined tokens)."""
        return [self.vocab.ids(split_tokens(line)) for line in lines]

    def decode(self, ids: Iterable[int]) -> str:
        return self.join(self.vocab.tokens(i for i in ids if i >= len(SPECIALS)))

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return self.vocab.tokens(ids)

    def join(self, pieces: list[str]) -> str:
        """The sentence of output tokens (pieces, with any <unk> replaced or kept)."""
        return detokenize(pieces)

    def surfaces(self, line: str) -> list[str]:
        """Each token of a .tok line as written, one per id encode_lines gives it."""
        return split_tokens(line)


class BpeCodec:
    """Raw sentences through one joint SentencePiece BPE model (lossless detokenization)."""

    kind = "bpe"

    def __init__(self, model_path: Path, lang: str):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.lang = lang

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def encode_lines(self, lines: list[str]) -> list[list[int]]:
        """The ids of raw lines, encoded on every core (the same ids as one by one)."""
        return self.sp.encode(lines, num_threads=os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([i for i in ids if i >= len(SPECIALS)])

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.sp.id_to_piece(i) for i in ids]

    def join(self, pieces: list[str]) -> str:
        """The sentence of output pieces (a piece the model lacks is taken as written; <unk>
        itself becomes SentencePiece's mark, " ⁇ ")."""
        return self.sp.decode_pieces(pieces)

    def surfaces(self, line: str) -> list[str]:
        """Each piece of a raw line as written, one per id encode_lines gives it: a character
        the model lacks keeps its own text where its id is <unk>."""
        return self.sp.encode(line, out_type=str)


def load_codecs(vocab_dir: Path) -> tuple:
    """(source codec, target codec) of one recipe's vocabulary folder."""
    vocab_dir = Path(vocab_dir)
    if not (vocab_dir / "meta.json").is_file():
        raise NmtError(f"{vocab_dir}/meta.json is missing (fix: run `nmt vocab` first)")
    # Each file is checked against the folder's SHA256SUMS (nmt.core.records) before use.
    meta = read_json(verified(vocab_dir / "meta.json"))
    if meta["kind"] == "word":
        src, tgt = (read_json(verified(vocab_dir / f"{side}.json")) for side in ("src", "tgt"))
        return (WordCodec(Vocab(src), meta["source_lang"]),
                WordCodec(Vocab(tgt), meta["target_lang"]))
    model = verified(vocab_dir / "spm.model")
    return BpeCodec(model, meta["source_lang"]), BpeCodec(model, meta["target_lang"])
