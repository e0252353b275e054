"""The headline metric against an oracle: `nmt evaluate` scores a system whose output is known.

A tiny model memorizes a few test sentences (a second or two on a CPU), so its greedy and beam
outputs are known before evaluate runs: the reference as written (BLEU and chrF 100), or the
reference as spaCy tokenized it (sacreBLEU's score of those lines against the written ones,
below 100). Each case is a way a correct-looking pipeline reports a wrong headline:

- scored against the tokenized references (.tok) instead of the written ones: the system that
  says the tokens scores 100 and the one that says the reference does not;
- detokenization (word vocabularies): lines whose tokens differ from the written text under
  sacreBLEU's own tokenizer ("man 's", "blond - haired") score 100 only if joined back right;
- the wrong test set: the second test set's scores are its own, not the first's;
- the wrong run or checkpoint: another seed's best.pt, or the run's last.pt, score near 0;
- references that are not the raw test-set lines: evaluation.json records the sha256 of what
  was scored, checked here against the lines of the mirror's .gz, byte for byte.

Beam against greedy (which decoding each score and file holds) is checked in test_evaluate,
on a random model, whose two decodings differ.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

from conftest import REPO, edit_params
from nmt.cli import main
from nmt.core.checkpoint import save
from nmt.core.codecs import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load_codecs
from nmt.core.data import collate, load_pairs
from nmt.core.loss import token_loss
from nmt.core.runs import Run
from nmt.core.text import read_lines
from nmt.models import ModelConfig, build_model
from nmt.pipeline.params import load_params
from nmt.pipeline.recipes import resolve

T16, T17 = "test_2016_flickr", "test_2017_flickr"
SENTENCES = 6  # of each test set: a few, so that memorizing them takes seconds
# No dropout, so that the weights memorize; max_len fits every chosen sentence whole.
ORACLE = ModelConfig(num_encoder_layers=1, num_decoder_layers=1, d_model=64, nhead=4,
                     dim_feedforward=128, dropout=0.0, max_len=64)


@dataclass(frozen=True)
class Case:
    """One oracle: a model of one vocabulary kind, and what it says for each test set."""

    kind: str  # the vocabulary: word (spaCy tokens, detokenized) or bpe (SentencePiece)
    model: str
    says: dict[str, str]  # test set -> "reference" (as written) or "tokens" (as tokenized)


CASES = {
    # The published recipe's kind: output tokens are joined back into text (core.text).
    "word": Case("word", "scratch", {T16: "reference", T17: "reference"}),
    # SentencePiece reads the written lines, so a model can say the tokenized line verbatim.
    "bpe": Case("bpe", "baseline", {T16: "reference", T17: "tokens"}),
}


def tokens_differ(prepared: dict, testset: str) -> set[int]:
    """The lines of the test set whose spaCy tokens score below 100 against the written line
    (sacreBLEU's 13a tokenizer splits "something ." and "something." alike, but not "man 's"
    and "man's"): only detokenization gives the written line back."""
    written = read_lines(prepared["tokenized"] / f"{testset}.en.txt")
    tokens = read_lines(prepared["tokenized"] / f"{testset}.en.tok")
    return {i for i, (w, t) in enumerate(zip(written, tokens, strict=True))
            if BLEU().corpus_score([t], [[w]]).score < 100}


def chosen_lines(prepared: dict, case: Case, testset: str) -> list[int]:
    """The line numbers of the test set the oracle memorizes. A word model says <unk> for a word
    its vocabulary lacks, so it gets sentences whose every target word is known, those whose
    tokens differ from the written line first; the BPE model gets the first lines."""
    if case.kind == "bpe":
        return list(range(SENTENCES))
    _, tgt_codec = load_codecs(prepared["word"])
    tokens = read_lines(prepared["tokenized"] / f"{testset}.en.tok")
    known = [i for i, t in enumerate(tokens) if UNK_ID not in tgt_codec.encode(t.split(" "))]
    differ = tokens_differ(prepared, testset)
    hard = [i for i in known if i in differ][:2]
    return hard + [i for i in known if i not in hard][: SENTENCES - len(hard)]


def write_testsets(prepared: dict, case: Case, out: Path) -> dict[str, list[int]]:
    """The chosen lines of each test set as a tokenized folder (.txt and .tok, both sides).
    At least two of them must differ from their tokens, or the case would test nothing of
    detokenization (word) or of the tokenized references (BPE)."""
    out.mkdir()
    chosen = {testset: chosen_lines(prepared, case, testset) for testset in case.says}
    for testset, lines in chosen.items():
        for lang in ("de", "en"):
            for ext in ("txt", "tok"):
                every = read_lines(prepared["tokenized"] / f"{testset}.{lang}.{ext}")
                (out / f"{testset}.{lang}.{ext}").write_text(
                    "".join(every[i] + "\n" for i in lines), "utf-8")
    checked = [t for t in case.says if case.kind == "word" or case.says[t] == "tokens"]
    assert sum(len(tokens_differ(prepared, t) & set(chosen[t])) for t in checked) >= 2, \
        "fewer than two chosen lines whose tokens differ from the written line"
    return chosen


def said(case: Case, testset: str, tokenized: Path) -> list[str]:
    """What the oracle says for each sentence of the test set: its written or tokenized line."""
    ext = "txt" if case.says[testset] == "reference" else "tok"
    return read_lines(tokenized / f"{testset}.en.{ext}")


def training_pairs(case: Case, tokenized: Path, codecs: tuple) -> list:
    """(source ids, target ids) of every chosen sentence, the target what the oracle learns to
    say: for a word model the spaCy tokens of the reference (which evaluate joins back into
    the written line), for a BPE model the pieces of what it says."""
    src_codec, tgt_codec = codecs
    pairs = []
    for testset in case.says:
        sources = load_pairs(tokenized, testset, src_codec, tgt_codec, ORACLE.max_len)
        if case.kind == "word":
            targets = tgt_codec.encode_lines(read_lines(tokenized / f"{testset}.en.tok"))
        else:
            targets = [tgt_codec.encode(line) for line in said(case, testset, tokenized)]
        pairs += [(src, [BOS_ID, *ids, EOS_ID])
                  for (src, _), ids in zip(sources, targets, strict=True)]
    return pairs


def memorize(case: Case, pairs: list, vocab_sizes: tuple[int, int]) -> torch.nn.Module:
    """A model trained on these pairs until, under teacher forcing, every target token has a
    probability over 0.99: greedy search then says each target, and so does beam search, which
    returns the best hypothesis it finds (any other holds a token of probability under 0.01,
    whose log, -4.6, outweighs the whole target's, above -0.01 a token, at these lengths and
    any length penalty). 100-200 Adam steps. (Beam search used to stop at K finished, and
    returned three beams' best that had each taken one improbable token: core/decoding.py.)"""
    torch.manual_seed(0)
    model = build_model(case.model, ORACLE, *vocab_sizes)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    src, tgt = collate(pairs)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    for step in range(1, 1001):
        model.train()
        loss, tokens = token_loss(model, src, tgt, "cpu")
        optimizer.zero_grad()
        (loss / tokens).backward()
        optimizer.step()
        if step % 25 == 0:
            model.eval()
            with torch.no_grad():
                log_probs = model(src, tgt_in).log_softmax(-1)
            said = log_probs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)[tgt_out != PAD_ID]
            if said.min() > math.log(0.99):
                return model
    raise AssertionError(f"the {case.model} oracle did not memorize its {len(pairs)} pairs")


