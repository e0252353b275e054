"""nmt evaluate and nmt translate end to end, on tiny random models and real Multi30k slices."""

import io
import json
import logging
import math
import time
from dataclasses import asdict

import pytest
import sacrebleu
import torch

from conftest import REPO, edit_params
from nmt.cli import main
from nmt.core.checkpoint import load, save
from nmt.core.codecs import BOS_ID, EOS_ID, UNK_ID, load_codecs
from nmt.core.data import Batches, load_pairs
from nmt.core.decoding import DecodeConfig, translate_batches
from nmt.core.errors import NmtError
from nmt.core.loss import corpus_loss
from nmt.core.records import RECORD, recorded_stage
from nmt.core.runs import Run
from nmt.core.runtime import GPU_MEMORY_ENV, autocast, limit_attention_kernels
from nmt.core.text import read_lines
from nmt.core.unknowns import detokenize_outputs, source_surfaces
from nmt.models import ModelConfig, build_model
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from nmt.stages.evaluate import Paths, evaluate, score, signatures

TINY = ModelConfig(num_encoder_layers=2, num_decoder_layers=2, d_model=32, nhead=4,
                   dim_feedforward=64, dropout=0.1, max_len=48)
TESTSETS = ["test_2016_flickr", "test_2017_flickr"]
N_TEST = 25  # test sentences decoded: enough for corpus scores, quick on a CPU


@pytest.fixture(scope="module")
def tokenized(prepared, tmp_path_factory):
    """The prepared test sets, cut to their first N_TEST sentences."""
    out = tmp_path_factory.mktemp("tokenized")
    for path in prepared["tokenized"].glob("test_*"):
        (out / path.name).write_text("".join(f"{s}\n" for s in read_lines(path)[:N_TEST]))
    return out


def tiny_params() -> dict:
    """The published recipe with the TINY model: what save_run's checkpoints were "trained" with
    (evaluate refuses a best.pt of other settings), decoding in fp32. Its `auto` would have
    evaluate measure fp32 against bf16 on this CPU where the recipe recorded no choice: a
    benchmark of half a minute that each mutant's process paid again (make mutate), whose
    choice follows the host's noise; test_evaluate_decodes_in_the_precision_its_recipe_recorded
    runs `auto`, and test_precision.py the measurement."""
    params = resolve(load_params(REPO / "params.yaml"), "published")
    params["model"] = asdict(TINY)
    params["train"] |= {"device": "cpu", "precision": "fp32"}
    params["evaluate"] |= {"testsets": TESTSETS, "batch_size": 32, "beam_size": 3}
    return params


def save_run(run_dir, name: str, recipe: str, vocab_dir) -> None:
    """A randomly initialised tiny model, saved as a trained run's best.pt."""
    src, tgt = load_codecs(vocab_dir)
    torch.manual_seed(0)
    model = build_model(name, TINY, len(src), len(tgt))
    save(run_dir / "best.pt", model, name=name, recipe=recipe, cfg=TINY,
         src_vocab_size=len(src), tgt_vocab_size=len(tgt), params=tiny_params())


def evaluated(settings: dict, prepared, tokenized, files) -> tuple[dict, dict]:
    """evaluate of the run whose folder `files` names (its best.pt saved there), against the
    prepared word vocabulary: (metrics, evaluation.json)."""
    metrics = evaluate(settings, Paths(tokenized, prepared["word"], files))
    return metrics, json.loads(files.evaluation.read_text())


def test_references_score_100_against_themselves(prepared):
    refs = read_lines(prepared["tokenized"] / "test_2016_flickr.en.txt")
    s = score(refs, refs)
    assert s["bleu"] == pytest.approx(100.0) and s["chrf"] == pytest.approx(100.0)
    assert "tok:13a" in signatures()["bleu"] and "case:mixed" in signatures()["bleu"]


