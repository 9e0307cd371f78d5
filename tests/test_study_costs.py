"""`crl-envs study`'s cost-aware values and pairwise interactions (crl_envs.study.costs), on scripted pools
whose coalitions the test replays itself."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest

import agents
from crl_envs import run_episodes, study, tasks

pytest.importorskip("shapiq")

QUESTIONS = 30


def tiny_config(out, estimator: str = "exact") -> dict:
    """One pool: a model, its exact clone (same name and seed: same answers) and a third model; vote only."""
    return {
        "study": {"name": "tiny", "out": str(out)},
        "pools": {"clones": [{"expert": 0.7}, {"expert": 0.7}, {"expert": 0.5, "seed": 3}]},
        "tasks": {"arith": {"n": QUESTIONS, "seed": 2}},
        "protocols": {"vote": {}},
        "valuation": {"alpha": 0.05, "bootstrap_resamples": 200, "estimator": estimator},
    }


def sii_by_hand(v: dict[frozenset, float], ids: list[str], i: str, j: str) -> float:
    """The Shapley interaction index of {i, j} from its definition."""
    n, rest = len(ids), [a for a in ids if a not in (i, j)]
    total = 0.0
    for k in range(len(rest) + 1):
        for s in itertools.combinations(rest, k):
            s = frozenset(s)
            w = math.factorial(k) * math.factorial(n - k - 2) / math.factorial(n - 1)
            total += w * (v[s | {i, j}] - v[s | {i}] - v[s | {j}] + v[s])
    return total


def test_study_reports_cost_values_and_clone_pairs_redundant(tmp_path):
    result = study.run(tiny_config(tmp_path / "out"), progress=False)
    (s,) = result["valuation"]["settings"]
    pool = agents.pool([agents.ScriptedAgent.expert("expert-0.7", 0.7), agents.ScriptedAgent.expert("expert-0.7", 0.7),
                        agents.ScriptedAgent.expert("expert-0.5", 0.5, seed=3)])
    task = tasks.load("arith", n=QUESTIONS, seed=2)
    v = {frozenset(): 0.0}
    for k in range(1, 4):
        for members in itertools.combinations(pool.ids, k):
            eps = run_episodes("vote", pool, task, coalition=list(members), progress=False,
                               sampling=agents.SamplingParams(temperature=0.0, max_new_tokens=256))
            v[frozenset(members)] = float(np.mean([e.score for e in eps]))
    keys = s["models"]  # duplicate names: the study keys models by agent id
    assert keys == pool.ids
    by_pair = {tuple(p["pair"]): p for p in s["interactions"]["pairs"]}
    assert len(by_pair) == 3
    for (a, b), p in by_pair.items():
        assert p["mean"] == pytest.approx(sii_by_hand(v, pool.ids, a, b), abs=1e-12)
        assert p["ci"][0] <= p["mean"] + 1e-12 and p["mean"] <= p["ci"][1] + 1e-12
    clone = by_pair[tuple(pool.ids[:2])]
    assert clone["mean"] < 0 and clone["ci"][1] < 0  # the clone pair is redundant

    # cost Shapley: efficiency (sums to the grand coalition's cost, the empty coalition costing nothing)
    cost = s["cost"]
    assert cost["measure"] == "shapley" and cost["grand_coalition"] > 0
    assert sum(cost["mean"].values()) == pytest.approx(cost["grand_coalition"], rel=1e-12)
    assert cost["mean"][keys[0]] == pytest.approx(cost["mean"][keys[1]], rel=1e-12)  # clones cost alike
    for k in keys:
        lo, hi = cost["ci"][k]
        assert lo - 1e-12 <= cost["mean"][k] <= hi + 1e-12
        assert s["value_per_1k"][k]["mean"] == pytest.approx(s["shapley"][k] / cost["mean"][k], rel=1e-9)

    md = (tmp_path / "out" / "study.md").read_text()
    assert "## Cost-aware values and pairwise interactions per setting" in md
    assert "most cost-effective" in md and "| vote, arith | 3 | " in md
    assert f"{keys[0]} + {keys[1]} {clone['mean']:+.3f}" in md  # the most redundant pair is the clones
    on_disk = json.loads((tmp_path / "out" / "study.json").read_text())
    assert on_disk["valuation"]["settings"][0]["interactions"] == s["interactions"]


def test_setting_without_every_coalition_is_skipped_with_its_reason(tmp_path):
    config = tiny_config(tmp_path / "out", estimator="loo")
    config["pools"]["clones"].append({"expert": 0.6, "seed": 4})  # 4 models: LOO plays fewer than all 15
    result = study.run(config, progress=False)
    (s,) = result["valuation"]["settings"]
    (skipped,) = s["interactions"].values()
    assert re.fullmatch(r'estimator loo played \d+ of 15 coalitions; pairwise interactions need every one '
                        r'\(estimator = "exact"\)', skipped)
    assert s["cost"]["measure"] == "loo"
    md = (tmp_path / "out" / "study.md").read_text()
    assert f"Interactions skipped in 1 settings: {skipped}." in md


def test_table_interactions_equal_shapiq_per_question_game():
    """The linear map the study applies equals shapiq run on each question's game (the valuation's path)."""
    from crl_envs.valuation.interactions import per_question_indices, table_interactions

    rng = np.random.default_rng(5)
    table = rng.integers(0, 2, size=(1 << 4, 12)).astype(float)
    table[0] = 0.25  # a non-zero empty coalition too
    found = table_interactions(table, ["a", "b", "c", "d"], bootstrap_resamples=100)
    wanted, per_game = per_question_indices(lambda masks: table[masks], 4, 12)
    assert found.interactions == wanted
    np.testing.assert_allclose(found.per_question, per_game, atol=1e-12)
