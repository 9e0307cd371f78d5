"""crl_envs.valuation: the coalition game, its cache, the estimators, reports and the pooled test.

Reference values are computed here independently of the package: coalition values straight from
``run_episodes``, Shapley by brute force over all permutations, Banzhaf over all subsets.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import agents
import crl_envs
from crl_envs import run_episodes, tasks, valuation
from crl_envs.protocols.vote import VoteEnv
from crl_envs.valuation import Measure, ValuationReport, correlation, evaluate, pooled_test

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- independent references
def coalition_values(protocol, pool, task, empty: float, **kw) -> dict[frozenset, np.ndarray]:
    """v(S) per question for every coalition S, straight from the runner."""
    ids = pool.ids
    out = {frozenset(): np.full(len(task), empty)}
    for k in range(1, len(ids) + 1):
        for members in itertools.combinations(ids, k):
            eps = run_episodes(protocol, pool, task, coalition=list(members), progress=False, **kw)
            out[frozenset(members)] = np.array([e.score for e in eps])
    return out


def brute_force_shapley(v: dict[frozenset, np.ndarray], ids: list[str]) -> np.ndarray:
    """Average marginal contribution over all n! orderings, per question."""
    phi = np.zeros((len(ids), len(next(iter(v.values())))))
    perms = list(itertools.permutations(ids))
    for perm in perms:
        before: frozenset = frozenset()
        for a in perm:
            phi[ids.index(a)] += v[before | {a}] - v[before]
            before = before | {a}
    return phi / len(perms)


def brute_force_banzhaf(v: dict[frozenset, np.ndarray], ids: list[str]) -> np.ndarray:
    phi = np.zeros((len(ids), len(next(iter(v.values())))))
    for i, a in enumerate(ids):
        others = [b for b in ids if b != a]
        for k in range(len(others) + 1):
            for s in itertools.combinations(others, k):
                phi[i] += v[frozenset(s) | {a}] - v[frozenset(s)]
        phi[i] /= 2 ** len(others)
    return phi


def always(answer: str):
    return lambda example, messages: f"The answer is {answer}."


@pytest.fixture
def mixed_pool():
    """Three experts and a stubborn agent that always answers 0 (right only when the answer is 0)."""
    return agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a, seed=3) for a in (0.85, 0.6, 0.45)]
                       + [agents.ScriptedAgent("zero", always("0"))])


# ---------------------------------------------------------------------- exactness
def test_exact_shapley_and_banzhaf_match_brute_force(mixed_pool, tmp_path):
    task = tasks.load("arith", n=25, seed=1)
    report = evaluate("debate", mixed_pool, task, cache_dir=tmp_path, progress=False)
    v = coalition_values("debate", mixed_pool, task, empty=0.0)
    ids = mixed_pool.ids
    np.testing.assert_allclose(report.shapley.per_question, brute_force_shapley(v, ids), atol=1e-12)
    np.testing.assert_allclose(report.banzhaf.per_question, brute_force_banzhaf(v, ids), atol=1e-12)
    full = frozenset(ids)
    loo = np.stack([v[full] - v[full - {a}] for a in ids])
    np.testing.assert_allclose(report.loo.per_question, loo, atol=1e-12)
    np.testing.assert_allclose(report.system, v[full])
    # efficiency, per question
    np.testing.assert_allclose(report.shapley.per_question.sum(axis=0), v[full] - report.empty_value, atol=1e-12)
    assert report.empty_value == crl_envs.protocols.debate.DebateEnv.empty_value
    # a non-trivial game: values differ between players
    assert len({round(x, 6) for x in report.shapley.means}) > 1
    assert report.shapley["model_0"] == pytest.approx(report.shapley.per_question[0].mean())


def test_individual_is_each_model_answering_alone(mixed_pool, tmp_path):
    task = tasks.load("arith", n=20, seed=2)
    report = evaluate("debate", mixed_pool, task, estimator="loo", cache_dir=tmp_path, progress=False)
    for i, a in enumerate(mixed_pool.ids):
        eps = run_episodes("vote", mixed_pool, task, coalition=[a], progress=False)
        assert [len(e.transcript) for e in eps] == [1] * len(task)  # one answer, no protocol
        np.testing.assert_array_equal(report.individual.per_question[i], [e.score for e in eps])
    # the expert's accuracy is what individual strength recovers; "zero" is right only on answer 0
    zero_right = np.mean([ex.answer == "0" for ex in task])
    assert report.individual["model_3"] == pytest.approx(zero_right)


def test_empty_value_chance_from_protocol(tmp_path):
    class ChanceVote(VoteEnv):
        empty_value = "chance"

    task = tasks.load("arith", n=10)
    task.chance = 0.25
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.9, 0.5)])
    report = evaluate(lambda p, t, **o: ChanceVote(p, t, **o), pool, task, cache_dir=tmp_path, progress=False)
    assert report.empty_value == 0.25
    np.testing.assert_allclose(report.shapley.per_question.sum(axis=0), report.system - 0.25, atol=1e-12)


# ---------------------------------------------------------------------- counting and caching
def test_run_counts_and_cache(mixed_pool, tmp_path):
    n = len(mixed_pool)
    task = tasks.load("arith", n=8)
    loo = evaluate("debate", mixed_pool, task, estimator="loo", cache_dir=tmp_path, progress=False)
    assert (loo.system_evaluations, loo.individual_evaluations, loo.coalitions) == (n + 1, n, n + 1)
    assert loo.shapley is None and loo.banzhaf is None
    exact = evaluate("debate", mixed_pool, task, cache_dir=tmp_path, progress=False)
    assert exact.system_evaluations == 2**n - 1 - (n + 1)  # the LOO coalitions came from the cache
    assert exact.individual_evaluations == 0 and exact.coalitions == 2**n - 1
    again = evaluate("debate", mixed_pool, task, cache_dir=tmp_path, progress=False)
    assert (again.system_evaluations, again.individual_evaluations) == (0, 0)
    np.testing.assert_array_equal(again.shapley.per_question, exact.shapley.per_question)
    fresh = evaluate("debate", mixed_pool, task, cache_dir=tmp_path / "other", progress=False)
    assert fresh.system_evaluations == 2**n - 1  # v(empty) is defined, never run
    # anything that determines the result changes the key: seed, options, samples, questions
    for kw in ({"seed": 1}, {"options": {"rounds": 1}}, {"samples": 2}):
        r = evaluate("debate", mixed_pool, task, estimator="loo", cache_dir=tmp_path, progress=False, **kw)
        assert r.system_evaluations == n + 1, kw
    r = evaluate("debate", mixed_pool, tasks.load("arith", n=9), estimator="loo", cache_dir=tmp_path, progress=False)
    assert r.system_evaluations == n + 1
    # vote's one-member coalitions are the individual runs, and its other coalitions are computed from
    # them (no generation): exact vote = n runs in all
    vote = evaluate("vote", mixed_pool, task, cache_dir=tmp_path / "vote", progress=False)
    assert (vote.individual_evaluations, vote.system_evaluations, vote.coalitions) == (n, 0, 2**n - 1)
    assert vote.cached_evaluations == 0


class Coin(agents.ScriptedAgent):
    """Right when its request's sampling seed is odd: samples of one question differ."""

    def _respond(self, request):
        ex = request.metadata["example"]
        return f"The answer is {ex.answer if request.sampling.seed % 2 else -1}."


