"""download, tokenize and vocab on the real Multi30k files."""

import gzip
import json
import random
import shutil
import urllib.request

import pytest
import sacrebleu

from conftest import REPO
from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID, SPECIALS, load_codecs
from nmt.core.data import Batches, load_pairs, padding_fraction, sentence_batches, token_batches
from nmt.core.errors import NmtError
from nmt.core.files import sha256, utf8_lines
from nmt.core.records import RECORD, read_sums
from nmt.core.text import (
    detokenize,
    first_words,
    read_lines,
    read_tokens,
    tokenize_lines,
    tokenizer,
    words,
)
from nmt.pipeline.corpora.raw import PINS as SUMS
from nmt.pipeline.params import load_params
from nmt.stages.download import Paths as DownloadPaths
from nmt.stages.download import download
from nmt.stages.tokenize import Paths as TokenizePaths
from nmt.stages.tokenize import tokenize
from nmt.stages.vocab import build_vocab

DATA = load_params(REPO / "params.yaml")["data"]
TOKENIZE = {"batch_size": 100, "words": True}
UNREACHABLE = "http://127.0.0.1:9/unreachable"


def test_download_verifies_every_file(prepared):
    assert sorted(p.name for p in prepared["raw"].iterdir()) == sorted(
        [*read_sums(REPO / SUMS), RECORD])


def test_corrupt_mirror_file_is_rejected_and_nothing_is_left(mirror, tmp_path, monkeypatch):
    bad = tmp_path / "mirror"
    shutil.copytree(mirror, bad)
    (bad / "val.en.gz").chmod(0o644)
    with open(bad / "val.en.gz", "ab") as f:
        f.write(b"tampered")
    monkeypatch.setenv("MULTI30K_MIRROR", str(bad))
    out = tmp_path / "data" / "raw"
    with pytest.raises(NmtError) as err:
        download({"data": DATA | {"base_url": UNREACHABLE}}, DownloadPaths(out), retries=1,
                 backoff=0)
    msg = str(err.value)
    assert "val.en.gz" in msg and read_sums(REPO / SUMS)["val.en.gz"] in msg
    assert "corrupt: sha256 " in msg
    assert not out.exists() and not list((tmp_path / "data").iterdir())


def test_a_test_set_is_a_params_entry_plus_its_pinned_sum(prepared, tmp_path, monkeypatch):
    """A new test set of the same format needs no code: data.testsets and one sha256 line."""
    mirror = tmp_path / "mirror"
    shutil.copytree(prepared["raw"], mirror)
    for lang in ("de", "en"):  # a made-up test set: the first 7 lines of val
        lines = gzip.decompress((mirror / f"val.{lang}.gz").read_bytes()).splitlines()[:7]
        (mirror / f"test_mine.{lang}.gz").write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    sums = tmp_path / "sums"
    sums.write_text((REPO / SUMS).read_text() + "".join(
        f"{sha256(mirror / f'test_mine.{x}.gz')}  test_mine.{x}.gz\n" for x in ("de", "en")))
    monkeypatch.setenv("MULTI30K_MIRROR", str(mirror))
    data = DATA | {"base_url": UNREACHABLE, "testsets": ["test_mine"]}
    with pytest.raises(NmtError, match="test_mine.de.gz has no pinned sha256 in .*fix: add"):
        download({"data": data}, DownloadPaths(tmp_path / "raw", REPO / SUMS), retries=1)
    download({"data": data}, DownloadPaths(tmp_path / "raw", sums), retries=1)
    stats = tokenize({"data": data | {"max_train_pairs": 10}, "tokenize": TOKENIZE},
                     TokenizePaths(tmp_path / "raw", tmp_path / "tok"))
    assert stats["test_mine.en"]["sentences"] == 7 and "test_2016_flickr.en" not in stats


