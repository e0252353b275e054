"""Seed aggregates, the paired bootstraps, the Welch test and the verdict line, against hand
values, brute-force enumeration and sacreBLEU itself."""

import dataclasses
import gzip
import itertools
import math
import os
import warnings
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from nmt.core import stats
from nmt.core.errors import NmtError


@pytest.fixture(scope="module")
def references(mirror) -> list[str]:
    """120 real Multi30k English test sentences."""
    with gzip.open(mirror / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in itertools.islice(f, 120)]


def drop_words(lines: list[str], every: int, offset: int = 0) -> list[str]:
    """A worse system, deterministically: drop every `every`-th word."""
    return [" ".join(w for i, w in enumerate(line.split()) if (i + offset) % every)
            for line in lines]


# --- aggregates ------------------------------------------------------------------------------

def test_summarize_on_hand_numbers():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert (s.mean, s.n) == (2.5, 4)
    assert s.std == pytest.approx(math.sqrt(5 / 3), abs=1e-15)  # ddof=1: 5 / (4 - 1)
    assert s.format(2) == "2.50 ± 1.29 (4)"
    one = stats.summarize([25.314])
    assert one.n == 1 and math.isnan(one.std) and one.format(2) == "25.31 ± - (1)"
    with pytest.raises(ValueError):
        stats.summarize([])


def test_one_seed_has_no_spread_and_says_nothing_of_it():
    """A single value (one seed: the default pipeline) is a normal case: NaN spread, and no
    numpy warning about degrees of freedom in the report's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = stats.summarize([25.31])
    assert one.mean == 25.31 and one.n == 1 and math.isnan(one.std)


def test_aggregate_groups_in_first_seen_order():
    rows = [{"model": "b", "seed": 0, "bleu": 30.0, "loss": 2.0},
            {"model": "a", "seed": 0, "bleu": 10.0, "loss": 3.0},
            {"model": "b", "seed": 1, "bleu": 34.0, "loss": 2.5}]
    out = stats.aggregate(rows, ["model"], ["bleu", "loss"])
    assert [r["model"] for r in out] == ["b", "a"]
    b, a = out
    assert (b["n"], b["bleu"], b["loss"]) == (2, 32.0, 2.25)
    assert b["bleu_std"] == pytest.approx(math.sqrt(8)) and b["loss_std"] == pytest.approx(
        math.sqrt(0.125))
    assert a["n"] == 1 and a["bleu"] == 10.0 and math.isnan(a["bleu_std"])


# --- BLEU / chrF: sacreBLEU's paired bootstrap -------------------------------------------------

def test_identical_systems_differ_by_nothing(references):
    hyps = drop_words(references, 3)
    found = stats.paired_bootstrap(hyps, list(hyps), references)
    for c in found.values():
        assert c.difference == 0 and (c.low, c.high) == (0.0, 0.0)
        # sacreBLEU alone says p = 1/1001 here (its strict '>'); the report must not.
        assert c.p == 1.0
        assert stats.verdict(c).endswith("no significant difference")
        assert "bs:1000" in c.signature and "seed:12345" in c.signature


def test_a_system_better_on_every_sentence_is_significant(references):
    worse = drop_words(references, 2)
    found = stats.paired_bootstrap(list(references), worse, references)
    for name, c in found.items():
        assert c.p < 0.01 and c.low > 0 and c.difference > 0, name
        assert "scratch is better" in stats.verdict(c)
    flipped = stats.paired_bootstrap(worse, list(references), references)
    assert flipped["BLEU"].high < 0 and "baseline is better" in stats.verdict(flipped["BLEU"])


def test_scores_and_p_value_are_sacrebleus(references):
    """Same corpus scores as sacreBLEU's metrics, the same p-value as its PairedTest."""
    system, baseline = drop_words(references, 4), drop_words(references, 4, offset=1)
    found = stats.paired_bootstrap(system, baseline, references, names=("sys", "base"))
    metrics = {"BLEU": BLEU(), "chrF": CHRF()}
    os.environ.pop("SACREBLEU_SEED", None)  # sacreBLEU's default seed is ours: 12345
    _, results = PairedTest([("baseline", baseline), ("scratch", system)], metrics,
                            [references], test_type="bs", n_samples=1000)()
    for (label, metric), key in zip(metrics.items(), ("BLEU", "chrF2"), strict=True):
        c = found[label]
        assert (c.metric, c.system, c.baseline, c.higher_is_better) == (label, "sys", "base",
                                                                         True)
        assert c.method == "sacreBLEU paired bootstrap, 1000 resamples, seed 12345"
        assert c.system_score == metric.corpus_score(system, [references]).score
        assert c.baseline_score == metric.corpus_score(baseline, [references]).score
        assert c.p == results[key][1].p_value
        assert c.low <= c.difference <= c.high
    assert "SACREBLEU_SEED" not in os.environ  # the seed was set for the call only


