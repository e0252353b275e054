"""nmt bench: both models timed on the same batches and weights; figures and ratios written."""

import json

from conftest import edit_params
from nmt.cli import main


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
    assert result["mfu"] == {} and result["peak_memory_mib"] == {}  # CUDA-only figures
    assert result["cuda_graphs"] is False  # what was timed: eager steps on the CPU
    # The published recipe's sentence batches: random against bucketed (train.bucket).
    assert 0 < result["padding"]["bucketed"] < result["padding"]["random"] / 3
    table = capsys.readouterr().out
    assert "scratch/baseline" in table and "beam sentences/s" in table
    assert f"random {result['padding']['random']:.1%}, bucketed" in table
