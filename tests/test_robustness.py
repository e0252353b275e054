"""Damaged, missing or foreign files get one clear line and a fix, never a traceback (issue 11).

Every case runs the real thing: real torch.load on really damaged files, real spaCy on real
Latin-1 bytes, a real `python -m nmt` process for bytes in argv.
"""

import io
import json
import os
import pickle
import random
import select
import shutil
import subprocess
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import nmt
from conftest import REPO
from nmt.cli import main
from nmt.core.checkpoint import FIELDS, check_vocab, load, load_trained, save, vocab_fingerprint
from nmt.core.codecs import load_codecs
from nmt.core.errors import NmtError
from nmt.core.records import RECORD
from nmt.core.runs import Run
from nmt.models import ModelConfig, build_model
from nmt.pipeline.params import load_params

TINY = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=16, nhead=2,
                   dim_feedforward=32, max_len=32)
PARAMS = REPO / "params.yaml"
FIX = "(fix: re-run nmt train for that run, or point --checkpoint at a best.pt)"
pytestmark = pytest.mark.usefixtures("one_thread")


def save_tiny(path, sizes=(40, 50), name="scratch", recipe="word", init=0, params=None,
              **extra):
    """A randomly initialised tiny model saved the way nmt train saves one; returns the model."""
    torch.manual_seed(init)
    model = build_model(name, TINY, *sizes)
    evaluate = load_params(PARAMS)["evaluate"] | {"beam_size": 1, "batch_size": 8}
    save(path, model, name=name, recipe=recipe, cfg=TINY, src_vocab_size=sizes[0],
         tgt_vocab_size=sizes[1], params=params or {"evaluate": evaluate}, **extra)
    return model


def vocab_sizes(vocab_dir):
    return tuple(len(c) for c in load_codecs(vocab_dir))


def one_error_line(err: str) -> str:
    """The CLI's whole stderr must be one line that names the fix."""
    lines = err.strip().split("\n")
    assert len(lines) == 1, err
    assert "(fix: " in lines[0] and lines[0].endswith(")") and "Traceback" not in err
    return lines[0]


def translate_argv(checkpoint, vocab_root, *more):
    return ["--params", str(PARAMS), "translate", "--checkpoint", str(checkpoint), "--vocab",
            str(vocab_root), "--device", "cpu", *more]


# --- damaged and foreign checkpoints ---------------------------------------------------------

def zip_of_text() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("notes/readme.txt", "not weights")
    return out.getvalue()


def torch_bytes(obj) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