def test_cache_key_follows_agent_fingerprints(tmp_path):
    task = tasks.load("arith", n=4)
    experts = lambda acc: agents.pool([agents.ScriptedAgent.expert("a", acc), agents.ScriptedAgent.expert("b", 0.5)])  # noqa: E731
    key = lambda proto, pool, **o: valuation.CoalitionGame(proto, pool, task, options=o, cache_dir=tmp_path).key  # noqa: E731
    assert key("vote", experts(0.9)) == key("vote", experts(0.9))
    assert key("vote", experts(0.9)) != key("vote", experts(0.8))  # same names, other "weights"
    judge = lambda acc: agents.ScriptedAgent.expert("judge", acc)  # noqa: E731
    assert key("judge", experts(0.9), judge=judge(0.7)) != key("judge", experts(0.9), judge=judge(0.6))
    assert key("debate", experts(0.9), rounds=2) != key("debate", experts(0.9), rounds=3)


def test_samples_average_per_question(tmp_path):
    task = tasks.load("arith", n=6)
    coin = agents.pool([Coin("coin", always("unused"))])
    game = valuation.CoalitionGame("vote", coin, task, samples=4, cache_dir=tmp_path, progress=False)
    eps = run_episodes("vote", coin, task, samples=4, progress=False)
    expected = np.array([np.mean([e.score for e in eps if e.example_id == ex.id]) for ex in task])
    assert set(expected) - {0.0, 1.0}, "samples must disagree for this test to mean anything"
    np.testing.assert_allclose(game.value(1), expected)