def test_difference_interval_is_the_corpus_score_of_real_resamples(references):
    """Brute force: with 20 resamples the interval is (min, max) of the differences; score
    every resampled corpus from scratch with sacreBLEU and compare."""
    refs = references[:40]
    system, baseline = drop_words(refs, 3), drop_words(refs, 5)
    c = stats.paired_bootstrap(system, baseline, refs, n_samples=20, seed=7)["BLEU"]
    diffs = []
    for row in stats.resample_indices(len(refs), 20, seed=7):
        r = [refs[i] for i in row]
        diffs.append(BLEU().corpus_score([system[i] for i in row], [r]).score
                     - BLEU().corpus_score([baseline[i] for i in row], [r]).score)
    assert (c.low, c.high) == pytest.approx((min(diffs), max(diffs)), abs=1e-4)


def test_the_interval_drops_a_fortieth_of_the_resamples_at_each_end():
    """sacreBLEU's index rule: n // 40 values in from either end (1,000 resamples: the 26th
    smallest and the 26th largest), whatever the order the resamples come in."""
    assert stats.percentile_ci(np.arange(1000.0)[::-1]) == (25.0, 974.0)
    assert stats.percentile_ci(np.arange(79.0)) == (1.0, 77.0)
    assert stats.percentile_ci(np.arange(39.0)) == (0.0, 38.0)


def test_resamples_that_are_not_sacrebleus_are_caught(references, monkeypatch):
    """Planted bug: indices drawn with another seed than sacreBLEU used."""
    draw = stats.resample_indices
    monkeypatch.setattr(stats, "resample_indices",
                        lambda n, k, seed: draw(n, k, seed + 1))
    with pytest.raises(NmtError, match="differ from sacreBLEU"):
        stats.paired_bootstrap(drop_words(references, 3), list(references), references)


def test_bad_inputs_are_one_line_errors(references):
    with pytest.raises(NmtError, match="as many hypotheses as references"):
        stats.paired_bootstrap(references[:5], references[:4], references[:5])
    with pytest.raises(NmtError, match="as many hypotheses as references"):  # none at all
        stats.paired_bootstrap([], [], [])
    one = stats.paired_bootstrap(references[:1], references[:1], references[:1], n_samples=10)
    assert one["BLEU"].system_score == pytest.approx(100.0) and one["BLEU"].p == 1.0  # one will do
    with pytest.raises(ValueError, match="seed 0"):
        stats.paired_bootstrap(references[:5], references[:5], references[:5], seed=0)
    with pytest.raises(NmtError, match="different numbers of sentences"):
        stats.loss_bootstrap(([1.0, 2.0], [1, 1]), ([1.0], [1]))
    with pytest.raises(NmtError, match="different numbers of sentences"):  # none at all
        stats.loss_bootstrap(([], []), ([], []))
    one = stats.loss_bootstrap(([3.0], [2]), ([2.0], [2]))  # one sentence is a test set
    assert (one.difference, one.low, one.high) == (0.5, 0.5, 0.5)