def test_loss_is_per_token_whatever_the_batch_size(prepared, tmp_path):
    save_run(tmp_path, "scratch", "published", prepared["word"])
    model, _ = load(tmp_path / "best.pt")
    pairs = load_pairs(prepared["tokenized"], "test_2016_flickr", *load_codecs(prepared["word"]),
                       TINY.max_len)[:40]

    def loss(batch_size):
        return corpus_loss(model, Batches(pairs, "sentences", batch_size, 0, False), "cpu")

    assert loss(7) == pytest.approx(loss(40), rel=1e-6)


@pytest.mark.parametrize("name", ["baseline", "scratch"])
def test_evaluate_writes_metrics_and_translations(prepared, tokenized, tmp_path, caplog, name):
    run = Run("published", name, 0)
    save_run(run.dir(tmp_path), name, "published", prepared["word"])
    settings = tiny_params()
    settings["evaluate"]["attention_example"] = 3  # not the first: the index is read
    start = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="nmt"):
        metrics = evaluate(settings, Paths(tokenized, prepared["word"], run.files(tmp_path)))
    wall = time.perf_counter() - start
    run_dir = run.dir(tmp_path)
    assert_what_evaluate_says(caplog, run_dir, name, metrics)

    # metrics.json holds only the numbers people compare (dvc metrics show / exp show).
    assert metrics == json.loads((run_dir / "metrics.json").read_text())
    assert sorted(metrics) == TESTSETS
    about = json.loads((run_dir / "evaluation.json").read_text())
    assert {k: about[k] for k in ("run", "recipe", "model", "seed")} == {
        "run": f"published-{name}-s0", "recipe": "published", "model": name, "seed": 0}
    assert about["params"] == sum(p.numel() for p in load(run_dir / "best.pt")[0].parameters())
    assert "tok:13a" in about["signature"]["bleu"] and set(about["signature"]) == {"bleu", "chrf"}
    assert about["unknown_words"] == "copy"
    assert about["device"] == "cpu" and about["attention_kernels"] == limit_attention_kernels()
    assert (about["precision"], about["precision_reason"]) == ("fp32", "train.precision: fp32")
    # what the report reads the run's stage from (the record of translations/)
    assert recorded_stage(run_dir / "translations" / RECORD) == f"evaluate@published-{name}-0"
    model, codecs = load(run_dir / "best.pt")[0], load_codecs(prepared["word"])
    for testset, m in metrics.items():
        assert set(m) == {"loss", "ppl", "bleu", "bleu_greedy", "chrf", "chrf_greedy"}
        assert all(isinstance(v, float) for v in m.values())
        assert about["testsets"][testset]["sentences"] == N_TEST
        timings = about["testsets"][testset]
        assert set(timings) == {"sentences", "references", "seconds_greedy", "seconds_beam",
                                "unknowns_greedy", "unknowns_beam"}
        assert all(0 < timings[k] < wall and round(timings[k], 3) == timings[k]
                   for k in ("seconds_greedy", "seconds_beam"))
        pairs = load_pairs(tokenized, testset, *codecs, TINY.max_len)
        assert m["ppl"] == pytest.approx(math.exp(m["loss"]))
        refs = read_lines(tokenized / f"{testset}.en.txt")
        beam_ids = assert_each_file_holds_its_search(run_dir, tokenized, prepared["word"],
                                                     testset)
        # This model's BLEU is about 0 both ways; its chrF tells the two searches apart.
        assert m["chrf"] != pytest.approx(m["chrf_greedy"])
        for method, suffix in (("beam", ""), ("greedy", "_greedy")):
            hyps = read_lines(run_dir / "translations" / f"{testset}.{method}.txt")
            assert len(hyps) == N_TEST
            # The saved translations reproduce the scores: nothing else went into them.
            assert sacrebleu.corpus_bleu(hyps, [refs]).score == pytest.approx(m[f"bleu{suffix}"])
            assert sacrebleu.corpus_chrf(hyps, [refs]).score == pytest.approx(m[f"chrf{suffix}"])
            # Each <unk> was counted and copied from the source (evaluate.unknown_words: copy).
            assert about["testsets"][testset][f"unknowns_{method}"] >= 0
            assert not any("<unk>" in h for h in hyps)
        # Per-sentence losses add up to the corpus loss (the report's bootstrap resamples them).
        rows = [line.split("\t") for line in
                read_lines(run_dir / "translations" / f"{testset}.loss.tsv")]
        assert len(rows) == N_TEST
        total = sum(float(x) for x, _ in rows) / sum(int(n) for _, n in rows)
        assert total == pytest.approx(m["loss"], rel=1e-9)
        # ... each sentence's own, in the test set's order (its target tokens after <bos>)
        assert [int(n) for _, n in rows] == [len(tgt) - 1 for _, tgt in pairs]
        for i in (0, 7):
            alone = corpus_loss(model, Batches(pairs[i:i + 1], "sentences", 1, 0, False), "cpu")
            assert float(rows[i][0]) / int(rows[i][1]) == pytest.approx(alone, rel=1e-4)
        if testset == TESTSETS[0]:
            first_beam = beam_ids
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "attention.json", "best.pt", "evaluation.json", "metrics.json", "translations"]
    attention = json.loads((run_dir / "attention.json").read_text())
    weights = torch.tensor(attention["weights"])  # (output tokens, source tokens)
    assert weights.shape == (len(attention["output"]), len(attention["source"]))
    assert torch.allclose(weights.sum(1), torch.ones(len(weights)), atol=1e-3)  # rows sum to 1
    # sentence evaluate.attention_example of the first test set, its beam output: the last
    # decoder layer's cross-attention, the mean of its heads, to 4 decimals
    source = load_pairs(tokenized, TESTSETS[0], *codecs, TINY.max_len)[3][0]
    said = first_beam[3]
    assert attention["what"] == "last decoder layer, cross-attention, mean of heads"
    assert attention["source"] == codecs[0].pieces(source)
    assert attention["output"] == codecs[1].pieces(said + [EOS_ID])
    assert attention["translation"] == read_lines(
        run_dir / "translations" / f"{TESTSETS[0]}.beam.txt")[3]
    assert attention_weights(model, source, said, "fp32") == attention["weights"]


