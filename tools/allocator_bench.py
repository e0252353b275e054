"""A training step with glibc's own allocator settings against `nmt`'s (keep_freed_memory).

Produced docs/cpu-and-precision.md's allocator figures (the paragraph after "What it takes
on your CPU": ms and page faults a step, peak memory, kept 1.03-1.27x as fast).

The scratch model of the demo recipe's size (2+2 layers, d_model 128, 4 heads, ffn 512; the
demo's vocabulary sizes, 8,012 and 6,190 words) trains on one random batch of 160 sentences
of 26 tokens (4,160 target tokens, as the demo's 4,096-token batches): forward, backward and
Adam, an update as `nmt train` makes it (nmt.training.step.Updater). Each setting runs in a
process of its own (the allocator's state is per process), the two alternating, `--pairs`
times; each process times `--steps` steps after 2 untimed ones. Printed per process: the
median milliseconds a step, the minor page faults of its last step, and its peak resident
memory. --sentences shrinks the batch (tests/test_tools.py runs it so, as a smoke test).

    python tools/allocator_bench.py [--threads 2] [--pairs 3] [--steps 8] [--sentences 160]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SRC_VOCAB, TGT_VOCAB = 8012, 6190
SENTENCES, LENGTH = 160, 26


def one_process(kept: bool, threads: int, steps: int, sentences: int = SENTENCES) -> dict:
    """Steps in this process, after keep_freed_memory if `kept`; its figures."""
    from nmt.core.process import keep_freed_memory

    if kept and not keep_freed_memory():
        raise SystemExit("the C library is not glibc: there is nothing to compare")
    import torch

    from nmt.models import ModelConfig, build_model
    from nmt.training.step import UpdateConfig, Updater

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    cfg = ModelConfig(num_encoder_layers=2, num_decoder_layers=2, d_model=128, nhead=4,
                      dim_feedforward=512, dropout=0.1, max_len=128)
    model = build_model("scratch", cfg, SRC_VOCAB, TGT_VOCAB).train()
    update = Updater(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4),
                     scheduler=None, device=torch.device("cpu"), config=UpdateConfig())
    src = torch.randint(4, SRC_VOCAB, (sentences, LENGTH))
    tgt = torch.randint(4, TGT_VOCAB, (sentences, LENGTH))
    seconds, faults = [], 0
    for step in range(steps + 2):
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        update([(src, tgt, True)])
        if step >= 2:
            seconds.append(time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {"ms_per_step": 1000 * statistics.median(seconds), "faults_last_step": faults,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sentences", type=int, default=SENTENCES,
                        help=f"sentences of {LENGTH} tokens a batch")
    parser.add_argument("--one", choices=["default", "kept"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one == "kept", args.threads, args.steps,
                                     args.sentences)))
        return
    runs = {"default": [], "kept": []}
    for _ in range(args.pairs):
        for setting in runs:
            out = subprocess.run([sys.executable, __file__, "--one", setting, "--threads",
                                  str(args.threads), "--steps", str(args.steps),
                                  "--sentences", str(args.sentences)],
                                 capture_output=True, text=True, check=True).stdout
            runs[setting].append(json.loads(out))
            figures = runs[setting][-1]
            print(f"{setting:8} {figures['ms_per_step']:6.0f} ms a step  "
                  f"{figures['faults_last_step']:7,} faults  {figures['peak_mb']:6,.0f} MB peak")
    speedups = [d["ms_per_step"] / k["ms_per_step"]
                for d, k in zip(runs["default"], runs["kept"], strict=True)]
    print(f"kept is {min(speedups):.2f}-{max(speedups):.2f}x as fast ({args.pairs} pairs, "
          f"{args.threads} threads)")


if __name__ == "__main__":
    main()
