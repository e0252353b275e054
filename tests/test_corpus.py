"""data.corpus files and huggingface: download writes the same data/raw for both, checks what
it reads, and every bad input is one line naming the key and the fix."""

import copy
import gzip
import shutil

import pandas as pd
import pytest
import yaml

from conftest import REPO, edit_params
from corpora import LANGS, corpus_data, sentences, write_files, write_parquet
from nmt.core.codecs import load_codecs
from nmt.core.data import load_pairs
from nmt.core.errors import NmtError
from nmt.core.files import sha256
from nmt.core.records import RECORD, read_sums
from nmt.pipeline import declaration, preflight
from nmt.pipeline.corpora.kinds import KINDS
from nmt.pipeline.corpora.raw import MIN_TRAIN_PAIRS
from nmt.pipeline.params import load_params
from nmt.stages import sources, vocab
from nmt.stages.download import Paths as DownloadPaths
from nmt.stages.download import download
from nmt.stages.tokenize import Paths as TokenizePaths
from nmt.stages.tokenize import tokenize
from nmt.stages.verify import TRAJECTORY_STEPS, verify
from nmt.stages.verify import Paths as VerifyPaths

PARAMS = load_params(REPO / "params.yaml")
DATA = PARAMS["data"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, mirror):
    root = tmp_path_factory.mktemp("corpus")
    return {"root": root, "files": write_files(mirror, root / "files"),
            "translation": write_parquet(mirror, root / "hf_translation"),
            "columns": write_parquet(mirror, root / "hf_columns", layout="columns"),
            "sentences": sentences(mirror)}


def settings(kind: str, entry: dict) -> dict:
    return {"data": DATA | corpus_data(kind, entry), "tokenize": PARAMS["tokenize"]}


def fetch(kind: str, entry: dict, out):
    download(settings(kind, entry), DownloadPaths(out))
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_files_and_both_huggingface_layouts_give_the_same_raw_files(corpus, tmp_path):
    raw = fetch("files", corpus["files"], tmp_path / "files")
    assert raw == fetch("huggingface", corpus["translation"], tmp_path / "translation")
    assert raw == fetch("huggingface", corpus["columns"], tmp_path / "columns")
    names = [f"{split}.{lang}.gz" for split in ("train", "val", "news_test") for lang in LANGS]
    assert sorted(raw) == sorted(names + [RECORD])
    for split, sides in corpus["sentences"].items():
        for lang, lines in sides.items():
            assert gzip.decompress(raw[f"{split}.{lang}.gz"]).decode().splitlines() == lines
    assert read_sums(tmp_path / "files" / RECORD) == {
        n: sha256(tmp_path / "files" / n) for n in names}


def test_tokenize_reads_a_corpus_with_its_own_test_set(corpus, tmp_path):
    fetch("files", corpus["files"], tmp_path / "raw")
    stats = tokenize(settings("files", corpus["files"]) | {"data": DATA | corpus_data(
        "files", corpus["files"])}, TokenizePaths(tmp_path / "raw", tmp_path / "tok"))
    assert stats["news_test.en"]["sentences"] == 50 and stats["train.de"]["sentences"] == 1000


def bad_files(corpus, tmp_path, split="train", lang="en", lines=None, raw_bytes=None):
    """corpus["files"] with one file replaced by `lines` (or bytes)."""
    files = {s: dict(sides) for s, sides in corpus["files"].items()}
    path = tmp_path / f"bad.{split}.{lang}"
    path.write_bytes(raw_bytes if raw_bytes is not None
                     else "".join(x + "\n" for x in lines).encode())
    files[split][lang] = str(path)
    return files


