"""Valuation verdicts on planted truth played through the real protocols (no LM).

Each study: 6 scripted models, questions shared across the models, per-question correctness drawn from
planted accuracies, wrong answers shared (70% of wrong answers are one common wrong value), every
coalition's value read from a table the real protocol played (:mod:`tests.planted_games`: vote,
cascade, judge, routing through :func:`crl_envs.runner.run_coalitions`). The verdict is the study's:
cross-fit Kendall tau-b (:func:`crl_envs.stats.crossfit_tau`), alpha = 0.05, delta = 0.3, its 95% interval
(the taus consistent with the pairwise orders the questions determine).

Rates asserted (200 studies per claim; Monte Carlo bound: 3 binomial standard errors):

- exchangeable models (all accuracy 0.7, 100 questions), each protocol: cross-fit ``coupled`` at most
  alpha + 3 SE (0.096); the same-question tau (the paper's way) reads them ``coupled`` far above alpha
  in vote (asserted > 0.3: the artefact the cross-fit removes);
- a graded pool (accuracies 0.45 .. 0.95, 200 questions), vote and cascade: ``coupled`` within 3 SE of
  the power a separate 1,000-study simulation predicts, and that power above 0.8;
- planted decoupling (routing; generalists redundant on the common questions, specialists alone on theirs:
  true individual and Shapley rankings have Kendall tau 1/15), 4,000 questions: ``decoupled`` in at least
  half the studies (measured 0.70 on 40; 0.0 at 1,000 questions, where the 95% interval is 0.70 wide:
  equivalence needs nearly every pair of models ordered on both halves) and ``coupled`` at most alpha + 3 SE;
- the pooled test (one permutation of labels per pool, 4 protocols x 2 exchangeable pools): rejects at most
  alpha + 3 SE, and a pool's 4 settings read as heterogeneous at most alpha + 3 SE;
- the 95% interval's coverage of the true tau (planted decoupling and graded pool): at least 0.95 - 3 SE
  (measured 1.0; the 90% BCa interval it replaces covered 0.70-0.81 on the study's own tables,
  benchmarks/inference_coverage.py).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from crl_envs import stats

sys.path.insert(0, str(Path(__file__).parent))
from planted_games import draw_profiles, profile_table, study_tables, true_strengths  # noqa: E402

ALPHA, DELTA, STUDIES, N = 0.05, 0.3, 200, 6
MC = 3 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)
RESAMPLES = 400
GRADED = np.array([0.45, 0.55, 0.65, 0.75, 0.85, 0.95])
# planted decoupling: question types (rows) x models; model i right on a type with this probability.
# An easy type everyone may solve (weight 0.4), and types only one model solves (its own niche);
# the last type nobody solves. Individual strength follows the easy type, Shapley the niches:
# true individual .50 .44 .38 .34 .26 .20, true Shapley .21 .14 .09 .08 .15 .18 (tau 1/15).
SPECIALISTS = np.array([[0.958, 1.0, 0.958, 0.851, 0.348, 0.062], *np.eye(N)[[0, 1, 4, 5]], np.zeros(N)])
SPECIALIST_WEIGHTS = np.array([0.4, 0.117, 0.04, 0.121, 0.175, 0.147])


def _study(protocol: str, accuracy: np.ndarray, questions: int, rng: np.random.Generator, study: int) -> dict:
    """One study's cross-fit result and same-question tau and verdicts."""
    weights = SPECIALIST_WEIGHTS if accuracy is SPECIALISTS else None
    acc = accuracy[rng.choice(len(accuracy), questions, p=weights)] if accuracy.ndim == 2 else \
        np.broadcast_to(accuracy, (questions, N))
    individual, shapley = study_tables(profile_table(protocol, N), draw_profiles(rng, acc))
    ids = [f"s{study}-q{k}" for k in range(questions)]
    cf = stats.crossfit_tau(individual, shapley, ids, level=1 - ALPHA, resamples=RESAMPLES, seed=study)
    same = stats.correlation(individual.mean(axis=1), shapley.mean(axis=1))
    return {**cf, "verdict": stats.verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"],
                                            alpha=ALPHA, delta=DELTA, questions=cf["questions"]),
            "same_coupled": same.p_value <= ALPHA and same.value > 0}


def _rates(protocol: str, accuracy: np.ndarray, questions: int, seed: int, studies: int = STUDIES) -> dict:
    rng = np.random.default_rng(seed)
    runs = [_study(protocol, accuracy, questions, rng, k) for k in range(studies)]
    return {"runs": runs, **{v: np.mean([r["verdict"] == v for r in runs]) for v in stats.VERDICTS},
            "same_coupled": np.mean([r["same_coupled"] for r in runs])}


