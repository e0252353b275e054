"""`nmt bench --data`: the data stages on a million sentence pairs, each step measured alone.

It builds a synthetic corpus in a temporary folder from the Multi30k raw files (the train
split repeated and shuffled with a fixed seed up to --pairs; val and test_2016_flickr as they
are), then runs the data stages over it as a large corpus would: download (data.corpus
files), tokenize (word tokens, and the raw-text-only path of tokenize.words: false), the word
vocabularies and a 32k joint BPE trained on a sample (the wmt14 recipe's), and loading the
training pairs into one epoch of token batches, for either vocabulary.

Each step runs in a process of its own, so that its peak memory is its own: the resident
memory of that process and of every process it starts (tokenize's workers), summed, polled
every POLL_SECONDS. Summed RSS counts pages that forked workers share with their parent once
each, so it is an upper bound. Seconds include starting Python and importing the step's
modules, as a pipeline stage pays them.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil

from nmt.core.errors import NmtError
from nmt.core.files import write_json

log = logging.getLogger("nmt.databench")

LANGS = ("de", "en")
TESTSET = "test_2016_flickr"  # the one test set the corpus carries (as it is)
SEED = 0  # the corpus's shuffle
POLL_SECONDS = 0.05
LIMIT_GB = 4.0  # the goal: every step's peak at a million pairs


@dataclass(frozen=True)
class DataPlan:
    """What to build and measure (`nmt bench --data` options; the rest as the wmt14 recipe)."""

    pairs: int = 1_000_000  # training pairs of the synthetic corpus
    threads: int = 1  # tokenize's worker processes (nmt tokenize --threads)
    bpe_size: int = 32_000  # the joint BPE's size
    bpe_sample: int = 1_000_000  # sentences SentencePiece trains on (vocab.bpe_sample)
    max_tokens: int = 25_000  # a token batch (wmt14: 6,250 x 4 accumulated)
    max_len: int = 256  # sentences cut to this many ids (model.max_len)


@dataclass(frozen=True)
class Paths:
    raw: Path  # the Multi30k raw files (data/raw) the corpus is built from
    json: Path | None = None  # results/data_bench.json: the figures, if given


# step -> what it does, for the table and the report. Each is a function below (run_<step>),
# run in its own process by `python -m nmt.commands.data_bench <step> <folder>`.
STEPS = {
    "download": "download (data.corpus files): read, check, write data/raw",
    "tokenize": "tokenize: spaCy word tokens (.txt and .tok)",
    "tokenize_text": "tokenize, tokenize.words false: raw text only",
    "vocab_word": "vocab word, min_freq 1 (streamed counts)",
    "vocab_bpe": "vocab bpe 32k, trained on a sample (vocab.bpe_sample)",
    "load_word": "load_pairs + an epoch of token batches, word vocabulary",
    "load_bpe": "load_pairs + an epoch of token batches, BPE vocabulary",
}


def bench_data(paths: Paths, plan: DataPlan) -> dict:
    """Build the corpus, run every step in its own process, print a table, write paths.json."""
    if not all((Path(paths.raw) / f"{split}.{lang}.gz").is_file()
               for split in ("train", "val", TESTSET) for lang in LANGS):
        raise NmtError(f"{paths.raw} lacks the Multi30k raw files (train, val, {TESTSET}; de, "
                       "en) (fix: run `nmt download` first, or give --raw a folder holding them)")
    with tempfile.TemporaryDirectory(prefix="nmt-databench-") as tmp:
        folder = Path(tmp)
        build_corpus(Path(paths.raw), folder / "corpus", plan.pairs)
        write_json(folder / "plan.json", asdict(plan))
        steps = []
        for step, what in STEPS.items():
            log.info("%s ...", what)
            steps.append({"step": step, "what": what, **measure(step, folder, plan.pairs)})
    peak = max(s["peak_rss_gb"] for s in steps)
    out = {"pairs": plan.pairs, "threads": plan.threads, "cpus": os.cpu_count(),
           "corpus": f"Multi30k train repeated and shuffled (seed {SEED}); val, {TESTSET}",
           "limit_gb": LIMIT_GB, "peak_rss_gb": peak, "within_limit": peak <= LIMIT_GB,
           "steps": steps}
    print_data_steps(out)
    if paths.json:
        write_json(paths.json, out)
    return out


def build_corpus(raw: Path, out: Path, pairs: int) -> None:
    """out/<split>.<lang>: train as `pairs` pairs drawn from Multi30k's train split, every
    pair as often as the others (+-1), in a seeded shuffled order; val and TESTSET copied."""
    out.mkdir(parents=True)
    sides = {lang: gzip.decompress((raw / f"train.{lang}.gz").read_bytes()).decode("utf-8")
             .splitlines() for lang in LANGS}
    order = np.random.default_rng(SEED).permutation(np.arange(pairs) % len(sides[LANGS[0]]))
    for lang, lines in sides.items():
        with gzip.open(out / f"train.{lang}.gz", "wt", encoding="utf-8", compresslevel=1) as f:
            f.writelines(lines[i] + "\n" for i in order.tolist())
    for split in ("val", TESTSET):
        for lang in LANGS:
            shutil.copyfile(raw / f"{split}.{lang}.gz", out / f"{split}.{lang}.gz")


def measure(step: str, folder: Path, pairs: int) -> dict:
    """Run one step in its own process; its seconds, pairs a second, and the peak resident
    memory of its process tree. The step's log goes to folder/<step>.log."""
    command = [sys.executable, "-m", "nmt.commands.data_bench", step, str(folder)]
    start, peak = time.perf_counter(), 0
    with open(folder / f"{step}.log", "w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        tree = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, tree_rss(tree))
            time.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - start
    if proc.returncode:
        last = (folder / f"{step}.log").read_text().strip().splitlines()[-1:] or ["no output"]
        raise NmtError(f"bench --data: step {step} failed (exit {proc.returncode}): {last[0]} "
                       "(fix: run `nmt bench --data` with fewer --pairs to see it quickly)")
    detail = json.loads((folder / f"{step}.json").read_text())
    return {"seconds": round(seconds, 2), "pairs_per_second": round(pairs / seconds),
            "peak_rss_gb": round(peak / 1e9, 3), **detail}


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants (those alive at this moment)."""
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for member in members:
        try:
            total += member.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass  # ended between the listing and the reading
    return total


def print_data_steps(out: dict) -> None:
    print(f"\nnmt bench --data: {out['pairs']:,} pairs, {out['threads']} tokenize "
          f"process(es), {out['cpus']} CPUs")
    print(f"{'step':16}{'seconds':>10}{'pairs/s':>12}{'peak RSS GB':>14}")
    for s in out["steps"]:
        print(f"{s['step']:16}{s['seconds']:>10,.1f}{s['pairs_per_second']:>12,}"
              f"{s['peak_rss_gb']:>14.2f}")
    verdict = "within" if out["within_limit"] else "OVER"
    print(f"highest peak {out['peak_rss_gb']:.2f} GB: {verdict} the {out['limit_gb']:g} GB goal")


# --- the steps, each run in a process of its own ------------------------------------------------

def corpus_data(folder: Path) -> dict:
    """The data section of the synthetic corpus, as params.yaml would hold it."""
    return {"corpus": "files", "source_lang": LANGS[0], "target_lang": LANGS[1],
            "testsets": [TESTSET], "max_train_pairs": 0, "max_test_pairs": 0,
            "files": {split: {lang: str(folder / "corpus" / f"{split}.{lang}.gz")
                              for lang in LANGS} for split in ("train", "val", TESTSET)}}


def run_download(folder: Path, plan: DataPlan) -> dict:
    from nmt.stages import download

    download.download({"data": corpus_data(folder)}, download.Paths(out=folder / "raw"))
    return {}


def run_tokenize(folder: Path, plan: DataPlan, words: bool = True) -> dict:
    from nmt.stages import tokenize

    settings = {"data": corpus_data(folder), "tokenize": {"batch_size": 1000, "words": words}}
    out = folder / ("tokenized" if words else "text")
    stats = tokenize.tokenize(settings, tokenize.Paths(folder / "raw", out), plan.threads)
    return {"sentences": stats["train.de"]["sentences"]}


def run_tokenize_text(folder: Path, plan: DataPlan) -> dict:
    return run_tokenize(folder, plan, words=False)


def run_vocab(folder: Path, vocab_settings: dict, tokenized: str, name: str) -> dict:
    from nmt.stages import vocab

    meta = vocab.build({"data": corpus_data(folder), "vocab": vocab_settings},
                       vocab.Paths(folder / tokenized, folder / name))
    return {"src_size": meta["src_size"], "tgt_size": meta["tgt_size"]}


def run_vocab_word(folder: Path, plan: DataPlan) -> dict:
    return run_vocab(folder, {"kind": "word", "min_freq": 1}, "tokenized", "vocab_word")


def run_vocab_bpe(folder: Path, plan: DataPlan) -> dict:
    return run_vocab(folder, {"kind": "bpe", "bpe_size": plan.bpe_size,
                              "bpe_sample": plan.bpe_sample}, "text", "vocab_bpe")


def run_load(folder: Path, plan: DataPlan, tokenized: str, vocab_name: str) -> dict:
    """What training does before its first step, and its data work over one epoch: the
    pairs loaded, the epoch's token batches built and every one of them padded into tensors."""
    from nmt.core.codecs import PAD_ID, load_codecs
    from nmt.core.data import Batches, load_pairs, padding_fraction

    pairs = load_pairs(folder / tokenized, "train", *load_codecs(folder / vocab_name),
                       plan.max_len)
    batches = Batches(pairs, "tokens", 0, plan.max_tokens, shuffle=True, seed=0)
    order = batches.indices(0)
    target_ids = sum(int((tgt != PAD_ID).sum()) for _, tgt in batches)  # tensors, then dropped
    return {"batches": len(order), "padding": round(padding_fraction(pairs, order), 4),
            "target_ids": target_ids,
            "ids_mb": round((pairs.src.ids.nbytes + pairs.tgt.ids.nbytes) / 1e6, 1)}


def run_load_word(folder: Path, plan: DataPlan) -> dict:
    return run_load(folder, plan, "tokenized", "vocab_word")


def run_load_bpe(folder: Path, plan: DataPlan) -> dict:
    return run_load(folder, plan, "text", "vocab_bpe")


def command(args, params: dict) -> None:
    """`nmt bench --data` (nmt.stages.bench's options; nmt.cli runs this instead of the stage)."""
    from nmt.pipeline.commandline import usable_cores

    bench_data(Paths(raw=args.raw, json=args.json),
               DataPlan(pairs=args.pairs, threads=args.threads or usable_cores()))


def main(argv: list[str]) -> None:
    """`python -m nmt.commands.data_bench <step> <folder>`: one step, its details to
    folder/<step>.json."""
    step, folder = argv[0], Path(argv[1])
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    plan = DataPlan(**json.loads((folder / "plan.json").read_text()))
    detail = globals()[f"run_{step}"](folder, plan)
    write_json(folder / f"{step}.json", detail)


if __name__ == "__main__":
    main(sys.argv[1:])
