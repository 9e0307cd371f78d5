"""The project's statistics in one place (numpy, scipy and the standard library only; rank 0).

Rank correlation (:func:`kendall_tau_b`, :func:`spearman_rho`, :func:`correlation`) with **exact**
permutation p-values; the smallest p-value a design can ever give (:func:`min_p_value`: ``2 / n!``
two-sided with ``n`` models and no ties, larger with ties); the pooled permutation test with one
permutation of model labels per group (:func:`grouped_permutation_test`: the settings of one pool
share its models, so they are permuted together); percentile bootstrap CIs over questions
(:func:`bootstrap_cis`, :func:`paired_bootstrap_ci`, :func:`tau_bootstrap`); the cross-fit tau and its
interval (:func:`crossfit_tau`: the taus consistent with the pairwise orders the questions determine,
:func:`tau_bounds`); the verdict entry both the study and a valuation report print (:func:`judge`); the heterogeneity of pooled settings
(:func:`heterogeneity`); the design's power
(:func:`verdict_power`: the verdict itself run on settings :func:`plant_setting` plants); and the valuation
verdicts (:func:`verdict`), which :mod:`crl_envs.sequential` reads at looks.

Valuation verdicts, per setting (or per group of settings, e.g. a pool x method family), from the
**cross-fit** tau (:func:`crossfit_tau`: individual strength on one half of the questions, compositional
strength on the other, halves fixed by a hash of each question id; on the same questions a model's lucky
questions raise both, and copies of one model read as coupled):

- ``untestable`` — tau undefined, a half with fewer than :data:`MIN_QUESTIONS_PER_HALF` questions, or the
  smallest attainable two-sided p exceeds ``alpha`` (3 models: 1/3, 4 models: 1/12): evidence of nothing;
- ``heterogeneous`` — pooled settings disagree (:func:`heterogeneity`: Cochran's Q at ``alpha``, or taus
  beyond the margin on both sides): no pooled verdict;
- ``coupled`` — the exact permutation test rejects at ``alpha`` with a positive tau;
- ``decoupled`` — the ``1 - alpha`` interval of tau (:data:`TAU_INTERVAL`) lies inside ``(-delta, +delta)``
  and has a width: an equivalence test by interval inclusion, not "p >= alpha". A population tau outside
  the margin is called decoupled only when the interval misses it, at most ``alpha`` of the time (the
  interval's one-sided miss is not bounded by ``alpha / 2``, so the level is ``1 - alpha``, not the
  ``1 - 2 alpha`` of a symmetric TOST);
- ``inconclusive`` — anything else (a significant *negative* tau included; the setting says so).

Validated on planted truth played through the real protocols (``tests/test_valuation_crossfit.py``,
6 scripted models, shared questions and shared wrong answers, vote / cascade / judge / routing; alpha =
0.05, delta = 0.3; 200 studies per claim, measured 2026-12-06 on the suite's seeds; the decoupling and
coverage lines re-measured with the 95% interval of #53):

- exchangeable models (accuracy 0.7, 100 questions): cross-fit ``coupled`` 0.015 (vote), 0.015 (cascade),
  0.020 (judge), 0.015 (routing); the same-question tau: 0.56, 0.43, 0.68, 0.66;
- a graded pool (accuracies 0.45 .. 0.95, 200 questions): ``coupled`` 0.955 in vote and cascade against
  0.936 and 0.924 predicted by a separate 1,000-study simulation;
- a planted decoupling (routing; true tau 1/15): at 4,000 questions ``decoupled`` 0.52 (100 studies),
  ``coupled`` 0; at 1,000 questions ``decoupled`` 0 (the 95% interval is about 0.7 wide there);
- the 95% interval covers the true tau in 1.0 of studies (planted decoupling, graded pool); on planted
  truth in paper-small's own tables, 0.98-1.0 at N = 200 and 1,000 (``benchmarks/inference_coverage.py``,
  ``tests/test_inference_calibration.py``), where 90% BC and percentile intervals covered 0.49-0.83 and
  0.29-0.97;
- exchangeable models in vote: ``decoupled`` 0.0, ``inconclusive`` 0.98;
- the pooled test (4 protocols x 2 exchangeable pools, one permutation of labels per pool) holds alpha.

Synthetic tables (``tests/test_study_verdicts.py``, run through :func:`crl_envs.study.stats.valuation_tables`):
``decoupled`` when tau is truly ``>= delta`` at most alpha of the time; copies of one model played
through vote coupled at most alpha + 3 SE by the cross-fit verdict and far more often by the
same-question tau; the pooled test under the null with shared individual vectors holds alpha, the
stratified test does not.

Rank statistics treat values within a relative ``1e-9`` of each other as ties (:func:`snap_ties`), so
Shapley values equal in theory give the same tau, p and verdict on any CPU.

Training verdicts (the section at the end): an exact sign-flip permutation test of paired differences,
a paired t-test over seeds, the bootstrap over seeds then questions that gives a training Δ its CI, and
a ratio of two means with a bootstrap CI only when the denominator's CI lies above 0 (else the difference
with its CI, and why).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from crl_kit.errors import ConfigError

EXACT_PERMUTATION_LIMIT = 8
"""Rank-correlation p-values enumerate all n! orderings up to this many models (8! = 40320)."""
VERDICTS = ("coupled", "decoupled", "heterogeneous", "untestable", "inconclusive")
DEFAULT_DELTA = 0.3
"""The equivalence margin of ``decoupled``: |tau| < 0.3 means individual strength orders a pair of models
the same way as compositional strength at most 65% of the time (``(1 + tau) / 2``), barely better than a
coin."""
_EPS = 1e-12
TIE_DIGITS = 9
"""Values within a relative ``10**-TIE_DIGITS`` of their vector's largest magnitude rank as ties
(:func:`snap_ties`): Shapley values equal in theory differ in their last bits from CPU to CPU."""


# ---------------------------------------------------------------------- rank correlation
def snap_ties(v: np.ndarray) -> np.ndarray:
    """``v`` rounded, along its last axis, to a grid of ``10**-TIE_DIGITS`` times the row's largest
    magnitude, so that values equal up to floating-point error are equal (and rank as ties) on any CPU;
    ranks of values further apart are unchanged. NaN stays NaN."""
    v = np.asarray(v, float)
    if v.size == 0:
        return v
    with warnings.catch_warnings():  # an all-NaN row has no scale
        warnings.simplefilter("ignore", RuntimeWarning)
        scale = np.nanmax(np.abs(v), axis=-1, keepdims=True)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return np.round(v / scale, TIE_DIGITS) * scale


def _sign_matrix(v: np.ndarray) -> np.ndarray:
    return np.sign(v[..., :, None] - v[..., None, :])


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of ``x`` against each row of ``y`` (``(..., n)``; ``x`` may be batched the same
    way); NaN when either is constant. Values equal within :func:`snap_ties`'s tolerance are ties."""
    x, y = snap_ties(x), snap_ties(y)
    sx, sy = _sign_matrix(x), _sign_matrix(y)
    s = (sx * sy).sum(axis=(-1, -2)) / 2
    tx = (sx != 0).sum(axis=(-1, -2)) / 2  # pairs not tied in x
    ty = (sy != 0).sum(axis=(-1, -2)) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / np.sqrt(tx * ty)


