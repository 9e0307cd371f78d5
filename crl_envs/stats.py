"""The statistics the study's verdicts rest on (numpy, scipy and the standard library only: rank 0).

Training verdicts (the section below): an exact sign-flip permutation test of paired differences, a
paired t-test over seeds, the bootstrap over seeds then questions that gives a training Δ its CI, and
a ratio of two means with a bootstrap CI that says why it is undefined when it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as _scipy_stats

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
        raise ValueError("sign_flip_test: no paired differences; pass one difference per pair")
    if not np.isfinite(d).all():
        raise ValueError(f"sign_flip_test: every difference must be finite, got {d.tolist()}")
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
        raise ValueError(f"paired_t_test: a and b must be 1-d and paired, got shapes {x.shape} and {y.shape}")
    d = x - y
    out: dict[str, Any] = {"statistic": float(d.mean()) if d.size else float("nan"), "df": int(d.size) - 1}
    if d.size < 2:
        raise ValueError(f"paired_t_test: needs at least 2 pairs (seeds), got {d.size}; run more seeds")
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())):  # equal up to rounding (accuracies are k/n)
        why = "every paired difference is 0 (a tie)" if abs(d[0]) <= 1e-12 else \
            f"every paired difference equals {d[0]:+.4g} (zero variance)"
        return {**out, "t": None, "p_value": None, "undefined": why}
    res = _scipy_stats.ttest_rel(x, y)
    return {**out, "t": float(res.statistic), "p_value": float(res.pvalue), "undefined": None}


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
        raise ValueError(f"seed_question_bootstrap: values must be seeds x questions (2-d), got shape {v.shape}")
    seed_idx, q_idx = indices if indices is not None else bootstrap_indices(rng, *v.shape, resamples)
    if seed_idx.shape[1] != v.shape[0] or q_idx.shape[2] != v.shape[1]:
        raise ValueError(f"seed_question_bootstrap: indices for {seed_idx.shape[1]} seeds x {q_idx.shape[2]} "
                         f"questions do not fit values of shape {v.shape}")
    return v[seed_idx[..., None], q_idx].mean(axis=(1, 2))


def bootstrap_indices(rng: np.random.Generator, seeds: int, questions: int, resamples: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The resampled seed indices ``(resamples, seeds)`` and question indices ``(resamples, seeds, questions)``."""
    return rng.integers(0, seeds, size=(resamples, seeds)), rng.integers(0, questions, size=(resamples, seeds, questions))


def percentile_ci(samples: np.ndarray, level: float) -> list[float]:
    """The central ``level`` percentile interval of bootstrap ``samples``."""
    a = (1 - level) / 2
    return [float(np.quantile(samples, a)), float(np.quantile(samples, 1 - a))]


def ratio_ci(numerator: float, denominator: float, numerator_boot: np.ndarray, denominator_boot: np.ndarray, *,
             level: float = 0.95, names: tuple[str, str] = ("numerator", "denominator")) -> dict[str, Any]:
    """``numerator / denominator`` with a percentile bootstrap CI from paired resamples, or why not.

    The ratio of two gains means something only when the denominator is a gain: undefined (``value``
    ``None``) when the denominator's point estimate is not positive; no CI (``ci`` ``None``) when some
    resample's denominator is not positive (the ratio is then unbounded within the CI of the
    denominator). ``undefined`` states the reason in words.

    Returns:
        ``{"value", "ci", "undefined"}``.
    """
    num_name, den_name = names
    if not denominator > 0:
        return {"value": None, "ci": None,
                "undefined": f"{den_name}'s gain is {denominator:+.4f}, not positive: a ratio to it means nothing"}
    value = numerator / denominator
    den = np.asarray(denominator_boot, dtype=float)
    bad = float(np.mean(den <= 0))
    if bad > 0:
        return {"value": value, "ci": None,
                "undefined": f"{den_name}'s gain is not positive in {100 * bad:.1f}% of bootstrap resamples: "
                             f"the ratio's CI is unbounded"}
    return {"value": value, "ci": percentile_ci(np.asarray(numerator_boot, dtype=float) / den, level),
            "undefined": None}

