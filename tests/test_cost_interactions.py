"""Cost per coalition as deployed, cost-aware values, cost-quality fronts and interaction indices
(issue #45), checked against independent computations on scripted pools whose answers are planted."""

from __future__ import annotations

import json
import warnings
from itertools import combinations
from math import factorial

import numpy as np
import pytest

import agents
from agents import ScriptedAgent
from crl_envs import tasks, valuation
from crl_envs.valuation import CoalitionGame
from crl_envs.valuation.fronts import Front, pareto
from crl_envs.valuation.interactions import game_interactions
from crl_kit.errors import ConfigError

shapiq = pytest.importorskip("shapiq")

KINDS = 3
QUESTIONS = 12


def planted(right: list[set[int]], task) -> list[ScriptedAgent]:
    """Agents right on the questions of the kinds in ``right[i]`` (kind = position mod 3), each wrong one
    with its own wrong value (so wrong answers never agree)."""
    kind = {e.id: k % KINDS for k, e in enumerate(task.examples)}

    def agent(i: int, kinds: set[int]) -> ScriptedAgent:
        def respond(ex, msgs, i=i, kinds=frozenset(kinds), kind=kind):
            return f"The answer is {ex.answer if kind[ex.id] in kinds else int(ex.answer) + 100 + i}."

        return ScriptedAgent(f"p{i}-{''.join(map(str, sorted(kinds)))}", respond)

    return [agent(i, k) for i, k in enumerate(right)]


def vote_value(right: list[set[int]], members: tuple[int, ...]) -> float:
    """v(S) under plurality vote, computed here: per kind, the most frequent answer, ties to the member
    first in pool order; the right answer is 'R', member i's wrong one 'W{i}'."""
    if not members:
        return 0.0
    wins = 0
    for k in range(KINDS):
        answers = ["R" if k in right[i] else f"W{i}" for i in members]
        counts = {a: answers.count(a) for a in answers}
        wins += next(a for a in answers if counts[a] == max(counts.values())) == "R"
    return wins / KINDS


def sii(right: list[set[int]], i: int, j: int) -> float:
    """The pairwise Shapley interaction index by its definition."""
    n = len(right)
    rest = [p for p in range(n) if p not in (i, j)]
    total = 0.0
    for s in range(len(rest) + 1):
        for S in combinations(rest, s):
            w = factorial(s) * factorial(n - s - 2) / factorial(n - 1)
            total += w * (vote_value(right, tuple(sorted(S + (i, j)))) - vote_value(right, tuple(sorted(S + (i,))))
                          - vote_value(right, tuple(sorted(S + (j,)))) + vote_value(right, S))
    return total


def moebius(right: list[set[int]], T: tuple[int, ...]) -> float:
    return sum((-1) ** (len(T) - s) * vote_value(right, S) for s in range(len(T) + 1) for S in combinations(T, s))


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", n=QUESTIONS, seed=3)


def test_near_clones_are_redundant(task):
    right = [{0, 1}, {0, 1}, {1, 2}]  # p0 and p1 answer alike (clones), p2 differs
    pool = agents.pool(planted(right, task))
    report = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, interactions=2)
    for i, j in combinations(range(3), 2):
        value, _ = report.interactions.of(f"model_{i}", f"model_{j}")
        assert value == pytest.approx(sii(right, i, j), abs=1e-12)
    # v(clones) = v(one clone): each adds nothing to the other
    assert report.interactions.of("model_0", "model_1")[0] == pytest.approx(-1 / 3)


def test_complementary_specialists_in_a_noisy_pool_have_synergy(task):
    # two noisy members first in pool order (their ties win), then three specialists, each blind to one kind:
    # any two specialists agree on the third kind and outvote the noise, which one alone cannot
    right = [set(), set(), {1, 2}, {0, 2}, {0, 1}]
    pool = agents.pool(planted(right, task))
    report = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, interactions=2)
    for i, j in combinations(range(5), 2):
        value, _ = report.interactions.of(f"model_{i}", f"model_{j}")
        assert value == pytest.approx(sii(right, i, j), abs=1e-12)
    for i, j in combinations((2, 3, 4), 2):
        assert report.interactions.of(f"model_{i}", f"model_{j}")[0] == pytest.approx(1 / 12)
    assert report.interactions.of("model_0", "model_2")[0] < 0


