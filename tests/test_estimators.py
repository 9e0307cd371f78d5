"""Estimators as objects (issue #52): each names the coalitions it needs, what they cost and the values a
coalition table gives, checked against independent computations (brute-force Shapley over all orderings,
LOO and permutation marginals written out here); one registry that ``evaluate``, the study's plan and
``crl-envs value`` read, so a new estimator is one class (a test registers one and runs it end to end)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import agents
from crl_envs import tasks, valuation
from crl_envs.valuation import estimators
from crl_envs.valuation.estimators import (
    ESTIMATORS,
    SAMPLED_ESTIMATORS,
    Estimator,
    estimator,
    estimator_class,
    register,
    sample_permutations,
)
from crl_kit.errors import ConfigError


def random_game(n: int, questions: int = 5, seed: int = 0) -> dict[int, np.ndarray]:
    """Per-question values of every coalition of a random game (``v(∅)`` not 0, to catch a dropped term)."""
    rng = np.random.default_rng(seed)
    return {m: rng.random(questions) for m in range(1 << n)}


def brute_force_shapley(v: dict[int, np.ndarray], n: int) -> np.ndarray:
    phi = np.zeros((n, len(v[0])))
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        before = 0
        for i in order:
            phi[i] += v[before | 1 << i] - v[before]
            before |= 1 << i
    return phi / len(orders)


def brute_force_banzhaf(v: dict[int, np.ndarray], n: int) -> np.ndarray:
    return np.array([np.mean([v[s | 1 << i] - v[s] for s in range(1 << n) if not s >> i & 1], axis=0)
                     for i in range(n)])


def loo(v: dict[int, np.ndarray], n: int) -> np.ndarray:
    full = (1 << n) - 1
    return np.array([v[full] - v[full & ~(1 << i)] for i in range(n)])


# ---------------------------------------------------------------------- the registered estimators
def test_registry_names_and_the_public_tuple_still_read_the_same():
    assert tuple(ESTIMATORS) == ("exact", "loo", "permutation", "antithetic", "regression") and ESTIMATORS[0] == "exact"
    assert tuple(SAMPLED_ESTIMATORS) == ("permutation", "antithetic", "regression")
    assert valuation.ESTIMATORS is ESTIMATORS and "exact" in ESTIMATORS and ", ".join(ESTIMATORS)
    with pytest.raises(ConfigError, match="unknown estimator 'shap'; choose one of .*exact"):
        estimator_class("shap")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_exact_estimates_equal_brute_force(n):
    v = random_game(n, seed=n)
    e = estimator("exact", n)
    assert set(e.coalitions()) == set(range(1 << n)) and len(e.coalitions()) == 1 << n
    table = {m: v[m] for m in e.coalitions()}
    shapley, draws = e.estimate(table, "shapley")
    assert draws is None and e.compositional == "shapley"
    np.testing.assert_allclose(shapley, brute_force_shapley(v, n), atol=1e-12)
    np.testing.assert_allclose(e.estimate(table, "banzhaf")[0], brute_force_banzhaf(v, n), atol=1e-12)
    np.testing.assert_allclose(e.estimate(table, "loo")[0], loo(v, n), atol=1e-12)
    assert e.coalitions_per_size(n) == {k: math.comb(n, k) for k in range(1, n + 1)}


def test_loo_needs_n_plus_one_coalitions_and_reports_loo_only():
    v = random_game(4)
    e = estimator("loo", 4)
    assert e.coalitions() == [15, 14, 13, 11, 7] and e.measures == ("loo",) and e.compositional == "loo"
    np.testing.assert_array_equal(e.estimate(v, "loo")[0], loo(v, 4))
    assert e.coalitions_per_size(4) == {4: 1.0, 3: 4.0}
    with pytest.raises(ConfigError, match="does not compute 'shapley'"):
        e.estimate(v, "shapley")


@pytest.mark.parametrize("name", ["permutation", "antithetic"])
def test_permutation_estimate_is_the_mean_marginal_over_its_draws(name):
    n, budget = 4, 6
    v = random_game(n, seed=7)
    e = estimator(name, n, budget=budget, seed=3)
    perms = sample_permutations(n, budget, seed=3, antithetic=name == "antithetic")
    np.testing.assert_array_equal(e.permutations, perms)
    marginal = np.zeros((budget, n, len(v[0])))
    for b, order in enumerate(perms):
        before = 0
        for i in order:
            marginal[b, i] = v[before | 1 << int(i)] - v[before]
            before |= 1 << int(i)
    table = {m: v[m] for m in e.coalitions()}
    shapley, draws = e.estimate(table, "shapley")
    np.testing.assert_allclose(shapley, marginal.mean(axis=0), atol=1e-12)
    per_draw = marginal.mean(axis=2)  # each permutation's marginals at the questions' mean values
    if name == "antithetic":
        per_draw = (per_draw[0::2] + per_draw[1::2]) / 2
    np.testing.assert_allclose(draws, per_draw.T, atol=1e-12)
    # every prefix of every permutation, and LOO's coalitions, are played; nothing else
    prefixes = {sum(1 << int(i) for i in order[:k]) for order in perms for k in range(n + 1)}
    assert set(e.coalitions()) == prefixes | {15, 14, 13, 11, 7}
    assert len(e.coalitions()) == len(set(e.coalitions()))


def test_sampled_cost_is_the_expected_number_of_distinct_coalitions():
    """``coalitions_per_size`` (what a study's plan counts without drawing) against the mean over 400 seeds
    of the distinct coalitions actually drawn (Monte Carlo error ~1%)."""
    n, budget = 5, 6
    drawn = np.zeros(n + 1)
    for seed in range(400):
        for m in estimator("permutation", n, budget=budget, seed=seed).coalitions():
            if m:
                drawn[bin(m).count("1")] += 1 / 400
    expected = estimator_class("permutation").coalitions_per_size(n, budget)
    for k in range(1, n + 1):
        assert expected[k] == pytest.approx(drawn[k], rel=0.05), k
    assert expected[n] == 1.0 and expected[n - 1] == n  # LOO's coalitions always


def test_budget_errors_are_one_line_in_the_callers_spelling():
    perm, exact, anti = (estimator_class(e) for e in ("permutation", "exact", "antithetic"))
    cases = [(perm, None, False, r"^estimator='permutation' needs budget=<number of permutations> \(e\.g\. budget=200\)$"),
             (perm, None, True, r"^--estimator permutation needs --budget N, the number of permutations \(e\.g\. --budget 200\)$"),
             (exact, 10, False, r"^budget only applies to estimator='permutation', 'antithetic' or 'regression', not 'exact'$"),
             (exact, 10, True, r"^--budget only applies to --estimator permutation, antithetic or regression, not exact$"),
             (perm, 1, True, r"^--budget must be an int >= 2 permutations"),
             (perm, True, False, r"^budget must be an int >= 2 permutations"),
             (anti, 5, False, r"^estimator='antithetic' pairs each permutation with its reverse, so the budget must be even, got 5$"),
             (anti, 5, True, r"^--estimator antithetic pairs .* budget must be even, got 5$")]
    for cls, budget, flags, message in cases:
        with pytest.raises(ConfigError, match=message):
            cls.check_budget(budget, flags=flags)
    perm.check_budget(200)
    exact.check_budget(None)


def test_shapley_weights_live_in_one_place():
    import trainers
    from crl_envs.valuation import credit

    assert credit.shapley_weight is estimators.shapley_weight is trainers.shapley_weight
    for n in range(1, 7):  # the matrix is built from the same weight: W[i, S] = w(|S|) in S, -w(|S|+1) outside
        w = estimators.shapley_weights(n)
        for s in range(1 << n):
            size = bin(s).count("1")
            for i in range(n):
                assert w[i, s] == (estimators.shapley_weight(size, n) if s >> i & 1 else
                                   -estimators.shapley_weight(size + 1, n))


# ---------------------------------------------------------------------- a new estimator is one class
class EndpointsEstimator(Estimator):
    """Shapley from the two ends of a permutation only: ``(v(i) - v(∅) + v(N) - v(N - i)) / 2`` (exact for
    two players, and for any additive game)."""

    name = "endpoints"
    help = "Shapley from the first and last positions: 2n+2 coalitions"
    measures = ("loo", "shapley")

    def weights(self, measure):
        if measure != "shapley":
            return super().weights(measure)
        n, full = self.n, (1 << self.n) - 1
        masks = list(dict.fromkeys([0, full] + [1 << i for i in range(n)] + [full & ~(1 << i) for i in range(n)]))
        col = {m: k for k, m in enumerate(masks)}
        w = np.zeros((n, len(masks)))
        for i in range(n):
            for m, sign in ((1 << i, 0.5), (0, -0.5), (full, 0.5), (full & ~(1 << i), -0.5)):
                w[i, col[m]] += sign
        return masks, w


@pytest.fixture
def endpoints(monkeypatch):
    monkeypatch.setattr(estimators, "REGISTRY", dict(estimators.REGISTRY))
    register(EndpointsEstimator)
    return EndpointsEstimator


def mixed_pool(k: int):
    return agents.pool([agents.ScriptedAgent.expert(f"e{a}", a, seed=3) for a in (0.9, 0.6, 0.4)[:k]])


def test_a_registered_estimator_runs_through_evaluate(endpoints):
    assert "endpoints" in ESTIMATORS and "endpoints" in valuation.ESTIMATORS
    task = tasks.load("arith", n=12, seed=2)
    two = valuation.evaluate("debate", mixed_pool(2), task, estimator="endpoints", cache_dir=False, progress=False)
    exact = valuation.evaluate("debate", mixed_pool(2), task, cache_dir=False, progress=False)
    assert two.estimator == "endpoints" and two.banzhaf is None and two.coalitions == 3
    np.testing.assert_allclose(two.shapley.per_question, exact.shapley.per_question, atol=1e-12)  # exact at n = 2
    np.testing.assert_array_equal(two.loo.per_question, exact.loo.per_question)
    three = valuation.evaluate("debate", mixed_pool(3), task, estimator="endpoints", cache_dir=False, progress=False,
                               cost_lambda=0.5)
    costs = three.coalition_costs
    v = {m: costs.values[k] for k, m in enumerate(costs.masks)} | {0: np.full(12, three.empty_value)}
    assert sorted(costs.masks) == [1, 2, 3, 4, 5, 6, 7]  # 2n + 1 distinct non-empty coalitions at n = 3: 7
    expected = np.array([(v[1 << i] - v[0] + v[7] - v[7 & ~(1 << i)]) / 2 for i in range(3)])
    np.testing.assert_allclose(three.shapley.per_question, expected, atol=1e-12)
    tokens = {m: costs.spends[k].tokens / 1000 for k, m in enumerate(costs.masks)} | {0: np.zeros(12)}
    cost = np.array([(tokens[1 << i] + tokens[7] - tokens[7 & ~(1 << i)]) / 2 for i in range(3)])
    np.testing.assert_allclose(three.cost.per_question, cost, atol=1e-12)  # the cost game, valued by it too
    np.testing.assert_allclose(three.tradeoff.per_question, three.shapley.per_question - 0.5 * cost, atol=1e-12)
    with pytest.raises(ConfigError, match="budget only applies to estimator="):
        valuation.evaluate("vote", mixed_pool(2), task, estimator="endpoints", budget=4, cache_dir=False)


def test_the_cli_and_the_study_plan_ask_the_registry(endpoints, tmp_path, capsys):
    from crl_envs.commands import main
    from crl_envs.study.cells.valuation import ValuationCell

    assert main(["value", "--protocol", "vote", "--pool", "scripted", "--estimator", "endpoints", "--n", "4",
                 "--no-cache", "--quiet", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "vote_v0-arith-endpoints.json").exists()
    capsys.readouterr()
    from crl_envs.study.cells.specs import ValuationSpec

    spec = ValuationSpec(pool="zoo", pool_label="zoo", protocol={"protocol": "vote", "options": {}},
                         protocol_label="vote", task={"name": "arith", "n": 8, "split": "test", "seed": 0, "options": {}},
                         task_label="arith", estimator={"exact_up_to": 2, "larger": "endpoints"}, samples=1, seed=0,
                         budget=None, sampling={"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24}, ci_level=0.95,
                         bootstrap_resamples=2000)
    cell = ValuationCell.make("valuation/x", spec)
    kind, budget = cell.estimator_kind(5)
    assert kind is EndpointsEstimator and budget is None
    assert kind.coalitions_per_size(5) == {5: 1.0, 4: 5.0, 1: 5.0}  # counted from its coalitions
    assert cell.estimator_kind(2)[0] is estimator_class("exact")


def test_a_study_config_asks_the_estimator_about_its_budget(tmp_path):
    """An odd antithetic budget is refused when the config is read (it failed in the plan, outside the config's
    errors, before), in the estimator's words under the config's key."""
    from crl_envs import study
    from crl_envs.study.config import StudyConfigError

    config = {"study": {"name": "s", "out": str(tmp_path)}, "pools": {"p": [{"expert": 0.8}, {"expert": 0.5}]},
              "tasks": {"arith": {"n": 4}}, "protocols": {"vote": {}},
              "valuation": {"estimator": "antithetic", "budget": 5}}
    with pytest.raises(StudyConfigError, match=r"^study config: valuation\.budget: estimator 'antithetic' pairs each "
                                               r"permutation with its reverse, so the budget must be even, got 5$"):
        study.load_config(config)
    config["valuation"]["budget"] = 6
    (cell,) = study.plan(study.load_config(config))
    kind, budget = cell.estimator_kind(2)
    assert kind is estimator_class("antithetic") and budget == 6
