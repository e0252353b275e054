"""Statistics for the report: seed aggregates, paired bootstraps, a Welch test, verdict lines.

Three questions, three tools:
- How much do the scores move with the training seed? `summarize` / `aggregate`: mean, sample
  std (ddof=1) and n over the seeds of one (recipe, model, test set).
- Is one trained model better than another on this test set? A paired bootstrap over test
  sentences: sacreBLEU's own implementation for BLEU and chrF (`paired_bootstrap`), the same
  resampling for the per-token test loss (`loss_bootstrap`). It runs on one pair of trained
  models (the report runs it on each seed's pair), so it measures test-set sampling only.
- Do the two architectures train to different quality? With several seeds a side, a Welch
  t-test on the seed scores (`welch`); it sees training noise that the bootstrap cannot.
  `loss_verdict` says it in one sentence, and whether the difference's interval lies within
  a margin (`LOSS_MARGIN`, the goal: equivalent), outside it (different) or across an edge.

Everything here is torch-free: numpy, math and sacreBLEU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest, estimate_ci

from nmt.core.errors import NmtError

N_SAMPLES = 1000  # bootstrap resamples, sacreBLEU's default for its paired bootstrap
SEED = 12345      # sacreBLEU's default SACREBLEU_SEED; it treats 0 as "no seed", so never 0
ALPHA = 0.05
KINDS = ("bootstrap", "seeds")  # Comparison.kind: paired bootstrap, or Welch over seeds
# The goal the comparison is held to: scratch - baseline test loss within 0.02 nats a token,
# as a mean over seeds, with its 95% interval (loss_verdict).
LOSS_MARGIN = 0.02


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (ddof=1; NaN for one value) and count of some values."""

    mean: float
    std: float
    n: int

    def format(self, digits: int = 2) -> str:
        """'25.31 ± 0.42 (3)'; with one value the std reads '-': '25.31 ± - (1)'."""
        std = "-" if self.n < 2 else f"{self.std:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {std} ({self.n})"


def summarize(values: Sequence[float]) -> Summary:
    """Summary of a non-empty list of numbers, one per seed."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("summarize needs at least one value")
    return Summary(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, x.size)


def aggregate(rows: list[dict], keys: Sequence[str], metrics: Sequence[str]) -> list[dict]:
    """One row per distinct `keys` (first-seen order): n, and each metric's mean and _std."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for key, members in groups.items():
        row = dict(zip(keys, key, strict=True)) | {"n": len(members)}
        for m in metrics:
            s = summarize([r[m] for r in members])
            row |= {m: s.mean, f"{m}_std": s.std}
        out.append(row)
    return out


@dataclass(frozen=True)
class Comparison:
    """system - baseline on one metric: the difference, its 95% CI and a two-sided p-value."""

    metric: str             # "BLEU", "chrF", "test loss"
    system: str
    baseline: str
    system_score: float
    baseline_score: float
    difference: float       # system_score - baseline_score
    low: float              # 95% confidence interval of the difference
    high: float
    p: float
    method: str             # how difference, CI and p were obtained, in words
    higher_is_better: bool = True
    signature: str = ""     # sacreBLEU's signature, bootstrap settings included
    # What was resampled: "bootstrap" (test sentences of one pair of trained models) or
    # "seeds" (the training seeds, Welch). Keyword only; set where the comparison is made.
    kind: str = field(kw_only=True)
    seed: int | None = field(default=None, kw_only=True)  # a bootstrap's pair: their seed

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Comparison kind {self.kind!r}: not one of {KINDS}")

    def to_dict(self) -> dict:
        """Every field but kind, which `method` says in words (statistics.json)."""
        return {k: v for k, v in asdict(self).items() if k != "kind"}


def resample_indices(n_items: int, n_samples: int = N_SAMPLES, seed: int = SEED) -> np.ndarray:
    """Bootstrap resamples of range(n_items), drawn exactly as sacreBLEU's paired bootstrap
    draws them (numpy default_rng(seed).choice with replacement).  # (n_samples, n_items)"""
    rng = np.random.default_rng(seed)
    return rng.choice(n_items, size=(n_samples, n_items), replace=True)


def percentile_ci(samples: np.ndarray) -> tuple[float, float]:
    """95% percentile interval with sacreBLEU's index rule (n // 40 in from either end)."""
    s = np.sort(np.asarray(samples, dtype=np.float64))
    lower = len(s) // 40
    return float(s[lower]), float(s[len(s) - lower - 1])


def shift_p_value(observed: float, samples: np.ndarray) -> float:
    """Two-sided bootstrap p-value: the resampled differences shifted to mean 0 stand for
    'no difference'; p = (1 + #{|shifted| >= |observed|}) / (1 + resamples)."""
    d = np.asarray(samples, dtype=np.float64)
    extreme = np.abs(d - d.mean()) >= abs(observed) - 1e-12 * max(1.0, abs(observed))
    return float((1 + extreme.sum()) / (1 + len(d)))


