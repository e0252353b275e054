"""bench.json's figures as the table `nmt bench` prints: a column per model, then a ratio
column per model against the reference (the first), with the ratio's quartiles.

bench.json names the ratios as it did for two models: the first model after the reference
(scratch) has "ratio" in each of train, greedy and beam and its spreads in
ratio_spread[train|greedy|beam]; each further one has "<model>/<reference>" there and its
spreads in ratio_spread["<model>/<reference>"][train|greedy|beam].
"""

from __future__ import annotations

WIDTH, RATIO_WIDTH = 12, 18  # a model's column, a ratio's column
KINDS = (("train", "train tokens/s"), ("greedy", "greedy sentences/s"),
         ("beam", "beam sentences/s"))


def ratio_name(models: list[str], name: str) -> str:
    """The key of model `name`'s ratio against models[0] in bench.json's figures."""
    return "ratio" if name == models[1] else f"{name}/{models[0]}"


def spread_of(out: dict, models: list[str], name: str, kind: str) -> dict:
    """Model `name`'s ratio spread for `kind` (train, greedy, beam) in bench.json."""
    spreads = out["ratio_spread"]
    return spreads[kind] if name == models[1] else spreads[ratio_name(models, name)][kind]


def width(name: str, least: int = WIDTH) -> int:
    """A column's width: `least`, or its name and two spaces (decoder_only/baseline)."""
    return max(least, len(name) + 2)


def print_speeds(out: dict) -> None:
    models = list(out["train_gflops"])  # the reference first
    others = models[1:]
    print(f"\nnmt bench: {out['device']}, recipe {out['recipe']}, {out['steps']} training steps, "
          f"{out['sentences']} sentences decoded in {out['decode_precision']}")
    pairs = (f"   (median of {spread_of(out, models, others[0], 'train')['pairs']} update "
             "pairs; decoding: of batch pairs)" if others else "")
    print(f"{'':26}" + "".join(f"{m:>{width(m)}}" for m in models)
          + "".join(f"{m + '/' + models[0]:>{ratio_width(m, models)}}" for m in others)
          + pairs)
    for key, label in KINDS:
        v = out[key]
        print(f"{label:26}" + "".join(f"{v[m]:>{width(m)},.1f}" for m in models)
              + "".join(f"{v[ratio_name(models, m)]:>{ratio_width(m, models)}.2f}"
                        for m in others)
              + ("   quartiles " if others else "") + "; ".join(
                  ("" if len(others) == 1 else f"{m} ")
                  + quartiles(spread_of(out, models, m, key), out["ratio_max_spread"])
                  for m in others))
    print("padding (an epoch's batches): " + ", ".join(
        f"{kind} {share:.1%}" for kind, share in out["padding"].items()))
    print(f"padding (the timed batches, lengths a multiple of {out['pad_multiple']}): "
          f"source {out['padding_share']['src']:.1%}, target {out['padding_share']['tgt']:.1%}")
    gflops = out["train_gflops"]
    print(f"{'train GFLOP/s (' + out['precision'] + ')':26}"
          + "".join(f"{gflops[m]:>{width(m)},.1f}" for m in models))
    if out["mfu"]:
        print(f"{'MFU':26}" + "".join(f"{out['mfu'][m]:>{width(m)}.1%}" for m in models)
              + f"   of {mfu_peak(out)}")
    if out["peak_memory_mib"]:
        v = out["peak_memory_mib"]
        print(f"{'peak memory MiB':26}" + "".join(f"{v[m]:>{width(m)}}" for m in models))


def ratio_width(name: str, models: list[str]) -> int:
    """The width of model `name`'s ratio column against models[0]."""
    return width(f"{name}/{models[0]}", RATIO_WIDTH)


def quartiles(spread: dict, max_spread: float) -> str:
    """A ratio's quartiles, and a warning where their spread is over max_spread."""
    return (f"{spread['quartiles'][0]:.2f}-{spread['quartiles'][1]:.2f}"
            + ("" if spread["trusted"] else
               f", spread {spread['spread']:.1%}: NOT TRUSTED (over "
               f"{max_spread:.0%}; other load on the machine? run it again)"))


def mfu_peak(out: dict) -> str:
    """What bench.json's MFU is a share of, in words."""
    peak = out["peak_gflops"][out["precision"]]
    kind = "measured matmul peak" if out["peak_measured"] else "data-sheet dense peak"
    return f"the {kind} in {out['precision']}, {peak:,.1f} GFLOP/s"