def spearman_rho(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho (Pearson of average ranks) of ``x`` against each row of ``y`` (ties as in
    :func:`snap_ties`)."""
    rx = stats.rankdata(snap_ties(x))
    ry = stats.rankdata(snap_ties(y), axis=-1)
    rx, ry = rx - rx.mean(), ry - ry.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ry * rx).sum(-1) / np.sqrt((rx**2).sum() * (ry**2).sum(-1))


STATISTICS = {"kendall": kendall_tau_b, "spearman": spearman_rho}


@functools.lru_cache(maxsize=16)
def _permutations(n: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(n))), dtype=np.int64).reshape(-1, n)


@functools.lru_cache(maxsize=64)
def _inversions(n: int) -> tuple[int, ...]:
    """How many of the ``n!`` orderings have ``k`` inversions, ``k = 0 .. n(n-1)/2`` (Mahonian numbers)."""
    counts = [1]
    for m in range(2, n + 1):
        new = [0] * (len(counts) + m - 1)
        for k, c in enumerate(counts):
            for j in range(m):
                new[k + j] += c
        counts = new
    return tuple(counts)


@functools.lru_cache(maxsize=16)
def _spearman_null(n: int) -> np.ndarray:
    """Spearman's rho over all ``n!`` orderings of untied values (the null depends on ``n`` alone)."""
    return spearman_rho(np.arange(n), _permutations(n))


def _kendall_null_no_ties(n: int) -> dict[float, float]:
    """Kendall's tau over all orderings of ``n`` untied values: ``value -> probability``."""
    counts = np.array(_inversions(n), dtype=float)
    taus = np.round(1 - 2 * np.arange(len(counts)) / (n * (n - 1) / 2), 9)
    out: dict[float, float] = {}
    for t, c in zip(taus.tolist(), (counts / counts.sum()).tolist()):
        out[t] = out.get(t, 0.0) + c
    return out


def _kendall_exact_no_ties(n: int, observed: float) -> float:
    """Two-sided exact p of tau-b = ``observed`` with ``n`` untied models: ``P(|T| >= |t|)``."""
    counts = np.array(_inversions(n), dtype=float)
    pairs = n * (n - 1) / 2
    taus = 1 - 2 * np.arange(len(counts)) / pairs
    return float(counts[np.abs(taus) >= abs(observed) - _EPS].sum() / counts.sum())


def permutation_null(x: np.ndarray, y: np.ndarray, statistic: str = "kendall", draws: int = 20000,
                     seed: int = 0) -> tuple[np.ndarray, bool]:
    """The statistic over every ordering of ``y`` against ``x`` (``n <= 8``), else over ``draws``
    random orderings. Returns ``(values, exact)``."""
    y = np.asarray(y, float)
    n = len(y)
    if n <= EXACT_PERMUTATION_LIMIT:  # the values over all orderings depend on the two tie patterns alone
        return _exact_null(statistic, tuple(np.sort(stats.rankdata(x)).tolist()),
                           tuple(np.sort(stats.rankdata(y)).tolist())), True
    rng = np.random.default_rng(seed)
    perms = np.stack([rng.permutation(n) for _ in range(draws)])
    return STATISTICS[statistic](x, y[perms]), False


@functools.lru_cache(maxsize=256)  # at most 256 x 8! values (83 MB)
def _exact_null(statistic: str, x_ranks: tuple[float, ...], y_ranks: tuple[float, ...]) -> np.ndarray:
    """The statistic of ``x_ranks`` against every ordering of ``y_ranks`` (read-only, cached)."""
    values = STATISTICS[statistic](np.array(x_ranks), np.array(y_ranks)[_permutations(len(y_ranks))])
    values.setflags(write=False)
    return values


def _tail_at_max(null: np.ndarray) -> float:
    """The share of the null at its most extreme ``|value|``: the smallest two-sided p it can give."""
    a = np.abs(null[~np.isnan(null)])
    return float(np.mean(np.abs(null) >= a.max() - _EPS)) if a.size else 1.0


def min_p_value(n: int, x: Sequence[float] | None = None, y: Sequence[float] | None = None,
                statistic: str = "kendall") -> float:
    """The smallest two-sided permutation p-value any ordering could give ``n`` models: ``2 / n!`` with
    no ties (1/3 at n = 3, 1/12 at n = 4, 1/60 at n = 5, 1/20160 at n = 8). With the observed values
    ``x`` and ``y`` their ties count: the share of orderings at the null's most extreme value (exact up to
    :data:`EXACT_PERMUTATION_LIMIT` models, a Monte Carlo estimate above). 1.0 when either is constant.

    Raises:
        ValueError: ``n < 1``, or ``x`` / ``y`` not of length ``n``.
    """
    if n < 1:
        raise ConfigError(f"min_p_value needs n >= 1 models, got {n}")
    if x is None or y is None:
        return 1.0 if n < 2 else min(1.0, 2 / math.factorial(n))
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != (n,) or y.shape != (n,):
        raise ConfigError(f"min_p_value: x and y must have n = {n} values, got shapes {x.shape} and {y.shape}")
    x, y = snap_ties(x), snap_ties(y)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return 1.0
    if len(set(x)) == n and len(set(y)) == n and statistic == "kendall":
        return min_p_value(n)
    return _tail_at_max(permutation_null(x, y, statistic)[0])


@dataclass
class Correlation:
    """A rank correlation with its permutation p-value (two-sided: ``P(|T| >= |t|)`` under
    exchangeability of the models' orderings) and ``min_p``, the smallest p-value these models could
    give (ties included; ``None``: ``2 / n!``)."""

    statistic: str
    value: float
    p_value: float
    exact: bool
    n: int
    min_p: float | None = None

    @property
    def min_p_value(self) -> float:
        """The smallest p-value any ordering of these models could give: ``2 / n!`` without ties."""
        return min_p_value(self.n) if self.min_p is None else self.min_p


def correlation(x: Sequence[float], y: Sequence[float], statistic: str = "kendall", seed: int = 0) -> Correlation:
    """Rank correlation of ``x`` and ``y`` with its exact permutation p-value (every ordering up to 8
    models; Kendall's tau without ties exactly at any ``n``; else Monte Carlo).

    Example:
        >>> c = correlation([1, 2, 3], [1, 2, 3])
        >>> round(c.value, 3), round(c.p_value, 4), round(c.min_p_value, 4)   # n = 3: p never below 1/3
        (1.0, 0.3333, 0.3333)

    Raises:
        ValueError: an unknown statistic, or inputs that are not two 1-d sequences of equal length.
    """
    if statistic not in STATISTICS:
        raise ConfigError(f"unknown statistic {statistic!r}; choose one of {sorted(STATISTICS)}")
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1:
        raise ConfigError(f"correlation needs two 1-d sequences of equal length, got shapes {x.shape} and {y.shape}")
    x, y = snap_ties(x), snap_ties(y)
    n = len(x)
    observed = float(STATISTICS[statistic](x, y))
    if n < 2 or math.isnan(observed):  # a constant ranking carries no information
        return Correlation(statistic, float("nan"), float("nan"), True, n, 1.0)
    untied = len(set(x)) == n and len(set(y)) == n
    if statistic == "kendall" and untied:
        return Correlation(statistic, observed, _kendall_exact_no_ties(n, observed), True, n, min_p_value(n))
    if statistic == "spearman" and untied and n <= EXACT_PERMUTATION_LIMIT:
        null = _spearman_null(n)
        return Correlation(statistic, observed, float(np.mean(np.abs(null) >= abs(observed) - _EPS)), True, n,
                           _tail_at_max(null))
    null, exact = permutation_null(x, y, statistic, seed=seed)
    hits = int(np.sum(np.abs(null) >= abs(observed) - _EPS))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    return Correlation(statistic, observed, p, exact, n, _tail_at_max(null))


# ---------------------------------------------------------------------- the pooled test
def _distribution(values: np.ndarray) -> dict[float, float]:
    keys, counts = np.unique(np.round(values, 9), return_counts=True)
    return dict(zip(keys.tolist(), (counts / counts.sum()).tolist()))


def _convolve(a: dict[float, float], b: dict[float, float], limit: int) -> dict[float, float] | None:
    if len(a) * len(b) > 50 * limit:
        return None
    out: dict[float, float] = {}
    for va, pa in a.items():
        for vb, pb in b.items():
            k = round(va + vb, 9)
            out[k] = out.get(k, 0.0) + pa * pb
        if len(out) > limit:
            return None
    return out


def _tail(values: np.ndarray, observed: float, alternative: str) -> np.ndarray:
    eps = 1e-9
    if alternative == "greater":
        return values >= observed - eps
    if alternative == "less":
        return values <= observed + eps
    return np.abs(values) >= abs(observed) - eps


def grouped_permutation_test(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], groups: Sequence[Any] | None = None,
                             *, statistic: str = "kendall", alternative: str = "two-sided", draws: int = 100_000,
                             seed: int = 0, exact: bool | None = None, max_support: int = 1_000_000) -> dict[str, Any]:
    """Permutation test of the sum over settings of ``statistic(x_s, y_s)``, permuting model labels
    **once per group**: the settings of one group (one pool: the same models, often the same individual
    vector) get the same ordering, groups independent ones. With one group per setting this is the
    stratified test; with shared models it stays calibrated where the stratified test is not.

    Exact (each group's null over all ``n!`` orderings, convolved across groups) when every group has
    ``<= 8`` models and the support stays under ``max_support``; else ``draws`` Monte Carlo draws, p =
    ``(k + 1) / (draws + 1)`` with a Clopper-Pearson 95% interval.

    Returns:
        ``{"observed", "p_value", "exact", "draws", "p_interval", "min_p_value"}``.

    Raises:
        ValueError: unknown statistic or alternative, no pairs, or a group whose settings differ in size.
    """
    if statistic not in STATISTICS:
        raise ConfigError(f"unknown statistic {statistic!r}; choose one of {sorted(STATISTICS)}")
    if alternative not in ("two-sided", "greater", "less"):
        raise ConfigError(f"unknown alternative {alternative!r}; choose one of two-sided, greater, less")
    if not pairs:
        raise ConfigError("grouped_permutation_test needs at least one (x, y) pair")
    groups = list(range(len(pairs))) if groups is None else list(groups)
    if len(groups) != len(pairs):
        raise ConfigError(f"got {len(groups)} group labels for {len(pairs)} settings")
    members: dict[Any, list[tuple[np.ndarray, np.ndarray]]] = {}
    for g, (x, y) in zip(groups, pairs):
        members.setdefault(g, []).append((np.asarray(x, float), np.asarray(y, float)))
    for g, ps in members.items():
        if len({len(x) for x, _ in ps}) != 1:
            raise ConfigError(f"group {g!r}: its settings have different numbers of models "
                             f"{sorted({len(x) for x, _ in ps})}; one permutation of labels needs the same models")
    f = STATISTICS[statistic]
    observed = float(sum(f(x, y) for x, y in itertools.chain.from_iterable(members.values())))
    small = all(len(ps[0][0]) <= EXACT_PERMUTATION_LIMIT for ps in members.values())
    if exact is True and not small:
        raise ConfigError(f"exact=True needs every group to have <= {EXACT_PERMUTATION_LIMIT} models")
    dist: dict[float, float] | None = None
    if exact is not False and small:
        dist = {0.0: 1.0}
        for ps in members.values():
            (x0, y0), n0 = ps[0], len(ps[0][0])
            if len(ps) == 1 and statistic == "kendall" and len(set(x0)) == n0 == len(set(y0)):
                group_dist = _kendall_null_no_ties(n0)  # one untied setting: the Mahonian numbers
            else:
                perms = _permutations(n0)
                group_dist = _distribution(sum(f(x, y[perms]) for x, y in ps))
            dist = _convolve(dist, group_dist, max_support)
            if dist is None:
                break
    if dist is not None:
        support, probs = np.array(list(dist)), np.array(list(dist.values()))
        p = float(min(1.0, probs[_tail(support, observed, alternative)].sum()))
        extreme = {"greater": support.max(), "less": support.min()}.get(alternative, np.abs(support).max())
        min_p = float(min(1.0, probs[_tail(support, extreme, alternative)].sum()))
        return {"observed": observed, "p_value": p, "exact": True, "draws": None, "p_interval": (p, p),
                "min_p_value": min_p}
    rng = np.random.default_rng(seed)
    total = np.zeros(draws)
    for ps in members.values():
        perms = rng.permuted(np.tile(np.arange(len(ps[0][0])), (draws, 1)), axis=1)
        for x, y in ps:
            total += f(x, y[perms])
    hits = int(_tail(total, observed, alternative).sum())
    p = (hits + 1) / (draws + 1)
    ci = stats.binomtest(hits, draws).proportion_ci(confidence_level=0.95, method="exact")
    min_p = float(np.prod([1 / math.factorial(len(ps[0][0])) for ps in members.values()]))
    return {"observed": observed, "p_value": p, "exact": False, "draws": draws,
            "p_interval": (float(ci.low), float(ci.high)),
            "min_p_value": min(1.0, min_p * (2 if alternative == "two-sided" else 1))}


