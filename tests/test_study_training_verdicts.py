"""The study's training verdicts: the statistics (crl_envs/stats.py, training section) against
independent computations and on planted truth, the tables' semantics (the learner's own accuracy
beside the system's, the collapse flag, ties as ties, significant wins, ratios or why not), the config
(the trainers' roster and defaults, one budget and learning-rate rule, per-task answer lengths) and a
tiny zoo study end to end."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import fields

import numpy as np
import pytest
from scipy import stats as scipy_stats

import trainers
from crl_envs import stats, study
from crl_envs.study import StudyConfigError, load_config
from crl_envs.study.stats import COLLAPSE_FRACTION, training_tables
from crl_envs.study.tables import training_markdown


# ---------------------------------------------------------------------- crl_envs/stats.py
def brute_force_sign_flip(d) -> float:
    obs = abs(sum(d))
    flips = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(f >= obs - 1e-9 for f in flips) / len(flips)


@pytest.mark.parametrize("d", [[0.1, 0.2, -0.05, 0.3], [0.0, 0.0, 0.1, 0.1, -0.1], [1, 2, 3, 4, 5, 6, 7, 8],
                               [-0.25, 0.125, 0.0, 0.5, -0.5, 0.375, 0.25, -0.125, 0.0]])
def test_sign_flip_matches_brute_force_enumeration(d):
    res = stats.sign_flip_test(d)
    assert res["exact"] and res["p_value"] == pytest.approx(brute_force_sign_flip(d))
    k = sum(x != 0 for x in d)
    assert res["nonzero"] == k and res["min_p_value"] == pytest.approx(2 / 2 ** k)
    assert res["statistic"] == pytest.approx(np.mean(d))


def test_sign_flip_edge_cases_and_monte_carlo(monkeypatch):
    assert stats.sign_flip_test([0.0, 0.0])["p_value"] == 1.0  # no signs to flip: a tie, never significant
    assert stats.sign_flip_test([1.0] * 6)["p_value"] == pytest.approx(2 / 64)  # the floor
    with pytest.raises(ValueError, match="no paired differences"):
        stats.sign_flip_test([])
    with pytest.raises(ValueError, match="must be finite"):
        stats.sign_flip_test([0.1, float("nan")])
    d = np.random.default_rng(3).normal(0.3, 1.0, size=14)
    exact = stats.sign_flip_test(d)["p_value"]
    monkeypatch.setattr(stats, "EXACT_SIGN_FLIP_UP_TO", 10)
    mc = stats.sign_flip_test(d, resamples=40_000, seed=1)
    assert not mc["exact"] and abs(mc["p_value"] - exact) < 0.01


def test_paired_t_matches_scipy_and_the_formula():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.1, 0.05, 5), rng.normal(0.05, 0.05, 5)
    res = stats.paired_t_test(a, b)
    d = a - b
    t = d.mean() / (d.std(ddof=1) / np.sqrt(len(d)))
    assert res["t"] == pytest.approx(t)
    assert res["p_value"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), df=len(d) - 1))
    assert res["p_value"] == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)
    tie = stats.paired_t_test([0.2, 0.3], [0.2, 0.3])
    assert tie["p_value"] is None and "a tie" in tie["undefined"]
    assert "zero variance" in stats.paired_t_test([0.3, 0.4], [0.2, 0.3])["undefined"]
    with pytest.raises(ValueError, match="at least 2 pairs"):
        stats.paired_t_test([0.1], [0.2])


def test_seed_question_bootstrap_and_ratio():
    rng = np.random.default_rng(0)
    v = np.arange(6, dtype=float).reshape(2, 3)
    seed_idx, q_idx = stats.bootstrap_indices(rng, 2, 3, 50)
    boot = stats.seed_question_bootstrap(v, resamples=50, rng=rng, indices=(seed_idx, q_idx))
    expect = [np.mean([v[seed_idx[r, j], q_idx[r, j, k]] for j in range(2) for k in range(3)]) for r in range(50)]
    np.testing.assert_allclose(boot, expect)
    with pytest.raises(ValueError, match="seeds x questions"):
        stats.seed_question_bootstrap(np.zeros(3), resamples=5, rng=rng)
    num, den = np.array([0.2, 0.3, 0.4]), np.array([0.1, 0.1, 0.2])
    r = stats.ratio_ci(0.3, 0.15, num, den, level=0.5, names=("crl", "grpo"))
    assert r["value"] == pytest.approx(2.0) and r["undefined"] is None
    assert r["ci"] == pytest.approx([np.quantile(num / den, 0.25), np.quantile(num / den, 0.75)])
    assert "grpo's gain is -0.0500, not positive" in stats.ratio_ci(0.3, -0.05, num, den, names=("crl", "grpo"))["undefined"]
    half = stats.ratio_ci(0.3, 0.05, num, np.array([0.1, -0.1, 0.2]), names=("crl", "grpo"))  # no bare ratio
    assert half["value"] is None and half["ci"] is None and "CI reaches 0" in half["undefined"]
    assert half["difference"]["value"] == pytest.approx(0.25)


def test_sign_flip_calibrated_under_the_null():
    """Planted truth: 2000 synthetic (settings x seeds) = 9 paired differences with no effect (a
    symmetric law, ties included): the two-sided rejection rate is at most alpha (the exact test's
    level is 24/512 = 0.047), the false-win rate (significant with a positive mean) about half."""
    rng = np.random.default_rng(11)
    alpha, sims = 0.05, 2000
    p = np.empty(sims)
    mean = np.empty(sims)
    for i in range(sims):
        d = rng.choice([-0.1, -0.05, 0.0, 0.05, 0.1], size=9) + rng.normal(0, 0.01, size=9) * (rng.random(9) < 0.5)
        res = stats.sign_flip_test(d)
        p[i], mean[i] = res["p_value"], res["statistic"]
    rejected = p < alpha
    assert rejected.mean() <= alpha
    assert np.mean(rejected & (mean > 0)) <= alpha / 2 + 2 * np.sqrt(alpha / 2 / sims)
    # and with a planted effect (mean 0.07, sd 0.05) the test finds it nearly always
    found = np.mean([stats.sign_flip_test(rng.normal(0.07, 0.05, 9))["p_value"] < alpha for _ in range(300)])
    assert found > 0.9


# ---------------------------------------------------------------------- training tables
def holm_by_hand(p: dict) -> dict:
    """Holm (1979) written out: the i-th smallest p times (m - i + 1), made monotone, capped at 1."""
    order = sorted(p, key=p.get)
    out, running = {}, 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[k]))
        out[k] = running
    return out


Q, TRAINERS = 40, ["crl", "grpo", "loo_reward", "shapley_credit", "placebo"]


def synthetic(rng, lift, *, seeds=(0, 1, 2), collapse=(), q=Q, before_p=0.5, alone_p=0.3):
    """``(setup, task) -> trainer -> seed -> cell``: each trainer turns a wrong answer right with its
    lift; ``collapse`` trainers' learners stop answering alone (standalone 0)."""
    baselines, runs = {}, {}
    for key, by_trainer in lift.items():
        before = (rng.random(q) < before_p).astype(float)
        alone = (rng.random(q) < alone_p).astype(float)
        baselines[key] = {"system": before.tolist(), "standalone": alone.tolist()}
        runs[key] = {t: {s: {"system": np.where(rng.random(q) < p, 1.0, before).tolist(),
                             "standalone": (np.zeros(q) if t in collapse else alone).tolist()} for s in seeds}
                     for t, p in by_trainer.items()}
    return baselines, runs


