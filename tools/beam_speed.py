"""Our beam search against CTranslate2's at the published size, on the same weights.

Produced docs/serving-ctranslate2.md's published-size beam timings (ours 12.3-13.3 s against
the engine's 10.7-10.8 s, 0.81-0.87x, outputs identical). A scratch model of the published
architecture (6+6 layers, d_model 512, 8 heads, ffn 2048; Multi30k's word vocabulary sizes)
with random weights, so that no hypothesis ends early and every sentence is decoded to its
length limit; its CTranslate2 export (nmt.core.engine); 60 sources of 20 random tokens; beam
5, alpha 0.6. Each decoder runs once untimed, then the repeats alternate between them. The
engine is timed on its own search (Engine.search; the GNMT re-ranking of Engine.translate is
left out); our outputs are compared with a saved run's, if given. --layers, --d-model,
--heads, --ffn, --sentences and --length shrink it (tests/test_tools.py runs it tiny, as a
smoke test).

    python tools/beam_speed.py [--threads 2] [--repeats 3] [--save F | --check F]
        [--layers 6] [--d-model 512] [--heads 8] [--ffn 2048] [--sentences 60] [--length 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from nmt.core.codecs import SPECIALS
from nmt.core.decoding import DecodeConfig, output_limits, translate_batches
from nmt.core.engine import Engine, engine_length_penalty, model_spec
from nmt.models import ModelConfig, build_model

SRC_VOCAB, TGT_VOCAB = 19215, 10838
SENTENCES, LENGTH = 60, 20


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    cfg = ModelConfig(num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                      d_model=args.d_model, nhead=args.heads, dim_feedforward=args.ffn)
    model = build_model("scratch", cfg, SRC_VOCAB, TGT_VOCAB).eval()
    g = torch.Generator().manual_seed(1)
    sources = [[2, *torch.randint(4, SRC_VOCAB, (args.length,), generator=g).tolist(), 3]
               for _ in range(args.sentences)]
    dc = DecodeConfig(method="beam", beam_size=5, length_penalty=0.6, cap=cfg.max_len - 1)
    with tempfile.TemporaryDirectory() as folder:
        engine = exported(model, cfg, Path(folder), args.threads)
    limit = output_limits([args.length], dc.max_len_a, dc.max_len_b, dc.cap)[0]
    batch = [engine.source(s) for s in sources]

    def ctranslate2():
        return engine.search(batch, dc.beam_size, engine_length_penalty(dc.length_penalty),
                             limit)

    decoders = {"nmt": lambda: translate_batches(model, sources, dc, progress=False),
                "ctranslate2": ctranslate2}
    ours = decoders["nmt"]()  # and the engine's warm-up below
    decoders["ctranslate2"]()
    times = {name: [] for name in decoders}
    for _ in range(args.repeats):
        for name, decode in decoders.items():
            start = time.perf_counter()
            decode()
            times[name].append(time.perf_counter() - start)
    report(times, args)
    if args.save:
        args.save.write_text(json.dumps(ours))
    if args.check:
        print("outputs identical to", args.check, ":", json.loads(args.check.read_text()) == ours)


def exported(model, cfg: ModelConfig, folder: Path, threads: int) -> Engine:
    """The model as a CTranslate2 model in folder, loaded (it stays in memory)."""
    src = list(SPECIALS) + [f"s{i}" for i in range(SRC_VOCAB - len(SPECIALS))]
    tgt = list(SPECIALS) + [f"t{i}" for i in range(TGT_VOCAB - len(SPECIALS))]
    spec = model_spec("scratch", model.state_dict(), cfg, src, tgt)
    spec.optimize(quantization="float32")
    spec.save(str(folder))
    return Engine(folder, src, tgt, "float32", threads=threads)


def report(times: dict, args) -> None:
    size = ("published size" if (args.layers, args.d_model, args.heads, args.ffn)
            == (6, 512, 8, 2048) else
            f"{args.layers}+{args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
            f"ffn {args.ffn}")
    print(f"beam 5, {args.sentences} sentences of {args.length} tokens, {size}, "
          f"{args.threads} threads, {args.repeats} repeats")
    for name, t in times.items():
        print(f"{name:12} median {statistics.median(t):6.2f} s  "
              f"({', '.join(f'{x:.2f}' for x in t)})")
    ratio = statistics.median(times["ctranslate2"]) / statistics.median(times["nmt"])
    print(f"our speed / CTranslate2's: {ratio:.2f}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=2048, help="feed-forward width")
    p.add_argument("--sentences", type=int, default=SENTENCES)
    p.add_argument("--length", type=int, default=LENGTH, help="tokens a source")
    p.add_argument("--save", type=Path, help="write our outputs (token ids) here")
    p.add_argument("--check", type=Path, help="compare our outputs with a saved run's")
    return p.parse_args()


if __name__ == "__main__":
    main()