KILL_SCRIPT = textwrap.dedent('''
    import os, sys, time, json
    import agents
    from agents import ScriptedAgent
    from crl_envs import tasks, valuation

    class Slow(ScriptedAgent):
        """An expert that sleeps per batch when SLOW is set (its fingerprint does not depend on it)."""
        def __init__(self, name, accuracy):
            inner = ScriptedAgent.expert(name, accuracy)
            super().__init__(name, lambda ex, msgs: "")
            self.inner, self._fingerprint = inner, "slow-" + inner.fingerprint
        def _generate(self, requests):
            time.sleep(float(os.environ.get("SLOW", "0")))
            return self.inner._generate(requests)

    def run(cache_dir):
        pool = agents.pool([Slow(f"e{a}", a) for a in (0.9, 0.7, 0.5, 0.3)])
        task = tasks.load("arith", n=15, seed=4)
        # two coalitions per lockstep group: results reach the cache group by group, SLOW seconds apart
        # per phase (with every coalition in one group, they would all land within milliseconds)
        executor = valuation.LocalExecutor(coalitions_per_task=2)
        return valuation.evaluate("debate", pool, task, cache_dir=cache_dir, progress=False, executor=executor)

    if __name__ == "__main__":
        report = run(sys.argv[1])
        report.to_json(sys.argv[2])
''')


def test_sigkill_midway_then_resume_matches_uninterrupted(tmp_path):
    script = tmp_path / "kill_script.py"
    script.write_text(KILL_SCRIPT)
    cache = tmp_path / "cache"
    env = {**os.environ, "SLOW": "0.15", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), str(cache), str(tmp_path / "never.json")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def results() -> list[Path]:
        return [p for p in cache.glob("*/*.json") if p.name != "meta.json"]

    deadline = time.monotonic() + 120
    while len(results()) < 4 + 3 and time.monotonic() < deadline:  # 4 individual runs, then >= 3 coalitions
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cached = len(results())
    assert 7 <= cached < 4 + 15, "the kill must land midway"
    for p in results():
        json.loads(p.read_text())  # every file on disk is whole

    out = tmp_path / "resumed.json"
    subprocess.run([sys.executable, str(script), str(cache), str(out)], env={**env, "SLOW": "0"}, check=True)
    resumed = ValuationReport.from_json(out)
    assert resumed.system_evaluations + resumed.individual_evaluations == 4 + 15 - cached

    spec = importlib.util.spec_from_file_location("kill_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    uninterrupted = module.run(tmp_path / "clean-cache")
    assert uninterrupted.system_evaluations == 15
    for name, m in uninterrupted.measures.items():
        np.testing.assert_array_equal(resumed.measures[name].per_question, m.per_question)
    np.testing.assert_array_equal(resumed.system, uninterrupted.system)


# ---------------------------------------------------------------------- sampled Shapley
@pytest.fixture(scope="module")
def six_pool_exact(tmp_path_factory):
    """A 6-member vote game, solved exactly once (its 63 coalitions cached for the sampled runs)."""
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a, seed=7) for a in (0.9, 0.75, 0.6, 0.5, 0.4, 0.3)])
    task = tasks.load("arith", n=30, seed=5)
    cache = tmp_path_factory.mktemp("six")
    exact = evaluate("vote", pool, task, cache_dir=cache, progress=False)
    # per-permutation marginal (mean over questions) of each player: its spread bounds the sampling error
    game = valuation.CoalitionGame("vote", pool, task, cache_dir=cache, progress=False)
    v = {m: game.value(m).mean() for m in range(64)}
    marginals = np.zeros((math.factorial(6), 6))
    for k, perm in enumerate(itertools.permutations(range(6))):
        before = 0
        for p in perm:
            marginals[k, p] = v[before | 1 << p] - v[before]
            before |= 1 << p
    np.testing.assert_allclose(marginals.mean(axis=0), exact.shapley.means, atol=1e-12)
    return pool, task, cache, exact, marginals.std(axis=0)