def attention_weights(model, source: list[int], said: list[int], precision: str) -> list:
    """What attention.json's weights must be: the last decoder layer's cross-attention, the
    mean of its heads, to 4 decimals, under `precision`."""
    with torch.inference_mode(), autocast("cpu", precision):
        maps = model.attention_maps(torch.tensor([source]), torch.tensor([[BOS_ID, *said]]))
    return [[round(w, 4) for w in row] for row in maps["decoder_cross"][-1][0].mean(0).tolist()]


def assert_what_evaluate_says(caplog, run_dir, name: str, metrics: dict) -> None:
    """evaluate's log, line for line: what it read, each test set's numbers, what it wrote."""
    about = json.loads((run_dir / "evaluation.json").read_text())
    said = [r.getMessage() for r in caplog.records if r.name == "nmt.evaluate"]
    expected = [f"read {run_dir / 'best.pt'}: {name} model of recipe published, "
                f"{about['params']} parameters, on cpu in {about['precision']}"]
    for testset in TESTSETS:
        m = metrics[testset]
        expected += [f"read {testset}: {N_TEST} sentences",
                     f"{testset}: loss {m['loss']:.4f}, ppl {m['ppl']:.2f}, BLEU {m['bleu']:.2f} "
                     f"(greedy {m['bleu_greedy']:.2f}), chrF {m['chrf']:.2f}; "
                     f"{about['testsets'][testset]['unknowns_beam']} <unk> in the beam output "
                     "(copy)"]
    expected += [f"wrote {run_dir / 'translations'}",
                 f"wrote {run_dir / 'metrics.json'} and evaluation.json"]
    assert said == expected