DAMAGED = {
    # Each a different way torch.load, the field checks or the weights fail.
    "random bytes": lambda good: random.Random(0).randbytes(5000),
    "a JSON file": lambda good: json.dumps({"model": "scratch", "epoch": 3}).encode(),
    "an empty file": lambda good: b"",
    "a truncated checkpoint": lambda good: good[: len(good) // 2],
    "a zip of something else": lambda good: zip_of_text(),
    "a pickle of Python objects": lambda good: torch_bytes({"model": io.BytesIO}),
    "a bare state_dict": lambda good: torch_bytes(
        torch.load(io.BytesIO(good), weights_only=True)["state_dict"]),
    "a tensor": lambda good: torch_bytes(torch.zeros(3)),
}
WHY = {"random bytes": "not a PyTorch zip archive", "a JSON file": "not a PyTorch zip archive",
       "an empty file": "not a PyTorch zip archive",
       "a truncated checkpoint": "a truncated or damaged zip archive",
       "a pickle of Python objects": "it holds Python objects",
       "a bare state_dict": "no model, recipe", "a tensor": "it holds a Tensor, not a dict"}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_or_foreign_best_pt_is_one_line_never_a_traceback(tmp_path, capsys, case):
    run_dir = tmp_path / "results" / "published-scratch-s0"
    save_tiny(run_dir / "best.pt", recipe="published")
    (run_dir / "best.pt").write_bytes(DAMAGED[case]((run_dir / "best.pt").read_bytes()))

    with pytest.raises(NmtError) as err:
        load(run_dir / "best.pt")
    assert str(err.value).startswith(f"{run_dir / 'best.pt'} is not a checkpoint written by nmt "
                                     "train (")
    assert str(err.value).endswith(FIX) and WHY.get(case, "") in str(err.value)
    # torch's own message advises weights_only=False, which would run arbitrary code.
    assert "weights_only" not in str(err.value)

    # Through the CLI: exit 2, one line, and evaluate writes nothing beside the bad file.
    argv = ["--params", str(PARAMS), "evaluate", "--model", "scratch", "--results",
            str(tmp_path / "results")]
    assert main(argv) == 2
    assert one_error_line(capsys.readouterr().err).startswith("nmt evaluate: error: ")
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.pt"]


@pytest.mark.parametrize("seed", range(8))
def test_any_random_bytes_are_refused_cleanly(tmp_path, seed):
    """Random bytes reach different corners of the unpickler; each must end in NmtError."""
    data = random.Random(seed).randbytes(64 + 997 * seed)
    if seed % 2:  # behind a zip signature, so torch's zip reader gets further
        data = b"PK\x03\x04" + data
    (tmp_path / "best.pt").write_bytes(data)
    with pytest.raises(NmtError, match=r"is not a checkpoint written by nmt train"):
        load(tmp_path / "best.pt")


def test_weights_that_do_not_fit_the_model_config_are_named(tmp_path):
    save_tiny(tmp_path / "best.pt")
    ckpt = torch.load(tmp_path / "best.pt", weights_only=True)

    wider = ckpt | {"model_config": ckpt["model_config"] | {"dim_feedforward": 64}}
    (tmp_path / "wider.pt").write_bytes(torch_bytes(wider))
    with pytest.raises(NmtError, match=r"weight \S+ is \(32, 16\), the model_config needs "
                                       r"\(64, 16\)"):
        load(tmp_path / "wider.pt")

    # The other kind of model: same config, different parameter names.
    (tmp_path / "other.pt").write_bytes(torch_bytes(ckpt | {"model": "baseline"}))
    with pytest.raises(NmtError, match=r"weights missing and \d+ unexpected for a baseline"):
        load(tmp_path / "other.pt")

    bad_cfg = ckpt | {"model_config": ckpt["model_config"] | {"nhead": 3}}
    (tmp_path / "cfg.pt").write_bytes(torch_bytes(bad_cfg))
    with pytest.raises(NmtError, match=r"model_config does not build: d_model 16 is not "
                                       r"divisible by nhead 3\) \(fix: re-run"):
        load(tmp_path / "cfg.pt")

    (tmp_path / "name.pt").write_bytes(torch_bytes(ckpt | {"model": "lstm"}))
    with pytest.raises(NmtError, match="unknown model 'lstm'"):
        load(tmp_path / "name.pt")
    assert load(tmp_path / "best.pt")[1]["model"] == "scratch"  # the untouched one loads


def test_each_reason_a_checkpoint_is_unreadable_is_named_exactly(tmp_path):
    """The words in the parentheses, whole: torch's first sentence, cut to 120 characters,
    never its traceback or advice; a bare exception by its type."""
    from nmt.core.checkpoint import _why_unreadable
    save_tiny(tmp_path / "best.pt")
    good, zip_head = tmp_path / "best.pt", b"PK\x03\x04"
    long = "x" * 130
    cases = [(b"\x80\x02", ValueError("any"), "not a PyTorch zip archive"),
             (zip_head, pickle.UnpicklingError("Weights only load failed. Use weights_only=False"),
              "it holds Python objects, not only tensors and plain data"),
             (zip_head, RuntimeError("  first sentence. second one\nline two. more  "),
              "RuntimeError: first sentence"),
             (zip_head, RuntimeError("first line\nsecond. line"), "RuntimeError: first line"),
             (zip_head, RuntimeError(long + ". tail"), "RuntimeError: " + "x" * 120),
             (zip_head, KeyError(), "KeyError")]
    for head, error, why in cases:
        assert _why_unreadable(good, head, error) == why
    half = tmp_path / "half.pt"
    half.write_bytes(good.read_bytes()[:300])
    assert _why_unreadable(half, zip_head, RuntimeError("x")) == ("a truncated or damaged zip "
                                                                 "archive")
    whole = WHY | {
        "a zip of something else":
            'RuntimeError: Expected hasRecord("version") to be true, but got false',
        "a pickle of Python objects": "it holds Python objects, not only tensors and plain data",
        "a bare state_dict": "no " + ", ".join(FIELDS)}
    for case, why in whole.items():
        (tmp_path / "bad.pt").write_bytes(DAMAGED[case](good.read_bytes()))
        with pytest.raises(NmtError) as err:
            load(tmp_path / "bad.pt")
        assert str(err.value) == (f"{tmp_path / 'bad.pt'} is not a checkpoint written by nmt "
                                  f"train ({why}) {FIX}")


def test_a_pickle_is_refused_even_where_the_environment_allows_pickles(tmp_path, monkeypatch):
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 turns torch.load's default to full unpickling
    (arbitrary code); read asks for weights_only itself, so the variable changes nothing."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    (tmp_path / "best.pt").write_bytes(torch_bytes({"model": io.BytesIO}))
    with pytest.raises(NmtError, match=r"\(it holds Python objects, not only tensors"):
        load(tmp_path / "best.pt")


def as_if_saved_on_a_gpu(good: bytes) -> bytes:
    """The same archive with each tensor's recorded device cpu -> cuda:0, as a checkpoint
    trained on a GPU records it (torch.save's pickle spells the location as a BINUNICODE)."""
    src, out = zipfile.ZipFile(io.BytesIO(good)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            dst.writestr(info.filename, data)
    return out.getvalue()


def test_a_checkpoint_trained_on_a_gpu_loads_on_a_machine_without_one(tmp_path):
    model = save_tiny(tmp_path / "best.pt")
    (tmp_path / "gpu.pt").write_bytes(as_if_saved_on_a_gpu((tmp_path / "best.pt").read_bytes()))
    if not torch.cuda.is_available():  # what read's map_location spares a CPU-only machine
        with pytest.raises(RuntimeError, match="on a CUDA device"):
            torch.load(tmp_path / "gpu.pt", weights_only=True)
    loaded, _ = load(tmp_path / "gpu.pt")
    for name, weight in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], weight), name