@pytest.mark.parametrize("case, want", [
    ("missing", "params.yaml: data.files.train.en: {missing} does not exist (fix: correct the "
                "path"),
    ("shorter", "data.files.train: train has 1000 de but 999 en sentences: the sides do not "
                "pair up (fix: give both sides one sentence a line"),
    ("empty", "data.files.val: val is empty (fix: point it at a corpus with sentences)"),
    ("corrupt", "params.yaml: data.files.train.en: {corrupt} is unreadable"),
    ("latin1", "params.yaml: data.files.train.en: {latin1}: line 3 is not UTF-8 (byte 7 of the "
               "line) (fix: give a UTF-8 text file, plain or gzipped)"),
    ("no_text", "data.files.train: train has no en text: its 1000 en lines are all empty (fix: "
                "point it at the en sentences, one a line)"),
    ("few_pairs", "data.files.train: train has 959 pairs with text on both sides, fewer than the "
                  "960 verify trains on (30 batches of 32) (fix: point it at a corpus of at "
                  "least 960 such pairs)"),
    ("no_pair", "data.files.val: val has no pair with text on both sides (fix: give each de line "
                "its en translation on the same line)"),
])
def test_bad_files_are_one_line_and_leave_nothing(corpus, tmp_path, case, want):
    lines = corpus["sentences"]["train"]["en"]
    if case == "missing":
        files = bad_files(corpus, tmp_path, lines=[])
        files["train"]["en"] = str(tmp_path / "nope.en")
    elif case == "shorter":
        files = bad_files(corpus, tmp_path, lines=lines[:-1])
    elif case == "empty":  # both sides of val empty
        files = bad_files(corpus, tmp_path, "val", "de", lines=[])
        files["val"]["en"] = files["val"]["de"]
    elif case == "no_text":  # 1,000 empty lines: tokenize, vocab and train took them
        files = bad_files(corpus, tmp_path, lines=[""] * len(lines))
    elif case == "few_pairs":  # text on both sides of one pair too few for verify
        files = bad_files(corpus, tmp_path, lines=lines[:959] + [""] * (len(lines) - 959))
    elif case == "no_pair":  # each side has text, but never on the same line as the other's
        val = corpus["sentences"]["val"]
        files = bad_files(corpus, tmp_path, "val", "de",
                          lines=[x if i % 2 else "" for i, x in enumerate(val["de"])])
        files["val"]["en"] = bad_files(corpus, tmp_path, "val", "en", lines=[
            "" if i % 2 else x for i, x in enumerate(val["en"])])["val"]["en"]
    elif case == "latin1":  # "Fußgänger" written in Latin-1 on line 3
        files = bad_files(corpus, tmp_path, raw_bytes=b"".join(
            x.encode() + b"\n" for x in lines[:2]) + "Ein Fußgänger.\n".encode("latin-1"))
    else:
        files = bad_files(corpus, tmp_path, raw_bytes=b"\x1f\x8bnot gzip")
        (tmp_path / "bad.train.en").rename(tmp_path / "bad.train.en.gz")
        files["train"]["en"] = str(tmp_path / "bad.train.en.gz")
    with pytest.raises(NmtError) as e:
        download(settings("files", files), DownloadPaths(tmp_path / "raw"))
    message = str(e.value)
    assert "\n" not in message
    assert want.format(missing=tmp_path / "nope.en", corrupt=tmp_path / "bad.train.en.gz",
                       latin1=tmp_path / "bad.train.en") in message, message
    assert not (tmp_path / "raw").exists() and not list(tmp_path.glob(".raw.*"))
    # Sources, which download depends on, refuses it first with the same line and records
    # nothing: neither orchestrator gets to delete data/raw for this download.
    record = tmp_path / "sources.sha256"
    with pytest.raises(NmtError) as e:
        sources.refresh(settings("files", files), record)
    assert str(e.value) == message and not record.exists()


def test_bad_huggingface_datasets_are_one_line(corpus, tmp_path):
    hf = corpus["translation"]
    other = tmp_path / "hf_other"  # a dataset with neither a translation nor de/en columns
    (other / "data").mkdir(parents=True)
    for name in ("train", "validation", "test"):
        pd.DataFrame({"text": ["a"], "label": [1]}).to_parquet(
            other / "data" / f"{name}-00000.parquet")
    blank = tmp_path / "hf_blank"  # train's en column all empty strings
    (blank / "data").mkdir(parents=True)
    pd.DataFrame({"de": corpus["sentences"]["train"]["de"], "en": [""] * 1000}).to_parquet(
        blank / "data" / "train-00000.parquet")
    cases = [
        ({**hf, "splits": {**hf["splits"], "val": "nosuch"}},
         "params.yaml: data.huggingface.splits.val: 'nosuch': Unknown split"),
        ({**hf, "path": str(tmp_path / "no_such_folder")},
         "params.yaml: data.huggingface.path: cannot load"),
        ({**hf, "path": str(other)}, "params.yaml: data.huggingface.splits.train: "
         f"{other} has no de/en text (columns: label, text)"),
        ({**hf, "path": str(blank)}, "data.huggingface.splits.train: train has no en text: its "
         "1000 en lines are all empty"),
    ]
    for entry, want in cases:
        with pytest.raises(NmtError) as e:
            download(settings("huggingface", entry), DownloadPaths(tmp_path / "raw"))
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert not (tmp_path / "raw").exists()
    # A wrong split or path is refused by sources first (download depends on it), which reads
    # no rows: the columns are download's to check.
    record = tmp_path / "sources.sha256"
    for entry, want in [cases[0][0], "params.yaml: data.huggingface.splits.val: 'nosuch': "
                        f"{hf['path']} has no split 'nosuch' (its splits: test, train, "
                        "validation)"], [cases[1][0], cases[1][1]]:
        with pytest.raises(NmtError) as e:
            sources.refresh(settings("huggingface", entry), record)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)
        assert not record.exists()
    assert sources.refresh(settings("huggingface", cases[2][0]), record)