def assert_each_file_holds_its_search(run_dir, tokenized, vocab, testset: str) -> list:
    """<testset>.beam.txt holds the beam search's output and .greedy.txt the greedy one's (the
    metrics are their scores, checked above): both decoded again here, and told apart, since
    this untrained model's two searches differ on some sentence. Returns the beam's ids."""
    model, _ = load(run_dir / "best.pt")
    codecs = load_codecs(vocab)
    pairs = load_pairs(tokenized, testset, *codecs, TINY.max_len)
    surfaces = source_surfaces(tokenized, testset, codecs[0])
    said = {}
    for method in ("greedy", "beam"):
        ids = translate_batches(model, pairs, DecodeConfig.from_params(
            tiny_params()["evaluate"], method, TINY.max_len - 1), progress=False)
        said[method] = detokenize_outputs(model, [p[0] for p in pairs], surfaces, ids,
                                          codecs[1], "copy").lines
        assert read_lines(run_dir / "translations" / f"{testset}.{method}.txt") == said[method]
    assert said["greedy"] != said["beam"]
    return ids


@pytest.mark.parametrize("kind,name", [("word", "baseline"), ("bpe", "scratch")])
def test_translate_cli_handles_empty_long_and_unknown_input(prepared, tmp_path, capsys, caplog,
                                                            kind, name):
    caplog.set_level("INFO", logger="nmt.translate")
    # The vocabulary folder is looked up as --vocab / the checkpoint's recipe.
    save_run(tmp_path / "results" / f"{kind}-{name}-s0", name, kind, prepared["word"].parent / kind)
    unknown = "Ein Zzyzxqwv springt."
    src_codec, _ = load_codecs(prepared["word"])
    assert UNK_ID in src_codec.encode(["Ein", "Zzyzxqwv", "springt", "."])
    long_line = " ".join(["Ein Hund läuft über die Wiese ."] * 12)  # 84 tokens > max_len 48
    base = ["--params", str(REPO / "params.yaml"), "translate", "--run", f"{kind}-{name}-s0",
            "--results", str(tmp_path / "results"), "--vocab", str(prepared["word"].parent),
            "--device", "cpu"]

    assert main(base + ["--beam", "2", "Ein Mann fährt Fahrrad.", "", long_line, unknown]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[4] == ""
    # A warning (on stderr under the CLI's logging; pytest captures it here).
    assert "line 3: " in caplog.text and "cut to the model's limit of 46" in caplog.text
    assert "unknown words: copy" in caplog.text  # which way an <unk> is shown

    (tmp_path / "in.txt").write_text(f"Ein Mann fährt Fahrrad.\n\n{unknown}\n", "utf-8")
    assert main(base + ["--file", str(tmp_path / "in.txt")]) == 0
    from_file = capsys.readouterr().out.split("\n")
    assert len(from_file) == 4 and from_file[1] == ""


def test_translate_reads_stdin_and_beam_one_is_greedy(prepared, tmp_path, capsys, monkeypatch,
                                                      params_file):
    save_run(tmp_path / "results" / "published-scratch-s0", "scratch", "published",
             prepared["word"])
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "published").symlink_to(prepared["word"])
    edit_params(params_file, model=asdict(TINY))  # what the run's best.pt was saved with
    base = ["--params", str(params_file), "translate", "--results",
            str(tmp_path / "results"), "--vocab", str(tmp_path / "vocab"), "--beam", "1"]
    monkeypatch.setattr("sys.stdin", io.StringIO("Zwei Hunde spielen.\nEine Frau singt.\n"))
    assert main(base) == 0
    piped = capsys.readouterr().out
    assert main(base + ["Zwei Hunde spielen.", "Eine Frau singt."]) == 0
    assert capsys.readouterr().out == piped and len(piped.split("\n")) == 3


def test_translate_names_the_fix_for_a_missing_checkpoint(tmp_path, capsys):
    argv = ["--params", str(REPO / "params.yaml"), "translate", "--results", str(tmp_path),
            "--run", "published-baseline-s0", "Hallo"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "best.pt not found" in err and "nmt train --recipe published --model baseline" in err
    assert main(argv[:3] + ["--checkpoint", str(tmp_path / "x.pt"), "Hallo"]) == 2
    assert "x.pt not found (fix: " in capsys.readouterr().err


def test_a_vocabulary_that_does_not_fit_the_checkpoint_is_refused(prepared, tmp_path, capsys):
    save_run(tmp_path / "run", "scratch", "published", prepared["bpe"])
    argv = ["--params", str(REPO / "params.yaml"), "translate", "--checkpoint",
            str(tmp_path / "run" / "best.pt"), "--vocab", str(tmp_path / "vocab"), "Hallo"]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "published").symlink_to(prepared["word"])
    assert main(argv) == 2
    assert "source/target tokens" in capsys.readouterr().err