# --- test loss: sentence-level paired bootstrap ----------------------------------------------

# Three sentences: (summed loss in nats, tokens). Baseline 12 nats / 6 tokens = 2.0 a token;
# system 14 / 6 = 7/3. The difference is 1/3, all of it from the third sentence.
BASE = ([2.0, 4.0, 6.0], [1, 2, 3])
SYS = ([1.0, 4.0, 9.0], [1, 2, 3])


def exact_distribution() -> list[Fraction]:
    """Every one of the 3^3 equally likely resamples, in exact arithmetic."""
    out = []
    for row in itertools.product(range(3), repeat=3):
        s = Fraction(sum(int(SYS[0][i]) for i in row), sum(SYS[1][i] for i in row))
        b = Fraction(sum(int(BASE[0][i]) for i in row), sum(BASE[1][i] for i in row))
        out.append(s - b)
    return out


def test_loss_differences_match_exact_enumeration():
    idxs = np.array(list(itertools.product(range(3), repeat=3)))  # (27, 3)
    got = stats.loss_differences(tuple(map(np.array, SYS)), tuple(map(np.array, BASE)), idxs)
    assert got == pytest.approx([float(d) for d in exact_distribution()], abs=1e-12)


def test_loss_bootstrap_against_the_exact_bootstrap():
    c = stats.loss_bootstrap(SYS, BASE, n_samples=20000, seed=3)
    assert c.kind == "bootstrap" and "kind" not in c.to_dict()  # statistics.json as before
    assert (c.system_score, c.baseline_score) == pytest.approx((7 / 3, 2.0))
    assert c.difference == pytest.approx(1 / 3) and not c.higher_is_better
    exact = exact_distribution()
    mean = sum(exact) / len(exact)
    # Shift to 'no difference' and count resamples at least as far out as 1/3.
    p_exact = sum(abs(d - mean) >= Fraction(1, 3) for d in exact) / len(exact)
    assert c.p == pytest.approx(float(p_exact), abs=0.015)
    assert 0.1 < p_exact < 0.9  # a case that is neither trivially 0 nor 1
    # The interval's ends are values the exact distribution takes (the 2.5% / 97.5% ones).
    support = sorted(float(d) for d in exact)
    assert min(abs(c.low - v) for v in support) < 1e-12
    assert min(abs(c.high - v) for v in support) < 1e-12
    assert c.low == pytest.approx(support[0]) and c.high == pytest.approx(support[-1])


def test_loss_bootstrap_says_what_it_compared_and_resamples_with_the_seed_given():
    """Its fields name the metric and both sides; the seed given draws the resamples (the
    interval is that of the differences on resample_indices' draws, not the default seed's);
    the sums are float64 whatever the caller hands in (float32 losses here)."""
    rng = np.random.default_rng(0)
    losses, tokens = rng.uniform(1, 30, 50), rng.integers(1, 20, 50)
    base = (losses * 1.1, tokens)
    c = stats.loss_bootstrap((losses, tokens), base, names=("sys", "base"), n_samples=200,
                             seed=7)
    assert (c.metric, c.system, c.baseline, c.higher_is_better) == (
        "test loss", "sys", "base", False)
    assert c.method == "paired bootstrap over sentences, 200 resamples, seed 7"
    diffs = stats.loss_differences(
        (losses, tokens.astype(np.float64)), (base[0], tokens.astype(np.float64)),
        stats.resample_indices(50, 200, 7))
    assert (c.low, c.high) == stats.percentile_ci(diffs)
    default_seed = stats.loss_bootstrap((losses, tokens), base, n_samples=200)
    assert (default_seed.low, default_seed.high) != (c.low, c.high)
    as32 = stats.loss_bootstrap((losses.astype(np.float32), tokens),
                                (base[0].astype(np.float32), tokens), n_samples=200, seed=7)
    exact = stats.loss_bootstrap((losses.astype(np.float32).astype(np.float64), tokens),
                                 (base[0].astype(np.float32).astype(np.float64), tokens),
                                 n_samples=200, seed=7)
    assert as32 == exact