@pytest.mark.parametrize("protocol", ["vote", "cascade", "judge", "routing"])
def test_exchangeable_models_are_coupled_at_most_at_alpha(protocol):
    r = _rates(protocol, np.full(N, 0.7), 100, seed=1)
    assert r["coupled"] <= ALPHA + MC, (protocol, r["coupled"])
    if protocol == "vote":  # the same-question tau reads copies of one model as coupled
        assert r["same_coupled"] > 0.3, r["same_coupled"]
    print(f"{protocol}: exchangeable, cross-fit coupled {r['coupled']:.3f}, same-question {r['same_coupled']:.3f}")


@pytest.mark.parametrize("protocol", ["vote", "cascade"])
def test_graded_pool_is_coupled_at_the_simulated_power(protocol):
    predicted = _rates(protocol, GRADED, 200, seed=1000, studies=1000)["coupled"]
    r = _rates(protocol, GRADED, 200, seed=2)
    se = math.sqrt(predicted * (1 - predicted) / STUDIES)
    assert predicted > 0.8 and abs(r["coupled"] - predicted) <= 3 * max(se, 1 / STUDIES), (predicted, r["coupled"])
    print(f"{protocol}: graded, coupled {r['coupled']:.3f}, predicted {predicted:.3f}")


def test_planted_decoupling_is_found_decoupled():
    ind, sh = true_strengths(profile_table("routing", N), SPECIALISTS, weights=SPECIALIST_WEIGHTS)
    assert stats.kendall_tau_b(ind, sh) == pytest.approx(1 / 15)  # the planted truth itself
    r = _rates("routing", SPECIALISTS, 4000, seed=3, studies=100)
    assert r["decoupled"] >= 0.5 and r["coupled"] <= ALPHA + MC, (r["decoupled"], r["coupled"])
    print(f"routing specialists: decoupled {r['decoupled']:.3f}, coupled {r['coupled']:.3f}")


def test_pooled_test_holds_its_level_across_protocols_and_pools():
    """Exchangeable pools, 4 protocols each: the pooled test rejects, and a pool's 4 settings read as
    heterogeneous, each at most alpha + 3 SE (measured: heterogeneous 0.01, Q is conservative here)."""
    rng = np.random.default_rng(4)
    rejected = heterogeneous = 0
    for study in range(STUDIES):
        pairs, groups = [], []
        for pool in range(2):
            acc = np.full((100, N), 0.7)
            digits = draw_profiles(rng, acc)  # one pool: its models answer the same questions in every protocol
            ids = [f"s{study}-p{pool}-q{k}" for k in range(100)]
            taus, boots = [], []
            for protocol in ("vote", "cascade", "judge", "routing"):
                individual, shapley = study_tables(profile_table(protocol, N), digits)
                cf = stats.crossfit_tau(individual, shapley, ids, resamples=100, seed=study)
                pairs.append((cf["x"], cf["y"]))
                groups.append(pool)
                taus.append(np.nan if cf["kendall_tau"] is None else cf["kendall_tau"])
                boots.append(cf["boots"])
            if pool == 0:
                heterogeneous += stats.heterogeneity(taus, boots)["heterogeneous"]
        rejected += stats.grouped_permutation_test(pairs, groups, draws=2000, seed=study)["p_value"] <= ALPHA
    assert rejected / STUDIES <= ALPHA + MC, rejected / STUDIES
    assert heterogeneous / STUDIES <= ALPHA + MC, heterogeneous / STUDIES


def test_tau_interval_covers_the_true_tau():
    """Coverage of the 95% interval of the cross-fit tau against the population tau of the true
    individual accuracies and Shapley values: the planted decoupling (routing, true tau 1/15, 1,000
    questions) and the graded pool (vote, true tau 1, 200 questions). Asserted >= 0.95 - 3 SE each."""
    for protocol, accuracy, weights, questions in (("routing", SPECIALISTS, SPECIALIST_WEIGHTS, 1000),
                                                   ("vote", GRADED[None, :], None, 200)):
        ind, sh = true_strengths(profile_table(protocol, N), accuracy, weights=weights)
        truth = float(stats.kendall_tau_b(ind, sh))
        r = _rates(protocol, SPECIALISTS if weights is not None else GRADED, questions, seed=5)
        coverage = float(np.mean([x["tau_ci"] is not None and x["tau_ci"][0] - 1e-9 <= truth <= x["tau_ci"][1] + 1e-9
                                  for x in r["runs"]]))
        print(f"{protocol}: 95% coverage of the true tau {truth:+.3f}: {coverage:.3f}")
        assert coverage >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / STUDIES), (protocol, coverage)