def test_training_tables_recomputed_independently():
    rng = np.random.default_rng(4)
    lift = {("judge", "arith"): {"crl": 0.3, "grpo": 0.05, "loo_reward": 0.25, "shapley_credit": 0.1, "placebo": 0.05},
            ("vote", "arith"): {"crl": 0.1, "grpo": 0.05, "loo_reward": 0.15, "shapley_credit": 0.0, "placebo": 0.05},
            ("debate", "arith"): {"crl": 0.02, "grpo": -0.02, "loo_reward": 0.0, "shapley_credit": 0.05,
                                  "placebo": 0.05}}
    baselines, runs = synthetic(rng, lift)
    runs[("vote", "arith")]["grpo"][1]["standalone"] = [1.0] * Q  # the learner alone after, per seed
    out = training_tables(baselines, runs, TRAINERS, resamples=400, alpha=0.05,
                          budgets={k[0]: {"steps": 4, "learning_rate": 1e-3} for k in lift})
    deltas = {}
    for st in out["settings"]:
        key = (st["protocol"], st["task"])
        assert st["seeds"] == [0, 1, 2] and st["budget"] == {"steps": 4, "learning_rate": 1e-3}
        before = np.asarray(baselines[key]["system"])
        alone = np.asarray(baselines[key]["standalone"])
        per_seed = {t: [np.mean(np.asarray(runs[key][t][s]["system"]) - before) for s in (0, 1, 2)] for t in TRAINERS}
        deltas[key] = {t: np.mean(v) for t, v in per_seed.items()}
        assert st["learner_alone"]["before"] == pytest.approx(alone.mean())
        for t in TRAINERS:
            assert st["delta"][t]["value"] == pytest.approx(deltas[key][t])
            assert st["delta"][t]["per_seed"] == pytest.approx(per_seed[t])
            lo, hi = st["delta"][t]["ci"]
            assert lo <= deltas[key][t] <= hi
            for x, (plo, phi) in zip(per_seed[t], st["delta"][t]["per_seed_ci"]):
                assert plo <= x <= phi
            after = [np.mean(runs[key][t][s]["standalone"]) for s in (0, 1, 2)]
            assert st["learner_alone"]["after"][t] == pytest.approx(after)
            assert st["learner_alone"]["delta"][t]["value"] == pytest.approx(np.mean(after) - alone.mean())
        best = max(deltas[key].values())
        assert st["strongest"] == [t for t in TRAINERS if deltas[key][t] == pytest.approx(best)]
        raw = {b: scipy_stats.ttest_rel(per_seed["crl"], per_seed[b]).pvalue for b in TRAINERS[1:]}
        adjusted = holm_by_hand(raw)
        for b in TRAINERS[1:]:
            c = st["crl_vs"][b]
            diff = deltas[key]["crl"] - deltas[key][b]
            assert c["difference"] == pytest.approx(diff)
            assert c["outcome"] == ("win" if diff > 1e-12 else "loss" if diff < -1e-12 else "tie")
            assert c["p_value"] == pytest.approx(raw[b]) and c["p_holm"] == pytest.approx(adjusted[b])
            assert c["significant"] == (adjusted[b] < 0.05 and c["outcome"] != "tie")
    assert out["settings"][1]["learner_alone"]["after"]["grpo"][1] == 1.0
    s = out["summary"]
    assert s["settings"] == 3 and s["seeds"] == [3]
    assert all(st["comparable"] for st in out["settings"])
    mean = {t: np.mean([d[t] for d in deltas.values()]) for t in TRAINERS}
    across = {b: scipy_stats.ttest_1samp([np.mean(st["crl_vs"][b]["per_seed"]) for st in out["settings"]], 0).pvalue
              for b in TRAINERS[1:]}
    for b in TRAINERS[1:]:
        c = s["crl_vs"][b]
        outcomes = [st["crl_vs"][b]["outcome"] for st in out["settings"]]
        assert (c["wins"], c["ties"], c["losses"]) == tuple(outcomes.count(o) for o in ("win", "tie", "loss"))
        assert c["significant_wins"] == sum(st["crl_vs"][b]["significant"] and st["crl_vs"][b]["outcome"] == "win"
                                            for st in out["settings"])
        # the unit across settings is the setting (its seeds share its questions): a t over 3 setting means
        assert c["across"]["unit"] == "setting" and c["across"]["units"] == 3
        assert c["across"]["p_value"] == pytest.approx(across[b])
        assert c["across"]["p_holm"] == pytest.approx(holm_by_hand(across)[b])
        assert c["ratio"]["difference"]["value"] == pytest.approx(mean["crl"] - mean[b])
        assert c["ratio"]["value"] is None or c["ratio"]["value"] == pytest.approx(mean["crl"] / mean[b])
    assert s["mean_gain"] == pytest.approx(mean)


