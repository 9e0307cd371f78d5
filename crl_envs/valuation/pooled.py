"""Pooled, stratified permutation test of "individual strength predicts compositional strength".

One setting (a pool under a protocol) has only 3-6 models, and a rank correlation over ``n`` models
can never have a two-sided p-value below ``2 / n!`` (1/3 at ``n = 3``, 1/12 at ``n = 4``, 1/60 at
``n = 5``): "not significant in 12 of 15 settings" says nothing by itself. This module pools the
settings: the statistic is the sum over settings (strata) of the per-setting rank correlation, and
the null permutes the models' orderings *within* each setting, independently across settings.

The null distribution is computed exactly when every stratum has ``n <= 8`` models and the sum's
support stays small (each stratum's distribution over all ``n!`` orderings, convolved across
strata); otherwise by Monte Carlo with ``draws`` draws, reporting the p-value ``(k + 1) / (draws + 1)``
and a Clopper-Pearson 95% interval for the exact p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from crl_envs.valuation.report import (
    EXACT_PERMUTATION_LIMIT,
    LABELS,
    STATISTICS,
    ValuationReport,
    permutation_null,
)

ALTERNATIVES = ("two-sided", "greater", "less")
MAX_SUPPORT = 1_000_000
_ROUND = 9


@dataclass
class Stratum:
    """One setting: its label, number of models, observed correlation and its own exact p-value."""

    label: str
    n: int
    value: float
    p_value: float


@dataclass
class PooledTest:
    """Result of :func:`pooled_test`. ``p_interval`` is ``(p, p)`` when exact, else the Clopper-Pearson
    95% interval of the exact p-value given the Monte Carlo draws. ``min_p_value`` is the smallest
    p-value these strata could ever give (their power floor)."""

    measure: str
    statistic: str
    alternative: str
    observed: float
    p_value: float
    exact: bool
    draws: int | None
    p_interval: tuple[float, float]
    min_p_value: float
    strata: list[Stratum] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        how = "exact" if self.exact else f"Monte Carlo, {self.draws} draws, 95% CI [{self.p_interval[0]:.4f}, {self.p_interval[1]:.4f}]"
        lines = [
            f"pooled stratified permutation test: individual strength vs {LABELS.get(self.measure, self.measure)}",
            f"  statistic: sum over {len(self.strata)} settings of {self.statistic} = {self.observed:+.3f}",
            f"  p ({self.alternative}) = {self.p_value:.4g} ({how}); smallest attainable p = {self.min_p_value:.3g}",
        ]
        for s in self.strata:
            lines.append(f"    {s.label}: n={s.n}, {self.statistic} {s.value:+.3f}, own exact p {s.p_value:.3g} "
                         f"(never below {min(1.0, 2 / math.factorial(s.n)):.3g})")
        for s in self.skipped:
            lines.append(f"    skipped {s}")
        return "\n".join(lines)


def _tail(values: np.ndarray, observed: float, alternative: str) -> np.ndarray:
    eps = 1e-9
    if alternative == "greater":
        return values >= observed - eps
    if alternative == "less":
        return values <= observed + eps
    return np.abs(values) >= abs(observed) - eps


def _distribution(values: np.ndarray) -> dict[float, float]:
    keys, counts = np.unique(np.round(values, _ROUND), return_counts=True)
    return dict(zip(keys.tolist(), (counts / counts.sum()).tolist()))


def _convolve(a: dict[float, float], b: dict[float, float], limit: int) -> dict[float, float] | None:
    if len(a) * len(b) > 50 * limit:
        return None
    out: dict[float, float] = {}
    for va, pa in a.items():
        for vb, pb in b.items():
            k = round(va + vb, _ROUND)
            out[k] = out.get(k, 0.0) + pa * pb
        if len(out) > limit:
            return None
    return out


def pooled_test(
    reports: Sequence[ValuationReport],
    *,
    measure: str = "shapley",
    statistic: str = "kendall",
    alternative: str = "two-sided",
    draws: int = 100_000,
    seed: int = 0,
    labels: Sequence[str] | None = None,
    exact: bool | None = None,
) -> PooledTest:
    """Test whether individual strength predicts ``measure`` across several settings.

    Args:
        reports: one :class:`ValuationReport` per setting (pool x protocol x task).
        measure: ``"shapley"``, ``"loo"`` or ``"banzhaf"``.
        statistic: ``"kendall"`` (tau-b) or ``"spearman"``; summed over settings.
        alternative: ``"two-sided"``, ``"greater"`` (individual predicts compositional) or ``"less"``.
        draws: Monte Carlo draws when the exact null is too large.
        labels: names of the settings (default ``protocol/task/models``).
        exact: ``None`` — exact when feasible, else Monte Carlo; ``False`` — always Monte Carlo.

    Settings where either ranking is constant carry no information and are skipped (listed).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {sorted(STATISTICS)}")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"unknown alternative {alternative!r}; choose one of {ALTERNATIVES}")
    if not reports:
        raise ValueError("pooled_test needs at least one report")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    labels = list(labels) if labels is not None else [f"{r.protocol}/{r.task}/{','.join(r.names)}" for r in reports]
    if len(labels) != len(reports):
        raise ValueError(f"got {len(labels)} labels for {len(reports)} reports")
    from crl_envs.valuation.report import correlation

    strata, skipped, pairs = [], [], []
    for label, r in zip(labels, reports):
        m = r.measures.get(measure)
        if m is None:
            raise ValueError(f"report {label!r} has no {measure!r} measure (estimator {r.estimator!r}); "
                             f"choose a measure it has: {[k for k in r.measures if k != 'individual']}")
        x, y = r.individual.means, m.means
        c = correlation(x, y, statistic, seed=seed)
        if math.isnan(c.value):
            skipped.append(f"{label} (a constant ranking)")
            continue
        strata.append(Stratum(label, len(x), c.value, c.p_value))
        pairs.append((x, y))
    if not strata:
        raise ValueError("no informative setting: every report has a constant ranking")
    observed = float(sum(s.value for s in strata))

    exact_dist: dict[float, float] | None = {0.0: 1.0}
    if exact is True and any(len(x) > EXACT_PERMUTATION_LIMIT for x, _ in pairs):
        raise ValueError(f"exact=True needs every setting to have <= {EXACT_PERMUTATION_LIMIT} models")
    if exact is not False and all(len(x) <= EXACT_PERMUTATION_LIMIT for x, _ in pairs):
        for x, y in pairs:
            null, _ = permutation_null(x, y, statistic)
            exact_dist = _convolve(exact_dist, _distribution(null), MAX_SUPPORT)
            if exact_dist is None:
                break
    else:
        exact_dist = None

    if exact_dist is not None:
        support = np.array(list(exact_dist))
        probs = np.array(list(exact_dist.values()))
        p = float(min(1.0, probs[_tail(support, observed, alternative)].sum()))
        extreme = support.max() if alternative != "less" else support.min()
        if alternative == "two-sided":
            extreme = np.abs(support).max()
        min_p = float(probs[_tail(support, extreme, alternative)].sum())
        return PooledTest(measure, statistic, alternative, observed, p, True, None, (p, p), min_p, strata, skipped)

    rng = np.random.default_rng(seed)
    total = np.zeros(draws)
    for x, y in pairs:
        perms = rng.permuted(np.tile(np.arange(len(y)), (draws, 1)), axis=1)
        total += STATISTICS[statistic](x, np.asarray(y, float)[perms])
    hits = int(_tail(total, observed, alternative).sum())
    p = (hits + 1) / (draws + 1)
    ci = stats.binomtest(hits, draws).proportion_ci(confidence_level=0.95, method="exact")
    min_p = float(np.prod([1 / math.factorial(s.n) for s in strata])) * (2 if alternative == "two-sided" else 1)
    return PooledTest(measure, statistic, alternative, observed, p, False, draws, (float(ci.low), float(ci.high)),
                      min(1.0, min_p), strata, skipped)