def raw_sha256(mirror: Path, testset: str, lines: list[int]) -> str:
    """sha256 of the chosen lines of the mirror's <testset>.en.gz, each ended by a newline."""
    written = gzip.decompress((mirror / f"{testset}.en.gz").read_bytes()).split(b"\n")
    return hashlib.sha256(b"".join(written[i] + b"\n" for i in lines)).hexdigest()


@dataclass(frozen=True)
class Evaluated:
    """What `nmt evaluate` wrote for the oracle's run (seed 0) and a random model's (seed 1)."""

    case: Case
    tokenized: Path
    chosen: dict[str, list[int]]
    results: Path

    def read(self, seed: int, name: str) -> dict:
        return json.loads((Run("published", self.case.model, seed).dir(self.results)
                           / name).read_text())


def oracle_params(case: Case, root: Path) -> Path:
    """root/params.yaml: the repository's, with the oracle's model, vocabulary kind and test
    sets (evaluate refuses a best.pt trained with other settings)."""
    shutil.copytree(REPO / "workflow" / "schemas", root / "workflow" / "schemas")
    return edit_params(Path(shutil.copy(REPO / "params.yaml", root)), model=asdict(ORACLE),
                       vocab={"kind": case.kind, "bpe_size": 1000},
                       train={"device": "cpu", "precision": "fp32"},
                       evaluate={"testsets": list(case.says), "beam_size": 3, "batch_size": 16})


