"""Pools of 16 (issue #54 item 1): their registration, their stated checks on planted truth, and one
committed figure of ``docs/pools16.json`` replayed (``benchmarks/pools16.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import agents
from agents.zoo.specs import POOL_SHAPES16, POOLS4, POOLS16, SAMPLED_TEMPERATURE

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import pools16  # noqa: E402

COMMITTED = ROOT / "docs" / "pools16.json"


def test_every_pool_of_16_is_registered_with_its_stated_shape_and_checks():
    assert set(POOLS16) == set(POOL_SHAPES16) == set(pools16.CHECKS)
    for name, seats in POOLS16.items():
        assert len(seats) == 16, name
        assert name in agents.pool_names()
        assert all(POOL_SHAPES16[name]), name
        assert POOL_SHAPES16[name][2] in ("graded", "close")
    hf = agents.agent_class("zoo16-graded")
    assert hf.__name__ == "HFAgent" and hf.deterministic
    assert agents.agent_class("zoo16-copies") is agents.SampledAgent and not agents.SampledAgent.deterministic


def test_copies_pool_samples_each_seat_with_its_own_seed():
    pool = agents.pool("zoo16-copies")
    assert len(pool) == 16 and all(isinstance(a, agents.SampledAgent) for a in pool.values())
    base = {id(a.agent) for a in pool.values()}
    assert len(base) == 1  # one model loaded once
    assert {a.temperature for a in pool.values()} == {SAMPLED_TEMPERATURE}
    request = agents.Request([{"role": "user", "content": "What is 47 + 85?"}], agents.SamplingParams(max_new_tokens=24))
    seat = pool["model_0"]
    texts = [g.text for g in seat.generate([agents.Request(request.messages, request.sampling.with_seed(s))
                                            for s in range(12)])]
    assert len(set(texts)) > 1, "sampled seeds should not all give one answer"
    again = [g.text for g in seat.generate([agents.Request(request.messages, request.sampling.with_seed(s))
                                            for s in range(12)])]
    assert again == texts  # a seed gives the same answer again
    greedy = seat.agent.generate([request] * 2)
    assert greedy[0].text == greedy[1].text
    assert seat.fingerprint != seat.agent.fingerprint


def test_specialists_pool_is_v4_specialists_greedy_then_sampled():
    pool = agents.pool("zoo16-specialists")
    specialists = list(POOLS4["zoo4-specialists"])
    assert pool.names[:8] == specialists
    assert pool.names[8:] == [f"{m}@t{SAMPLED_TEMPERATURE:g}" for m in specialists]


def test_sampled_agent_refuses_a_greedy_temperature():
    seat = agents.ScriptedAgent("s", lambda ex, msgs: "The answer is 1.")
    with pytest.raises(Exception, match="temperature must be a number > 0"):
        agents.SampledAgent(seat, 0.0)


def test_vote_shapley_matches_the_valuation_of_a_scripted_pool():
    """The benchmark's vote game from answers equals crl_envs.valuation's exact Shapley on the same answers."""
    from crl_envs import tasks, valuation

    task = tasks.load("arith", split="test", n=12, seed=3, digits=1)
    rng = np.random.default_rng(0)
    n = 5
    offsets = rng.integers(-1, 2, (len(task.examples), n)) * (rng.random((len(task.examples), n)) < 0.5)
    table = {e.id: offsets[k] for k, e in enumerate(task.examples)}

    def seat(i: int) -> agents.ScriptedAgent:
        return agents.ScriptedAgent(f"s{i}", lambda ex, msgs, i=i: f"The answer is {int(ex.answer) + int(table[ex.id][i])}.")

    report = valuation.evaluate("vote", agents.pool([seat(i) for i in range(n)]), task, cache_dir=False, progress=False)
    codes = np.array([[int(table[e.id][i]) for i in range(n)] for e in task.examples]) + 1  # 1 is right
    right = (codes == 1).astype(float)
    np.testing.assert_allclose(pools16.vote_shapley(codes, right), report.shapley.per_question, atol=1e-12)


def test_planted_truth_the_tau0_construction_is_near_zero():
    """The planted populations, computed exactly: the graded pool's tau is 1, the tau-0 construction's lies well
    inside the decoupling margin, with every redundant seat stronger alone than every complementary one and the
    weaker redundant seats worth less in vote than every complementary one."""
    graded, tau0 = pools16.planted_truth("graded"), pools16.planted_truth("tau0")
    assert graded["tau"] == 1.0 and abs(tau0["tau"]) < 0.1
    assert min(tau0["accuracy"][:8]) > max(tau0["accuracy"][8:])
    assert max(tau0["shapley"][:4]) < min(tau0["shapley"][8:])


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["graded", "tau0"])
def test_planted_truth_agrees_with_questions_played_through_vote(shape):
    """A 4,000-question Monte Carlo through vote's rule gives the exact population within 4 standard errors."""
    truth = pools16.planted_truth(shape)
    rng = np.random.default_rng(7)
    codes = np.concatenate([pools16.planted_codes(shape, 400, rng) for _ in range(10)])
    right = (codes == 0).astype(float)
    phi = pools16.vote_shapley(codes, right)
    se = phi.std(axis=1, ddof=1) / np.sqrt(len(codes))
    assert np.all(np.abs(phi.mean(axis=1) - truth["shapley"]) < 4 * se + 1e-5)
    np.testing.assert_allclose(right.mean(axis=0), truth["accuracy"], atol=4 * 0.5 / np.sqrt(len(codes)))