def test_a_field_of_the_wrong_type_is_named(tmp_path):
    save_tiny(tmp_path / "best.pt")
    ckpt = torch.load(tmp_path / "best.pt", weights_only=True)
    (tmp_path / "bad.pt").write_bytes(torch_bytes(ckpt | {"recipe": 3, "src_vocab_size": "40"}))
    with pytest.raises(NmtError) as err:
        load(tmp_path / "bad.pt")
    assert str(err.value) == (f"{tmp_path / 'bad.pt'} is not a checkpoint written by nmt train "
                              f"(recipe, src_vocab_size of the wrong type) {FIX}")


def test_weights_that_are_missing_extra_or_not_tensors_are_named_exactly(tmp_path):
    """build's messages whole: the counts, the first two names, the shape or type found."""
    save_tiny(tmp_path / "best.pt")
    ckpt = torch.load(tmp_path / "best.pt", weights_only=True)
    weights = ckpt["state_dict"]
    names = sorted(weights)

    def refusal(state_dict) -> str:
        (tmp_path / "bad.pt").write_bytes(torch_bytes(ckpt | {"state_dict": state_dict}))
        with pytest.raises(NmtError) as err:
            load(tmp_path / "bad.pt")
        head = f"{tmp_path / 'bad.pt'} is not a checkpoint written by nmt train ("
        assert str(err.value).startswith(head) and str(err.value).endswith(f") {FIX}")
        return str(err.value)[len(head):-len(FIX) - 2]

    three_gone = {k: v for k, v in weights.items() if k not in names[:3]}
    assert refusal(three_gone) == (f"3 weights missing and 0 unexpected for a scratch model, "
                                   f"e.g. {names[0]}, {names[1]}")
    extra = weights | {"zz.extra": torch.zeros(1)}
    assert refusal(extra) == "0 weights missing and 1 unexpected for a scratch model, e.g. zz.extra"
    listed = weights | {names[0]: [1.0, 2.0]}
    assert refusal(listed).startswith(f"weight {names[0]} is a list, the model_config needs (")
    sparse = weights | {names[0]: torch.zeros_like(weights[names[0]]).to_sparse()}
    assert refusal(sparse) == ("its weights do not load: Error(s) in loading state_dict for "
                               f"{type(build_model('scratch', TINY, 40, 50)).__name__}:")