@contextmanager
def sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its RNG seed from SACREBLEU_SEED only; set it for one block."""
    if seed == 0:
        raise ValueError("sacreBLEU treats seed 0 as unseeded; use a seed >= 1")
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


def resampled_scores(metric, hypotheses: list[str], references: list[str],
                     idxs: np.ndarray) -> np.ndarray:
    """The metric's corpus score on every resample, computed as sacreBLEU's paired bootstrap
    computes it (float32 sentence statistics summed over each resample).  # (n_samples,)"""
    stats = np.array(metric._extract_corpus_statistics(hypotheses, [references]),
                     dtype="float32")
    return np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[idxs]])


def paired_bootstrap(system: list[str], baseline: list[str], references: list[str],
                     names: tuple[str, str] = ("scratch", "baseline"),
                     n_samples: int = N_SAMPLES, seed: int = SEED) -> dict[str, Comparison]:
    """BLEU and chrF of system vs baseline by sacreBLEU's paired bootstrap resampling.

    sacreBLEU gives each system's score and a p-value for the difference, but a confidence
    interval only around each system's own mean, none for the difference. So the interval
    here comes from the same resamples: we redraw sacreBLEU's indices (same seed, same
    generator call), score both systems on each, and take the percentile interval of the
    differences. That they are the same resamples is checked: our resampled mean and interval
    of the system must equal the ones sacreBLEU reports.
    """
    if not len(system) == len(baseline) == len(references) > 0:
        raise NmtError(f"paired bootstrap needs as many hypotheses as references, got "
                       f"{len(system)}, {len(baseline)} and {len(references)} "
                       "(fix: re-run `nmt evaluate` for both runs)")
    metrics = {"BLEU": BLEU(), "chrF": CHRF()}
    with sacrebleu_seed(seed):
        test = PairedTest([(names[1], baseline), (names[0], system)], metrics, [references],
                          test_type="bs", n_samples=n_samples)
        signatures, results = test()
    idxs = resample_indices(len(system), n_samples, seed)
    out = {}
    # PairedTest names its results by the scores' names ("BLEU", "chrF2"), in our order.
    for (label, metric), key in zip(metrics.items(), test.metrics, strict=True):
        base, sys = results[key]
        sys_scores = resampled_scores(metric, system, references, idxs)
        diffs = sys_scores - resampled_scores(metric, baseline, references, idxs)
        if estimate_ci(sys_scores) != (sys.mean, sys.ci):
            raise NmtError(f"our bootstrap resamples differ from sacreBLEU's ({label}: "
                           f"{estimate_ci(sys_scores)} vs {(sys.mean, sys.ci)}) "
                           "(fix: use the sacrebleu version in requirements.txt)")
        low, high = percentile_ci(diffs)
        # sacreBLEU counts resamples with |d*| - mean|d*| > |d| (strictly). When the systems
        # agree on every sentence all of these are 0 and it returns 1/(n+1), calling two
        # identical systems different; nothing can be more extreme than no difference, so 1.
        p = 1.0 if not diffs.any() else float(sys.p_value)
        out[label] = Comparison(
            label, names[0], names[1], sys.score, base.score, sys.score - base.score, low, high,
            p, f"sacreBLEU paired bootstrap, {n_samples} resamples, seed {seed}",
            signature=str(signatures[key]), kind="bootstrap")
    return out


def loss_differences(system: tuple[np.ndarray, np.ndarray], baseline: tuple[np.ndarray,
                     np.ndarray], idxs: np.ndarray) -> np.ndarray:
    """Per-token loss difference (system - baseline) on each resample of sentences; each
    side is (summed loss per sentence, tokens per sentence).  # (n_samples,)"""
    (s_loss, s_tok), (b_loss, b_tok) = system, baseline
    return s_loss[idxs].sum(1) / s_tok[idxs].sum(1) - b_loss[idxs].sum(1) / b_tok[idxs].sum(1)


def loss_bootstrap(system: tuple[Sequence[float], Sequence[int]],
                   baseline: tuple[Sequence[float], Sequence[int]],
                   names: tuple[str, str] = ("scratch", "baseline"),
                   n_samples: int = N_SAMPLES, seed: int = SEED) -> Comparison:
    """Paired bootstrap of the per-token test loss: resample sentences (the same for both
    systems, drawn as for BLEU), loss = summed nats / tokens per system; lower is better."""
    s = tuple(np.asarray(x, dtype=np.float64) for x in system)
    b = tuple(np.asarray(x, dtype=np.float64) for x in baseline)
    if not len(s[0]) == len(s[1]) == len(b[0]) == len(b[1]) > 0:
        raise NmtError("the two runs' loss.tsv files list different numbers of sentences "
                       "(fix: re-run `nmt evaluate` for both runs)")
    s_score, b_score = s[0].sum() / s[1].sum(), b[0].sum() / b[1].sum()
    diffs = loss_differences(s, b, resample_indices(len(s[0]), n_samples, seed))
    low, high = percentile_ci(diffs)
    return Comparison("test loss", names[0], names[1], float(s_score), float(b_score),
                      float(s_score - b_score), low, high,
                      shift_p_value(s_score - b_score, diffs),
                      f"paired bootstrap over sentences, {n_samples} resamples, seed {seed}",
                      higher_is_better=False, kind="bootstrap")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional)."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_critical(df: float, alpha: float = ALPHA) -> float:
    """The t with P(|T| >= t) = alpha, by bisection."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > alpha else (lo, mid)
    return (lo + hi) / 2


def welch(system: Sequence[float], baseline: Sequence[float], metric: str,
          names: tuple[str, str] = ("scratch", "baseline"),
          higher_is_better: bool = True) -> Comparison | None:
    """Welch's t-test on seed scores (mean difference, 95% CI, p); None under 2 seeds a side."""
    s, b = summarize(system), summarize(baseline)
    if s.n < 2 or b.n < 2:
        return None
    diff = s.mean - b.mean
    var_s, var_b = s.std**2 / s.n, b.std**2 / b.n
    se = math.sqrt(var_s + var_b)
    if se == 0.0:  # every seed scored the same on both sides: the difference is exact
        low = high = diff
        p = 1.0 if diff == 0 else 0.0
    else:
        df = (var_s + var_b) ** 2 / (var_s**2 / (s.n - 1) + var_b**2 / (b.n - 1))
        half = t_critical(df) * se
        low, high, p = diff - half, diff + half, t_two_sided_p(diff / se, df)
    return Comparison(metric, names[0], names[1], s.mean, b.mean, diff, low, high, p,
                      f"Welch t-test over seeds, n = {s.n} vs {b.n}",
                      higher_is_better=higher_is_better, kind="seeds")