@pytest.mark.parametrize("shape", ["graded", "copies", "tau0"])
def test_planted_shapes_get_their_stated_verdicts(shape):
    """The study's verdict on planted tables (200 questions played through vote's rule, 10 draws of 100): graded is
    coupled, copies and the tau-0 construction are not called coupled more than chance allows."""
    out = pools16.planted_check(shape, questions=200, draws=10, draw_questions=100)
    coupled = out["verdicts"].get("coupled", {"rate": 0.0})["rate"]
    if shape == "graded":
        assert coupled >= 0.8
    else:
        assert coupled <= 0.3
    if shape == "copies":
        assert out["true_tau"] is None and np.ptp(out["accuracy"]) < 0.2


def test_checks_read_figures_as_stated():
    rng = np.random.default_rng(1)
    right = (rng.random((16, 200)) < 0.7).astype(float)
    verdict = {"kendall_tau": 0.1, "p_value": 0.6, "min_p_value": 1e-13, "tau_ci": [-0.5, 0.6], "tau_ci_level": 0.95,
               "verdict": "inconclusive"}
    f = pools16.figures(["m"] * 16, right, right / 16, right.max(axis=0), verdict)
    held = pools16.check("zoo16-copies", f)
    assert held["exchangeable"]["held"] and held["not_coupled"]["held"]
    graded = (rng.random((16, 200)) < np.linspace(0.05, 0.9, 16)[:, None]).astype(float)
    f = pools16.figures(["m"] * 16, graded, graded / 16, graded.max(axis=0), verdict)
    assert not pools16.check("zoo16-copies", f)["exchangeable"]["held"]
    assert pools16.check("zoo16-graded", f)["spread"]["held"] and not pools16.check("zoo16-graded", f)["coupled"]["held"]


@pytest.mark.skipif(not COMMITTED.exists(), reason="docs/pools16.json not written yet")
def test_committed_figures_replay():
    """The committed per-question tables give the committed means, tau, verdict and checks again, and the copies
    pool's solo answers replay: its 16 sampled seats on the first 30 committed questions score as committed."""
    import crl_envs
    from benchmarks.levels import task_for
    from crl_envs import stats

    result = json.loads(COMMITTED.read_text())
    for name, p in result["pools"].items():
        ind, sh = np.asarray(p["individual_per_question"], float), np.asarray(p["shapley_per_question"])
        np.testing.assert_allclose(ind.mean(axis=1), p["accuracy"], atol=1e-4)
        np.testing.assert_allclose(sh.mean(axis=1), p["shapley"], atol=1e-5)
        cf = stats.crossfit_tau(ind, sh, p["example_ids"], level=1 - result["alpha"])
        v = stats.verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"], alpha=result["alpha"],
                          questions=cf["questions"])
        assert v == p["verdict"]["verdict"], name
        assert cf["kendall_tau"] == pytest.approx(p["verdict"]["kendall_tau"]), name
        assert pools16.check(name, p) == p["checks"], name
    copies = result["pools"]["zoo16-copies"]
    task = task_for(result["questions"], result["seed"])
    task = task.subset(copies["example_ids"][:30])
    episodes = crl_envs.run_episodes("vote", agents.pool("zoo16-copies"), task, seed=result["seed"], progress=False,
                                     sampling=agents.SamplingParams(max_new_tokens=result["max_new_tokens"]))
    played = np.array([[ep.standalone[f"model_{i}"] for ep in episodes] for i in range(16)])
    np.testing.assert_array_equal(played, np.asarray(copies["individual_per_question"])[:, :30])
