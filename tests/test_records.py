"""Content records (nmt.core.records): a stage's output that changed after the stage wrote it
is refused where the next stage reads it, in one line naming the file and the fix, never
used. Issue 49's case: a DVC cache object of data/tokenized/train.en.tok with one byte
changed, restored by `dvc checkout`, was built into the vocabulary (1,920 -> 1,921 words).
The whole DVC round trip runs in tests/test_orchestrators.py, on the tiny pipeline."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from nmt.core.checkpoint import read
from nmt.core.codecs import load_codecs
from nmt.core.data import load_pairs
from nmt.core.errors import NmtError
from nmt.core.records import RECORD, check_folder, read_sums, recorded_stage, verified
from nmt.pipeline.params import load_params
from nmt.stages import vocab
from nmt.training import resume
from test_robustness import PARAMS, save_tiny

PUBLISHED = load_params(PARAMS)


def damage(path: Path, old: bytes = b"Two", new: bytes = b"TwX") -> None:
    """One word changed in place, as in the issue (the file keeps its size)."""
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    return dest


def test_every_stage_folder_records_each_file_it_wrote(prepared):
    """download, tokenize and vocab record every file they wrote, headed by their DVC stage;
    `sha256sum -c` (GNU coreutils, skipping the # line) agrees with every line."""
    for key, stage in (("raw", "download"), ("tokenized", "tokenize"), ("word", "vocab"),
                       ("bpe", "vocab")):
        folder = prepared[key]
        listed = read_sums(folder / RECORD)
        assert sorted(listed) == sorted(p.name for p in folder.iterdir() if p.name != RECORD)
        assert recorded_stage(folder / RECORD) == stage
        check = subprocess.run(["sha256sum", "-c", "--strict", RECORD], cwd=folder,
                               capture_output=True, text=True)
        assert check.returncode == 0 and check.stdout.count(": OK") == len(listed), check


def test_a_changed_byte_in_tokenized_data_is_refused_where_vocab_reads_it(prepared, tmp_path):
    tokenized = copy(prepared["tokenized"], tmp_path / "tokenized")
    damage(tokenized / "train.en.tok")
    with pytest.raises(NmtError) as err:
        vocab.build(PUBLISHED, vocab.Paths(tokenized, tmp_path / "vocab"), stage="vocab@published")
    record = tokenized / RECORD
    assert str(err.value) == (
        f"{tokenized / 'train.en.tok'}: its sha256 differs from the one recorded in {record}: "
        "the file is damaged or not the stage's (fix: `dvc repro -f -s tokenize`, which "
        f"replaces DVC's damaged copy too, or `rm -r {tokenized}` and run snakemake again)")
    assert not (tmp_path / "vocab").exists()  # nothing built from it
    # train, verify, evaluate, export and bench read pairs through load_pairs: refused too
    with pytest.raises(NmtError, match="train.en.tok: its sha256 differs"):
        load_pairs(tokenized, "train", *load_codecs(prepared["word"]), 64)


def test_a_vocabulary_file_that_changed_is_refused_by_every_reader(prepared, tmp_path):
    word = copy(prepared["word"], tmp_path / "word")
    tokens = json.loads((word / "tgt.json").read_text())
    tokens[5], tokens[6] = tokens[6], tokens[5]  # still a valid vocabulary of the same size
    (word / "tgt.json").write_text(json.dumps(tokens))
    with pytest.raises(NmtError, match=r"tgt.json: its sha256 differs .* `dvc repro -f -s "
                                       r"vocab`"):
        load_codecs(word)
    bpe = copy(prepared["bpe"], tmp_path / "bpe")
    model = bytearray((bpe / "spm.model").read_bytes())
    model[len(model) // 2] ^= 1
    (bpe / "spm.model").write_bytes(bytes(model))
    with pytest.raises(NmtError, match="spm.model: its sha256 differs"):
        load_codecs(bpe)


def test_a_missing_or_unlisted_file_is_named(prepared, tmp_path):
    word = copy(prepared["word"], tmp_path / "word")
    (word / "src.json").unlink()
    with pytest.raises(NmtError, match=r"src.json: it is missing, but listed in .*SHA256SUMS"):
        check_folder(word)
    (word / "extra.json").write_text("[]")
    with pytest.raises(NmtError, match=r"extra.json: it is not listed in .*SHA256SUMS"):
        verified(word / "extra.json")


def test_a_folder_without_a_record_is_read_as_it_is(prepared, tmp_path):
    """Folders made by hand (the tests cut the prepared data so) carry no record."""
    word = copy(prepared["word"], tmp_path / "word")
    (word / RECORD).unlink()
    tokens = json.loads((word / "tgt.json").read_text())
    (word / "tgt.json").write_text(json.dumps(tokens[:-1]))
    assert len(load_codecs(word)[1]) == len(tokens) - 1
    check_folder(word)


def flip_a_weight(path: Path, dest: Path) -> Path:
    """A copy of the checkpoint with one bit of a stored tensor flipped, the archive intact:
    torch.load reads it as a slightly different model."""
    with zipfile.ZipFile(path) as archive:
        member = next(i for i in archive.infolist() if "/data/" in i.filename
                      and i.file_size >= 64)
        start = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra)
    data = bytearray(path.read_bytes())
    data[start + member.file_size // 2] ^= 0x10
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(bytes(data))
    return dest


def test_a_flipped_weight_fails_the_checkpoints_crc(tmp_path):
    save_tiny(tmp_path / "best.pt")
    bad = flip_a_weight(tmp_path / "best.pt", tmp_path / "damaged.pt")
    torch.load(bad, weights_only=True)  # torch reads it without a word
    with pytest.raises(NmtError, match=r"damaged.pt is damaged: its member .*/data/\d+ fails "
                                       r"the CRC-32 check the archive recorded \(fix: re-run"):
        read(bad)
    read(tmp_path / "best.pt")  # the intact file still loads
    # In a run's folder, the fix names the DVC stage that trains that run again.
    in_run = flip_a_weight(tmp_path / "best.pt", tmp_path / "tuned-scratch-s2" / "best.pt")
    with pytest.raises(NmtError, match=r"\(fix: `dvc repro -f -s train@tuned-scratch-2`, or "
                                       r"delete it and run snakemake again\)$"):
        read(in_run)
    state, why = resume.read(bad)
    assert state is None and "fails the CRC-32 check" in why


def test_nmt_check_names_every_damaged_missing_or_unlisted_file_and_exits_1(prepared, tmp_path,
                                                                              capsys):
    """Issue 58 item 2: `nmt check` reads every record under data/, results/ and exports/ and
    prints one line for each file that differs, is gone or is not listed; exit status 1."""
    from nmt.cli import main

    data = tmp_path / "data"
    copy(prepared["tokenized"], data / "tokenized")
    copy(prepared["word"], data / "vocab" / "word")
    (data / "tokenized" / ".snakemake_timestamp").touch()  # Snakemake's, in a folder output
    assert main(["check", "--root", str(tmp_path)]) == 0
    damage(data / "tokenized" / "train.en.tok")
    (data / "vocab" / "word" / "src.json").unlink()
    (data / "vocab" / "word" / "extra.json").write_text("[]")
    assert main(["check", "--root", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        str(data / "tokenized" / "train.en.tok"), str(data / "vocab" / "word" / "extra.json"),
        str(data / "vocab" / "word" / "src.json")]
    assert "its sha256 differs" in lines[0] and "not listed" in lines[1]
    assert "missing, but listed" in lines[2]


@pytest.mark.parametrize("garbled, why", [
    (b"9204244e408ccb38  train.en.tok\n", "line 5 is not `<sha256>  <file name>`"),  # short
    (b"%s train.en.tok\n" % (b"a" * 64), "line 5 is not"),  # one space: no separator
    (b"\xff\xfe not text\n", "is not UTF-8"),
])
def test_a_garbled_record_line_is_one_line_for_the_record(prepared, tmp_path, capsys, garbled,
                                                          why):
    """Issue 69 item 3: a SHA256SUMS line that is no `<sha256>  <name>`, or bytes that are no
    UTF-8, is one line naming the record, its line and the fix, for `nmt check` and for a
    reader alike: no traceback, and no phantom missing file beside the real one unlisted."""
    from nmt.cli import main

    folder = copy(prepared["tokenized"], tmp_path / "data" / "tokenized")
    record = folder / RECORD
    lines = record.read_bytes().splitlines(keepends=True)
    record.write_bytes(b"".join(lines[:4] + [garbled] + lines[4:]))
    assert main(["check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{record}: ") and why in out[0], out
    assert "dvc repro -f -s tokenize" in out[0]
    with pytest.raises(NmtError, match="the record is damaged"):
        verified(folder / "train.en.tok")


def test_a_damaged_cache_object_outside_the_checkout_is_named_never_removed(tmp_path, caplog):
    """A DVC cache set outside the checkout (`dvc cache dir`): a stage's re-run names its damaged
    object and the fix, and deletes nothing there."""
    from nmt.core.dvc_cache import damaged_objects, evict_damaged, object_path

    checkout, cache = tmp_path / "checkout", tmp_path / "shared-cache"
    (checkout / ".dvc").mkdir(parents=True)
    (checkout / ".dvc" / "config").write_text("[core]\n    autostage = true\n[cache]\n"
                                              "    dir = ../../shared-cache\n")
    md5 = "0123456789abcdef0123456789abcdef"
    (checkout / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  tokenize:\n    cmd: nmt tokenize\n    outs:\n"
        f"    - path: data/a.txt\n      hash: md5\n      md5: {md5}\n      size: 3\n")
    damaged = object_path(cache, md5)
    damaged.parent.mkdir(parents=True)
    damaged.write_text("not what its name says")
    assert [c.object for c in damaged_objects(checkout)] == [damaged]
    evict_damaged("tokenize", checkout)
    assert damaged.read_text() == "not what its name says"
    assert "outside the checkout, so it stays (fix: remove it by hand" in caplog.text