# ---------------------------------------------------------------------- rules of the verdict
def test_no_interval_for_an_undefined_estimate_and_nan_resamples_counted():
    ids = [f"q{k}" for k in range(60)]
    constant = np.ones((5, 60))
    cf = stats.crossfit_tau(constant, np.random.default_rng(0).random((5, 60)), ids)
    assert cf["kendall_tau"] is None and cf["tau_ci"] is None and cf["p_value"] is None
    assert cf["nan_resamples"] == cf["resamples"]
    assert stats.verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"]) == "untestable"


def test_too_few_questions_and_zero_width_intervals_give_no_verdict():
    assert stats.verdict(0.05, 0.9, 0.001, [-0.1, 0.1], questions=[9, 30]) == "untestable"
    assert stats.verdict(0.05, 0.9, 0.001, [-0.1, 0.1], questions=[10, 10]) == "decoupled"
    assert stats.verdict(0.28, 0.49, 0.001, [0.28, 0.28], questions=[40, 40]) == "inconclusive"


def test_opposite_settings_pool_to_heterogeneous_never_decoupled():
    boots = [np.full(100, 1.0), np.full(100, -1.0)]
    h = stats.heterogeneity([1.0, -1.0], boots)
    assert h["opposite"] and h["heterogeneous"]
    assert stats.verdict(0.0, 1.0, 0.001, [-0.01, 0.01], heterogeneous=h["heterogeneous"]) == "heterogeneous"
    rng = np.random.default_rng(0)
    agree = stats.heterogeneity([0.5, 0.55], [rng.normal(0.5, 0.1, 500), rng.normal(0.55, 0.1, 500)])
    assert not agree["heterogeneous"] and agree["p_value"] > 0.5
    # Cochran's Q against its formula
    t, v = np.array([0.6, -0.2, 0.1]), np.array([0.01, 0.02, 0.04])
    w = 1 / v
    q = float(np.sum(w * (t - np.sum(w * t) / w.sum()) ** 2))
    draws = [rng.normal(ti, math.sqrt(vi), 200_000) for ti, vi in zip(t, v)]
    got = stats.heterogeneity(t, draws)
    assert got["q"] == pytest.approx(q, rel=0.02) and got["heterogeneous"]


def test_crossfit_halves_are_fixed_by_question_id():
    ids = [f"arith-{k}" for k in range(400)]
    a, b = stats.crossfit_halves(ids)
    assert sorted(np.concatenate([a, b]).tolist()) == list(range(400)) and 160 < len(a) < 240
    # the same question lands on the same side whatever else is asked, and in any order
    sub = ids[::-3]
    sa, _ = stats.crossfit_halves(sub)
    assert {sub[i] for i in sa} == {ids[i] for i in a} & set(sub)


def test_crossfit_tau_against_a_direct_computation():
    rng = np.random.default_rng(3)
    ids = [f"q{k}" for k in range(80)]
    x, y = rng.random((7, 80)), rng.random((7, 80))
    a, b = stats.crossfit_halves(ids)
    cf = stats.crossfit_tau(x, y, ids)
    from scipy import stats as sps
    ref = sps.kendalltau(x[:, a].mean(axis=1), y[:, b].mean(axis=1), method="exact")
    assert cf["kendall_tau"] == pytest.approx(ref.statistic) and cf["p_value"] == pytest.approx(ref.pvalue)
    assert cf["questions"] == [len(a), len(b)] and cf["tau_ci"][0] < cf["tau_ci"][1]


def test_values_equal_up_to_floating_point_error_rank_as_ties():
    """#47: Shapley values tied in theory differ in their last bits across CPUs; they must rank as ties."""
    x = np.array([0.61, 0.55, 0.55, 0.40, 0.72])
    exact = np.array([-0.020916666666666667, 0.1, -0.020916666666666667, 0.05, 0.2])
    cpu_a = exact.copy()
    cpu_a[0], cpu_a[2] = -0.02091666666666668, -0.020916666666666677  # committed ladder-200 / ladder-300
    rng = np.random.default_rng(0)
    ref = stats.correlation(x, exact)
    for v in (cpu_a, exact * (1 + rng.uniform(-1e-14, 1e-14, 5)), exact + rng.uniform(-1e-17, 1e-17, 5)):
        c = stats.correlation(x, v)
        assert (c.value, c.p_value, c.min_p_value) == (ref.value, ref.p_value, ref.min_p_value)
        assert stats.spearman_rho(x, v) == stats.spearman_rho(x, exact)
    assert ref.min_p_value > 2 / math.factorial(5)  # the tie is seen as a tie
    # values apart by more than the tolerance keep their order
    assert stats.correlation([1, 2, 3], [0.1, 0.1 + 1e-6, 0.2]).value == 1.0


