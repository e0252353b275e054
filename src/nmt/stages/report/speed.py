"""The speed sections: each run's training (its curves, speed and machine), the speed
benchmark (results/bench.json), and, when their files are there, the data stages at scale
and the decoding engines."""

from __future__ import annotations

import pandas as pd

from nmt.core.files import read_json
from nmt.stages.report.inputs import Inputs, need
from nmt.stages.report.markdown import md_table
from nmt.stages.report.reference import REFERENCE_RECIPES


def training_section(inp: Inputs, figures: dict[str, str]) -> list[str]:
    """Loss curves, the other curves of history.csv (lr, gradient norm, speed), each run's
    training speed, and the speed benchmark."""
    testset = inp.testsets[0]
    published = [r for r in inp.recipes if r in REFERENCE_RECIPES]
    dotted = (f" Dotted, on the panel of {', '.join(f'`{r}`' for r in published)}: the "
              "published runs' validation loss, the epochs the reference reports."
              if published else "")
    lines = ["## Training", "", f"![loss curves](figures/{figures['loss']})", "",
             "Loss per token by epoch: dashed train, solid validation; bold the mean over "
             f"the seeds.{dotted}", "",
             "Per epoch: the learning rate, the mean gradient norm of the epoch's updates "
             "(before clipping), seconds and tokens a second.", "",
             "In the table below, `wall s` is a run's whole training, from each of its "
             "processes' start to its outputs, and `epochs s` the sum of its epochs (the "
             "updates); train.json's `seconds` says where the rest went.", "",
             f"![training curves](figures/{figures['training']})", ""]
    speed = pd.DataFrame([
        {"run": run.name, "device": r["train"]["device"], "epochs": r["train"]["epochs"],
         "best epoch": r["train"]["best_epoch"], "best valid loss": r["train"]["best_valid_loss"],
         "s/epoch": r["train"]["seconds_per_epoch"],
         "train tokens/s": r["train"]["tokens_per_second"],
         f"beam s ({testset})": r["evaluation"]["testsets"][testset]["seconds_beam"]}
        | machine_columns(r["train"]) for run, r in inp.runs.items()])
    return lines + [md_table(speed, ".3f"), ""] + machine_note(inp) + bench_lines(inp)


def machine_columns(summary: dict) -> dict:
    """train.json's device report as table columns ("-" for a run trained before it): the
    run's wall time beside its epochs' sum among them."""
    compiled, seconds = summary.get("compile"), summary.get("seconds", {})
    return {"wall s": seconds.get("wall", "-"), "epochs s": seconds.get("epochs", "-"),
            "precision": summary.get("precision", "-"),
            "compile s": summary.get("compile_seconds", "-") if compiled else "off",
            "CUDA graphs": summary.get("cuda_graphs", "-"),
            "peak MB": summary.get("peak_memory_mb", "-")}


def machine_note(inp: Inputs) -> list[str]:
    """The devices the runs trained on, by name, and what their peak memory measures; the
    precisions they trained and decoded in, and why (train.json: nmt.training.precision)."""
    seen = sorted({f"{r['train']['device_name']} (peak memory: {r['train']['peak_memory_of']})"
                   for r in inp.runs.values() if "device_name" in r["train"]})
    kinds = (("training", ""), ("decoding", "decode_"))
    why = sorted({f"{what} in {t[key + 'precision']} ({t[key + 'precision_reason']})"
                  for t in (r["train"] for r in inp.runs.values()) for what, key in kinds
                  if key + "precision_reason" in t})
    return ([f"Trained on: {'; '.join(seen)}. Epoch 1's seconds include the compile time.", ""]
            if seen else []) + ([f"Precision: {'; '.join(why)}.", ""] if why else [])