def test_loss_bootstrap_identical_and_uniformly_better():
    losses = ([2.0, 3.5, 1.2, 4.4, 2.8] * 20, [3, 5, 2, 6, 4] * 20)
    same = stats.loss_bootstrap(losses, losses)
    assert same.difference == 0 and same.p == 1.0 and (same.low, same.high) == (0.0, 0.0)
    better = ([x * 0.9 for x in losses[0]], losses[1])  # lower loss on every sentence
    c = stats.loss_bootstrap(better, losses)
    assert c.p < 0.01 and c.high < 0
    assert "scratch is better" in stats.verdict(c, digits=4)


# --- seeds: Welch's t-test ------------------------------------------------------------------

def test_t_distribution_against_closed_forms():
    for t in (0.3, 1.0, 2.5, 12.0):
        assert stats.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t),
                                                          rel=1e-10)
        assert stats.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t),
                                                          rel=1e-10)
    assert stats.t_two_sided_p(1.959963984540054, 1e7) == pytest.approx(0.05, rel=1e-5)
    assert stats.t_critical(4) == pytest.approx(2.776445105, rel=1e-8)
    assert stats.t_critical(1) == pytest.approx(12.70620474, rel=1e-8)


def test_t_tails_agree_with_mpmath():
    """The two-sided tail is the regularized incomplete beta I_x(df/2, 1/2), x = df/(df+t^2):
    against mpmath's, at 30 digits, over the degrees of freedom Welch gives a few seeds a side
    (fractional ones too) and beyond."""
    mpmath.mp.dps = 30
    for df in (1, 1.5, 3.447, 7.5, 30, 1000):
        for t in (0.01, 0.5, 1.7, 2.2, 4.0, 12.0):
            x = mpmath.mpf(df) / (df + mpmath.mpf(t) ** 2)
            exact = float(mpmath.betainc(mpmath.mpf(df) / 2, 0.5, 0, x, regularized=True))
            assert stats.t_two_sided_p(t, df) == pytest.approx(exact, rel=1e-11), (df, t)


def test_t_tails_at_their_ends_and_critical_values_at_any_level():
    """t = 0 is the likeliest (p = 1) and an infinite t impossible (p = 0), exactly; near t = 0
    (x = df / (df + t^2) close to 1, where the continued fraction converges slowly unless the
    symmetry relation is used) the closed forms still hold; t_critical inverts the tail at any
    level, one that puts it below 1 included (df = 1: t = tan(pi / 2 * (1 - alpha)))."""
    for df in (1, 2, 7.5):
        assert stats.t_two_sided_p(0.0, df) == 1.0
        assert stats.t_two_sided_p(math.inf, df) == 0.0
    for t in (1e-3, 0.05):
        assert stats.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t),
                                                          rel=1e-10)
        assert stats.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t),
                                                          rel=1e-10)
    for alpha in (0.6, 0.05):
        assert stats.t_critical(1, alpha) == pytest.approx(math.tan(math.pi / 2 * (1 - alpha)),
                                                           rel=1e-9)


def t_tail_by_integration(t: float, df: float) -> float:
    """P(|T| >= t) by integrating Student's density numerically (x = t + u / (1 - u))."""
    u = np.linspace(0.0, 1.0, 400_001)[:-1]
    x, dx = t + u / (1 - u), 1 / (1 - u) ** 2
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df)) * dx
    return 2 * float(np.sum((f[1:] + f[:-1]) / 2) * (u[1] - u[0]))