# ---------------------------------------------------------------------- bootstrap over questions
def question_resamples(questions: int, resamples: int, seed: int = 0) -> np.ndarray:
    """``(resamples, questions)`` question indices drawn with replacement: the same for every table of
    ``questions`` questions and ``seed``, so settings on the same questions are resampled together."""
    return np.random.default_rng([seed, questions]).integers(0, questions, size=(resamples, questions))


def tau_bootstrap(x: np.ndarray, y: np.ndarray, *, resamples: int = 2000, seed: int = 0) -> np.ndarray:
    """Kendall tau-b between per-model means of ``x`` and ``y`` (``(models, questions)`` tables on the
    same questions) under :func:`question_resamples`: ``(resamples,)``, NaN where a resample's ranking is
    constant. The models are fixed: the spread is the questions' sampling error only."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 2:
        raise ConfigError(f"tau_bootstrap needs two (models, questions) tables of one shape, got {x.shape} and {y.shape}")
    weights = _resample_weights(x.shape[1], resamples, seed)
    # einsum's own loop, not BLAS: a BLAS thread pool on a busy machine is 40x slower for these sizes
    means = [np.einsum("mq,qr->rm", t, weights, optimize=False) for t in (x, y)]
    return kendall_tau_b(*means)


@functools.lru_cache(maxsize=32)
def _resample_weights(questions: int, resamples: int, seed: int) -> np.ndarray:
    """``(questions, resamples)``: how often each question is drawn in :func:`question_resamples`, over
    ``questions``, so that ``table @ weights`` are the resampled means."""
    idx = question_resamples(questions, resamples, seed)
    flat = (idx + questions * np.arange(resamples)[:, None]).ravel()
    counts = np.bincount(flat, minlength=resamples * questions).reshape(resamples, questions)
    return counts.T / questions


def percentile_ci(boots: np.ndarray, level: float) -> list[float] | None:
    """The central ``level`` percentile interval ``[lo, hi]`` of the non-NaN resamples; ``None`` when over
    half are NaN."""
    b = np.asarray(boots, float)
    b = b[~np.isnan(b)]
    if b.size * 2 < np.asarray(boots).size or b.size == 0:
        return None
    a = (1 - level) / 2
    return [float(np.quantile(b, a)), float(np.quantile(b, 1 - a))]


# ---------------------------------------------------------------------- cross-fitting
MIN_QUESTIONS_PER_HALF = 10
"""No valuation verdict with fewer questions than this in either cross-fit half (20 questions in all,
about): below it a tau rests on a handful of questions and its interval on fewer distinct resamples."""


def crossfit_halves(example_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(individual, compositional)`` question indices: each question's half decided by a hash of its id
    alone (SHA-256 of ``"crossfit:" + id``, low bit), fixed before any answer is seen. A question is on the
    same side in every setting that asks it, so a pool's individual half never shares a question with any
    of its settings' compositional halves: under exchangeable models every individual vector is
    independent of every compositional one, and one permutation of labels per pool stays exact."""
    side = np.array([hashlib.sha256(f"crossfit:{q}".encode()).digest()[-1] & 1 for q in example_ids], dtype=bool)
    return np.flatnonzero(~side), np.flatnonzero(side)