def test_evaluate_in_bf16_scores_and_decodes_in_bf16(prepared, tokenized, tmp_path):
    """train.precision bf16: the loss and both searches run under bf16 autocast (the loss in
    float32 of bf16 matmuls), which gives other numbers than fp32 on this random model."""
    run = Run("published", "scratch", 0)
    save_run(run.dir(tmp_path), "scratch", "published", prepared["word"])
    settings = tiny_params()
    settings["train"]["precision"] = "bf16"
    metrics, about = evaluated(settings, prepared, tokenized, run.files(tmp_path))
    assert about["precision"] == "bf16"
    model, codecs = load(run.dir(tmp_path) / "best.pt")[0], load_codecs(prepared["word"])
    pairs = load_pairs(tokenized, TESTSETS[0], *codecs, TINY.max_len)
    batches = Batches(pairs, "sentences", 32, 0, False)
    loss = {p: corpus_loss(model, batches, "cpu", precision=p) for p in ("bf16", "fp32")}
    assert abs(loss["bf16"] - loss["fp32"]) > 1e-5  # what the test tells apart (about 6e-5)
    assert metrics[TESTSETS[0]]["loss"] == pytest.approx(loss["bf16"], rel=1e-6, abs=0)
    surfaces = source_surfaces(tokenized, TESTSETS[0], codecs[0])
    for method in ("greedy", "beam"):
        with autocast("cpu", "bf16"):
            ids = translate_batches(model, pairs, DecodeConfig.from_params(
                settings["evaluate"], method, TINY.max_len - 1), progress=False)
        lines = detokenize_outputs(model, [p[0] for p in pairs], surfaces, ids, codecs[1],
                                   "copy").lines
        assert read_lines(run.dir(tmp_path) / "translations" / f"{TESTSETS[0]}.{method}.txt"
                          ) == lines
    # the attention example too (sentence 0 of the first test set, its beam output)
    attention = json.loads((run.dir(tmp_path) / "attention.json").read_text())
    assert attention["weights"] == attention_weights(model, pairs[0][0], ids[0], "bf16")
    assert attention["weights"] != attention_weights(model, pairs[0][0], ids[0], "fp32")


def test_evaluate_copies_each_unk_from_its_source(prepared, tokenized, tmp_path):
    """A model that says <unk> at every step: each is counted, and written as the source word
    it attended to most (evaluate.unknown_words: copy), never as <unk>."""
    run = Run("published", "scratch", 0)
    save_run(run.dir(tmp_path), "scratch", "published", prepared["word"])
    ckpt = torch.load(run.dir(tmp_path) / "best.pt", weights_only=True)
    ckpt["state_dict"]["generator.bias"][UNK_ID] = 100.0  # <unk> wins every step
    torch.save(ckpt, run.dir(tmp_path) / "best.pt")
    settings = tiny_params()
    settings["evaluate"]["attention_example"] = 10**6  # past the end: the last sentence
    settings["evaluate"]["max_len_a"] = 10  # outputs may run to the model's cap, not a * source
    _, about = evaluated(settings, prepared, tokenized, run.files(tmp_path))
    src_codec = load_codecs(prepared["word"])[0]
    attention = json.loads((run.dir(tmp_path) / "attention.json").read_text())
    assert attention["translation"] == read_lines(
        run.dir(tmp_path) / "translations" / f"{TESTSETS[0]}.beam.txt")[N_TEST - 1]
    assert attention["source"] == src_codec.pieces(load_pairs(
        tokenized, TESTSETS[0], src_codec, load_codecs(prepared["word"])[1], TINY.max_len)[-1][0])
    for testset in TESTSETS:
        # no <eos> ever wins: every output runs to the model's cap, max_len - 1 tokens
        assert about["testsets"][testset]["unknowns_greedy"] == N_TEST * (TINY.max_len - 1)
        surfaces = source_surfaces(tokenized, testset, src_codec)
        for method in ("greedy", "beam"):
            lines = read_lines(run.dir(tmp_path) / "translations" / f"{testset}.{method}.txt")
            assert about["testsets"][testset][f"unknowns_{method}"] >= len(lines) == N_TEST
            for line, words in zip(lines, surfaces, strict=True):
                # each word a copy of one of its source's written words (detokenized: a
                # copied "." or "," joins the word before it)
                assert line and "<unk>" not in line, line
                assert all(any(w in word for w in words) for word in line.split()), (line, words)


