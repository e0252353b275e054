"""nmt bench: both models timed on the same batches and weights; figures and ratios written."""

import json

import torch

from conftest import REPO, edit_params
from nmt.cli import main
from nmt.core.codecs import PAD_ID, load_codecs
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve
from nmt.stages.bench import SpeedPlan, bench_inputs, padding_share
from nmt.training.precision import BF16_MIN_SPEEDUP


def test_bench_writes_figures_and_ratios(prepared, params_file, tmp_path, capsys):
    edit_params(params_file, model={"num_encoder_layers": 1, "num_decoder_layers": 1,
                                    "d_model": 32, "nhead": 2, "dim_feedforward": 64},
                evaluate={"batch_size": 8, "beam_size": 3})
    out = tmp_path / "bench.json"
    code = main(["--params", str(params_file), "bench", "--tokenized", str(prepared["tokenized"]),
                 "--vocab", str(prepared["word"]), "--steps", "2", "--repeats", "2",
                 "--sentences", "10",
                 "--device", "cpu", "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["steps"] == 2 and result["sentences"] == 10
    for key in ("train", "greedy", "beam"):
        figures = result[key]
        assert figures["baseline"] > 0 and figures["scratch"] > 0
        assert abs(figures["ratio"] - figures["scratch"] / figures["baseline"]) < 0.01
    # MFU on the CPU: the steps' FLOP/s over the measured matmul peak of the precision they ran
    # in: params' train.precision auto, the faster of the two as measured here (precision.py),
    # for training and for decoding each, with the measured ratio and the reason.
    trained_in = result["precision"]
    for kind in ("", "decode_"):
        faster = result[f"{kind}bf16_speedup"] >= BF16_MIN_SPEEDUP
        assert result[f"{kind}precision"] == ("bf16" if faster else "fp32")
        assert result[f"{kind}precision_reason"].startswith("auto: ")
    assert result["peak_measured"] is True
    assert set(result["peak_gflops"]) == {"fp32", "bf16"} and min(
        result["peak_gflops"].values()) > 0
    for model in ("baseline", "scratch"):
        mfu = result["train_gflops"][model] / result["peak_gflops"][trained_in]  # both rounded
        assert 0 < result["mfu"][model] < 1
        assert abs(result["mfu"][model] - mfu) < 0.02 * mfu + 1e-4
    assert result["peak_memory_mib"] == {}  # a CUDA figure
    assert result["cuda_graphs"] is False  # what was timed: eager steps on the CPU
    # The published recipe's sentence batches: random against bucketed (train.bucket).
    assert 0 < result["padding"]["bucketed"] < result["padding"]["random"] / 3
    table = capsys.readouterr().out
    assert "scratch/baseline" in table and "beam sentences/s" in table
    assert f"10 sentences decoded in {result['decode_precision']}" in table
    assert f"random {result['padding']['random']:.1%}, bucketed" in table
    # The timed batches: params' pad_multiple auto is 1 where steps run eagerly (no graphs).
    assert result["pad_multiple"] == 1 and set(result["padding_share"]) == {"src", "tgt"}
    assert all(0 < share < 1 for share in result["padding_share"].values())
    assert (f"lengths a multiple of 1): source {result['padding_share']['src']:.1%}, target"
            in table)
    assert f"of the measured matmul peak in {trained_in}" in table



def test_timed_batches_are_padded_to_the_multiple_and_say_how_much(prepared):
    """bench_inputs pads as nmt train would with the multiple resolved; padding_share counts
    the pad slots of exactly those batches, which padding to 8 can only raise."""
    settings = resolve(load_params(REPO / "params.yaml"), "published")
    plan = SpeedPlan(recipe="published", steps=6, repeats=1, sentences=1)
    codecs = load_codecs(prepared["word"])
    shares = {}
    for multiple in (1, 8):
        timed, _, _ = bench_inputs(settings, prepared["tokenized"], plan, codecs,
                                   torch.device("cpu"), multiple)
        assert len(timed) == 6 and all(t.shape[1] % multiple == 0 for b in timed for t in b)
        shares[multiple] = padding_share(timed)
        pads = sum(int((src == PAD_ID).sum()) for src, _ in timed)
        assert shares[multiple]["src"] == round(pads / sum(src.numel() for src, _ in timed), 4)
    assert all(shares[8][side] > shares[1][side] for side in ("src", "tgt"))


def test_timed_batches_stay_on_the_host_as_training_hands_them_over(prepared):
    """A graphed update takes host batches (it pins and copies them into its buffers): bench
    handed it device tensors on an H200, every capture failed and it timed eager steps. Any
    device but CUDA (here `meta`, which nothing can be copied to) leaves them as they are."""
    settings = resolve(load_params(REPO / "params.yaml"), "published")
    plan = SpeedPlan(recipe="published", steps=2, repeats=1, sentences=1)
    timed, _, _ = bench_inputs(settings, prepared["tokenized"], plan,
                               load_codecs(prepared["word"]), torch.device("meta"), 8)
    assert all(t.device.type == "cpu" for batch in timed for t in batch)


def test_train_flops_is_what_torch_counts_in_a_step():
    """bench's FLOP formula (MFU's numerator) against torch's FLOP counter on one training step
    (forward and backward) of the scratch model, exactly. The batch has no padding, so the
    formula's real tokens are every matrix product's rows; attention runs its math path
    (fused off), whose products the counter sees (it counts no fused attention kernel)."""
    from torch.utils.flop_counter import FlopCounterMode

    from nmt.core.loss import token_loss
    from nmt.models import ModelConfig, build_model
    from nmt.stages.bench import train_flops

    cfg = ModelConfig(num_encoder_layers=2, num_decoder_layers=3, d_model=64, nhead=4,
                      dim_feedforward=96, dropout=0.0)
    torch.manual_seed(0)
    model = build_model("scratch", cfg, 300, 200)
    for module in model.modules():
        if hasattr(module, "fused"):
            module.fused = False
    # Source and target of different lengths: cross-attention's keys and values are the
    # source's, its queries the target's.
    src, tgt = torch.randint(4, 300, (5, 11)), torch.randint(4, 200, (5, 8))
    with FlopCounterMode(display=False) as counter:
        loss, _ = token_loss(model, src, tgt, torch.device("cpu"), precision="fp32")
        loss.backward()
    assert {str(op) for op in counter.get_flop_counts()["Global"]} == {
        "aten.addmm", "aten.mm", "aten.bmm"}
    assert train_flops(cfg, 200, [(src, tgt)]) == counter.get_total_flops()