def test_judge_fallback_flags_the_collapse_and_ties_stay_ties():
    """The committed judge-plurality shape: C-RL and LOO-reward gain the same in the system (identical
    per-question outcomes) while the learner's own accuracy falls to 0; GRPO's gain is 0."""
    rng = np.random.default_rng(7)
    baselines, runs = synthetic(rng, {("judge-plurality", "arith"): {"crl": 0.3, "grpo": 0.0, "loo_reward": 0.3}},
                                collapse=("crl", "loo_reward"), alone_p=0.255)
    key = ("judge-plurality", "arith")
    runs[key]["loo_reward"] = copy.deepcopy(runs[key]["crl"])  # identical outcomes
    out = training_tables(baselines, runs, ["crl", "grpo", "loo_reward"], resamples=300)
    (st,) = out["settings"]
    assert st["learner_collapse"] == ["crl", "loo_reward"] and st["learner_alone"]["after"]["crl"] == [0.0] * 3
    assert st["tie"] and st["strongest"] == ["crl", "loo_reward"]
    # a collapse (and no placebo) fails the gates: the setting is not compared (issue #46)
    assert not st["comparable"] and "no_collapse: learner alone collapses under crl, loo_reward" in st["not_comparable"]
    assert "placebo_present: no placebo in the roster" in st["not_comparable"]
    c = st["crl_vs"]["loo_reward"]
    assert c["outcome"] == "not comparable" and c["identical_outcomes"] and not c["significant"]
    s = out["summary"]
    assert s["crl_vs"]["loo_reward"] == {"settings": 0, "not_comparable": 1}
    assert s["not_comparable"][0]["protocol"] == "judge-plurality"
    assert {(f["trainer"], f["learner_after"]) for f in s["learner_collapse"]} == {("crl", 0.0), ("loo_reward", 0.0)}
    assert [b["trainer"] for b in s["largest_gain"]["by"]] == ["crl", "loo_reward"]
    text = training_markdown(out, ["crl", "grpo", "loo_reward"])
    assert "**Flag: the learner's own answers collapse** in judge-plurality on arith (crl)" in text
    assert "| loo_reward | not comparable in any of 1 settings (gates below) |" in text
    assert "**judge-plurality on arith: not comparable: " in text and "no_collapse FAILED" in text
    assert "not comparable: +0.0 (p n/a), identical outcomes" in text