def test_specialists_alone_interact_at_order_three(task):
    # without noise, a pair's tie goes to its first member, so pairs are redundant; the three form majorities
    right = [{1, 2}, {0, 2}, {0, 1}]
    game = CoalitionGame("vote", agents.pool(planted(right, task)), task, cache_dir=False, progress=False)
    found = game_interactions(game, index="Moebius", order=3)
    for T in [t for k in (1, 2, 3) for t in combinations(range(3), k)]:
        assert found.means[found.interactions.index(T)] == pytest.approx(moebius(right, T), abs=1e-12)
    assert found.means[found.interactions.index((0, 1, 2))] == pytest.approx(1.0)
    assert sii(right, 0, 1) < 0


def test_cost_is_counted_as_deployed_and_cached(tmp_path, task):
    right = [{0, 1}, {0, 1}, {1, 2}]
    pool = agents.pool(planted(right, task))
    memo = CoalitionGame("vote", pool, task, cache_dir=tmp_path, progress=False)
    plain = CoalitionGame("vote", pool, task, cache_dir=False, progress=False, memo=False)
    masks = list(range(1, 8))
    a, b = memo.spends(masks), plain.spends(masks)
    for m in masks:  # the memo generates each shared request once; the cost counts every answer given
        for name in ("calls", "prompt_tokens", "generated_tokens"):
            assert np.array_equal(a[m].field(name), b[m].field(name))
        # a vote's members each answer once, with the same prompt: a coalition costs its members' sum
        singles = [a[1 << i] for i in range(3) if m >> i & 1]
        assert np.array_equal(a[m].calls, np.full(QUESTIONS, float(len(singles))))
        assert np.array_equal(a[m].tokens, sum(s.tokens for s in singles))
    assert a[1].prompt_tokens.min() > 0 and a[1].generated_tokens.min() > 0
    again = CoalitionGame("vote", pool, task, cache_dir=tmp_path, progress=False)
    cached = again.spends(masks)
    assert again.evaluations == 0 and all(np.array_equal(cached[m].tokens, a[m].tokens) for m in masks)
    assert not memo._path(0b011).exists()  # vote's larger coalitions are computed from its singles, never stored
    path = memo._path(0b001)
    record = json.loads(path.read_text())
    assert set(record["spend"]) == {"calls", "prompt_tokens", "generated_tokens", "seconds"}
    del record["spend"]  # an entry without cost (as version 2 wrote them) is played again, with a warning
    path.write_text(json.dumps(record))
    fresh = CoalitionGame("vote", pool, task, cache_dir=tmp_path, progress=False)
    with pytest.warns(RuntimeWarning, match="no cost record"):
        fresh.spends([0b011])
    assert fresh.evaluations == 1


def test_cost_aware_values_use_the_estimators_weights(task):
    right = [{0, 1}, {0, 1}, {1, 2}]
    pool = agents.pool(planted(right, task) + [ScriptedAgent("chatty", lambda ex, m: "Let me think. " * 5
                                                               + f"The answer is {ex.answer}.")])
    plain = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False)
    report = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, cost_lambda=0.5)
    for k, m in plain.measures.items():  # values and their CIs do not move
        assert np.array_equal(m.per_question, report.measures[k].per_question) and m.ci == report.measures[k].ci
    costs = report.coalition_costs
    c = {m: costs.spends[k].tokens / 1000 for k, m in enumerate(costs.masks)} | {0: np.zeros(QUESTIONS)}
    w = valuation.shapley_weights(4)
    assert np.allclose(report.cost.per_question, w @ np.stack([c[m] for m in range(16)]))
    assert np.allclose(report.cost.per_question.sum(axis=0), c[15])  # efficiency: the costs add up to c(N)
    assert np.allclose(report.tradeoff.per_question, report.shapley.per_question - 0.5 * report.cost.per_question)
    for i in range(4):  # a vote's cost is additive, so each model's cost value is what it costs alone
        assert report.cost[f"model_{i}"] == pytest.approx(c[1 << i].mean())
    assert report.cost["model_3"] > report.cost["model_0"]  # the chatty one costs more
    ratio, _ = report.value_per_1k()
    assert ratio[3] == pytest.approx(report.shapley["model_3"] / report.cost["model_3"])
    again = valuation.ValuationReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert np.array_equal(again.tradeoff.per_question, report.tradeoff.per_question)
    assert again.cost.ci == report.cost.ci