def test_evaluate_scores_only_the_runs_own_best_pt_trained_as_the_recipe_says(
        prepared, tokenized, tmp_path, caplog, monkeypatch):
    """A baseline's best.pt in scratch's folder, or a best.pt the recipe's settings no longer
    describe, is refused before anything is written; NMT_GPU_MEM_MB on a CPU: one line."""
    run = Run("published", "scratch", 0)
    files = run.files(tmp_path)
    paths = Paths(tokenized, prepared["word"], files)
    monkeypatch.setenv(GPU_MEMORY_ENV, "100")
    save_run(run.dir(tmp_path), "baseline", "published", prepared["word"])
    with caplog.at_level(logging.INFO, logger="nmt"), pytest.raises(NmtError) as refused:
        evaluate(tiny_params(), paths)
    assert f"{GPU_MEMORY_ENV}=100: no CUDA memory to bound on cpu" in caplog.messages
    assert str(refused.value) == (
        f"{files.best} holds a baseline model of recipe published, expected a scratch model of "
        "recipe published (fix: re-run `nmt train --recipe published --model scratch --seed "
        "0`, or put that run's own best.pt there)")
    save_run(run.dir(tmp_path), "scratch", "published", prepared["word"])
    settings = tiny_params()
    settings["train"]["lr"] *= 2
    with pytest.raises(NmtError) as refused:
        evaluate(settings, paths)
    assert str(refused.value).startswith(f"{files.best} was trained with other settings than "
                                         "recipe published has now: train.lr"), refused.value
    assert sorted(p.name for p in run.dir(tmp_path).iterdir()) == ["best.pt"]


def test_evaluate_decodes_in_the_precision_its_recipe_recorded(prepared, tokenized, tmp_path,
                                                                monkeypatch):
    """train.precision auto on a CPU: evaluate takes the decoding precision the recipe's first
    run recorded in results/precision/<recipe>.json (bf16 here), measuring nothing (a
    measurement fails this test), as the trainings it scores did."""
    from nmt.training import precision_cache, precision_timing
    from nmt.training.precision_cache import machine

    def measured(workload):
        raise AssertionError("evaluate measured the precision its recipe recorded")

    monkeypatch.setattr(precision_timing, "measure", measured)
    monkeypatch.setenv(precision_cache.CACHE_ENV, str(tmp_path / "cache"))
    run = Run("published", "scratch", 0)
    save_run(run.dir(tmp_path), "scratch", "published", prepared["word"])
    record = tmp_path / "precision" / "published.json"
    record.parent.mkdir()
    record.write_text(json.dumps({
        "machine": machine(), "decided": "2026-11-29T12:00:00+00:00",
        "train": {"precision": "fp32", "reason": "planted", "speedup": None},
        "decode": {"precision": "bf16", "reason": "planted", "speedup": 1.5}}))
    settings = tiny_params()
    settings["train"]["precision"] = "auto"
    _, about = evaluated(settings, prepared, tokenized, run.files(tmp_path))
    assert (about["precision"], about["bf16_speedup"]) == ("bf16", 1.5)
    assert about["precision_reason"] == (f"planted (recorded for the recipe in {record} by its "
                                         "first run here, 2026-11-29T12:00:00+00:00)")