def test_a_ratio_whose_denominator_may_be_zero_gives_the_difference():
    rng = np.random.default_rng(0)
    num, den = rng.normal(0.10, 0.01, 4000), rng.normal(0.02, 0.02, 4000)
    r = stats.ratio_ci(0.10, 0.02, num, den, names=("crl", "grpo"))
    assert r["value"] is None and r["ci"] is None and "CI reaches 0" in r["undefined"]
    assert r["difference"]["value"] == pytest.approx(0.08)
    lo, hi = r["difference"]["ci"]
    assert lo == pytest.approx(np.quantile(num - den, 0.025)) and hi == pytest.approx(np.quantile(num - den, 0.975))
    ok = stats.ratio_ci(0.10, 0.05, num, rng.normal(0.05, 0.005, 4000))
    assert ok["value"] == pytest.approx(2.0) and ok["ci"][0] < 2.0 < ok["ci"][1]


def test_pooled_test_cross_fits_by_default_and_skips_reports_too_small_to_split():
    from crl_envs.valuation import pooled_test
    from crl_envs.valuation.report import Measure, ValuationReport

    rng = np.random.default_rng(8)
    reports = []
    for k, questions in enumerate((80, 80, 12)):
        ids = [f"m{i}" for i in range(5)]
        alone = (rng.random((5, questions)) < np.linspace(0.3, 0.9, 5)[:, None]).astype(float)
        shap = alone / 5 + rng.random((5, questions)) * 0.05
        reports.append(ValuationReport(protocol=f"p{k}", task="t", ids=ids, names=ids, estimator="exact",
                                       example_ids=[f"r{k}-q{j}" for j in range(questions)],
                                       individual=Measure("individual", ids, alone), loo=Measure("loo", ids, shap),
                                       shapley=Measure("shapley", ids, shap), banzhaf=None, system=alone.max(0),
                                       empty_value=0.0, bootstrap_resamples=10))
    t = pooled_test(reports)
    expected = sum(stats.crossfit_tau(r.individual.per_question, r.shapley.per_question, r.example_ids,
                                      resamples=10)["kendall_tau"] for r in reports[:2])
    assert t.crossfit and t.observed == pytest.approx(expected) and len(t.strata) == 2
    assert "fewer than 10" in t.skipped[0] and "cross-fit" in str(t)
    same = pooled_test(reports, crossfit=False)
    assert same.observed == pytest.approx(sum(stats.kendall_tau_b(r.individual.means, r.shapley.means) for r in reports))


@pytest.mark.slow
def test_copies_through_the_runner_and_the_study_tables():
    """End to end through the real runner (``valuation.evaluate``: every coalition played by
    ``run_coalitions``) and the study's tables: 40 studies of 6 scripted copies (accuracy 0.7 each,
    independent per question, the scripted wrong answers), vote, 100 questions each. The cross-fit verdict
    says 'coupled' in at most alpha + 3 SE of them (6 of 40); the same-question tau beside it is
    significant and positive in more (the artefact), and the cross-fit tau equals its direct computation."""
    import agents
    from agents import ScriptedAgent
    from crl_envs import tasks, valuation
    from crl_envs.study.stats import valuation_tables

    studies, coupled, same = 40, 0, 0
    for k in range(studies):
        pool = agents.pool([ScriptedAgent.expert(f"copy-{i}", 0.7, seed=k) for i in range(N)])
        report = valuation.evaluate("vote", pool, tasks.load("arith", n=100, seed=k), cache_dir=False,
                                    progress=False, seed=k)
        d = report.to_dict()
        d["family"] = "aggregation"
        (s,) = valuation_tables([{"report": d, "labels": {"pool": "c", "protocol": "vote", "task": "arith"}}],
                                ALPHA, delta=DELTA, resamples=50)["settings"]
        direct = stats.crossfit_tau(report.individual.per_question, report.shapley.per_question, report.example_ids,
                                    resamples=10)
        assert s["kendall_tau"] == direct["kendall_tau"] and s["p_value"] == direct["p_value"]
        coupled += s["verdict"] == "coupled"
        sq = s["measures"]["shapley"]["same_questions"]
        same += sq["p_value"] is not None and sq["p_value"] <= ALPHA and sq["kendall_tau"] > 0
    assert coupled <= ALPHA * studies + 3 * math.sqrt(ALPHA * (1 - ALPHA) * studies), coupled
    assert same > coupled, (same, coupled)
    print(f"runner copies: cross-fit coupled {coupled} of {studies}, same-question {same}")