@pytest.fixture(scope="module", params=list(CASES))
def evaluated(request, prepared, tmp_path_factory, one_thread) -> Evaluated:
    """The oracle memorizes its test sets' chosen lines and is saved as best.pt of seed 0; a
    random model of the same shape is that run's last.pt and seed 1's best.pt; `nmt evaluate`
    runs for both seeds."""
    case, root = CASES[request.param], tmp_path_factory.mktemp(request.param)
    tokenized, vocab, results = root / "tokenized", prepared[case.kind], root / "results"
    chosen = write_testsets(prepared, case, tokenized)
    params_file = oracle_params(case, root)
    codecs = load_codecs(vocab)
    sizes = (len(codecs[0]), len(codecs[1]))
    oracle = memorize(case, training_pairs(case, tokenized, codecs), sizes)
    torch.manual_seed(1)
    untrained = build_model(case.model, ORACLE, *sizes)
    for seed, path, model in ((0, "best.pt", oracle), (0, "last.pt", untrained),
                              (1, "best.pt", untrained)):
        save(Run("published", case.model, seed).dir(results) / path, model, name=case.model,
             recipe="published", cfg=ORACLE, src_vocab_size=sizes[0], tgt_vocab_size=sizes[1],
             params=resolve(load_params(params_file), "published"), seed=seed)
    for seed in (0, 1):
        assert main(["--params", str(params_file), "evaluate", "--model", case.model,
                     "--seed", str(seed), "--results", str(results), "--tokenized",
                     str(tokenized), "--vocab", str(vocab)]) == 0
    return Evaluated(case, tokenized, chosen, results)


def test_the_oracle_scores_what_it_says(evaluated, mirror):
    """BLEU and chrF, greedy and beam, are sacreBLEU's scores of what the oracle says against
    the test set's written lines: 100 where it says them, below where it says the tokens."""
    metrics, about = evaluated.read(0, "metrics.json"), evaluated.read(0, "evaluation.json")
    for testset, says in evaluated.case.says.items():
        written = read_lines(evaluated.tokenized / f"{testset}.en.txt")
        outputs = said(evaluated.case, testset, evaluated.tokenized)
        translations = Run("published", evaluated.case.model, 0).dir(
            evaluated.results) / "translations"
        for method in ("greedy", "beam"):
            assert read_lines(translations / f"{testset}.{method}.txt") == outputs, method
        bleu = BLEU().corpus_score(outputs, [written]).score
        chrf = CHRF().corpus_score(outputs, [written]).score
        if says == "reference":
            assert (bleu, chrf) == pytest.approx((100, 100))
        else:
            assert bleu < 99, "the tokens should score below the written lines"
        m = metrics[testset]
        assert (m["bleu"], m["bleu_greedy"], m["chrf"], m["chrf_greedy"]) == pytest.approx(
            (bleu, bleu, chrf, chrf), abs=1e-9), testset
        # The references are the raw test set's lines, byte for byte (the mirror's .gz).
        assert about["testsets"][testset]["references"] == {
            "lines": SENTENCES,
            "sha256": raw_sha256(mirror, testset, evaluated.chosen[testset])}


def test_another_run_is_scored_as_itself(evaluated):
    """Seed 1's best.pt (untrained) and seed 0's last.pt (untrained too) are not the oracle:
    evaluate of seed 0 scores its best.pt, and evaluate of seed 1 its own."""
    oracle, other = (evaluated.read(seed, "metrics.json") for seed in (0, 1))
    for testset in evaluated.case.says:
        assert other[testset]["bleu"] < 5 and other[testset]["chrf"] < 30
        assert oracle[testset]["bleu"] > 50