def test_load_puts_the_model_on_the_device_asked_for(tmp_path):
    save_tiny(tmp_path / "best.pt")
    model, _ = load(tmp_path / "best.pt", "meta")
    assert {p.device.type for p in model.parameters()} == {"meta"} and not model.training


def test_a_checkpoint_trained_with_other_settings_is_refused_in_process(tmp_path):
    """check_trained_with as evaluate calls it: every differing key named, in both sections;
    a train key only one side has counts (a setting added or dropped since)."""
    params = load_params(PARAMS)
    train = {"epochs": 3, "lr": 1e-3, "device": "cuda", "precision": "bf16"}
    save_tiny(tmp_path / "best.pt", recipe="word", seed=0,
              params={"evaluate": params["evaluate"], "train": train})
    run = Run("word", "scratch", 0)
    same = {"model": asdict(TINY), "train": train | {"attention_kernels": "route",
                                                      "device": "cpu", "precision": "fp32"}}
    assert load(tmp_path / "best.pt", expect=run, settings=same)[1]["recipe"] == "word"
    other = {"model": asdict(TINY) | {"d_model": 32}, "train": same["train"] | {"lr": 2e-3,
                                                                              "warmup": 10}}
    for opened in (lambda: load(tmp_path / "best.pt", expect=run, settings=other),
                   lambda: load_trained(tmp_path / "best.pt", tmp_path, expect=run,
                                        settings=other)):
        with pytest.raises(NmtError) as err:
            opened()
        assert str(err.value) == (
            f"{tmp_path / 'best.pt'} was trained with other settings than recipe word has now: "
            "model.d_model (trained 16, now 32), train.lr (trained 0.001, now 0.002), "
            "train.warmup (trained None, now 10) (fix: re-run `nmt train --recipe word --model "
            "scratch --seed 0`, or restore those settings in params.yaml)")


# --- a checkpoint of the wrong run -----------------------------------------------------------