def test_no_collapse_flag_when_the_learner_keeps_its_answers():
    rng = np.random.default_rng(8)
    baselines, runs = synthetic(rng, {("vote", "arith"): {"crl": 0.3, "grpo": 0.1}})
    (st,) = training_tables(baselines, runs, ["crl", "grpo"], resamples=200)["settings"]
    assert st["learner_collapse"] == [] and st["delta"]["crl"]["value"] > 0
    assert st["learner_alone"]["before"] * COLLAPSE_FRACTION < np.mean(st["learner_alone"]["after"]["crl"])


def test_significant_wins_calibrated_on_planted_truth():
    """200 synthetic studies (3 settings x 3 seeds, 40 questions) where C-RL and the baseline share one
    law: significant C-RL wins per setting at most alpha/2 + noise, the across test's false wins at most
    alpha/2; with a planted lift of +15 points the across test (over 3 setting means) finds it in over half."""
    rng = np.random.default_rng(21)
    sims, alpha = 200, 0.05
    keys = [("judge", "arith"), ("vote", "arith"), ("debate", "arith")]
    sig_wins = across_wins = 0
    for _ in range(sims):
        baselines, runs = synthetic(rng, {k: {"crl": 0.15, "grpo": 0.15, "placebo": 0.0} for k in keys})
        c = training_tables(baselines, runs, ["crl", "grpo", "placebo"], resamples=20,
                            alpha=alpha)["summary"]["crl_vs"]["grpo"]
        sig_wins += c["significant_wins"]
        across_wins += c["across"]["significant"] and c["across"]["mean"] > 0
    se = np.sqrt(alpha / 2 / (3 * sims))
    assert sig_wins / (3 * sims) <= alpha / 2 + 2 * se
    assert across_wins / sims <= alpha / 2 + 2 * np.sqrt(alpha / 2 / sims)
    found = 0
    for _ in range(50):
        baselines, runs = synthetic(rng, {k: {"crl": 0.3, "grpo": 0.0, "placebo": 0.0} for k in keys})
        c = training_tables(baselines, runs, ["crl", "grpo", "placebo"], resamples=20,
                            alpha=alpha)["summary"]["crl_vs"]["grpo"]
        found += c["across"]["significant"] and c["across"]["mean"] > 0
    # the unit across settings is the setting: a t over 3 setting means (df 2), Holm over 2 baselines, finds
    # the +15 point lift in 34 of these 50 studies (the sign-flip over 9 setting x seed units said > 0.9, at a
    # level it did not hold: tests/test_inference_calibration.py)
    assert found / 50 >= 0.5