def format_p(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.3f}" if p >= 0.001 else "< 0.001"


def verdict(c: Comparison, alpha: float = ALPHA, digits: int = 2) -> str:
    """One plain line, e.g. 'scratch - baseline: -0.12 BLEU (95% CI -0.61 .. +0.38,
    p = 0.31): no significant difference'."""
    if c.p >= alpha:
        meaning = "no significant difference"
    else:
        better = c.system if (c.difference > 0) == c.higher_is_better else c.baseline
        meaning = f"{better} is better (significant at {alpha:g})"
    p = format_p(c.p)
    return (f"{c.system} - {c.baseline}: {c.difference:+.{digits}f} {c.metric} (95% CI "
            f"{c.low:+.{digits}f} .. {c.high:+.{digits}f}, p {'' if '<' in p else '= '}{p}): "
            f"{meaning}")


def margin_outcome(c: Comparison, margin: float = LOSS_MARGIN) -> str:
    """Where the difference's 95% interval lies against [-margin, +margin]: "equivalent"
    (inside), "different" (wholly outside) or "undecided" (across an edge)."""
    if -margin <= c.low and c.high <= margin:
        return "equivalent"
    if c.high < -margin or c.low > margin:
        return "different"
    return "undecided"


WHERE = {"equivalent": "lies within", "different": "lies outside", "undecided": "straddles"}
MEANING = {"equivalent": "equivalent within", "different": "different by more than",
           "undecided": "undecided at"}


def loss_verdict(seed_test: Comparison | None, first_bootstrap: Comparison,
                 system: Summary, baseline: Summary, margin: float = LOSS_MARGIN,
                 alpha: float = ALPHA) -> dict:
    """The test-loss verdict of system - baseline in one sentence, and where its interval
    lies against ±margin. With a Welch test over seeds (seed_test) it speaks for the
    architectures; without one (one seed a side) only the first seed's paired bootstrap over
    test sentences speaks, the sentence says that training noise is unmeasured, and the
    outcome is "one seed": an interval of test sentences alone cannot meet the goal."""
    c = seed_test or first_bootstrap
    better = c.system if c.difference < 0 else c.baseline  # lower loss is better
    p = format_p(c.p)
    p = p if "<" in p else f"= {p}"
    interval = margin_outcome(c, margin)
    where = f"the interval {WHERE[interval]} ±{margin:g}"
    figures = (f"(difference {c.difference:+.3f}, 95% CI {c.low:+.3f} .. {c.high:+.3f}, "
               f"{'Welch ' if seed_test else ''}p {p})")
    judged = f"{better} is better" if c.p < alpha else "no significant difference"
    if seed_test is not None:
        sentence = (f"Over {system.n} seeds, {c.system}'s test loss is {system.mean:.3f} ± "
                    f"{system.std:.3f} against {c.baseline}'s {baseline.mean:.3f} ± "
                    f"{baseline.std:.3f} {figures}: {judged}; {where}: "
                    f"{MEANING[interval]} {margin:g}.")
        outcome = interval
    else:
        sentence = (f"One seed ({c.seed}), so training noise is unmeasured and only the paired "
                    f"bootstrap over test sentences speaks: {c.system}'s test loss is "
                    f"{c.system_score:.3f} against {c.baseline}'s {c.baseline_score:.3f} "
                    f"{figures}: {judged} on these sentences; {where}, but whether the "
                    f"architectures are within {margin:g} needs two or more seeds a side.")
        outcome = "one seed"
    return {"system": c.system, "baseline": c.baseline, "metric": c.metric, "basis": c.method,
            "seeds": system.n, "margin": margin, "interval": interval, "outcome": outcome,
            "difference": c.difference, "low": c.low, "high": c.high, "p": c.p,
            "sentence": sentence}