def test_missing_source_names_the_fix(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("MULTI30K_MIRROR", str(tmp_path / "empty"))
    with pytest.raises(NmtError, match="could not fetch train.de.gz .*fix: set MULTI30K_MIRROR"):
        download({"data": DATA | {"base_url": UNREACHABLE}}, DownloadPaths(tmp_path / "raw"),
                 retries=2, backoff=0)
    assert not (tmp_path / "raw").exists()


def test_a_mirror_folder_that_is_not_there_is_named_before_any_network(tmp_path, monkeypatch):
    """The public repository is not tried (it cost ~12 s of retries): the user meant the
    mirror."""
    def no_network(*args, **kwargs):
        raise AssertionError("the network was tried")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.setenv("MULTI30K_MIRROR", str(tmp_path / "nowhere"))
    with pytest.raises(NmtError) as err:
        download({"data": DATA}, DownloadPaths(tmp_path / "raw"))
    assert str(err.value) == (
        f"MULTI30K_MIRROR is {tmp_path / 'nowhere'}, which is not a folder (fix: point it at the "
        "folder holding the Multi30k raw files, or unset it to download them from the public "
        "repository)")
    assert not (tmp_path / "raw").exists()


def test_tokenize_counts_and_alignment(prepared):
    stats = json.loads((prepared["tokenized"] / "stats.json").read_text())
    assert stats["train.de"]["sentences"] == stats["train.en"]["sentences"] == 2000
    assert stats["val.en"]["sentences"] == 1014 and stats["test_2016_flickr.de"]["sentences"] == 100
    toks = read_tokens(prepared["tokenized"] / "train.en.tok")
    assert len(toks) == 2000 and all(toks)
    assert stats["train.en"]["tokens"] == sum(map(len, toks))
    assert stats["train.en"]["max_len"] == max(map(len, toks))


def test_each_language_is_tokenized_by_its_own_rules(prepared):
    """Each .tok file stage tokenize writes is spaCy's tokenizer of its own language over the
    .txt beside it, line for line; the two languages' rules differ on the English side (a
    file tokenized by the German rules would pass every count)."""
    for split in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            raw = read_lines(prepared["tokenized"] / f"{split}.{lang}.txt")
            assert read_tokens(prepared["tokenized"] / f"{split}.{lang}.tok") == \
                tokenize_lines(raw, lang, progress=False), (split, lang)
    english = read_lines(prepared["tokenized"] / "val.en.txt")
    assert tokenize_lines(english, "en", progress=False) != \
        tokenize_lines(english, "de", progress=False)


def test_spacy_tokens():
    de = tokenize_lines(["Ein Mann fährt mit dem Fahrrad."], "de")
    en = tokenize_lines(["A man's T-shirt,  isn't it?"], "en")
    assert de == [["Ein", "Mann", "fährt", "mit", "dem", "Fahrrad", "."]]
    assert en == [["A", "man", "'s", "T", "-", "shirt", ",", "is", "n't", "it", "?"]]
    assert detokenize(en[0]) == "A man's T-shirt, isn't it?"


def test_a_line_over_spacys_max_length_tokenizes_and_the_files_stay_aligned(prepared, tmp_path):
    """spaCy refuses a text over nlp.max_length, 1,000,000 characters (E088), a guard for its
    parser's memory that a tokenizer alone does not need: such a line in a corpus gets its
    tokens like any other, on its own line of the .tok file."""
    raw = tmp_path / "raw"  # edited below, so made without download's record
    shutil.copytree(prepared["raw"], raw, ignore=shutil.ignore_patterns(RECORD))
    lines = gzip.decompress((raw / "val.de.gz").read_bytes()).split(b"\n")
    sentence = ["Ein", "Hund", "läuft", "über", "die", "Wiese", "."]
    lines[2] = " ".join(sentence * 40_000).encode()  # 1.28 million characters
    (raw / "val.de.gz").write_bytes(gzip.compress(b"\n".join(lines)))
    data = DATA | {"max_train_pairs": 10, "max_test_pairs": 10}
    stats = tokenize({"data": data, "tokenize": TOKENIZE}, TokenizePaths(raw, tmp_path / "tok"))
    de = read_tokens(tmp_path / "tok" / "val.de.tok")
    assert len(de) == len(read_lines(tmp_path / "tok" / "val.en.tok")) == 1014
    assert de[2] == sentence * 40_000 and de[3] == tokenize_lines([lines[3].decode()], "de")[0]
    assert stats["val.de"]["max_len"] == 7 * 40_000


def test_the_first_words_of_a_line_give_its_first_tokens(prepared):
    """nmt translate tokenizes only the words a model can read of a line (first_words): their
    tokens must be the whole line's first ones, spaCy's and SentencePiece's, whatever the
    whitespace between them."""
    spaces = [" ", "  ", "\t", "\u00a0", " \u2009 "]
    sentences = read_lines(prepared["tokenized"] / "val.de.txt")
    line = "".join(s + spaces[i % len(spaces)] for i, s in enumerate(sentences)).strip()
    nlp, bpe = tokenizer("de"), load_codecs(prepared["bpe"])[0]
    whole = {"spacy": next(words(nlp, [line])), "bpe": bpe.encode(line)}
    for n in (1, 7, 100, 5000):
        head = first_words(line, n)
        assert len(head) < len(line) and not head[-1].isspace()
        for kind, tokens in (("spacy", next(words(nlp, [head]))), ("bpe", bpe.encode(head))):
            assert len(tokens) >= n and tokens == whole[kind][: len(tokens)], (kind, n)
    assert first_words(line, 10**6) == line


def test_detokenize_restores_the_references(prepared):
    """Word-level output is scored detokenized, so detokenize(tokenize(ref)) must be ~ref."""
    refs = read_lines(prepared["tokenized"] / "val.en.txt")
    hyps = [detokenize(t) for t in read_tokens(prepared["tokenized"] / "val.en.tok")]
    assert sacrebleu.corpus_bleu(hyps, [refs]).score > 99.5


def test_truncated_or_corrupt_raw_file(prepared, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(prepared["raw"], raw)
    (raw / "val.de.gz").write_bytes(gzip.compress(b"only one line\n"))
    with pytest.raises(NmtError, match=r"val.de.gz: its sha256 differs from the one recorded in "
                       r".*SHA256SUMS.*fix: `dvc repro -f -s download`"):
        tokenize({"data": DATA, "tokenize": TOKENIZE}, TokenizePaths(raw, tmp_path / "tok"))
    (raw / RECORD).unlink()  # a folder without a record (made by hand) is read as it is
    with pytest.raises(NmtError, match="val: 1 de vs 1014 en lines"):
        tokenize({"data": DATA, "tokenize": TOKENIZE},
                 TokenizePaths(raw, tmp_path / "tok"))
    (raw / "val.de.gz").write_bytes(b"not gzip")
    with pytest.raises(NmtError, match="val.de.gz is unreadable"):
        tokenize({"data": DATA, "tokenize": TOKENIZE},
                 TokenizePaths(raw, tmp_path / "tok"))
    lines = gzip.decompress((prepared["raw"] / "val.de.gz").read_bytes()).split(b"\n")
    lines[4] = "Ein Fußgänger.".encode("latin-1")  # line 5: not UTF-8 from its 7th byte
    (raw / "val.de.gz").write_bytes(gzip.compress(b"\n".join(lines)))
    with pytest.raises(NmtError) as err:
        tokenize({"data": DATA, "tokenize": TOKENIZE}, TokenizePaths(raw, tmp_path / "tok"))
    assert str(err.value) == (f"{raw / 'val.de.gz'}: line 5 is not UTF-8 (byte 7 of the line) "
                              "(fix: re-run `nmt download`)")
    assert not (tmp_path / "tok").exists()


def test_a_byte_order_mark_opening_a_raw_file_is_no_token(prepared, tmp_path):
    """Issue 69 item 7: a corpus saved by Windows tools opens each file with a UTF-8 BOM, which
    stuck to the first token of every tokenized file; one inside a line is text and stays."""
    raw = tmp_path / "raw"
    shutil.copytree(prepared["raw"], raw)
    (raw / RECORD).unlink()  # edited by hand: read as it is
    for lang in ("de", "en"):
        lines = gzip.decompress((raw / f"val.{lang}.gz").read_bytes())
        (raw / f"val.{lang}.gz").write_bytes(gzip.compress("\ufeff".encode() + lines))
    tokenize({"data": DATA, "tokenize": TOKENIZE}, TokenizePaths(raw, tmp_path / "tok"))
    for lang in ("de", "en"):
        first = (tmp_path / "tok" / f"val.{lang}.tok").read_text(encoding="utf-8")
        assert "\ufeff" not in first, lang
        assert first.split("\n")[0] == (prepared["tokenized"] / f"val.{lang}.tok").read_text(
            encoding="utf-8").split("\n")[0]
    assert list(utf8_lines([b"a\n", "\ufeffb\n".encode()], "x", "y")) == ["a\n", "\ufeffb\n"]


def test_vocab_order_specials_and_min_freq():
    sents = [["b", "a", "c"], ["a", "c", "d"], ["c", "<pad>"]]
    v = build_vocab(sents, min_freq=1)
    # c (3) first, then a (2), then the ties b, d in order of first appearance.
    assert v.itos == list(SPECIALS) + ["c", "a", "b", "d"]
    assert build_vocab(sents, min_freq=2).itos == list(SPECIALS) + ["c", "a"]
    assert v.ids(["a", "zebra"]) == [5, 0]


def test_word_vocab_from_train_only(prepared):
    src, tgt = load_codecs(prepared["word"])
    train_de = {t for s in read_tokens(prepared["tokenized"] / "train.de.tok") for t in s}
    assert len(src) == len(train_de | set(SPECIALS)) == prepared["word_meta"]["src_size"]
    assert src.vocab.itos[:4] == list(SPECIALS) and tgt.kind == "word"


def test_a_word_codec_decodes_the_ids_it_encodes_to_the_detokenized_line(prepared):
    """What evaluate scores: the target codec's decode of a model's ids (bos ... eos, pads
    after) is the detokenized line of those words; every word of the vocabulary survives,
    the most frequent one (the first id after the specials) too. Lines of words the train
    split never had (<unk>) are left out: their <unk> is for evaluate.unknown_words."""
    _, tgt = load_codecs(prepared["word"])
    lines = [t for t in read_tokens(prepared["tokenized"] / "val.en.tok")
             if all(w in tgt.vocab.stoi for w in t)]
    assert len(lines) > 50
    for tokens in lines:
        ids = [BOS_ID, *tgt.encode(tokens), EOS_ID, PAD_ID]
        assert tgt.decode(ids) == detokenize(tokens), tokens
    assert tgt.decode([len(SPECIALS)]) == tgt.vocab.itos[len(SPECIALS)]


def test_bpe_vocab_is_joint_and_lossless(prepared):
    src, tgt = load_codecs(prepared["bpe"])
    assert len(src) == len(tgt) == 1000
    assert [src.sp.id_to_piece(i) for i in range(4)] == list(SPECIALS)
    line = "Zwei Männer stehen am Strand."
    assert src.decode(src.encode(line)) == line


@pytest.mark.parametrize(("batch_by", "bucket"), [("sentences", False), ("sentences", True),
                                                 ("tokens", False)])
def test_batches_cover_every_pair_once(prepared, batch_by, bucket):
    src, tgt = load_codecs(prepared["word"])
    pairs = load_pairs(prepared["tokenized"], "train", src, tgt, max_len=256)
    assert pairs[0][0][0] == BOS_ID and pairs[0][1][-1] == EOS_ID
    batches = Batches(pairs, batch_by, batch_size=32, max_tokens=600, shuffle=True, seed=1,
                      bucket=bucket)
    first = [(s.clone(), t.clone()) for s, t in batches]
    second = [(s.clone(), t.clone()) for s, t in batches]
    seen = sum(s.shape[0] for s, _ in first)
    assert seen == len(pairs)
    assert any(not a.equal(b) for (a, _), (b, _) in zip(first, second, strict=False))  # reshuffled
    real = sum(int((t != PAD_ID).sum()) for _, t in first)
    padded = sum(t.numel() for _, t in first)
    if batch_by == "tokens":
        assert all(max(s.shape[1], t.shape[1]) * s.shape[0] <= 600 for s, t in first)
        assert real / padded > 0.9  # length bucketing leaves little padding


def test_bucketed_sentence_batches_pad_little_and_reshuffle_by_seed_and_epoch(prepared):
    """train.bucket: still batch_size sentences a batch (one short last batch), far less padding
    than random batches, another order every epoch, the same order again from (seed, epoch)."""
    pairs = load_pairs(prepared["tokenized"], "train", *load_codecs(prepared["word"]), 256)

    def batches(bucket, seed=1):
        return Batches(pairs, "sentences", 32, 600, shuffle=True, seed=seed, bucket=bucket)

    bucketed, rand = batches(True), batches(False)
    sizes = sorted(len(idx) for idx in bucketed.indices(0))
    assert sizes[1:] == [32] * (len(pairs) // 32) and sizes[0] == len(pairs) % 32
    assert sorted(i for idx in bucketed.indices(0) for i in idx) == list(range(len(pairs)))
    random_padding = padding_fraction(pairs, rand.indices(0))
    assert padding_fraction(pairs, bucketed.indices(0)) < random_padding / 3
    # Reshuffled each epoch: another order, and other sentences meet in a batch.
    first, second = ({tuple(idx) for idx in bucketed.indices(e)} for e in (0, 1))
    assert bucketed.indices(0) != bucketed.indices(1) and first != second
    assert batches(True).indices(1) == bucketed.indices(1) != batches(True, seed=2).indices(1)


def test_bucket_changes_neither_random_sentence_nor_token_batches(prepared):
    """bucket: false is the published reference's random order, and token batches ignore it."""
    pairs = load_pairs(prepared["tokenized"], "train", *load_codecs(prepared["word"]), 256)
    for epoch in (0, 1):
        rand = Batches(pairs, "sentences", 32, 600, True, 1, bucket=False)
        assert rand.indices(epoch) == sentence_batches(len(pairs), 32, random.Random(1 + epoch))
        tokens = Batches(pairs, "tokens", 32, 600, True, 1, bucket=True)
        assert tokens.indices(epoch) == token_batches(pairs, 600, random.Random(1 + epoch))


def test_padding_fraction_counts_source_and_target_positions():
    pairs = [([1, 2, 3], [1, 2]), ([1], [1, 2, 3, 4]), ([1, 2], [1, 2])]
    # batch [0, 1]: source 2 x 3 positions, 4 real; target 2 x 4, 6 real; batch [2]: none padded
    assert padding_fraction(pairs, [[0, 1], [2]]) == pytest.approx(1 - (4 + 6 + 4) / (6 + 8 + 4))
