"""The ``regression`` estimator (#54 item 2b): exact where it should be, RMSE at most half antithetic's on a planted
vote game at equal coalition counts, and Monte Carlo intervals that cover at their level."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import agents
import crl_envs
from crl_envs.protocols.base import plurality_winners
from crl_envs.valuation import evaluate
from crl_envs.valuation.estimators import RegressionEstimator, estimator, shapley_weights


def _planted_vote(n: int, questions: int = 300, seed: int = 0) -> np.ndarray:
    """``v(S)`` (mean over questions) of plurality voting over planted answers: accuracies 0.3-0.8, wrong answers
    among three values, 10% unparseable."""
    rng = np.random.default_rng(seed)
    right = rng.random((questions, n)) < np.linspace(0.3, 0.8, n)
    codes = np.where(right, 0, rng.integers(1, 4, (questions, n)))
    codes[rng.random((questions, n)) < 0.1] = -1
    winner = plurality_winners(codes, np.arange(1 << n))
    return np.where(winner < 0, 0.0, np.take_along_axis(right.astype(float) * (codes == 0), np.maximum(winner, 0),
                                                         axis=1)).mean(axis=0)


def _estimate(name: str, n: int, budget: int, seed: int, v: np.ndarray):
    est = estimator(name, n, budget=budget, seed=seed)
    masks, w = est.weights("shapley")
    return w @ v[masks], sum(1 for m in masks if m), est.draws("shapley", {m: v[m] for m in masks})


def test_additive_games_are_exact_and_a_full_budget_is_exact_shapley():
    n = 9
    masks = np.arange(1 << n)
    inside = ((masks[:, None] >> np.arange(n)) & 1).astype(float)
    a = np.random.default_rng(3).uniform(0, 1, n)
    for seed in range(3):
        phi, _, _ = _estimate("regression", n, 24, seed, 0.2 + inside @ a * (masks > 0))
        np.testing.assert_allclose(phi, a, atol=1e-12)
    v = _planted_vote(6)
    phi, used, draws = _estimate("regression", 6, 1000, 0, v)
    assert used == 63 and draws is None  # every stratum played whole: no sampling error
    np.testing.assert_allclose(phi, shapley_weights(6) @ v, atol=1e-12)


def test_rmse_at_most_half_of_antithetic_and_intervals_cover():
    """Planted vote game, n = 10; antithetic with 20 permutations (~146 coalitions) against regression with exactly
    as many, 100 seeds each. Measured ratio 0.395 (s.e. 0.014, the delta method on the two mean squared errors), so
    0.5 leaves ~7 s.e. of margin. Coverage of regression's 95% Monte Carlo intervals: 0.94 over 1,000
    player-seeds (binomial s.e. 0.007; seeds are independent, players within one are not), asserted in [0.9, 0.99]."""
    n, reps = 10, 100
    v = _planted_vote(n)
    phi = shapley_weights(n) @ v
    anti, regr, covered = [], [], []
    for r in range(reps):
        est, used, _ = _estimate("antithetic", n, 20, r, v)
        anti.append(((est - phi) ** 2).mean())
        est, used_r, draws = _estimate("regression", n, used - (2 * n + 1), 10_000 + r, v)
        assert used_r == used
        regr.append(((est - phi) ** 2).mean())
        se = draws.std(axis=1, ddof=1) / np.sqrt(draws.shape[1])
        covered += list(np.abs(est - phi) <= stats.t.ppf(0.975, draws.shape[1] - 1) * se)
    ratio = np.sqrt(np.mean(regr) / np.mean(anti))
    assert ratio <= 0.5, ratio
    assert 0.9 <= np.mean(covered) <= 0.99, np.mean(covered)


def test_budget_problems_fail_at_once_in_one_line():
    with pytest.raises(ValueError, match="needs two coalition pairs of every size from 2 to 10"):
        RegressionEstimator(12, budget=8)
    with pytest.raises(ValueError, match="needs budget=<number of coalitions>"):
        RegressionEstimator(5)


def test_evaluate_reports_regression_shapley_with_its_sampling_error():
    """Through evaluate() on an interactive protocol: the coalitions it plays are its plan, and its Shapley interval
    is wider than the questions alone make it (the jackknife's Monte Carlo error is added)."""
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)])
    task = crl_envs.tasks.load("arith", n=12)
    report = evaluate("judge", pool, task, estimator="regression", budget=10, cache_dir=False, progress=False,
                      bootstrap_resamples=200)
    est = RegressionEstimator(6, budget=10)
    assert report.coalitions == len([m for m in est.coalitions() if m]) == 2 * 6 + 1 + 10
    assert report.shapley.draws is not None and report.shapley.draws.shape[1] == 5
    draws = report.shapley.draws
    var_mc = draws.var(axis=1, ddof=1) / draws.shape[1]
    assert np.all(var_mc > 0)
    ci = np.array([report.shapley.ci[a] for a in report.ids])
    half = (ci[:, 1] - ci[:, 0]) / 2
    assert np.all(half > 1.96 * np.sqrt(var_mc))  # the interval holds the sampling error (and the questions')