@dataclass(frozen=True)
class OrderBand:
    """Which pairwise orders of model means one set of questions determines, with the family-wise error
    controlled: ``diff`` and ``se`` per pair (models ``i < j``, ``np.triu_indices`` order) and ``t_star``,
    per pair that some question separates (``se > 0``) and per question resample, ``|resampled diff - diff| / se``.

    :meth:`signs` runs the step-down max-t procedure (Westfall & Young 1993; Romano & Wolf 2005): pairs by
    decreasing ``|diff| / se``; the k-th is ordered when it exceeds the ``coverage`` quantile of the largest
    resampled statistic among the pairs from the k-th on; the first that does not stops the walk, and it and
    every pair after it stay undetermined (0). A pair that no question separates is never ordered (the
    questions not drawn may separate it)."""

    diff: np.ndarray
    se: np.ndarray
    t_star: np.ndarray

    def signs(self, coverage: float) -> np.ndarray:
        """``+1`` / ``-1`` for each pair whose order is determined at family-wise ``coverage``, else ``0``."""
        out = np.zeros(len(self.diff))
        moved = np.flatnonzero(self.se > 0)
        if moved.size == 0:
            return out
        t = np.abs(self.diff[moved]) / self.se[moved]
        order = np.argsort(-t, kind="stable")
        tail_max = np.maximum.accumulate(self.t_star[order][::-1], axis=0)[::-1]  # max over ranks >= k
        critical = np.quantile(tail_max, coverage, axis=1)
        passed = t[order] > critical
        stop = int(np.argmin(passed)) if not passed.all() else len(order)
        chosen = moved[order[:stop]]
        out[chosen] = np.sign(self.diff[chosen])
        return out


def order_band(table: np.ndarray, weights: np.ndarray) -> OrderBand:
    """The :class:`OrderBand` of a ``(models, questions)`` table under question-resample ``weights``
    (``(questions, resamples)``, as :func:`question_resamples` draws them)."""
    t = np.asarray(table, float)
    i, j = np.triu_indices(t.shape[0], 1)
    d = t[i] - t[j]  # (pairs, questions)
    diff = d.mean(axis=1)
    se = d.std(axis=1, ddof=1) / math.sqrt(t.shape[1]) if t.shape[1] > 1 else np.zeros(len(i))
    se = np.where(se > _EPS, se, 0.0)
    moved = se > 0
    boots = np.einsum("pq,qr->pr", d[moved], weights, optimize=False)
    return OrderBand(diff, se, np.abs(boots - diff[moved, None]) / se[moved, None])


def tau_bounds(x_signs: Sequence[np.ndarray], y_signs: Sequence[np.ndarray]) -> list[float]:
    """``[low, high]``: the smallest and largest mean Kendall tau-b, over settings ``k``, that population
    orderings agreeing with every determined pair of ``x_signs[k]`` and ``y_signs[k]`` can have
    (:meth:`OrderBand.signs`). An undetermined pair may be concordant, discordant or tied: a bound takes each
    undetermined pair at its extreme and the fewest untied pairs in the denominator, so the interval holds
    every consistent tau-b (and may hold more: transitivity is not used).

    Example:
        >>> tau_bounds([np.array([1.0, 1.0, 1.0])], [np.array([1.0, 1.0, 0.0])])  # 2 of 3 pairs ordered alike
        [0.3333333333333333, 1.0]
    """
    lows, highs = [], []
    for sx, sy in zip(x_signs, y_signs):
        pairs = len(sx)
        both = (sx != 0) & (sy != 0)
        s, free = float(np.sum(sx[both] * sy[both])), pairs - int(both.sum())
        den = math.sqrt(max(int(np.sum(sx != 0)), 1) * max(int(np.sum(sy != 0)), 1))
        hi, lo = s + free, s - free
        highs.append(min(1.0, hi / den if hi > 0 else hi / pairs))
        lows.append(max(-1.0, lo / den if lo < 0 else lo / pairs))
    return [float(np.mean(lows)), float(np.mean(highs))]


TAU_INTERVAL = ("the Kendall tau-b values of the models' population means consistent with every pairwise order the "
                "questions determine (step-down bootstrap max-t over the pairwise differences of model means on each "
                "half, family-wise; a pair not determined taken at its extremes): coverage at least its level by "
                "construction, measured in benchmarks/inference_coverage.py")


