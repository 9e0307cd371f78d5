"""Pooled, stratified permutation test of "individual strength predicts compositional strength".

One setting (a pool under a protocol) has only 3-6 models, and a rank correlation over ``n`` models
can never have a two-sided p-value below ``2 / n!`` (1/3 at ``n = 3``, 1/12 at ``n = 4``, 1/60 at
``n = 5``): "not significant in 12 of 15 settings" says nothing by itself. This module pools the
settings: the statistic is the sum over settings (strata) of the per-setting rank correlation, and
the null permutes the models' orderings *within* each setting, independently across settings, or
once per ``groups`` label (the settings of one pool share their models: one permutation of model labels
per pool, :func:`crl_envs.stats.grouped_permutation_test`).

The null distribution is computed exactly when every stratum has ``n <= 8`` models and the sum's
support stays small (each stratum's distribution over all ``n!`` orderings, convolved across
strata); otherwise by Monte Carlo with ``draws`` draws, reporting the p-value ``(k + 1) / (draws + 1)``
and a Clopper-Pearson 95% interval for the exact p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from crl_envs.stats import (
    MIN_QUESTIONS_PER_HALF,
    STATISTICS,
    correlation,
    crossfit_halves,
    grouped_permutation_test,
    min_p_value,
)
from crl_envs.valuation.report import LABELS, ValuationReport
from crl_kit.errors import ConfigError

ALTERNATIVES = ("two-sided", "greater", "less")


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
    crossfit: bool = True

    def __str__(self) -> str:
        how = "exact" if self.exact else f"Monte Carlo, {self.draws} draws, 95% CI [{self.p_interval[0]:.4f}, {self.p_interval[1]:.4f}]"
        lines = [
            f"pooled stratified permutation test: individual strength vs {LABELS.get(self.measure, self.measure)}"
            + (" (cross-fit: on disjoint halves of the questions)" if self.crossfit else
               " (same questions: the paper's way of measuring)"),
            f"  statistic: sum over {len(self.strata)} settings of {self.statistic} = {self.observed:+.3f}",
            f"  p ({self.alternative}) = {self.p_value:.4g} ({how}); smallest attainable p = {self.min_p_value:.3g}",
        ]
        for s in self.strata:
            lines.append(f"    {s.label}: n={s.n}, {self.statistic} {s.value:+.3f}, own exact p {s.p_value:.3g} "
                         f"(never below {min_p_value(s.n):.3g})")
        for s in self.skipped:
            lines.append(f"    skipped {s}")
        return "\n".join(lines)


def pooled_test(
    reports: Sequence[ValuationReport], *, measure: str = "shapley", statistic: str = "kendall",
    alternative: str = "two-sided", draws: int = 100_000, seed: int = 0, labels: Sequence[str] | None = None,
    exact: bool | None = None, groups: Sequence[str] | None = None, crossfit: bool = True,
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
        groups: one label per report; reports with the same label (the settings of one pool: the same
            models, often one individual vector) share one permutation of model labels (default: each
            report its own, the stratified test, which is anti-conservative when settings share data).
        crossfit: individual strength from one half of each report's questions, ``measure`` from the other
            (:func:`crl_envs.stats.crossfit_halves`, fixed by question id; the study's verdicts use it:
            on the same questions shared question noise correlates the two even for copies of one
            model). ``False``: both on every question (the paper's way of measuring).

    Settings where either ranking is constant carry no information and are skipped (listed), and so,
    cross-fitted, are settings with fewer than :data:`~crl_envs.stats.MIN_QUESTIONS_PER_HALF` questions in
    a half.

    Raises:
        ValueError: an unknown statistic / alternative / measure, no report, no informative report,
            labels or groups not one per report.
    """
    if statistic not in STATISTICS:
        raise ConfigError(f"unknown statistic {statistic!r}; choose one of {sorted(STATISTICS)}")
    if alternative not in ALTERNATIVES:
        raise ConfigError(f"unknown alternative {alternative!r}; choose one of {ALTERNATIVES}")
    if not reports:
        raise ConfigError("pooled_test needs at least one report")
    if draws < 1:
        raise ConfigError(f"draws must be >= 1, got {draws}")
    labels = list(labels) if labels is not None else [f"{r.protocol}/{r.task}/{','.join(r.names)}" for r in reports]
    if len(labels) != len(reports):
        raise ConfigError(f"got {len(labels)} labels for {len(reports)} reports")
    groups = list(range(len(reports))) if groups is None else list(groups)
    if len(groups) != len(reports):
        raise ConfigError(f"got {len(groups)} groups for {len(reports)} reports")

    strata, skipped, pairs, kept = [], [], [], []
    for label, r, g in zip(labels, reports, groups):
        m = r.measures.get(measure)
        if m is None:
            raise ConfigError(f"report {label!r} has no {measure!r} measure (estimator {r.estimator!r}); "
                             f"choose a measure it has: {[k for k in r.measures if k != 'individual']}")
        x, y = r.individual.means, m.means
        if crossfit:
            a, b = crossfit_halves(r.example_ids)
            if min(a.size, b.size) < MIN_QUESTIONS_PER_HALF:
                skipped.append(f"{label} (cross-fit halves of {a.size} and {b.size} questions: fewer than "
                               f"{MIN_QUESTIONS_PER_HALF})")
                continue
            x, y = r.individual.per_question[:, a].mean(axis=1), m.per_question[:, b].mean(axis=1)
        c = correlation(x, y, statistic, seed=seed)
        if math.isnan(c.value):
            skipped.append(f"{label} (a constant ranking)")
            continue
        strata.append(Stratum(label, len(x), c.value, c.p_value))
        pairs.append((x, y))
        kept.append(g)
    if not strata:
        raise ConfigError("no informative setting: every report has a constant ranking")
    t = grouped_permutation_test(pairs, kept, statistic=statistic, alternative=alternative, draws=draws, seed=seed,
                                 exact=exact)
    return PooledTest(measure, statistic, alternative, t["observed"], t["p_value"], t["exact"], t["draws"],
                      t["p_interval"], t["min_p_value"], strata, skipped, crossfit)