def test_welch_on_hand_numbers():
    """(4, 5, 6) vs (1, 2, 3): difference 3, se = sqrt(1/3 + 1/3), t = 3.6742, df = 4,
    p = 0.02131 (the t(4) tail), CI 3 -/+ 2.7764 se = 0.7330 .. 5.2670."""
    c = stats.welch([4.0, 5.0, 6.0], [1.0, 2.0, 3.0], "BLEU", names=("sys", "base"))
    assert (c.metric, c.system, c.baseline, c.system_score, c.baseline_score) == (
        "BLEU", "sys", "base", 5.0, 2.0)
    assert c.higher_is_better  # BLEU: by default, higher is better
    assert c.difference == 3.0 and c.p == pytest.approx(0.021311641, rel=1e-6)
    assert (c.low, c.high) == pytest.approx((0.7330421, 5.2669579), rel=1e-6)
    assert "n = 3 vs 3" in c.method and c.kind == "seeds"
    # Unequal sizes and variances: Welch-Satterthwaite df = 3.447 (fractional).
    a, b = [30.1, 30.9, 29.7, 31.2], [30.0, 30.2]
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 2
    t, df = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb), (va + vb) ** 2 / (
        va**2 / 3 + vb**2 / 1)
    assert df == pytest.approx(3.447, abs=1e-3)
    assert stats.welch(a, b, "BLEU").p == pytest.approx(t_tail_by_integration(t, df), rel=1e-5)
    assert stats.welch([30.0], [29.0, 31.0], "BLEU") is None
    exact = stats.welch([2.0, 2.0], [2.0, 2.0], "test loss", higher_is_better=False)
    assert (exact.p, exact.difference, exact.low, exact.high) == (1.0, 0.0, 0.0, 0.0)
    assert not exact.higher_is_better
    # Every seed alike on each side, the sides apart: the difference is exact, and certain.
    apart = stats.welch([3.0, 3.0], [2.0, 2.0], "BLEU")
    assert (apart.p, apart.difference, apart.low, apart.high) == (0.0, 1.0, 1.0, 1.0)


# --- the verdict line -------------------------------------------------------------------------

def test_a_comparison_kind_is_bootstrap_or_seeds():
    with pytest.raises(ValueError, match="Welch"):
        stats.Comparison("BLEU", "a", "b", 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, "hand", kind="Welch")
    with pytest.raises(TypeError):  # no default: whoever makes a comparison says which
        stats.Comparison("BLEU", "a", "b", 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, "hand")


def test_verdict_lines_read_as_specified():
    c = stats.Comparison("BLEU", "scratch", "baseline", 30.0, 30.12, -0.12, -0.61, 0.38, 0.31,
                         "hand", kind="bootstrap")
    assert stats.verdict(c) == ("scratch - baseline: -0.12 BLEU (95% CI -0.61 .. +0.38, "
                                "p = 0.31): no significant difference")
    at_alpha = dataclasses.replace(c, p=0.05)  # significant means p < alpha
    assert stats.verdict(at_alpha).endswith("p = 0.05): no significant difference")
    loss = stats.Comparison("test loss", "decoder_only", "baseline", 2.1, 2.0, 0.1, 0.05, 0.15,
                            0.0004, "hand", higher_is_better=False, kind="seeds")
    assert stats.verdict(loss, digits=3) == (
        "decoder_only - baseline: +0.100 test loss (95% CI +0.050 .. +0.150, p < 0.001): "
        "baseline is better (significant at 0.05)")


def test_p_values_read_with_the_digits_their_size_needs():
    assert [stats.format_p(p) for p in (0.31, 0.01, 0.0099, 0.005, 0.001, 0.00099)] == [
        "0.31", "0.01", "0.010", "0.005", "0.001", "< 0.001"]