def test_a_checkpoint_of_another_run_is_refused(tmp_path, capsys):
    path = tmp_path / "best.pt"
    save_tiny(path, name="baseline", recipe="published", seed=1)  # as train records it
    assert load(path, expect=Run("published", "baseline", 1))[1]["model"] == "baseline"

    cases = {Run("published", "scratch", 1): "holds a baseline model of recipe published, "
                                             "seed 1, expected a scratch model of recipe "
                                             "published, seed 1",
             Run("tuned", "baseline", 1): "expected a baseline model of recipe tuned, seed 1",
             Run("published", "baseline", 0): "seed 1, expected a baseline model of recipe "
                                              "published, seed 0"}
    for run, expected in cases.items():
        with pytest.raises(NmtError) as err:
            load(path, expect=run)
        assert str(err.value).startswith(f"{path} holds "), str(err.value)
        assert expected in str(err.value), str(err.value)
        assert (f"(fix: re-run `nmt train --recipe {run.recipe} --model {run.model} --seed "
                f"{run.seed}`") in str(err.value)

    # A checkpoint that records no seed (written before train saved it): model and recipe only.
    save_tiny(tmp_path / "old.pt", name="baseline", recipe="published")
    assert load(tmp_path / "old.pt", expect=Run("published", "baseline", 5))[1]["recipe"]
    with pytest.raises(NmtError, match="holds a baseline model of recipe published, expected a "
                                       r"scratch model of recipe published \(fix"):
        load(tmp_path / "old.pt", expect=Run("published", "scratch", 5))

    # nmt translate --run checks the folder's name against what the file holds.
    run_dir = tmp_path / "results" / "published-scratch-s0"
    run_dir.mkdir(parents=True)
    shutil.copy(tmp_path / "old.pt", run_dir / "best.pt")
    assert main(["--params", str(PARAMS), "translate", "--results", str(tmp_path / "results"),
                 "--device", "cpu", "Hallo"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "holds a baseline model" in one_error_line(err)


# --- byte-stable checkpoints -----------------------------------------------------------------

def test_the_same_weights_give_the_same_bytes(tmp_path):
    model = save_tiny(tmp_path / "a" / "best.pt", epoch=3)
    save_tiny(tmp_path / "b" / "last.pt", epoch=3)  # same seed: the same weights
    a, b = (tmp_path / "a" / "best.pt").read_bytes(), (tmp_path / "b" / "last.pt").read_bytes()
    assert a == b
    assert sorted(os.listdir(tmp_path / "a")) == ["best.pt"]  # no temporary file left behind

    reloaded, ckpt = load(tmp_path / "a" / "best.pt")
    for (k, v), (k2, v2) in zip(model.state_dict().items(), reloaded.state_dict().items(),
                                strict=True):
        assert k == k2 and torch.equal(v, v2)
    assert ckpt["epoch"] == 3

    # Planted: one changed weight must change the bytes, so the equality above means something.
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    save(tmp_path / "c.pt", model, name="scratch", recipe="word", cfg=TINY, src_vocab_size=40,
         tgt_vocab_size=50, params=ckpt["params"], epoch=3)
    assert (tmp_path / "c.pt").read_bytes() != a


# --- a vocabulary that is not the checkpoint's -----------------------------------------------

def test_a_same_size_but_different_vocabulary_is_refused(prepared, tmp_path, capsys):
    vocab = tmp_path / "vocab" / "word"
    # Without its SHA256SUMS, which refuses an edited file first (tests/test_records.py): the
    # fingerprint must tell the checkpoint's vocabulary from another on its own.
    shutil.copytree(prepared["word"], vocab, ignore=shutil.ignore_patterns(RECORD))
    assert vocab_fingerprint(vocab) == vocab_fingerprint(prepared["word"])  # bytes, not paths
    assert vocab_fingerprint(vocab) != vocab_fingerprint(prepared["bpe"])
    sizes = vocab_sizes(vocab)
    fingerprint = vocab_fingerprint(vocab)
    save_tiny(tmp_path / "new.pt", sizes, vocab_sha256=fingerprint)
    save_tiny(tmp_path / "old.pt", sizes)  # from before checkpoints recorded the fingerprint
    argv = translate_argv(tmp_path / "new.pt", vocab.parent, "Ein Hund.")
    assert main(argv) == 0 and capsys.readouterr().out.count("\n") == 1

    # Two tokens swap places: the same sizes, a different vocabulary.
    itos = json.loads((vocab / "src.json").read_text())
    itos[10], itos[11] = itos[11], itos[10]
    (vocab / "src.json").write_text(json.dumps(itos))
    assert vocab_sizes(vocab) == sizes and vocab_fingerprint(vocab) != fingerprint
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = one_error_line(err)
    assert out == "" and "has the checkpoint's sizes but not its tokens" in line
    # Older checkpoints are checked by size only, as before.
    assert main(translate_argv(tmp_path / "old.pt", vocab.parent, "Ein Hund.")) == 0
    capsys.readouterr()

    # meta.json is part of the fingerprint; a missing vocabulary file is named.
    shutil.copy(prepared["word"] / "src.json", vocab / "src.json")
    assert vocab_fingerprint(vocab) == fingerprint
    meta = json.loads((vocab / "meta.json").read_text())
    (vocab / "meta.json").write_text(json.dumps(meta | {"min_freq": 3}))
    assert vocab_fingerprint(vocab) != fingerprint
    (vocab / "tgt.json").unlink()
    with pytest.raises(NmtError, match=r"tgt.json is missing \(fix: run `nmt vocab`"):
        vocab_fingerprint(vocab)
    codecs = load_codecs(prepared["word"])
    with pytest.raises(NmtError, match="tgt.json is missing"):
        check_vocab({"src_vocab_size": sizes[0], "tgt_vocab_size": sizes[1],
                     "vocab_sha256": fingerprint}, *codecs, vocab)


def test_a_trained_run_opens_with_the_vocabulary_it_was_trained_with(prepared, tmp_path):
    """load_trained, what evaluate, export, translate and the decoding bench open a run with:
    the model in eval mode, its codecs and config; the vocabulary named, or found from the
    checkpoint's recipe; another vocabulary refused with one line."""
    sizes = vocab_sizes(prepared["word"])
    save_tiny(tmp_path / "best.pt", sizes, recipe="word")
    trained = load_trained(tmp_path / "best.pt", prepared["word"])
    assert not trained.model.training and tuple(len(c) for c in trained.codecs) == sizes
    assert trained.config == TINY and trained.max_len == TINY.max_len
    asked = []
    found = load_trained(tmp_path / "best.pt", lambda recipe: asked.append(recipe) or
                         prepared["word"])
    assert asked == ["word"] and found.checkpoint["recipe"] == "word"
    on_meta = load_trained(tmp_path / "best.pt", prepared["word"], "meta")
    assert {p.device.type for p in on_meta.model.parameters()} == {"meta"}
    with pytest.raises(NmtError, match="source/target tokens"):  # BPE's 1,000 against words
        load_trained(tmp_path / "best.pt", prepared["bpe"])


# --- nmt translate: hostile input ------------------------------------------------------------

LATIN1 = "Ein Mädchen singt.".encode("latin-1")  # b"Ein M\xe4dchen singt."


@pytest.fixture
def word_checkpoint(prepared, tmp_path):
    """A tiny model over the word vocabulary (the spaCy path), as results would hold it."""
    save_tiny(tmp_path / "best.pt", vocab_sizes(prepared["word"]))
    return tmp_path / "best.pt"


def test_latin1_file_and_stdin_are_decoded_with_one_warning(prepared, word_checkpoint, tmp_path,
                                                             capsys, caplog, monkeypatch):
    lines = [b"Ein Hund l\xc3\xa4uft.", LATIN1, b"", b"Zwei M\xe4nner und ein \xfc.", b"Gut."]
    (tmp_path / "in.txt").write_bytes(b"\r\n".join(lines) + b"\r\n")
    argv = translate_argv(word_checkpoint, prepared["word"].parent)
    assert main(argv + ["--file", str(tmp_path / "in.txt")]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == len(lines) and out.split("\n")[2] == ""  # a line for a line
    assert err == ""  # no progress bar: spaCy's tokenizer runs without tqdm here
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"{tmp_path / 'in.txt'}: lines 2, 4 are not UTF-8; undecodable bytes "
                        "replaced with U+FFFD"]

    caplog.clear()
    stdin = io.TextIOWrapper(io.BytesIO(b"\n".join(lines[:3]) + b"\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(argv) == 0
    assert capsys.readouterr().out.count("\n") == 3
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "standard input: line 2 is not UTF-8; undecodable bytes replaced with U+FFFD"]


def test_translate_prints_each_line_before_the_input_ends(prepared, word_checkpoint):
    """From a pipe, a line's translation comes out while standard input is still open (it
    printed nothing until all input was translated), one output line a line, in order."""
    proc = subprocess.Popen([sys.executable, "-m", "nmt", *translate_argv(
        word_checkpoint, prepared["word"].parent)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        for line in (b"Ein Hund l\xc3\xa4uft.\n", b"\n", b"Zwei M\xc3\xa4nner.\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, "no output line while the input is open"
            answer = proc.stdout.readline()
            assert answer.endswith(b"\n") and (answer == b"\n") == (line == b"\n")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0 and proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()


def test_a_carriage_return_inside_a_line_keeps_one_output_line_for_each_input_line(
        prepared, word_checkpoint, tmp_path, capsys):
    """Lines end at LF (CRLF too); a lone CR inside one is a space, not two more lines."""
    data = b"Ein Hund\rl\xc3\xa4uft.\r\nZwei M\xc3\xa4nner.\r\r\n\rGut.\n\n"
    (tmp_path / "in.txt").write_bytes(data)
    argv = translate_argv(word_checkpoint, prepared["word"].parent, "--file",
                          str(tmp_path / "in.txt"))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == data.count(b"\n") == 4 and out.split("\n")[3] == ""


@pytest.mark.parametrize("data,why", [
    (b"\x00\x01binary\x00" * 20, "binary"),
    ("Ein Hund.\n".encode("utf-16"), "UTF-16"),
])
def test_binary_or_utf16_input_is_refused(prepared, word_checkpoint, tmp_path, capsys, data, why):
    (tmp_path / "in.txt").write_bytes(data)
    argv = translate_argv(word_checkpoint, prepared["word"].parent, "--file",
                          str(tmp_path / "in.txt"))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "is binary or UTF-16, not UTF-8 text" in one_error_line(err)


def test_latin1_bytes_in_argv_in_a_real_process(prepared, word_checkpoint):
    """argv bytes that are not UTF-8 reach Python as surrogate escapes; spaCy refuses those."""
    cmd = [sys.executable, "-m", "nmt", "-q", *translate_argv(
        word_checkpoint, prepared["word"].parent, b"Ein Hund.", LATIN1)]
    env = {**os.environ, "PYTHONPATH": str(Path(nmt.__file__).parents[1])}  # the code under test
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.count(b"\n") == 2
    # -q keeps warnings only: the one decode warning and nothing else, no progress bar.
    assert proc.stderr.decode().split("\n") == [
        "nmt.translate: arguments: line 2 is not UTF-8; undecodable bytes replaced with U+FFFD",
        ""]


def test_a_line_of_megabytes_is_cut_to_the_model_before_spacy_reads_it(
        prepared, word_checkpoint, tmp_path, capsys, caplog):
    """spaCy refuses a text over 1,000,000 characters (E088). Only the words the model can read
    are tokenized: the translation is that of the line's first words, with one warning."""
    sentence = "Ein Hund läuft über die Wiese ."  # 7 words, 7 tokens
    huge = " ".join([sentence] * 160_000)  # 5.1 million characters
    (tmp_path / "in.txt").write_text(f"{huge}\nGut.\n", "utf-8")
    argv = translate_argv(word_checkpoint, prepared["word"].parent, "--beam", "1")
    assert main(argv + ["--file", str(tmp_path / "in.txt")]) == 0
    out = capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"line 1: over 30 tokens ({len(huge)} characters), cut to the model's "
                        "limit of 30"]
    assert main(argv + [" ".join([sentence] * 5), "Gut."]) == 0  # 35 tokens, cut to 30
    assert out == capsys.readouterr().out and out.count("\n") == 2


# --- params.yaml: the YAML 1.1 exponent gotcha -----------------------------------------------

@pytest.mark.parametrize("written,expected", [
    ("lr: 1e-4", "train.lr: '1e-4' is a string to YAML (fix: write 1.0e-4: YAML reads "
                 "exponent form as a number only with a dot and a signed exponent, like 1.0e-4)"),
    ("lr: 5E-4", "train.lr: '5E-4' is a string to YAML (fix: write 5.0e-4:"),
    ("lr: 1.0e4", "train.lr: '1.0e4' is a string to YAML (fix: write 1.0e+4:"),
    ("lr: '0.5'", "train.lr: '0.5' is a string (fix: write 0.5 without quotes)"),
    ("warmup_steps: 4e3", "train.warmup_steps: '4e3' is a string to YAML (fix: write 4000: "
                          "this key takes a whole number)"),
])
def test_a_yaml_exponent_string_names_the_fix(params_file, capsys, written, expected):
    text = params_file.read_text()
    key = written.split(":")[0]
    original = next(line for line in text.split("\n") if line.startswith(f"  {key}: "))
    params_file.write_text(text.replace(original, f"  {written}", 1))
    with pytest.raises(NmtError) as err:
        load_params(params_file)
    assert str(err.value).startswith(f"params.yaml: {expected}")
    fixed = expected.split("(fix: write ")[1].split(":")[0].split(" ")[0]
    params_file.write_text(text.replace(original, f"  {key}: {fixed}", 1))
    assert load_params(params_file)["train"][key] == float(written.split(": ")[1].strip("'"))

    params_file.write_text(text.replace(original, f"  {written}", 1))
    assert main(["--params", str(params_file), "download", "--out",
                 str(params_file.parent / "raw")]) == 2
    assert expected in one_error_line(capsys.readouterr().err)
    assert not (params_file.parent / "raw").exists()