@pytest.mark.parametrize("estimator", ["permutation", "antithetic"])
def test_permutation_sampling_converges_to_exact(six_pool_exact, estimator):
    pool, task, cache, exact, sigma = six_pool_exact
    rms = []
    for budget in (8, 64, 512):
        errors = []
        for seed in range(4):
            r = evaluate("vote", pool, task, estimator=estimator, budget=budget, permutation_seed=seed,
                         cache_dir=cache, progress=False)
            assert r.system_evaluations == 0
            err = r.shapley.means - exact.shapley.means
            # the estimate is a mean of `budget` marginals of spread sigma (antithetic pairs: at worst
            # budget/2 independent means of pairs, hence the sqrt(2))
            bound = 4 * sigma * np.sqrt(2 if estimator == "antithetic" else 1) / np.sqrt(budget) + 1e-12
            assert np.all(np.abs(err) <= bound), (budget, seed, err, bound)
            np.testing.assert_allclose(r.shapley.per_question.sum(0), r.system - r.empty_value, atol=1e-12)
            errors.append(err)
        rms.append(float(np.sqrt(np.mean(np.square(errors)))))
    assert rms[0] > rms[1] > rms[2], rms


def test_permutation_never_runs_a_coalition_twice(tmp_path):
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.9, 0.7, 0.5, 0.3)])
    task = tasks.load("arith", n=5)
    r = evaluate("debate", pool, task, estimator="permutation", budget=50, cache_dir=tmp_path, progress=False)
    perms = valuation.sample_permutations(4, 50, seed=0)
    prefixes = {valuation.mask_of(p[:k]) for p in perms for k in range(1, 5)} | set(valuation.estimators.loo_masks(4))
    assert r.system_evaluations == r.coalitions == len(prefixes) <= 15


# ---------------------------------------------------------------------- report statistics
def test_bootstrap_cis_contain_estimate_and_shrink():
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.8, 0.6, 0.4)])
    widths = []
    for n in (20, 320):
        r = evaluate("vote", pool, tasks.load("arith", n=n), cache_dir=False, progress=False)
        width = []
        for m in r.measures.values():
            for a in r.ids:
                lo, hi = m.ci[a]
                assert lo <= m[a] <= hi
                width.append(hi - lo)
        widths.append(np.mean(width))
    assert widths[1] < widths[0] / 2.5  # ~ 1/sqrt(16) = 1/4 in theory


def test_exact_p_values_against_hand_enumeration():
    # n = 3, perfect agreement: 2 of the 3! orderings reach |tau| = 1
    c = correlation([0.2, 0.5, 0.9], [0.1, 0.3, 0.4])
    assert (c.value, c.p_value, c.exact, c.min_p_value) == (pytest.approx(1.0), pytest.approx(1 / 3), True,
                                                            pytest.approx(1 / 3))
    assert correlation([1, 2, 3], [1, 3, 2]).p_value == pytest.approx(1.0)  # |tau| = 1/3 is the least extreme
    # n = 4, one discordant pair: tau = 2/3. Inversion counts of the 24 orderings: 1,3,5,6,5,3,1 for
    # 0..6 inversions; |tau| >= 2/3 <=> 0, 1, 5 or 6 inversions: 8 of 24
    c = correlation([1, 2, 3, 4], [1, 2, 4, 3])
    assert c.value == pytest.approx(2 / 3) and c.p_value == pytest.approx(8 / 24)
    assert c.p_value == pytest.approx(stats.kendalltau([1, 2, 3, 4], [1, 2, 4, 3], method="exact").pvalue)
    assert correlation([1, 2, 3, 4], [4, 3, 2, 1]).p_value == pytest.approx(1 / 12)
    # Spearman n = 4: rho = 1 - sum(d^2) / 10 = 0.8 for one swapped adjacent pair; |rho| >= 0.8 <=>
    # sum(d^2) in {0, 2} (identity + 3 adjacent swaps) or {18, 20} (their reverses): 8 of 24
    s = correlation([1, 2, 3, 4], [1, 2, 4, 3], "spearman")
    assert s.value == pytest.approx(0.8) and s.p_value == pytest.approx(8 / 24)
    # ties: tau-b and rho equal scipy's
    x, y = [0.5, 0.5, 0.7, 0.1, 0.9], [0.2, 0.1, 0.1, 0.0, 0.3]
    assert correlation(x, y).value == pytest.approx(stats.kendalltau(x, y).statistic)
    assert correlation(x, y, "spearman").value == pytest.approx(stats.spearmanr(x, y).statistic)
    assert math.isnan(correlation([1, 2, 3], [5, 5, 5]).value)