def test_a_summary_reads_mean_std_and_count():
    assert stats.summarize([25.1, 25.5, 25.9]).format() == "25.50 ± 0.40 (3)"
    assert stats.summarize([1.23456, 1.23466]).format(digits=4) == "1.2346 ± 0.0001 (2)"
    assert stats.summarize([25.31]).format() == "25.31 ± - (1)"


@pytest.mark.parametrize("low, high, outcome", [
    (-0.02, 0.02, "equivalent"), (-0.019, -0.001, "equivalent"),  # the edges count as inside
    (-0.05, -0.021, "different"), (0.021, 0.03, "different"),
    (-0.03, -0.01, "undecided"), (-0.03, 0.03, "undecided"),
    (0.02, 0.03, "undecided"), (-0.03, -0.02, "undecided")])  # on the edge: not wholly outside
def test_margin_outcome_places_the_interval_against_the_goal(low, high, outcome):
    c = stats.Comparison("test loss", "scratch", "baseline", 1.9, 1.9, (low + high) / 2, low,
                         high, 0.5, "hand", higher_is_better=False, kind="seeds")
    assert stats.margin_outcome(c, 0.02) == outcome


def test_the_loss_verdict_names_the_better_side_the_test_and_the_margin_it_held_to():
    """Over seeds: Welch's figures, the side with the lower loss, and the interval placed
    against the margin given (0.1 here: inside it, where the default 0.02 is not). One seed:
    the bootstrap's figures, and no outcome against the margin."""
    seeds = stats.Comparison("test loss", "scratch", "baseline", 1.95, 1.90, 0.05, 0.03, 0.07,
                             0.0004, "Welch t-test over seeds, n = 3 vs 3",
                             higher_is_better=False, kind="seeds")
    boot = stats.Comparison("test loss", "scratch", "baseline", 1.89, 1.90, -0.01, -0.02, 0.0,
                            0.31, "paired bootstrap over sentences", higher_is_better=False,
                            kind="bootstrap", seed=0)
    v = stats.loss_verdict(seeds, boot, stats.Summary(1.95, 0.01, 3),
                           stats.Summary(1.90, 0.012, 3), margin=0.1)
    assert {k: x for k, x in v.items() if k != "sentence"} == {
        "system": "scratch", "baseline": "baseline", "metric": "test loss",
        "basis": seeds.method, "seeds": 3, "margin": 0.1, "interval": "equivalent",
        "outcome": "equivalent", "difference": 0.05, "low": 0.03, "high": 0.07, "p": 0.0004}
    assert v["sentence"] == (
        "Over 3 seeds, scratch's test loss is 1.950 ± 0.010 against baseline's 1.900 ± 0.012 "
        "(difference +0.050, 95% CI +0.030 .. +0.070, Welch p < 0.001): baseline is better; "
        "the interval lies within ±0.1: equivalent within 0.1.")
    one = stats.loss_verdict(None, boot, stats.Summary(1.89, math.nan, 1),
                             stats.Summary(1.90, math.nan, 1))
    assert (one["interval"], one["outcome"], one["margin"]) == ("equivalent", "one seed", 0.02)
    assert ("scratch's test loss is 1.890 against baseline's 1.900 (difference -0.010, 95% CI "
            "-0.020 .. +0.000, p = 0.31): no significant difference on these sentences; the "
            "interval lies within ±0.02, but") in one["sentence"]
    at_alpha = stats.loss_verdict(None, dataclasses.replace(boot, p=0.05),
                                  stats.Summary(1.89, math.nan, 1), stats.Summary(1.9, math.nan, 1))
    assert "p = 0.05): no significant difference on these sentences" in at_alpha["sentence"]
    better = dataclasses.replace(boot, difference=-0.3, low=-0.4, high=-0.2, p=0.001)
    assert "p = 0.001): scratch is better on these sentences; the interval lies outside" in \
        stats.loss_verdict(None, better, stats.Summary(1.6, math.nan, 1),
                           stats.Summary(1.9, math.nan, 1))["sentence"]