# ---------------------------------------------------------------------- config
def training_config(tmp_path, **training):
    return {"study": {"out": str(tmp_path)}, "pools": {"zoo": "zoo"},
            "tasks": {"arith": {"n": 10, "max_new_tokens": 24, "options": {"digits": 2, "operations": ["+", "-"]}}},
            "training": {"pool": "zoo", "learner": "model_4", "setups": {"vote": {}}, **training}}


def test_training_config_reads_the_trainers_roster_and_defaults(tmp_path):
    t = load_config(training_config(tmp_path)).training
    assert t.trainers == list(trainers.ROSTER) == list(trainers.TRAINERS) and "shapley_credit" in t.trainers
    assert t.seeds == [0, 1, 2]
    defaults = {f.name: f.default for f in fields(trainers.TrainerConfig)}
    assert (t.setups["vote"].steps, t.setups["vote"].learning_rate, t.questions_per_step, t.num_generations) == \
        (defaults["steps"], defaults["learning_rate"], defaults["questions_per_step"], defaults["num_generations"])
    assert load_config({**training_config(tmp_path), "tasks": {"arith": {"n": 5}}}).sampling["max_new_tokens"] == \
        defaults["max_new_tokens"]
    cfg = load_config(training_config(tmp_path, seeds=[0], setups={"vote": {"learning_rate": 1e-3}}))
    assert f"training: crl, grpo, loo_reward, shapley_credit, placebo x seeds [0], every trainer with its setup's budget " \
           f"(vote: {defaults['steps']} steps x 8 questions x 8 generations, lr 0.001); fewer than 3 seeds" in \
           study.describe_plan(cfg, study.plan(cfg))


@pytest.mark.parametrize("training, message", [
    ({"learning_rate": {"crl": 1e-3, "grpo": 1e-4}}, r"training\.learning_rate: every trainer gets the same steps and "
                                                     r"learning rate"),
    ({"setups": {"vote": {"grpo": {"learning_rate": 1e-4}}}}, r"training\.setups\.vote\.grpo: every trainer gets"),
    ({"setups": {"vote": {"steps": {"crl": 4}}}}, r"training\.setups\.vote\.steps: every trainer gets"),
    ({"max_new_tokens": 24}, r"training\.max_new_tokens: moved: .*\[tasks\.<label>\] max_new_tokens"),
    ({"trainers": ["crl", "shapley"]}, r"unknown trainer 'shapley' \(did you mean 'shapley_credit'\?\)"),
    ({"trainers": ["crl", "crl"]}, r"lists a trainer twice"),
    ({"alpha": 1.0}, r"training\.alpha: must lie strictly between 0 and 1"),
])
def test_training_config_errors(tmp_path, training, message):
    with pytest.raises(StudyConfigError, match=message):
        load_config(training_config(tmp_path, **training))