def fake_report(individual, compositional, label="s") -> ValuationReport:
    ids = [f"model_{i}" for i in range(len(individual))]
    col = lambda v: np.asarray(v, float)[:, None]  # noqa: E731  one "question"
    return ValuationReport(
        protocol=label, task="t", ids=ids, names=ids, estimator="exact", example_ids=["q"],
        individual=Measure("individual", ids, col(individual)), loo=Measure("loo", ids, col(compositional)),
        shapley=Measure("shapley", ids, col(compositional)), banzhaf=None, system=np.zeros(1), empty_value=0.0,
        bootstrap_resamples=10,
    )


def test_pooled_test_exact_and_monte_carlo():
    """The permutation mechanics on one-question reports (same questions: a report of one question has no
    cross-fit halves; tests/test_valuation_crossfit.py tests the cross-fitted default)."""
    a = fake_report([1, 2, 3], [1, 2, 3], "a")
    b = fake_report([1, 2, 3], [1, 2, 3], "b")
    # each stratum's tau over 3! orderings: -1, -1/3, 1/3, 1 with probabilities 1/6, 2/6, 2/6, 1/6;
    # the sum reaches |2| only when both strata are extreme in the same direction: 2 * (1/6)^2
    t = pooled_test([a, b], crossfit=False)
    assert t.exact and t.observed == pytest.approx(2.0) and t.p_value == pytest.approx(2 / 36)
    assert t.min_p_value == pytest.approx(2 / 36)
    assert pooled_test([a, b], alternative="greater", crossfit=False).p_value == pytest.approx(1 / 36)
    c = fake_report([1, 2, 3, 4], [2, 1, 4, 3], "c")  # tau = 1/3
    exact = pooled_test([a, b, c], crossfit=False)
    mc = pooled_test([a, b, c], exact=False, draws=20000, seed=1, crossfit=False)
    assert not mc.exact and mc.draws == 20000
    assert mc.p_interval[0] <= exact.p_value <= mc.p_interval[1]
    # brute force over all 3! * 3! * 4! joint orderings
    hits = total = 0
    for pa in itertools.permutations([1, 2, 3]):
        for pb in itertools.permutations([1, 2, 3]):
            for pc in itertools.permutations([2, 1, 4, 3]):
                s = sum(stats.kendalltau(x, y).statistic for x, y in
                        (([1, 2, 3], pa), ([1, 2, 3], pb), ([1, 2, 3, 4], pc)))
                hits += abs(s) >= exact.observed - 1e-9
                total += 1
    assert exact.p_value == pytest.approx(hits / total)
    assert "never below 0.333" in str(exact)
    flat = fake_report([1, 2, 3], [0, 0, 0], "flat")
    assert pooled_test([a, flat], crossfit=False).skipped == ["flat/t/model_0,model_1,model_2 (a constant ranking)"]
    with pytest.raises(ValueError, match="no 'banzhaf'"):
        pooled_test([a], measure="banzhaf", crossfit=False)