def bench_lines(inp: Inputs) -> list[str]:
    """results/bench.json as a table: every model bench timed, and the ratio where given."""
    bench = read_json(need(inp.results / "bench.json"))
    units = {"train": "train tokens/s", "greedy": "greedy sentences/s",
             "beam": "beam sentences/s"}
    spreads = bench.get("ratio_spread", {})  # benches before issue 58 did not measure it
    # "ratio" is the second model's over the first (bench.json's name, table.py); a bench.json
    # from before MFU timed baseline and scratch
    timed = list(bench.get("train_gflops", ["baseline", "scratch"]))
    rows = [{"what": label, **{m: v for m, v in bench[k].items() if m != "ratio"},
             **({f"{timed[1]}/{timed[0]}": bench[k]["ratio"]} if "ratio" in bench[k] else {}),
             **({"ratio quartiles": spread_cell(spreads[k])} if k in spreads else {})}
            for k, label in units.items()]
    lines = [f"### Speed benchmark (`nmt bench`, {bench['device']}, recipe {bench['recipe']})",
             "", md_table(pd.DataFrame(rows), ".2f"), ""]
    if spreads:
        lines += ["Each ratio is the median of per-pair ratios: the models alternate step by "
                  "step on the same work. `ratio quartiles` are those ratios' quartiles and "
                  "their spread (interquartile range over the median); over "
                  f"{bench['ratio_max_spread']:.0%} a ratio is NOT TRUSTED: other load on the "
                  "machine moved it (run `nmt bench` again on a quiet machine).", ""]
    if bench.get("padding"):  # random and bucketed sentence batches, or token batches
        lines += ["Padding, the padded share of the source and target positions of an epoch's "
                  "training batches: " + ", ".join(
                      f"{kind} {share:.1%}" for kind, share in bench["padding"].items()) + ".", ""]
    if bench.get("padding_share"):  # what the timed steps computed on padding
        lines += [f"The timed batches (lengths a multiple of {bench['pad_multiple']}) are "
                  f"{bench['padding_share']['src']:.1%} padding in the source, "
                  f"{bench['padding_share']['tgt']:.1%} in the target.", ""]
    if bench.get("mfu"):
        precision = bench.get("precision", "bf16")
        peak = bench.get("peak_gflops", {}).get(precision)
        of = (f"of this machine's measured {precision} matmul peak, {peak:,.1f} GFLOP/s"
              if bench.get("peak_measured") else f"of the GPU's dense {precision} peak")
        lines += [f"Model FLOPs utilisation in training ({of}; steps in {precision}): " +
                  ", ".join(f"{m} {v:.1%}" for m, v in bench["mfu"].items()) + ".", ""]
    if bench.get("peak_memory_mib"):
        lines += ["Peak GPU memory in training: " + ", ".join(
            f"{m} {v:,} MiB" for m, v in bench["peak_memory_mib"].items()) + ".", ""]
    return lines


def spread_cell(spread: dict) -> str:
    """A ratio's quartiles and spread (bench.json's ratio_spread) as a table cell."""
    low, high = spread["quartiles"]
    return (f"{low:.2f}-{high:.2f} ({spread['spread']:.0%}"
            f"{'' if spread['trusted'] else ', NOT TRUSTED'})")


def data_bench_section(inp: Inputs) -> list[str]:
    """results/data_bench.json (`nmt bench --data`, `make bench-data`), when there: each data
    stage's seconds, pairs a second and peak memory on a synthetic corpus of a million pairs."""
    path = inp.results / "data_bench.json"
    if not path.is_file():
        return []
    bench = read_json(path)
    rows = [{"step": s["what"], "seconds": s["seconds"], "pairs/s": f"{s['pairs_per_second']:,}",
             "peak RSS (GB)": s["peak_rss_gb"]} for s in bench["steps"]]
    verdict = "within" if bench["within_limit"] else "over"
    return [f"## Data stages at scale (`nmt bench --data`, {bench['pairs']:,} pairs)", "",
            f"Corpus: {bench['corpus']}; tokenize in {bench['threads']} process(es) on "
            f"{bench['cpus']} CPUs. Each step ran in a process of its own; its peak is the "
            "summed resident memory of that process and the processes it started.", "",
            md_table(pd.DataFrame(rows), ".2f", text=True), "",
            f"Highest peak: {bench['peak_rss_gb']:.2f} GB, {verdict} the "
            f"{bench['limit_gb']:g} GB goal.", ""]


def decoding_section(inp: Inputs) -> list[str]:
    """results/<run>/decoding.json (`nmt bench --decoding`), when there: our greedy and beam
    search against CTranslate2's in fp32 and int8 on the run's weights, on the same threads."""
    lines = []
    for path in sorted(inp.results.glob("*/decoding.json")):
        bench = read_json(path)
        rows = [{"decoder": f"{r['engine']} {r['compute_type']}", "method": r["method"],
                 "sentences/s": r["sentences_per_s"], "tokens/s": r["tokens_per_s"],
                 "BLEU": r["bleu"], "same as nmt": f"{r['identical_to_nmt']}/{bench['sentences']}"}
                for r in bench["rows"]]
        check = bench.get("export_check") or {}
        lines += [f"## Decoding engines: {bench['run']} (`nmt bench --decoding`)", "",
                  f"{bench['sentences']} sentences of {bench['testset']}, beam "
                  f"{bench['beam_size']}, {bench['threads']} CPU thread(s), median of "
                  f"{bench['repeats']} alternating repeats. CTranslate2 decodes the run's export "
                  f"(`nmt export`), whose per-token log-probabilities were within "
                  f"{check.get('max_abs_logprob_diff', float('nan')):.1e} of ours on "
                  f"{check.get('pairs', 0)} validation pairs; its beam search is ranked by GNMT "
                  "as ours is.", "", md_table(pd.DataFrame(rows), ".2f", text=True), ""]
    return lines