def crossfit_tau(individual: np.ndarray, compositional: np.ndarray, example_ids: Sequence[str], *,
                 level: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Kendall tau-b of individual strength, measured on one half of the questions
    (:func:`crossfit_halves`), against compositional strength, measured on the other half, with its
    exact permutation p-value and a ``level`` interval for the tau of the models' population means
    (:data:`TAU_INTERVAL`; each half's band at simultaneous coverage ``sqrt(level)``: the halves are
    independent, so both hold with probability ``level``).

    Why not a bootstrap interval around the estimate: question noise shrinks the tau of sample means toward 0
    (attenuation), by more than the interval's width when models are close, and a bootstrap reproduces the
    spread, not the bias: on planted truth in paper-small's tables the 90% BC and percentile intervals covered
    the planted tau in 0.49-0.83 and 0.29-0.97 of studies at N = 200 and 1,000 (benchmarks/inference_coverage.py). The order bounds assume nothing about the
    spacing: they are wide when the models are close, which is what the questions can say.

    Why a fixed split and not K-fold: on disjoint questions a model's lucky questions cannot raise both
    its measures, so under exchangeable models the two vectors are independent and the ordinary exact
    permutation test holds its level; averaging the two directions (or K folds) would pair each
    compositional half with an individual half that shares questions with the other fold's, and the test
    would need its own null. One split costs half the questions on each side; it is the price of an
    exact test.

    Args:
        individual, compositional: ``(models, questions)`` per-question tables on ``example_ids``.

    Returns:
        ``{"kendall_tau", "p_value", "min_p_value", "questions": [individual half, compositional half],
        "tau_ci", "tau_ci_level", "undefined" (why there is no interval, else None), "nan_resamples",
        "resamples", "x", "y", "boots", "bands"}`` (``x``, ``y``: the two halves' model means; ``boots``: the
        resampled taus, NaN kept, for :func:`heterogeneity`; ``bands``: the halves' :class:`OrderBand`).

    Raises:
        ValueError: tables of different shapes, or ids that do not match their questions.
    """
    x, y = np.asarray(individual, float), np.asarray(compositional, float)
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != len(example_ids):
        raise ConfigError(f"crossfit_tau needs two (models, questions) tables of one shape with one id per question, "
                          f"got {x.shape}, {y.shape} and {len(example_ids)} ids")
    ind, comp = crossfit_halves(example_ids)
    out: dict[str, Any] = {"questions": [int(ind.size), int(comp.size)], "resamples": resamples,
                           "tau_ci_level": level}
    if min(ind.size, comp.size) == 0:
        return {**out, "kendall_tau": None, "p_value": None, "min_p_value": 1.0, "tau_ci": None,
                "undefined": "a cross-fit half has no question", "nan_resamples": 0, "x": None, "y": None,
                "boots": None, "bands": None}
    xa, yb = x[:, ind], y[:, comp]
    xm, ym = xa.mean(axis=1), yb.mean(axis=1)
    c = correlation(xm, ym)
    wa = _resample_weights(ind.size, resamples, seed)
    wb = _resample_weights(comp.size, resamples, seed + 1)
    boots = kendall_tau_b(np.einsum("mq,qr->rm", xa, wa, optimize=False),
                          np.einsum("mq,qr->rm", yb, wb, optimize=False))
    bands = (order_band(xa, wa), order_band(yb, wb))
    value = None if math.isnan(c.value) else c.value
    ci, why = None, None
    if value is None:
        why = "tau undefined: a ranking is constant"
    elif min(ind.size, comp.size) < MIN_QUESTIONS_PER_HALF:
        why = f"fewer than {MIN_QUESTIONS_PER_HALF} questions in a cross-fit half"
    else:
        half = math.sqrt(level)
        ci = tau_bounds([bands[0].signs(half)], [bands[1].signs(half)])
    return {**out, "kendall_tau": value, "p_value": None if value is None else c.p_value,
            "min_p_value": c.min_p_value, "tau_ci": ci, "undefined": why, "nan_resamples": int(np.isnan(boots).sum()),
            "x": xm, "y": ym, "boots": boots, "bands": bands}


def pooled_tau_bounds(bands: Sequence[tuple[OrderBand, OrderBand]], pools: Sequence[Any], level: float) -> list[float]:
    """The ``level`` interval of the mean population tau over settings (:func:`tau_bounds`): settings of one
    pool share their individual half's band (counted once); every distinct band at simultaneous coverage
    ``1 - (1 - level) / bands`` (Bonferroni), so that all hold together with probability at least ``level``."""
    x_by_pool: dict[Any, OrderBand] = {}
    for (bx, _), pool in zip(bands, pools):
        x_by_pool.setdefault(pool, bx)
    coverage = 1 - (1 - level) / (len(x_by_pool) + len(bands))
    return tau_bounds([x_by_pool[p].signs(coverage) for p in pools], [by.signs(coverage) for _, by in bands])


def judge(tau: float | None, p: float | None, min_p: float, ci: Sequence[float] | None, *, alpha: float,
          delta: float, level: float, questions: Sequence[int] | None = None, heterogeneous: bool = False,
          undefined: str | None = None) -> dict[str, Any]:
    """The verdict entry that the study and :meth:`crl_envs.valuation.ValuationReport.verdict` both print:
    ``{"kendall_tau", "p_value", "min_p_value", "tau_ci", "tau_ci_level", "verdict"}``, with ``"undefined"``
    (why there is no interval) and a ``"note"`` where the verdict needs one. ``ci`` is the ``level``
    interval of tau; ``decoupled`` needs it inside the margin, so its false rate is at most ``1 - level``."""
    tau = None if tau is None or (isinstance(tau, float) and math.isnan(tau)) else float(tau)
    out = {"kendall_tau": tau, "p_value": None if p is None or math.isnan(p) else float(p),
           "min_p_value": float(min_p), "tau_ci": None if ci is None or tau is None else [float(c) for c in ci],
           "tau_ci_level": level,
           "verdict": verdict(tau, p, min_p, ci, alpha=alpha, delta=delta, questions=questions,
                              heterogeneous=heterogeneous)}
    if out["tau_ci"] is None:
        out["undefined"] = undefined or ("tau undefined: a ranking is constant" if tau is None else "no interval")
    if questions is not None and min(questions) < MIN_QUESTIONS_PER_HALF:
        out["note"] = (f"cross-fit halves of {questions[0]} and {questions[1]} questions: fewer than "
                       f"{MIN_QUESTIONS_PER_HALF} in a half, no verdict")
    elif out["verdict"] == "inconclusive" and p is not None and p <= alpha and tau is not None and tau < 0:
        out["note"] = "significant negative tau: individual strength predicts compositional strength inversely"
    return out


def heterogeneity(taus: Sequence[float], boots: Sequence[np.ndarray], *, alpha: float = 0.05,
                  delta: float = DEFAULT_DELTA) -> dict[str, Any]:
    """Do settings pooled together agree? Cochran's Q of their taus (weights: 1 / bootstrap variance;
    settings with no spread left out of Q), chi-square with ``k - 1`` df, and whether settings lie beyond the
    margin on both sides (some ``tau >= delta``, some ``tau <= -delta``). ``heterogeneous`` when either:
    then no pooled verdict (a +1 and a -1 must not average to "decoupled"). Settings of one pool share
    their individual vector, so their taus correlate positively and Q is conservative (exchangeable models,
one pool x vote / cascade / judge / routing, 100 questions: heterogeneous in 0.01 of 200 studies).

    Returns:
        ``{"q", "df", "p_value", "opposite", "heterogeneous"}`` (``q``/``p_value`` ``None`` with < 2 usable settings).
    """
    t = np.asarray(taus, float)
    var = np.array([np.nanvar(np.asarray(b, float), ddof=1) if np.sum(~np.isnan(b)) > 1 else np.nan for b in boots])
    use = np.isfinite(t) & np.isfinite(var) & (var > 0)
    q = p = None
    if use.sum() >= 2:
        w = 1 / var[use]
        mean = float(np.sum(w * t[use]) / w.sum())
        q = float(np.sum(w * (t[use] - mean) ** 2))
        p = float(stats.chi2.sf(q, int(use.sum()) - 1))
    finite = t[np.isfinite(t)]
    opposite = bool(finite.size and finite.max() >= delta and finite.min() <= -delta)
    return {"q": q, "df": int(use.sum()) - 1, "p_value": p, "opposite": opposite,
            "heterogeneous": opposite or (p is not None and p <= alpha)}


def check_ci_options(level: Any, resamples: Any) -> None:
    """One-line errors for a CI level outside (0, 1) or a resample count that is not an int >= 1."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0 < level < 1:
        hint = f" (a fraction: {level / 100:g} for {level:g}%)" if isinstance(level, (int, float)) and 1 < level < 100 else ""
        raise ConfigError(f"ci_level must be a number in (0, 1), e.g. 0.95, got {level!r}{hint}")
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise ConfigError(f"bootstrap_resamples must be an int >= 1, e.g. 2000, got {resamples!r}")


def bootstrap_cis(tables: Mapping[str, np.ndarray], *, resamples: int = 2000, level: float = 0.95,
                  seed: int = 0, draws: Mapping[str, np.ndarray | None] | None = None) -> dict[str, np.ndarray]:
    """Percentile CIs of per-model means, resampling questions (the same resamples for every
    measure, so measures stay paired). Returns ``name -> (models, 2)``.

    A measure with Monte Carlo ``draws[name]`` (``(models, draws)``) has two independent sources of error:
    the questions and the sampled permutations. Its CI is ``estimate ± t(df) * sqrt(var_q + var_mc)``:
    ``var_q`` the variance of the question-resampled means (permutations fixed), ``var_mc = s^2 / draws``
    the Monte Carlo variance from the spread of the draws, and ``df`` Welch-Satterthwaite's
    (``questions - 1`` and ``draws - 1`` degrees of freedom), so that a budget of a few permutations gets
    the wide interval it needs.

    Raises:
        ValueError: a bad level or resample count, or draws not shaped ``(models, >= 2)``.
    """
    check_ci_options(level, resamples)
    q = next(iter(tables.values())).shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, q, size=(resamples, q))
    alpha = (1 - level) / 2
    out = {}
    for name, table in tables.items():
        means = table[:, idx].mean(axis=-1)  # (models, resamples)
        mc = None if draws is None else draws.get(name)
        if mc is None:
            out[name] = np.quantile(means, [alpha, 1 - alpha], axis=1).T
            continue
        mc = np.asarray(mc, float)
        if mc.ndim != 2 or mc.shape[0] != table.shape[0] or mc.shape[1] < 2:
            raise ConfigError(f"{name}: Monte Carlo draws must be (models, >= 2 draws), got shape {mc.shape}")
        var_q = means.var(axis=1, ddof=1)
        var_mc = mc.var(axis=1, ddof=1) / mc.shape[1]
        total = var_q + var_mc
        with np.errstate(invalid="ignore", divide="ignore"):
            df = total**2 / (var_q**2 / max(q - 1, 1) + var_mc**2 / (mc.shape[1] - 1))
        half = np.where(total > 0, stats.t.ppf(1 - alpha, np.where(total > 0, df, 1.0)) * np.sqrt(total), 0.0)
        estimate = table.mean(axis=1)
        out[name] = np.stack([estimate - half, estimate + half], axis=1)
    return out


class PairedCI(tuple):
    """``(delta, low, high)``: mean of ``after - before`` and its bootstrap CI, as fractions; unpacks as a
    3-tuple. ``str()`` reads in points: ``+15.3 points, 95% CI [+11.5, +19.0] (400 questions)``."""

    def __new__(cls, delta: float, low: float, high: float, *, level: float = 0.95, n: int = 0):
        obj = super().__new__(cls, (float(delta), float(low), float(high)))
        obj.level, obj.n = level, n
        return obj

    delta = property(lambda self: self[0])
    low = property(lambda self: self[1])
    high = property(lambda self: self[2])

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return (f"{100 * self.delta:+.1f} points, {100 * self.level:g}% CI [{100 * self.low:+.1f}, "
                f"{100 * self.high:+.1f}] ({self.n} questions)")

    def __repr__(self) -> str:
        return f"PairedCI(delta={self.delta:.4f}, low={self.low:.4f}, high={self.high:.4f}, level={self.level}, n={self.n})"