def test_the_schemas_corpus_kinds_are_the_tables():
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "params.schema.yaml").read_text())
    assert sorted(schema["$defs"]["data"]["properties"]["corpus"]["enum"]) == list(KINDS)


def test_every_kind_gives_what_the_pipeline_asks_of_a_kind():
    for name, kind in KINDS.items():
        for function in ("check", "preflight", "describe", "vet", "download", "title"):
            assert callable(getattr(kind, function, None)), (name, function)
        for key in kind.SETTINGS:  # a default in params.yaml: DVC reads every declared key
            assert key.split(".")[1] in PARAMS["data"], (name, key)


def test_sources_declares_every_kinds_settings_and_the_stages_that_run_a_kind_its_record():
    """sources records the settings and code of the kind in use; download and the report,
    which run it, declare no kind's settings and hold no kind's module: they depend on the
    record, so another kind's edit or a new kind re-runs neither."""
    stages = declaration.load(REPO / declaration.DECLARATION)
    settings = [key for kind in KINDS.values() for key in kind.SETTINGS]
    assert {"data.files", "data.huggingface", "data.base_url"} <= set(settings)
    declared = stages["sources"].corpus_params
    assert set(settings) <= set(declared) and declaration.KIND_SETTINGS not in declared
    assert stages["sources"].records_kind
    assert declaration.kind_readers(stages) == ["download", "report"]
    kinds = {f"pipeline/corpora/{k}.py" for k in KINDS}
    for name, stage in stages.items():
        assert not set(stage.code) & kinds, name
        assert not set(stage.corpus_params) & set(settings) or name == "sources", name


def test_the_record_changes_with_the_kind_in_use_its_settings_and_its_code(tmp_path):
    """params/sources.sha256 is what download and the report know of the kind: it changes
    when the kind's settings or any module it runs change, and not when another kind's does."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "src" / "nmt", src / "nmt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    data = PARAMS["data"]
    before = sources.describe(data, REPO, src)
    assert "nmt/pipeline/corpora/multi30k.py" in before and "corpora/files.py" not in before
    for other in ("pipeline/corpora/files.py", "pipeline/corpora/huggingface.py",
                  "models/baseline.py"):
        with open(src / "nmt" / other, "a") as f:
            f.write("\n# an edit\n")
    (src / "nmt" / "pipeline" / "corpora" / "tsv.py").write_text(
        (src / "nmt" / "pipeline" / "corpora" / "files.py").read_text())
    assert sources.describe(data, REPO, src) == before
    for own in ("pipeline/corpora/multi30k.py", "pipeline/corpora/raw.py", "core/records.py"):
        edited = src / "nmt" / own
        text = edited.read_text()
        edited.write_text(text + "\n# an edit\n")
        assert sources.describe(data, REPO, src) != before, own
        edited.write_text(text)
    assert sources.describe(data, REPO, src) == before
    assert sources.describe({**data, "base_url": "https://example.org/x"}, REPO, src) != before


def test_download_asks_a_train_split_for_what_verify_trains_on():
    assert MIN_TRAIN_PAIRS == 32 * TRAJECTORY_STEPS


def test_params_name_what_a_corpus_lacks(params_file, corpus):
    files = {s: v for s, v in corpus["files"].items() if s != "news_test"}
    cases = [
        (corpus_data("files", files), "params.yaml: data.files: the test set news_test has no "
         "de file (fix: add data.files.news_test.de: <path>, or remove news_test from "
         "data.testsets)"),
        (corpus_data("huggingface", {"path": "x", "splits": {"train": "train"}}),
         "params.yaml: data.huggingface.splits: the split val has no datasets split"),
        (corpus_data("huggingface", {}), "params.yaml: data: corpus huggingface needs "
         "data.huggingface"),
    ]
    text = params_file.read_text()
    for data, want in cases:
        params_file.write_text(text)
        edit_params(params_file, data=data, evaluate={"testsets": ["news_test"]})
        with pytest.raises(NmtError) as e:
            load_params(params_file)
        assert want in str(e.value), str(e.value)


def test_word_vocabularies_need_word_tokens(params_file):
    edit_params(params_file, tokenize={"words": False})
    with pytest.raises(NmtError, match=r"params.yaml: vocab: vocab.kind word needs spaCy's word "
                                       r"tokens, but tokenize: tokenize.words is false \(fix:"):
        load_params(params_file)


def test_one_pipeline_trains_on_one_corpus(params_file, corpus):
    params = yaml.safe_load(params_file.read_text())
    params["recipes"]["demo"]["data"] = corpus_data("files", copy.deepcopy(corpus["files"]))
    params["recipes"]["demo"]["evaluate"]["testsets"] = ["news_test"]
    params["pipeline"]["recipes"] = ["published", "demo"]
    params_file.write_text(yaml.safe_dump(params))
    with pytest.raises(NmtError, match="pipeline.recipes: published and demo read different "
                                       "data sections"):
        load_params(params_file)
    params["pipeline"]["recipes"], params["bench"]["recipe"] = ["demo"], "demo"
    params_file.write_text(yaml.safe_dump(params))
    loaded = load_params(params_file)  # alone, the demo recipe brings its corpus
    preflight.check_settings(loaded, params_file.parent)
    params["recipes"]["demo"]["data"]["files"]["val"]["en"] = "corpora/none.en"
    params_file.write_text(yaml.safe_dump(params))
    with pytest.raises(NmtError, match=r"recipes.demo.data.files.val.en: .*none.en does not "
                                       "exist"):
        preflight.check_settings(load_params(params_file), params_file.parent)


def test_sources_change_only_when_a_corpus_file_does(corpus, tmp_path):
    files = bad_files(corpus, tmp_path, lines=corpus["sentences"]["train"]["en"])
    record = tmp_path / "sources.sha256"
    assert sources.refresh(settings("files", files), record)
    before = record.read_text()
    assert not sources.refresh(settings("files", files), record) and record.read_text() == before
    (tmp_path / "bad.train.en").write_text("edited\n" * 1000)
    assert sources.refresh(settings("files", files), record)
    assert record.read_text() != before and str(tmp_path / "bad.train.en") in record.read_text()
    assert sources.refresh(settings("huggingface", corpus["translation"]), record)
    assert "data/train-00000.parquet" in record.read_text()


# ---- a side without text, past download (data/raw of an older download, or made by hand) ----

def tokenized(folder, lines: dict[str, list[str]], ext: str = "tok"):
    """A tokenized folder whose train split holds `lines` ({lang: lines}) as .tok or .txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang, side in lines.items():
        (folder / f"train.{lang}.{ext}").write_text("".join(x + "\n" for x in side))
    return folder