def test_nmt_evaluate_scores_the_seed_it_is_given(prepared, tokenized, tmp_path, params_file,
                                                  capsys):
    """`nmt evaluate --seed 1` reads and writes published-scratch-s1, not seed 0's folder;
    each decoding's progress bar names its test set and search."""
    save_run(tmp_path / "results" / "published-scratch-s1", "scratch", "published",
             prepared["word"])
    edit_params(params_file, model=asdict(TINY), evaluate=tiny_params()["evaluate"],
                train={"precision": "fp32"})  # as tiny_params: nothing measured
    argv = ["--params", str(params_file), "evaluate", "--model", "scratch", "--seed", "1",
            "--results", str(tmp_path / "results"), "--tokenized", str(tokenized), "--vocab",
            str(prepared["word"])]
    assert main(argv) == 0
    assert not (tmp_path / "results" / "published-scratch-s0").exists()
    about = json.loads((tmp_path / "results" / "published-scratch-s1" / "evaluation.json")
                       .read_text())
    assert (about["run"], about["seed"]) == ("published-scratch-s1", 1)
    err = capsys.readouterr().err
    assert all(f"{t} {m}:" in err for t in TESTSETS for m in ("greedy", "beam")), err


# --- out of memory while decoding, and the beam's bound -------------------------------------------

def out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def oom_line(command: str, fix: str) -> str:
    return (f"nmt {command}: error: out of GPU memory: an allocation of 2.00 GiB failed (fix: "
            f"{fix}; then run the same command again)\n")


@pytest.mark.parametrize("search", ["greedy", "beam_search"])
def test_evaluate_out_of_memory_names_what_the_search_holds(prepared, tokenized, tmp_path,
                                                             params_file, capsys, monkeypatch,
                                                             search):
    """The line named evaluate.batch_size alone, even where a beam of 10000 ran out: in beam
    search it names the beam too, with the hypotheses a batch holds."""
    save_run(tmp_path / "results" / "published-scratch-s0", "scratch", "published",
             prepared["word"])
    edit_params(params_file, model=asdict(TINY), evaluate=tiny_params()["evaluate"],
                train={"precision": "fp32"})  # as tiny_params: nothing measured
    monkeypatch.setattr(f"nmt.core.decoding.{search}", out_of_memory)
    argv = ["--params", str(params_file), "evaluate", "--model", "scratch", "--results",
            str(tmp_path / "results"), "--tokenized", str(tokenized), "--vocab",
            str(prepared["word"])]
    assert main(argv) == 2
    err = capsys.readouterr().err  # after the progress bar, cleared with "\r"
    assert err.count("\n") == 1 and err.split("\r")[-1] == oom_line("evaluate", {
        "greedy": "a smaller evaluate.batch_size",
        "beam_search": "a smaller evaluate.beam_size or evaluate.batch_size: beam search holds "
                       "3 x 32 hypotheses at once"}[search])
    assert not (tmp_path / "results" / "published-scratch-s0" / "translations").exists()


def test_translate_out_of_memory_names_the_beam_it_was_given(prepared, tmp_path, capsys,
                                                              monkeypatch):
    save_run(tmp_path / "run", "scratch", "published", prepared["word"])
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "published").symlink_to(prepared["word"])
    argv = ["--params", str(REPO / "params.yaml"), "translate", "--checkpoint",
            str(tmp_path / "run" / "best.pt"), "--vocab", str(tmp_path / "vocab"), "Hallo"]
    batch = load_params(REPO / "params.yaml")["evaluate"]["batch_size"]
    monkeypatch.setattr("nmt.core.decoding.beam_search", out_of_memory)
    assert main(argv + ["--beam", "7"]) == 2
    assert capsys.readouterr().err == oom_line(
        "translate", f"a smaller --beam or evaluate.batch_size: beam search holds 7 x {batch} "
                     "hypotheses at once")
    assert main(argv) == 2  # the beam from params.yaml
    assert "a smaller evaluate.beam_size or evaluate.batch_size" in capsys.readouterr().err
    for beam in ("0", "101"):
        assert main(argv + ["--beam", beam]) == 2
        assert capsys.readouterr().err == (f"nmt translate: error: --beam {beam}: a beam holds "
                                           "1 to 100 hypotheses (fix: --beam 1 to 100; 1 is "
                                           "greedy)\n")