def test_report_json_roundtrip_table_and_plot(mixed_pool, tmp_path):
    task = tasks.load("arith", n=10)
    r = evaluate("debate", mixed_pool, task, cache_dir=tmp_path, progress=False)
    back = ValuationReport.from_json(r.to_json(tmp_path / "r.json"))
    for k, m in r.measures.items():
        np.testing.assert_array_equal(back.measures[k].per_question, m.per_question)
        assert back.measures[k].ci == m.ci
    assert back.correlation["shapley"]["kendall"].p_value == r.correlation["shapley"]["kendall"].p_value
    text = str(r)
    for name in mixed_pool.names:
        assert name in text
    assert "Shapley" in text and "Banzhaf" in text and "smallest possible two-sided p-value is 0.0833" in text
    png = r.plot(tmp_path / "r.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# ---------------------------------------------------------------------- errors and CLI
def test_bad_input_errors(mixed_pool):
    task = tasks.load("arith", n=3)
    with pytest.raises(ValueError, match="unknown estimator 'shap'.*exact, loo, permutation, antithetic"):
        evaluate("vote", mixed_pool, task, estimator="shap", cache_dir=False)
    with pytest.raises(ValueError, match="needs budget="):
        evaluate("vote", mixed_pool, task, estimator="permutation", cache_dir=False)
    with pytest.raises(ValueError, match="budget only applies"):
        evaluate("vote", mixed_pool, task, budget=10, cache_dir=False)
    with pytest.raises(ValueError, match="budget must be even"):
        evaluate("vote", mixed_pool, task, estimator="antithetic", budget=5, cache_dir=False)
    with pytest.raises(ValueError, match="samples must be"):
        evaluate("vote", mixed_pool, task, samples=0, cache_dir=False)
    big = agents.pool([agents.ScriptedAgent.expert(f"e{i}", 0.5) for i in range(13)])
    with pytest.raises(ValueError, match="8192 for a pool of 13.*estimator='permutation'"):
        evaluate("debate", big, task, cache_dir=False, progress=False)  # played coalitions: 12 at most
    bigger = agents.pool([agents.ScriptedAgent.expert(f"e{i}", 0.5) for i in range(17)])
    with pytest.raises(ValueError, match="131072 for a pool of 17.*estimator='permutation'"):
        evaluate("vote", bigger, task, cache_dir=False, progress=False)  # computed from answers: 16 at most
    with pytest.raises(ValueError, match="unknown protocol"):
        evaluate("nope", mixed_pool, task, cache_dir=False)


def test_cli_value(tmp_path, capsys):
    from crl_envs.commands import main

    rc = main(["value", "--protocol", "debate", "--task", "arith", "--pool", "scripted", "--n", "12",
               "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Shapley [95% CI]" in out and "expert-0.8" in out
    report = ValuationReport.from_json(tmp_path / "out" / "debate_v0-arith-exact.json")
    assert report.n_questions == 12 and report.system_evaluations == 7
    assert (tmp_path / "out" / "debate_v0-arith-exact.png").stat().st_size > 10_000
    rc = main(["value", "--pool", "scripted", "--estimator", "permutation", "--n", "3", "--no-cache", "--quiet",
               "--out", str(tmp_path / "out")])
    assert rc == 2 and "needs --budget" in capsys.readouterr().err


@pytest.mark.slow
def test_hf_agents_cache_on_weights(tiny_model_dir, tmp_path):
    """Real models: a reloaded model hits the cache; changed weights miss it."""
    import torch

    from agents import HFAgent, SamplingParams

    task = tasks.load("arith", n=3)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)

    def pool():
        return agents.pool([HFAgent(tiny_model_dir, name="tiny-a"), HFAgent(tiny_model_dir, name="tiny-b")])

    kw = dict(sampling=sampling, cache_dir=tmp_path, progress=False, estimator="loo")
    first = evaluate("debate", pool(), task, **kw)
    assert (first.system_evaluations, first.individual_evaluations) == (3, 2)
    again = evaluate("debate", pool(), task, **kw)
    assert (again.system_evaluations, again.individual_evaluations) == (0, 0)
    changed = pool()
    with torch.no_grad():
        next(changed["model_1"].model.parameters()).add_(0.01)
    after = evaluate("debate", changed, task, **kw)
    # only what model_1 plays in misses: {model_0, model_1} and {model_1}, and model_1 alone; the
    # coalition {model_0} is the same game as before (cache v2 keys a coalition by its members)
    assert (after.system_evaluations, after.individual_evaluations, after.cached_evaluations) == (2, 1, 2)


# ---------------------------------------------------------------------- #14: defects 2, 3, 6 and the report
def test_sampled_shapley_ci_includes_monte_carlo_error(six_pool_exact):
    """With few permutations the CI must be at least as wide as the Monte Carlo error alone (brute
    force: the spread of the per-permutation marginals); resampling questions alone was far narrower."""
    pool, task, cache, exact, _ = six_pool_exact
    game = valuation.CoalitionGame("vote", pool, task, cache_dir=cache, progress=False)
    v = {m: game.value(m).mean() for m in range(64)}
    for estimator in ("permutation", "antithetic"):
        r = evaluate("vote", pool, task, estimator=estimator, budget=8, permutation_seed=3, cache_dir=cache,
                     progress=False)
        perms = valuation.sample_permutations(6, 8, seed=3, antithetic=estimator == "antithetic")
        draws = np.zeros((len(perms), 6))
        for k, perm in enumerate(perms):
            before = 0
            for p in perm:
                draws[k, p] = v[before | 1 << p] - v[before]
                before |= 1 << p
        if estimator == "antithetic":
            draws = (draws[0::2] + draws[1::2]) / 2
        np.testing.assert_allclose(draws.mean(0), r.shapley.means, atol=1e-12)
        mc_half = stats.norm.ppf(0.975) * draws.std(0, ddof=1) / np.sqrt(len(draws))
        for i, a in enumerate(r.ids):
            lo, hi = r.shapley.ci[a]
            assert hi - lo >= 2 * mc_half[i] * 0.999 and lo <= r.shapley[a] <= hi, (estimator, a)
        assert mc_half.max() > 0.02  # the Monte Carlo error is real here


def majority_table(correct: np.ndarray) -> dict[int, np.ndarray]:
    """Per-question v(S) of a majority vote over who is right (ties: the lowest member decides)."""
    q, n = correct.shape
    out = {0: np.zeros(q)}
    for mask in range(1, 1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        votes = correct[:, members].sum(1)
        out[mask] = np.where(2 * votes == len(members), correct[:, members[0]], 2 * votes > len(members)).astype(float)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["permutation", "antithetic"])
def test_sampled_shapley_ci_coverage(estimator):
    """400 replications of a known game (6 players right independently with known accuracies, v(S) a
    majority vote; 200 questions, 50 permutations): the 95% CIs cover the true Shapley value (exact
    Shapley of the expected game, by enumeration) 95% +- 3% of the time."""
    p = np.array([0.85, 0.7, 0.6, 0.5, 0.4, 0.3])
    n, q, budget = len(p), 200, 50
    patterns = np.array(list(itertools.product([0, 1], repeat=n)))
    weight = np.prod(np.where(patterns == 1, p, 1 - p), axis=1)
    expected = {m: float(weight @ v) for m, v in majority_table(patterns).items()}
    truth = valuation.shapley_weights(n) @ np.array([expected[m] for m in range(1 << n)])
    ids = [f"model_{i}" for i in range(n)]
    hits = total = 0
    for rep in range(400):
        correct = (np.random.default_rng(1000 + rep).random((q, n)) < p).astype(int)
        table = majority_table(correct)
        perms = valuation.sample_permutations(n, budget, seed=rep, antithetic=estimator == "antithetic")
        masks, w = valuation.permutation_weights(perms)
        shapley = Measure("shapley", ids, w @ np.stack([table[m] for m in masks]),
                          draws=valuation.permutation_draws(perms, {m: t.mean() for m, t in table.items()},
                                                            antithetic=estimator == "antithetic"))
        r = ValuationReport(protocol="majority", task="synthetic", ids=ids, names=ids, estimator=estimator,
                            example_ids=[str(k) for k in range(q)], individual=Measure("individual", ids, correct.T),
                            loo=Measure("loo", ids, correct.T * 0.0), shapley=shapley, banzhaf=None,
                            system=table[(1 << n) - 1], empty_value=0.0, seed=rep, bootstrap_resamples=500)
        ci = np.array([r.shapley.ci[a] for a in ids])
        hits += int(np.sum((ci[:, 0] <= truth) & (truth <= ci[:, 1])))
        total += n
    assert 0.92 <= hits / total <= 0.98, hits / total


def test_scripted_fingerprints_follow_behaviour(tmp_path):
    """Two agents named alike with different `respond` never share a fingerprint (nor a cache)."""
    right = lambda example, messages: f"The answer is {example.answer}."  # noqa: E731
    wrong = lambda example, messages: "The answer is -12345."  # noqa: E731
    fp = lambda respond: agents.ScriptedAgent("same", respond).fingerprint  # noqa: E731
    assert fp(right) != fp(wrong)
    assert fp(always("0")) != fp(always("1"))  # same code, other closure value
    assert fp(always("0")) == fp(always("0"))  # the same definition: the same fingerprint
    source = "from agents import ScriptedAgent as S\nfp = S('same', lambda e, m: f'The answer is {0}.').fingerprint"
    here: dict = {"__name__": "__main__"}
    exec(source, here)
    there = subprocess.run([sys.executable, "-c", source + "\nprint(fp)"], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here["fp"]  # stable across processes: the next run reuses the cache
    task = tasks.load("arith", n=6)
    good = evaluate("vote", agents.pool([agents.ScriptedAgent("same", right)]), task, cache_dir=tmp_path, progress=False)
    bad = evaluate("vote", agents.pool([agents.ScriptedAgent("same", wrong)]), task, cache_dir=tmp_path, progress=False)
    assert good.system.mean() == 1.0 and bad.system.mean() == 0.0
    assert bad.individual_evaluations == 1  # played, not read from the other agent's cache


def test_bad_valuation_options_fail_before_any_run(mixed_pool, tmp_path, monkeypatch):
    task = tasks.load("arith", n=3)
    played = []
    monkeypatch.setattr(valuation.executors, "coalitions_outcomes", lambda run, masks: played.append(masks))
    bad = [({"ci_level": 95}, r"ci_level must be a number in \(0, 1\), e\.g\. 0\.95, got 95 \(a fraction: 0\.95"),
           ({"ci_level": "0.9"}, "ci_level must be a number"),
           ({"bootstrap_resamples": 0}, "bootstrap_resamples must be an int >= 1"),
           ({"bootstrap_resamples": "100"}, "bootstrap_resamples must be an int"),
           ({"samples": "2"}, r"samples must be an int >= 1 \(episodes per question"),
           ({"samples": True}, "samples must be an int"),
           ({"seed": "1"}, "seed must be an int"),
           ({"seed": 1.5}, "seed must be an int"),
           ({"estimator": "permutation", "budget": "50"}, "budget must be an int >= 2"),
           ({"estimator": "permutation", "budget": 20, "permutation_seed": 0.5}, "permutation_seed must be an int"),
           ({"progress": "yes"}, "progress must be True or False"),
           ({"executor": "dask"}, "unknown executor 'dask'; choose one of local, processes, ray")]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            evaluate("debate", mixed_pool, task, cache_dir=tmp_path, **{"progress": False, **kwargs})
        assert "\n" not in message
    assert played == []
    assert [p.name for p in tmp_path.glob("*/*.json") if p.name != "meta.json"] == []


def test_table_says_from_cache_only_when_true(mixed_pool, tmp_path):
    task = tasks.load("arith", n=4)
    first = evaluate("debate", mixed_pool, task, estimator="loo", cache_dir=tmp_path, progress=False)
    assert "from cache" not in str(first) and first.cached_evaluations == 0
    assert "runs executed: 5 of 5 coalitions + 4 of 4 individual\n" in str(first)
    exact = evaluate("debate", mixed_pool, task, cache_dir=tmp_path, progress=False)
    assert "runs executed: 10 of 15 coalitions + 0 of 4 individual (9 from cache)" in str(exact)
    vote = evaluate("vote", mixed_pool, task, cache_dir=tmp_path / "vote", progress=False)
    assert "from cache" not in str(vote)  # its one-member coalitions are its individual runs, run once


def crowded_report(estimator: str = "loo") -> ValuationReport:
    """Five models, four of them within a hair of each other (labels that collide unless placed)."""
    ids = [f"model_{i}" for i in range(5)]
    names = ["zoo-nocarry", "zoo-noborrow", "zoo-small", "zoo-positive", "zoo-rookie"]
    rng = np.random.default_rng(0)
    ind = np.array([0.70, 0.705, 0.71, 0.69, 0.26])[:, None] + rng.normal(0, 0.3, (5, 40))
    comp = np.array([0.01, 0.012, 0.011, 0.009, -0.01])[:, None] + rng.normal(0, 0.05, (5, 40))
    return ValuationReport(
        protocol="debate_v0", task="arith", ids=ids, names=names, estimator=estimator,
        example_ids=[str(i) for i in range(40)], individual=Measure("individual", ids, ind),
        loo=Measure("loo", ids, comp), shapley=Measure("shapley", ids, comp) if estimator == "exact" else None,
        banzhaf=None, system=np.zeros(40), empty_value=0.0, bootstrap_resamples=50)


@pytest.mark.parametrize("estimator", ["loo", "exact"])
def test_plot_crops_nothing_and_labels_do_not_overlap(estimator):
    import matplotlib.pyplot as plt

    fig = crowded_report(estimator).figure()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [fig._suptitle] + [t for legend in fig.legends for t in legend.get_texts()]
    labels = [t for ax in fig.axes for t in ax.texts]
    texts += [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    assert len(labels) == 5 * len(fig.axes)
    for t in texts + labels:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, t.get_text()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        for a, b in itertools.combinations(range(len(boxes)), 2):
            assert not boxes[a].overlaps(boxes[b]), (ax.texts[a].get_text(), ax.texts[b].get_text())
    plt.close(fig)