def paired_bootstrap_ci(before: Sequence[float], after: Sequence[float], *, n_boot: int = 10_000, seed: int = 0,
                        level: float = 0.95) -> PairedCI:
    """Mean of ``after - before`` over questions and its percentile bootstrap CI (questions resampled).

    ``before[q]`` and ``after[q]`` must score the same question ``q``: equal-length 1-D vectors.

    Raises:
        ValueError: vectors of different lengths or empty, or a level outside (0, 1).
    """
    before, after = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if before.ndim != 1 or after.ndim != 1 or before.size == 0 or before.size != after.size:
        raise ConfigError(
            f"paired_bootstrap_ci needs two equal-length, non-empty per-question score vectors (question q in both); "
            f"got shapes {before.shape} and {after.shape}: evaluate both on the same questions"
        )
    if not 0 < level < 1:
        raise ConfigError(f"level must be in (0, 1) (0.95 for a 95% CI), got {level!r}")
    diff = after - before
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(n_boot, diff.size))].mean(axis=1)
    alpha = (1 - level) / 2
    return PairedCI(diff.mean(), np.quantile(means, alpha), np.quantile(means, 1 - alpha), level=level, n=diff.size)


# --- valuation verdicts ---
def verdict(tau: float | None, p_value: float | None, min_p: float, ci: Sequence[float] | None, *,
            alpha: float = 0.05, delta: float = DEFAULT_DELTA, questions: Sequence[int] | None = None,
            heterogeneous: bool = False) -> str:
    """One of :data:`VERDICTS` for an observed tau (see the module docstring): ``untestable`` when tau is
    undefined or a cross-fit half has fewer than :data:`MIN_QUESTIONS_PER_HALF` ``questions``;
    ``heterogeneous`` when pooled settings disagree (:func:`heterogeneity`); ``untestable`` when
    ``min_p > alpha``; ``coupled`` when ``p <= alpha``
    and ``tau > 0``; ``decoupled`` when the ``1 - alpha`` interval of tau lies strictly inside ``(-delta, delta)``
    and has a width (a zero-width interval is no evidence of precision); else ``inconclusive``.

    Raises:
        ValueError: ``alpha`` or ``delta`` outside (0, 1).
    """
    if not 0 < alpha < 1 or not 0 < delta < 1:
        raise ConfigError(f"verdict needs alpha and delta in (0, 1), got alpha={alpha!r}, delta={delta!r}")
    if tau is None or p_value is None or math.isnan(tau):
        return "untestable"
    if questions is not None and min(questions) < MIN_QUESTIONS_PER_HALF:
        return "untestable"
    if heterogeneous:  # settings that disagree say so, whatever the pooled test's floor
        return "heterogeneous"
    if min_p > alpha:
        return "untestable"
    if p_value <= alpha and tau > 0:
        return "coupled"
    if ci is not None and -delta < ci[0] and ci[1] < delta and ci[1] - ci[0] > _EPS:
        return "decoupled"
    return "inconclusive"


# --- the design's power ---
@dataclass(frozen=True)
class PlantedPool:
    """A pool shape :func:`verdict_power` plants: the models' accuracies alone spread over ``individual``
    (lowest, highest), their mean compositional values (Shapley per question) over ``compositional``, and
    ``noise``, the SD of one question's compositional value around its model's mean."""

    individual: tuple[float, float]
    compositional: tuple[float, float]
    noise: float


#: The spacings the design's power is stated for, measured in paper-small's own cells
#: (``tests/data/inference_tables.json``): ``graded`` as zoo4-ladder under vote (accuracies 0.05 .. 0.86,
#: Shapley -0.045 .. +0.31, 0.17 per question), ``close`` as zoo4-specialists under cascade (accuracies
#: 0.42 .. 0.62, Shapley +0.032 .. +0.084, 0.14 per question).
PLANTED_POOLS = {"graded": PlantedPool((0.05, 0.86), (-0.045, 0.31), 0.17),
                 "close": PlantedPool((0.42, 0.62), (0.032, 0.084), 0.14)}
#: The population tau at which each verdict's power is stated: "coupled" at 0.5, "decoupled" at 0.
POWER_TAUS = {"coupled": 0.5, "decoupled": 0.0}
#: Simulated settings behind one power figure (Monte Carlo SE at most 0.035).
POWER_SIMS = 200
#: Interval resamples when only "coupled" is counted: :func:`verdict` calls a setting coupled before it reads
#: the interval, and the tau and its exact p do not depend on the resamples, so the count is the same.
_COUPLED_RESAMPLES = 20
PLANTING = ("per simulated setting, the models' (individual, compositional) strengths drawn from a Gaussian copula "
            "with the population Kendall tau (the pool a sample of models: its own tau varies around it), mapped "
            "onto the spacing's ranges; each question's individual score a coin with the model's accuracy, its "
            "compositional value the model's mean plus Gaussian noise, independent across models and questions; "
            "fresh question ids (a fresh cross-fit split); the study's verdict (crossfit_tau, judge) on them")


@dataclass(frozen=True)
class Power:
    """The share of simulated settings given a verdict, with its Monte Carlo SE (``sqrt(p (1 - p) / sims)``);
    ``undefined`` says why a design can never give the verdict (then ``value`` is 0 and nothing was simulated)."""

    value: float
    se: float
    sims: int
    undefined: str | None = None

    def __str__(self) -> str:
        return format_power(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "se": self.se, "sims": self.sims, "undefined": self.undefined}


def format_power(p: Mapping[str, Any]) -> str:
    """A :meth:`Power.to_dict` as the design tables print it: ``0.29 ± 0.03``; with none or all of the settings
    the count (the SE formula says 0); an undefined power with its reason."""
    if p.get("undefined"):
        return f"{p['value']:.2f} ({p['undefined']})"
    if p["se"] == 0:
        return f"{p['value']:.2f} ({round(p['value'] * p['sims'])} of {p['sims']})"
    return f"{p['value']:.2f} ± {p['se']:.1g}"


def verdict_power(n: int, questions: int, *, verdict: str = "coupled", tau: float | None = None, alpha: float = 0.05,
                  delta: float = DEFAULT_DELTA, planted: str = "graded", sims: int = POWER_SIMS,
                  resamples: int = 2000, seed: int = 0) -> Power:
    """How often a setting of ``n`` models on ``questions`` questions gets ``verdict`` when the population
    tau is ``tau`` (default :data:`POWER_TAUS`): the study's own verdict run on ``sims`` planted settings
    (:data:`PLANTING`, spacing :data:`PLANTED_POOLS` ``[planted]``; ``resamples`` as the study's interval
    uses). Deterministic under ``seed``; cached per argument in this process and on disk
    (``$CRL_ENVS_CACHE/power``, keyed by the arguments and this module's source, checked on read).

    Example:
        >>> verdict_power(4, 200)   # 4 models: the smallest p is 1/12, never below alpha = 0.05
        Power(value=0.0, se=0.0, sims=0, undefined='untestable: 4 models never give p <= 0.05 (smallest p 0.0833)')

    Raises:
        ValueError: ``n < 2``, ``questions < 1``, an unknown verdict or spacing, ``tau`` outside [-1, 1],
            ``alpha`` or ``delta`` outside (0, 1), or ``sims`` / ``resamples`` below 1.
    """
    if verdict not in POWER_TAUS:
        raise ConfigError(f"verdict_power: verdict must be one of {sorted(POWER_TAUS)}, got {verdict!r}")
    if planted not in PLANTED_POOLS:
        raise ConfigError(f"verdict_power: planted must be one of {sorted(PLANTED_POOLS)}, got {planted!r}")
    tau = POWER_TAUS[verdict] if tau is None else tau
    checks = [(n >= 2, f"n >= 2 models, got {n}"), (questions >= 1, f"questions >= 1, got {questions}"),
              (-1 <= tau <= 1, f"tau in [-1, 1], got {tau}"), (0 < alpha < 1 and 0 < delta < 1,
              f"alpha and delta in (0, 1), got alpha={alpha}, delta={delta}"),
              (sims >= 1 and resamples >= 1, f"sims and resamples >= 1, got sims={sims}, resamples={resamples}")]
    for ok, need in checks:
        if not ok:
            raise ConfigError(f"verdict_power needs {need}")
    if min_p_value(n) > alpha:
        return Power(0.0, 0.0, 0, f"untestable: {n} models never give p <= {alpha:g} (smallest p {min_p_value(n):.3g})")
    if questions < 2 * MIN_QUESTIONS_PER_HALF:
        return Power(0.0, 0.0, 0, f"untestable: {questions} questions leave a cross-fit half under "
                                  f"{MIN_QUESTIONS_PER_HALF}")
    if verdict == "coupled":
        resamples = _COUPLED_RESAMPLES
    hits = _power_hits(n, questions, verdict, float(tau), alpha, delta, planted, sims, resamples, seed)
    p = hits / sims
    return Power(p, math.sqrt(p * (1 - p) / sims), sims)