def test_a_tasks_max_new_tokens_reaches_valuation_and_training_cells(tmp_path):
    config = training_config(tmp_path, trainers=["crl"], seeds=[0])
    config["tasks"]["other"] = {"name": "arith", "n": 10}
    config["protocols"] = {"vote": {}}
    config["valuation"] = {"pools": ["zoo"]}
    config["sampling"] = {"max_new_tokens": 40}
    cfg = load_config({**config, "training": {**config["training"], "tasks": ["arith", "other"]}})
    lengths = {(c.kind, c.spec.task_label): c.spec.sampling["max_new_tokens"] if c.kind == "valuation"
               else c.spec.max_new_tokens for c in study.cells(cfg)}
    assert lengths == {("valuation", "arith"): 24, ("valuation", "other"): 40, ("baseline", "arith"): 24,
                       ("training", "arith"): 24, ("baseline", "other"): 40, ("training", "other"): 40}
    with pytest.raises(StudyConfigError, match=r"tasks\.arith\.max_new_tokens: must be an int >= 1"):
        load_config({**config, "tasks": {"arith": {"max_new_tokens": 0}}})


# ---------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_tiny_zoo_study_renders_the_training_verdicts(tmp_path):
    """1 setup x 2 seeds x 2 steps, C-RL and GRPO on the zoo: study.json carries learner_alone and
    seeds per setting, study.md prints both Δs per seed and the comparison (this is a smoke test of
    the report, not evidence: 2 steps train nothing)."""
    config = training_config(tmp_path, trainers=["crl", "grpo"], seeds=[0, 1], questions_per_step=2,
                             num_generations=2, n_train=8, n_eval=10, bootstrap_resamples=100,
                             setups={"vote": {"steps": 2, "learning_rate": 1e-3}})
    result = study.run(config, progress=False)
    (st,) = result["training"]["settings"]
    assert st["seeds"] == [0, 1] and set(st["learner_alone"]["after"]) == {"crl", "grpo"}
    cells = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "cells").glob("*.json")}
    runs = [c for c in cells.values() if c["kind"] == "training"]
    assert len(runs) == 4
    afters = sorted(np.mean(c["standalone"]) for c in runs)
    assert afters == pytest.approx(sorted(x for t in ("crl", "grpo") for x in st["learner_alone"]["after"][t]))
    text = (tmp_path / "study.md").read_text()
    # no placebo in this roster, so the setting fails the placebo_present gate: it is printed, not summarised
    assert "**C-RL against each baseline** over the 0 comparable of 1 settings (setup x task), 2 seed(s) each" in text
    assert "Not comparable, left out of every summary: vote on arith (placebo_present: no placebo in the roster)" in text
    assert "Note: 2 seed(s) in some setting: fewer than 3" in text
    assert "| vote | arith | 2 steps, lr 0.001 | crl" in text and "learner alone before -> after per seed" in text


def test_the_plan_prices_every_trainer_of_the_roster():
    from crl_envs.study.plan import trainer_credit

    credits = {t: trainer_credit(t) for t in trainers.ROSTER}  # each trainer declares its own: none KeyErrors
    costs = {t: (c.episodes_per_question(8, players=5), c.plays_system) for t, c in credits.items()}
    assert costs["placebo"] == costs["crl"] == (8, True) and costs["grpo"] == (8, False)
    assert costs["loo_reward"] == (8 + 1, True) and costs["shapley_credit"] == (8 * 2**4, True)
    assert trainer_credit("shapley_credit", {"shapley_coalitions": 3}).episodes_per_question(8, players=5) == 8 * 3