def word_vocab(tmp_path, lines: dict[str, list[str]]):
    """A word vocabulary of `lines`, in tmp_path/vocab."""
    vocab.build({"vocab": PARAMS["vocab"] | {"kind": "word"}, "data": DATA},
                vocab.Paths(tokenized(tmp_path / "for_vocab", lines), tmp_path / "vocab"))
    return tmp_path / "vocab"


VARIED = [" ".join(["ein", "Hund"] * (1 + i % 7)) for i in range(960)]  # lengths 2 to 14


@pytest.mark.parametrize("kind", ["word", "bpe"])
def test_vocab_says_the_train_split_has_no_text(tmp_path, kind):
    """bpe: both sides empty made SentencePiece fail, and the line said `lower vocab.bpe_size`;
    word: an empty side gave a vocabulary of the specials alone."""
    ext, de = ("tok", VARIED) if kind == "word" else ("txt", [""] * 960)
    folder = tokenized(tmp_path / "tok", {"de": de, "en": [""] * 960}, ext)
    side = "en" if kind == "word" else "de"
    with pytest.raises(NmtError) as e:
        vocab.build({"vocab": PARAMS["vocab"] | {"kind": kind, "bpe_size": 100}, "data": DATA},
                    vocab.Paths(folder, tmp_path / "vocab"))
    assert str(e.value) == (f"{folder / f'train.{side}.{ext}'} holds no text (its 960 lines are "
                            "empty): the train split has nothing on that side (fix: check the "
                            "corpus's train files, then re-run nmt download and nmt tokenize)")


def test_train_and_every_stage_that_loads_pairs_refuse_a_side_without_tokens(tmp_path):
    """`nmt train` alone trained on <bos> <eos> targets and exited 0."""
    codecs = load_codecs(word_vocab(tmp_path, {"de": VARIED, "en": VARIED}))
    folder = tokenized(tmp_path / "tok", {"de": VARIED, "en": [""] * 960})
    with pytest.raises(NmtError, match=r"train.en.tok holds no text \(its 960 lines are empty\)"):
        load_pairs(folder, "train", *codecs, 256)


def test_verify_names_a_train_split_without_padding_in_one_line(tmp_path):
    """Every target of one length: verify's padding checks raised a ValueError traceback."""
    lines = {"de": VARIED, "en": ["a dog"] * 960}
    paths = VerifyPaths(tokenized(tmp_path / "tok", lines), word_vocab(tmp_path, lines),
                        tmp_path / "verify.json")
    with pytest.raises(NmtError) as e:
        verify({"model": PARAMS["model"]}, paths, "scratch")
    assert str(e.value) == ("the train split gives verify no batch with padding on both sides: "
                            "in each of its 30 batches, the first 4 sentences of a side are all "
                            "one length (fix: a train split whose sentences vary in length; "
                            "check the corpus's train files, then re-run nmt download and nmt "
                            "tokenize)")
    assert not paths.out.exists()