@functools.lru_cache(maxsize=256)
def _power_hits(n: int, questions: int, verdict: str, tau: float, alpha: float, delta: float, planted: str,
                sims: int, resamples: int, seed: int) -> int:
    """:func:`verdict_power`'s count of simulated settings given ``verdict``, read from or written to the disk cache."""
    import json
    import os
    from pathlib import Path

    key = {"n": n, "questions": questions, "verdict": verdict, "tau": tau, "alpha": alpha, "delta": delta,
           "planted": planted, "sims": sims, "resamples": resamples, "seed": seed, "code": _source_digest()}
    root = Path(os.environ.get("CRL_ENVS_CACHE") or Path.home() / ".cache" / "crl_envs") / "power"
    path = root / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key and isinstance(cached.get("hits"), int) and 0 <= cached["hits"] <= sims:
            return cached["hits"]
    except (OSError, ValueError, AttributeError):
        pass  # absent or unreadable: recompute
    hits = _simulate_verdicts(n, questions, verdict, tau, alpha, delta, PLANTED_POOLS[planted], sims, resamples, seed)
    try:
        from crl_kit.safe_io import atomic_write_json

        root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"key": key, "hits": hits})
    except OSError:
        pass  # a read-only cache costs time, not results
    return hits


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """This module's source: the verdict, the interval and the planting all live here."""
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


@dataclass(frozen=True)
class PlantedSetting:
    """One simulated setting (:data:`PLANTING`): ``(models, questions)`` tables on ``example_ids``, and the
    models' planted population strengths (``accuracy``, ``mean``) whose Kendall tau-b is the setting's own
    population tau (:attr:`tau`), the one its interval speaks for."""

    individual: np.ndarray
    compositional: np.ndarray
    example_ids: list[str]
    accuracy: np.ndarray
    mean: np.ndarray

    @property
    def tau(self) -> float:
        return float(kendall_tau_b(self.accuracy, self.mean))


def plant_setting(rng: np.random.Generator, n: int, questions: int, tau: float, pool: PlantedPool) -> PlantedSetting:
    """One planted setting of ``n`` models on ``questions`` questions at copula tau ``tau`` (:data:`PLANTING`),
    drawn from ``rng``: the generator :func:`verdict_power` and the sequential design's benchmark share. Its
    questions are independent, so the first ``k`` columns are a planted setting on ``k`` questions."""
    r = math.sin(math.pi * tau / 2)  # the Gaussian copula's correlation for Kendall tau
    (a_lo, a_hi), (c_lo, c_hi) = pool.individual, pool.compositional
    z = rng.standard_normal((n, 2))
    u = stats.norm.cdf(np.stack([z[:, 0], r * z[:, 0] + math.sqrt(max(0.0, 1 - r * r)) * z[:, 1]]))
    accuracy, mean = a_lo + (a_hi - a_lo) * u[0], c_lo + (c_hi - c_lo) * u[1]
    individual = (rng.random((n, questions)) < accuracy[:, None]).astype(float)
    compositional = mean[:, None] + pool.noise * rng.standard_normal((n, questions))
    tag = int(rng.integers(1 << 62))
    return PlantedSetting(individual, compositional, [f"power-{tag}-{k}" for k in range(questions)], accuracy, mean)


def _simulate_verdicts(n: int, questions: int, verdict: str, tau: float, alpha: float, delta: float,
                       pool: PlantedPool, sims: int, resamples: int, seed: int) -> int:
    """How many of ``sims`` planted settings (:data:`PLANTING`) the study's verdict calls ``verdict``."""
    rng = np.random.default_rng([seed, n, questions, round(1e6 * (tau + 1)), sorted(POWER_TAUS).index(verdict)])
    hits = 0
    for _ in range(sims):
        s = plant_setting(rng, n, questions, tau, pool)
        cf = crossfit_tau(s.individual, s.compositional, s.example_ids, level=1 - alpha, resamples=resamples, seed=seed)
        got = judge(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"], alpha=alpha, delta=delta,
                    level=1 - alpha, questions=cf["questions"], undefined=cf["undefined"])["verdict"]
        hits += got == verdict
    return hits


def design(n: int, questions: int | None, *, alpha: float = 0.05, delta: float = DEFAULT_DELTA,
           resamples: int = 2000, sims: int = POWER_SIMS) -> dict[str, Any]:
    """What one setting of ``n`` models on ``questions`` questions can show: ``{"n", "questions",
    "min_p_value", "power"}``, ``power[verdict][spacing]`` a :meth:`Power.to_dict` per verdict of
    :data:`POWER_TAUS` (with its ``tau``) and spacing of :data:`PLANTED_POOLS`; ``power`` is ``None`` when
    ``questions`` is unknown (a task without ``n``)."""
    out: dict[str, Any] = {"n": n, "questions": questions, "min_p_value": min_p_value(n), "power": None}
    if questions is not None:
        out["power"] = {v: {"tau": t, **{s: verdict_power(n, questions, verdict=v, alpha=alpha, delta=delta, planted=s,
                                                            sims=sims, resamples=resamples).to_dict()
                                         for s in PLANTED_POOLS}}
                        for v, t in POWER_TAUS.items()}
    return out


# --- training verdicts ---
#: Up to this many paired differences the sign-flip test enumerates every flip (2**20 ≈ 1e6 means).
EXACT_SIGN_FLIP_UP_TO = 20