def test_front_and_cheapest_within():
    acc = np.array([0.5, 0.7, 0.6, 0.8, 0.79])
    cost = np.array([1.0, 2.0, 3.0, 5.0, 4.0])
    assert pareto(acc, cost).tolist() == [0, 1, 4, 3]
    rng = np.random.default_rng(0)
    per_q = (rng.random((5, 400)) < acc[:, None]).astype(float)
    front = Front([("p", (str(k),)) for k in range(5)], per_q,
                                   {"tokens": np.repeat(cost[:, None], 400, axis=1)})
    best = int(np.argmax(per_q.mean(axis=1)))
    pick = front.cheapest_within(0.05)
    means = per_q.mean(axis=1)
    ok = [k for k in range(5) if means[k] >= means[best] - 0.05]
    assert pick["point"] == min(ok, key=lambda k: cost[k]) and pick["best"] == best
    share = front.front_share()
    assert share[0] == 1.0 and share[2] < 0.5  # the cheapest is always on it; a dominated point rarely
    with pytest.raises(ConfigError, match="fraction of accuracy"):
        front.cheapest_within(5)


def test_interaction_options_fail_before_any_run(task):
    pool = agents.pool(planted([{0}, {1}, {2}], task))
    with pytest.raises(ConfigError, match="order must be an int in 1..3"):
        valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, interactions=4)
    with pytest.raises(ConfigError, match="unknown interaction index 'STI'"):
        valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, interactions=2,
                           interaction_index="STI")
    with pytest.raises(ConfigError, match="needs budget"):
        valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, interactions=2,
                           interaction_approximator="SVARMIQ")


def test_an_approximator_goes_through_the_same_call(task):
    right = [set(), set(), {1, 2}, {0, 2}, {0, 1}]
    game = CoalitionGame("vote", agents.pool(planted(right, task)), task, cache_dir=False, progress=False)
    exact = game_interactions(game, index="k-SII", order=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        approx = game_interactions(game, index="k-SII", order=2, approximator="KernelSHAPIQ",
                                                          budget=32)
    assert approx.interactions == exact.interactions
    # with every coalition in the budget, KernelSHAP-IQ solves the exact least-squares problem
    assert np.allclose(approx.means, exact.means, atol=1e-6)


def test_study_fronts_join_protocols_of_a_pool(task):
    from crl_envs.study.tables import markdown
    from crl_envs.valuation.fronts import study_fronts

    right = [{0, 1}, {0, 1}, {1, 2}]
    pool = agents.pool(planted(right, task))
    cells = []
    for protocol in ("vote", "debate"):
        report = valuation.evaluate(protocol, pool, task, cache_dir=False, progress=False, estimator="loo")
        cells.append({"report": json.loads(json.dumps(report.to_dict())),
                      "labels": {"pool": "planted", "protocol": protocol, "task": "arith"}})
    cells.append({"report": {k: v for k, v in cells[0]["report"].items() if k != "coalition_costs"},
                  "labels": {"pool": "old", "protocol": "vote", "task": "arith"}})
    fronts = study_fronts(cells, resamples=200)
    f = fronts["pools"]["planted"]["arith"]
    assert fronts["cells_without_costs"] == 1 and list(fronts["pools"]) == ["planted"]
    assert {p for p, _ in f["labels"]} == {"vote", "debate"} and len(f["labels"]) == 8  # LOO: n + 1 coalitions each
    assert f["front"]["tokens"] == pareto(np.array(f["accuracy"]), np.array(f["cost"]["tokens"])).tolist()
    text = markdown({"name": "t", "fronts": fronts})
    assert "Cost-quality fronts" in text and "Cheapest within 2 points" in text


def test_value_command_reports_costs_front_and_interactions(tmp_path, capsys):
    from crl_envs.commands import main

    base = ["value", "--pool", "scripted", "--protocol", "vote", "--n", "6", "--quiet", "--no-cache",
            "--out", str(tmp_path)]
    assert main(base) == 0
    plain = capsys.readouterr().out
    assert main(base + ["--costs", "--cost-lambda", "0.5", "--front", "0.05", "--interactions", "2"]) == 0
    out = capsys.readouterr().out
    head = plain.split("\nwrote ")[0]
    assert out.startswith(head)  # the main table is unchanged; the sections follow it
    for section in ("cost per coalition (vote_v0", "cost-aware values", "accuracy vs tokens", "accuracy vs seconds",
                    "cheapest within 5 points", "interactions (SII, order <= 2, exact"):
        assert section in out
    assert (tmp_path / "vote_v0-arith-exact-front-tokens.png").exists()
    assert (tmp_path / "vote_v0-arith-exact-interactions.png").exists()
    assert main(base + ["--interactions", "4"]) == 2
    assert "interaction order must be an int in 1..3" in capsys.readouterr().err
    assert main(base + ["--interaction-budget", "40"]) == 2
    assert "need --interactions ORDER" in capsys.readouterr().err
