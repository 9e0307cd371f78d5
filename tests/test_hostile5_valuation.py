"""Issue #57, findings 10 and 11: sampled interaction indices at a budget too small to mean anything, and
twins on the cost-quality front. Each test failed on the main branch before the fix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import agents
from crl_envs import tasks, valuation
from crl_envs.valuation.fronts import Front, pareto
from crl_kit.errors import ConfigError


# ---------------------------------------------------------------------- finding 11: ties on the front
def front_by_definition(accuracy: np.ndarray, cost: np.ndarray) -> set[int]:
    """The docstring's definition, point by point: no other point at most as costly and strictly more
    accurate, or strictly cheaper and as accurate."""
    return {k for k in range(len(accuracy))
            if not any((cost[j] <= cost[k] and accuracy[j] > accuracy[k])
                       or (cost[j] < cost[k] and accuracy[j] >= accuracy[k]) for j in range(len(accuracy)))}


def test_pareto_keeps_every_twin_as_its_definition_says():
    assert pareto(np.array([0.5, 0.5, 0.9, 0.4]), np.array([1.0, 1.0, 3.0, 2.0])).tolist() == [0, 1, 2]
    rng = np.random.default_rng(0)
    for _ in range(300):  # coarse grids: many ties in accuracy, in cost, and in both
        k = int(rng.integers(1, 9))
        acc, cost = rng.integers(0, 4, k) / 4, rng.integers(0, 4, k).astype(float)
        got = pareto(acc, cost)
        assert set(got.tolist()) == front_by_definition(acc, cost), (acc, cost)
        assert np.all(np.diff(cost[got]) >= 0)  # cheapest first


def test_a_twin_is_on_the_front_as_often_as_its_twin():
    rng = np.random.default_rng(1)
    row = (rng.random(40) < 0.7).astype(float)
    accuracy = np.stack([row, row, (rng.random(40) < 0.5).astype(float)])
    tokens = np.stack([np.full(40, 10.0), np.full(40, 10.0), np.full(40, 20.0)])
    front = Front([("vote", ("a",)), ("vote", ("b",)), ("vote", ("a", "b"))], accuracy, {"tokens": tokens},
                  bootstrap_resamples=200)
    assert front.front().tolist()[:2] == [0, 1]
    share = front.front_share()
    assert share[0] == share[1] == 1.0
    assert "vote: a " in front.table() and "vote: b " in front.table()


def test_clones_are_both_on_a_reports_front():
    """Two copies of one scripted model under vote (right on odd answers, terse) beside a chatty model that is
    always right: the copies' one-member coalitions are the cheapest systems, twins in accuracy and tokens on
    every question, so both are on the front, in every resample."""
    def clone(ex, messages):
        return f"The answer is {ex.answer if int(ex.answer) % 2 else int(ex.answer) + 1}."

    pool = agents.pool([agents.ScriptedAgent("left", clone), agents.ScriptedAgent("right", clone),
                        agents.ScriptedAgent("chatty", lambda ex, m: "Let me think. " * 8 + f"The answer is {ex.answer}.")])
    report = valuation.evaluate("vote", pool, tasks.load("arith", n=20, seed=3), cache_dir=False, progress=False,
                                bootstrap_resamples=200)
    front = report.front(costs=("tokens",))
    single = [front.labels.index(("vote_v0", (name,))) for name in ("left", "right")]
    assert np.array_equal(front.accuracy[single[0]], front.accuracy[single[1]])
    assert np.array_equal(front.costs["tokens"][single[0]], front.costs["tokens"][single[1]])
    assert 0 < front.accuracy[single[0]].mean() < 1
    assert front.front("tokens")[:2].tolist() == single
    assert front.front_share("tokens")[single].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------- finding 10: KernelSHAP-IQ's budget
def test_kernelshapiq_refuses_a_budget_too_small_to_mean_anything():
    pytest.importorskip("shapiq")
    from crl_envs.valuation.interactions import check_options

    n = 13
    for budget in (2 * n + 2, 92, 183):  # 92: one coalition per term up to order 2 (1 + 13 + 78) gave |74|
        with pytest.raises(ConfigError, match=r"^approximator KernelSHAPIQ needs budget=<coalitions to evaluate>, an "
                                              r"int >= 184 for 13 models \(twice the 92 terms .*\), got \d+$"):
            check_options(n, "SII", 2, "KernelSHAPIQ", budget)
    check_options(n, "SII", 2, "KernelSHAPIQ", 184)
    check_options(n, "SII", 2, "SVARMIQ", 2 * n + 2)  # SVARM-IQ stays in range from 2n + 2
    check_options(4, "SII", 2, "KernelSHAPIQ", 16)  # every coalition of 4 models: exact


@pytest.mark.parametrize("approximator", ["KernelSHAPIQ", "SVARMIQ"])
def test_sampled_interactions_at_the_least_budget_stay_in_range_or_are_untagged(approximator):
    """A [0, 1] game's pairwise SII lies in [-2, 2] and its order-1 SII (Shapley) in [-1, 1]. At the least
    budget accepted, each approximator's indices either stay in range or are reported undefined (NaN): never
    a tagged out-of-range value."""
    pytest.importorskip("shapiq")
    from crl_envs.valuation.interactions import Interactions, least_budget, per_question_indices

    n, questions = 13, 4
    rng = np.random.default_rng(5)
    table = {}

    def values(masks):
        for m in masks:
            if int(m) not in table:
                table[int(m)] = rng.random(questions) if m else np.zeros(questions)
        return np.stack([table[int(m)] for m in masks])

    budget = least_budget(approximator, n, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wanted, found = per_question_indices(values, n, questions, index="SII", order=2, approximator=approximator,
                                             budget=budget, seed=0)
    bound = np.array([1.0 if len(t) == 1 else 2.0 for t in wanted])[:, None]
    defined = ~np.isnan(found).any(axis=1)
    assert np.all(np.abs(found[defined]) <= bound[defined] + 1e-9)
    result = Interactions("SII", 2, [f"m{i}" for i in range(n)], wanted, found, approximator=approximator,
                          budget=budget, bootstrap_resamples=100)
    for line in result.table().splitlines()[1:]:
        if line.endswith(("redundant", "synergy")):
            value = float(line.split("[")[0].split()[-1])
            assert abs(value) <= 2, line
        else:
            assert "undefined" in line or "[" in line, line


def test_an_out_of_range_sampled_index_is_undefined_and_untagged(monkeypatch):
    """The approximator's output is checked, whatever the budget: an SII beyond the range a game of these values
    allows becomes undefined (NaN), printed as such, with no redundant/synergy tag."""
    shapiq = pytest.importorskip("shapiq")
    from crl_envs.valuation.interactions import Interactions, per_question_indices

    real = shapiq.SVARMIQ.approximate

    def inflated(self, budget, game, *args, **kwargs):
        result = real(self, budget, game, *args, **kwargs)
        result.interactions[(0, 1)] = 74.0  # what KernelSHAP-IQ gave at 2n + 2
        return result

    monkeypatch.setattr(shapiq.SVARMIQ, "approximate", inflated)
    rng = np.random.default_rng(0)
    wanted, found = per_question_indices(lambda masks: rng.random((len(masks), 3)), 5, 3, index="SII", order=2,
                                         approximator="SVARMIQ", budget=20, seed=0)
    pair = wanted.index((0, 1))
    assert np.isnan(found[pair]).all() and not np.isnan(np.delete(found, pair, axis=0)).any()
    text = Interactions("SII", 2, [f"m{i}" for i in range(5)], wanted, found, approximator="SVARMIQ", budget=20,
                        bootstrap_resamples=50).table()
    line = next(x for x in text.splitlines() if x.strip().startswith("m0 + m1"))
    assert "undefined" in line and "redundant" not in line and "synergy" not in line and text.splitlines()[-1] == line