def sign_flip_test(differences: Sequence[float], *, resamples: int = 100_000, seed: int = 0) -> dict[str, Any]:
    """Two-sided sign-flip permutation test that the paired differences are centred on 0.

    Under the null (each pair's two members exchangeable) every difference is equally likely to carry
    either sign; the statistic is the mean and the p-value is the share of sign assignments whose
    |mean| is at least the observed one. Exact (every ``2**m`` assignment) up to
    :data:`EXACT_SIGN_FLIP_UP_TO` differences, else Monte Carlo with ``(hits + 1) / (resamples + 1)``.
    Zero differences carry no sign: with ``k`` non-zero differences the smallest attainable p-value is
    ``2 / 2**k`` (``min_p_value``), and with none the p-value is 1.

    Returns:
        ``{"statistic": mean difference, "p_value", "exact": bool, "n": m, "nonzero": k, "min_p_value"}``.

    Raises:
        ValueError: no differences, or a difference that is not finite.
    """
    d = np.asarray(differences, dtype=float).ravel()
    if d.size == 0:
        raise ConfigError("sign_flip_test: no paired differences; pass one difference per pair")
    if not np.isfinite(d).all():
        raise ConfigError(f"sign_flip_test: every difference must be finite, got {d.tolist()}")
    observed = float(d.mean())
    nz = d[d != 0]
    k = int(nz.size)
    out = {"statistic": observed, "n": int(d.size), "nonzero": k, "min_p_value": 1.0 if k == 0 else min(1.0, 2.0 / 2 ** k)}
    if k == 0:
        return {**out, "p_value": 1.0, "exact": True}
    tol = 1e-12 * max(1.0, float(np.abs(nz).sum()))
    target = abs(float(nz.sum())) - tol  # |mean| >= |observed| <=> |sum of signed non-zeros| >= |observed sum|
    if k <= EXACT_SIGN_FLIP_UP_TO:
        hits = 0
        for start in range(0, 2 ** k, 1 << 16):  # every assignment, 65,536 at a time
            codes = np.arange(start, min(start + (1 << 16), 2 ** k))
            signs = 1 - 2 * ((codes[:, None] >> np.arange(k)) & 1)
            hits += int(np.sum(np.abs(signs @ nz) >= target))
        return {**out, "p_value": hits / 2 ** k, "exact": True}
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, 10_000):
        m = min(10_000, resamples - start)
        signs = rng.choice(np.array([-1.0, 1.0]), size=(m, k))
        hits += int(np.sum(np.abs(signs @ nz) >= target))
    return {**out, "p_value": (hits + 1) / (resamples + 1), "exact": False}


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Two-sided paired t-test of ``mean(a - b) = 0`` (``scipy.stats.ttest_rel``): the per-setting test
    over seeds, where a permutation test cannot reject (3 seeds: the smallest sign-flip p is 0.25).

    It assumes the per-seed differences are normal. When every difference is equal the test is
    undefined: ``p_value`` is ``None`` and ``undefined`` says why (all equal to 0 is a tie).

    Returns:
        ``{"statistic": mean(a - b), "t", "df", "p_value", "undefined": reason or None}``.

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or hold fewer than 2 pairs.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ConfigError(f"paired_t_test: a and b must be 1-d and paired, got shapes {x.shape} and {y.shape}")
    d = x - y
    out: dict[str, Any] = {"statistic": float(d.mean()) if d.size else float("nan"), "df": int(d.size) - 1}
    if d.size < 2:
        raise ConfigError(f"paired_t_test: needs at least 2 pairs (seeds), got {d.size}; run more seeds")
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())):  # equal up to rounding (accuracies are k/n)
        why = "every paired difference is 0 (a tie)" if abs(d[0]) <= 1e-12 else \
            f"every paired difference equals {d[0]:+.4g} (zero variance)"
        return {**out, "t": None, "p_value": None, "undefined": why}
    res = stats.ttest_rel(x, y)
    return {**out, "t": float(res.statistic), "p_value": float(res.pvalue), "undefined": None}


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjusted p-values (Holm 1979): reject every hypothesis whose adjusted p is at most
    alpha and the family-wise error rate is at most alpha, for any dependence between the tests. ``None``
    (an undefined test) stays ``None`` and is not counted in the family.

    Example:
        >>> holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
        {'a': 0.03, 'b': 0.06, 'c': 0.06, 'd': None}
    """
    defined = sorted((p, k) for k, p in p_values.items() if p is not None)
    m, running, out = len(defined), 0.0, {k: None for k in p_values}
    for rank, (p, k) in enumerate(defined):
        running = max(running, min(1.0, (m - rank) * p))
        out[k] = round(running, 15)
    return out


def seed_question_bootstrap(values: np.ndarray, *, resamples: int, rng: np.random.Generator,
                            indices: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Bootstrap means of a ``seeds x questions`` array: resample seeds, then questions within each
    drawn seed (two-stage). Pass the same ``indices`` (from :func:`bootstrap_indices`) to several
    arrays to pair their resamples.

    Raises:
        ValueError: ``values`` is not 2-d, or the indices do not fit its shape.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ConfigError(f"seed_question_bootstrap: values must be seeds x questions (2-d), got shape {v.shape}")
    seed_idx, q_idx = indices if indices is not None else bootstrap_indices(rng, *v.shape, resamples)
    if seed_idx.shape[1] != v.shape[0] or q_idx.shape[2] != v.shape[1]:
        raise ConfigError(f"seed_question_bootstrap: indices for {seed_idx.shape[1]} seeds x {q_idx.shape[2]} "
                         f"questions do not fit values of shape {v.shape}")
    return v[seed_idx[..., None], q_idx].mean(axis=(1, 2))


def bootstrap_indices(rng: np.random.Generator, seeds: int, questions: int, resamples: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The resampled seed indices ``(resamples, seeds)`` and question indices ``(resamples, seeds, questions)``."""
    return rng.integers(0, seeds, size=(resamples, seeds)), rng.integers(0, questions, size=(resamples, seeds, questions))


def ratio_ci(numerator: float, denominator: float, numerator_boot: np.ndarray, denominator_boot: np.ndarray, *,
             level: float = 0.95, names: tuple[str, str] = ("numerator", "denominator")) -> dict[str, Any]:
    """``numerator / denominator`` with a percentile bootstrap CI from paired resamples, or, when the
    ratio is not bounded, the difference ``numerator - denominator`` with its CI instead.

    The ratio of two gains means something only when the denominator is a gain: it is given only when the
    denominator's own ``level`` CI lies above 0. Otherwise (its point estimate or its interval reaching 0,
    where the ratio is unbounded) ``value`` and ``ci`` are ``None``, ``undefined`` says why in words, and
    ``difference`` holds ``{"value", "ci"}`` of the paired difference: never a bare ratio without a CI.

    Returns:
        ``{"value", "ci", "undefined", "difference"}``.
    """
    num_name, den_name = names
    num_b, den_b = np.asarray(numerator_boot, dtype=float), np.asarray(denominator_boot, dtype=float)
    difference = {"value": float(numerator - denominator), "ci": percentile_ci(num_b - den_b, level)}
    den_ci = percentile_ci(den_b, level)
    if not denominator > 0:
        return {"value": None, "ci": None, "difference": difference,
                "undefined": f"{den_name}'s gain is {denominator:+.4f}, not positive: a ratio to it means nothing; "
                             f"the difference {num_name} - {den_name} instead"}
    if den_ci is None or den_ci[0] <= 0:
        return {"value": None, "ci": None, "difference": difference,
                "undefined": f"{den_name}'s gain's {100 * level:g}% CI reaches 0 or below: the ratio is unbounded; "
                             f"the difference {num_name} - {den_name} instead"}
    return {"value": numerator / denominator, "ci": percentile_ci(num_b / den_b, level), "undefined": None,
            "difference": difference}


def interval(ci: Any, estimate: Any, fmt: Any, *, undefined: str | None = None,
             zero_width: str = "zero width: no resample moved it") -> str:
    """An interval as the report prints it, or "undefined (why)": no interval, one that excludes its own
    estimate, or one of zero width is never printed as numbers, nor one whose bounds print alike (the one
    place this rule lives).

    >>> interval((0.1, 0.3), 0.2, lambda v: f"{v:.2f}"), interval((0.2, 0.2), 0.2, lambda v: f"{v:.2f}")
    ('[0.10, 0.30]', 'undefined (zero width: no resample moved it)')
    >>> interval((0.0351, 0.0353), 0.0352, lambda v: f"{v:.3f}")
    '(CI within 0.035: narrower than the printed digits)'
    """
    if ci is None:
        return f"undefined ({undefined or 'no interval'})"
    if estimate is not None and not ci[0] - 1e-9 <= estimate <= ci[1] + 1e-9:
        return "undefined (the interval excludes its own estimate)"
    if ci[1] - ci[0] <= 1e-12:
        return f"undefined ({zero_width})"
    low, high = fmt(ci[0]), fmt(ci[1])
    if low == high:  # "[0.035, 0.035]" would read as a degenerate interval
        return f"(CI within {low}: narrower than the printed digits)"
    return f"[{low}, {high}]"
