"""The valuation verdicts (crl_envs.stats, crl_envs.study.stats): numbers against independent
computations, the verdict rule, and calibration on planted truth (synthetic pools whose per-question
correctness has a chosen correlation between individual and compositional strength) run through the
study's own table code. No LM: synthetic per-question tables."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from crl_envs import stats, study
from crl_envs.study.plan import design
from crl_envs.study.stats import valuation_design, valuation_tables
from crl_envs.study.tables import valuation_markdown
from crl_envs.valuation.estimators import shapley_weights
from crl_envs.valuation.report import Measure, ValuationReport

ALPHA, DELTA = 0.05, 0.3


# ---------------------------------------------------------------------- numbers, independently
def test_kendall_p_and_min_p_against_scipy_and_brute_force():
    rng = np.random.default_rng(0)
    for n in (3, 4, 5, 6, 9, 11):
        x, y = rng.random(n), rng.random(n)
        c = stats.correlation(x, y)
        ref = sps.kendalltau(x, y, method="exact")
        assert c.value == pytest.approx(ref.statistic) and c.p_value == pytest.approx(ref.pvalue) and c.exact
        assert c.min_p_value == pytest.approx(2 / math.factorial(n))
    # brute-force min p with ties: the share of orderings at the most extreme |tau-b|
    for x, y in (([1, 1, 2, 3], [1, 2, 3, 4]), ([1, 1, 2, 2, 3], [3, 1, 2, 2, 5]), ([0, 0, 0, 1, 1], [1, 2, 3, 4, 5])):
        x, y = np.asarray(x, float), np.asarray(y, float)
        taus = np.array([sps.kendalltau(x, y[list(p)]).statistic for p in itertools.permutations(range(len(x)))])
        expected = np.mean(np.abs(taus) >= np.abs(taus).max() - 1e-12)
        assert stats.min_p_value(len(x), x, y) == pytest.approx(expected)
        assert stats.correlation(x, y).min_p_value == pytest.approx(expected)
        assert expected > 2 / math.factorial(len(x))  # ties raise the floor
    assert stats.min_p_value(4, [1, 2, 3, 4], [5, 5, 5, 5]) == 1.0
    with pytest.raises(ValueError, match="n = 3 values"):
        stats.min_p_value(3, [1, 2], [1, 2])
    assert stats.min_p_value(5, [1, 2, 3, 4, 5], [5, 4, 3, 2, 1], "spearman") == pytest.approx(2 / 120)


def test_grouped_permutation_test_against_enumeration():
    """One permutation of labels per group: brute force over the product of the groups' orderings."""
    rng = np.random.default_rng(1)
    xa, xb = rng.random(4), rng.random(3)
    pairs = [(xa, rng.random(4)), (xa, rng.random(4)), (xb, rng.random(3))]
    groups = ["a", "a", "b"]
    t = stats.grouped_permutation_test(pairs, groups)
    observed = sum(sps.kendalltau(x, y).statistic for x, y in pairs)
    values = []
    for pa in itertools.permutations(range(4)):
        for pb in itertools.permutations(range(3)):
            values.append(sum(sps.kendalltau(x, y[list(pa if g == "a" else pb)]).statistic
                              for (x, y), g in zip(pairs, groups)))
    values = np.array(values)
    assert t["exact"] and t["observed"] == pytest.approx(observed)
    assert t["p_value"] == pytest.approx(np.mean(np.abs(values) >= abs(observed) - 1e-9))
    assert t["min_p_value"] == pytest.approx(np.mean(np.abs(values) >= np.abs(values).max() - 1e-9))
    mc = stats.grouped_permutation_test(pairs, groups, exact=False, draws=20000)
    assert mc["p_interval"][0] <= t["p_value"] <= mc["p_interval"][1]
    with pytest.raises(ValueError, match="different numbers of models"):
        stats.grouped_permutation_test([(xa, xa), (xb, xb)], ["a", "a"])


def _with_inversions(n: int, k: int) -> np.ndarray:
    """An ordering of ``range(n)`` with exactly ``k`` inversions."""
    perm, rest = [], list(range(n))
    for _ in range(n):
        m = len(rest) - 1
        j = min(k, m)
        perm.append(rest.pop(j))
        k -= j
    return np.array(perm, float)


def test_verdict_rule():
    assert stats.verdict(1.0, 1 / 3, 1 / 3, (0.9, 1.0)) == "untestable"  # n = 3: never counted as uncorrelated
    assert stats.verdict(0.0, 1.0, 1 / 12, (-0.1, 0.1)) == "untestable"
    assert stats.verdict(0.8, 0.01, 0.0167, (0.5, 1.0)) == "coupled"
    assert stats.verdict(-0.8, 0.01, 0.0167, (-1.0, -0.5)) == "inconclusive"
    assert stats.verdict(0.05, 0.8, 0.0001, (-0.2, 0.25)) == "decoupled"
    assert stats.verdict(0.05, 0.8, 0.0001, (-0.2, 0.3)) == "inconclusive"  # the CI must lie strictly inside
    assert stats.verdict(float("nan"), None, 1.0, None) == "untestable"
    with pytest.raises(ValueError, match="alpha and delta"):
        stats.verdict(0.1, 0.5, 0.01, None, delta=0)


# ---------------------------------------------------------------------- synthetic studies
def synthetic_cell(individual: np.ndarray, compositional: np.ndarray, questions: int, rng: np.random.Generator,
                   pool: str = "p", protocol: str = "vote", task: str = "t", individual_table: np.ndarray | None = None
                   ) -> dict:
    """A valuation cell result whose per-question tables are Bernoulli draws: each model answers alone with
    rate ``individual[i]`` and its per-question Shapley share is a Bernoulli(``compositional[i]``) / 2."""
    n = len(individual)
    ids = [f"model_{i}" for i in range(n)]
    alone = individual_table if individual_table is not None else \
        (rng.random((n, questions)) < individual[:, None]).astype(float)
    shap = (rng.random((n, questions)) < compositional[:, None]).astype(float) / 2
    loo = shap * (rng.random((n, questions)) < 0.8)
    report = ValuationReport(protocol=protocol, task=task, ids=ids, names=ids, estimator="exact",
                             example_ids=[f"q{j}" for j in range(questions)], individual=Measure("individual", ids, alone),
                             loo=Measure("loo", ids, loo), shapley=Measure("shapley", ids, shap), banzhaf=None,
                             system=shap.sum(0), empty_value=0.0, bootstrap_resamples=10)
    d = report.to_dict()
    d["family"] = "aggregation"
    return {"report": d, "labels": {"pool": pool, "protocol": protocol, "task": task}}


def _strengths_with_tau(n: int, discordant: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Individual rates spread over [0.3, 0.9] and compositional rates over [0.1, 0.7] whose noise-free
    Kendall tau is ``1 - 4 * discordant / (n (n - 1))``."""
    ind = np.linspace(0.3, 0.9, n)
    comp = np.linspace(0.1, 0.7, n)[_with_inversions(n, discordant).astype(int)]
    perm = rng.permutation(n)
    return ind[perm], comp[perm]


def _verdicts(cells: list[dict]) -> list[str]:
    return [s["verdict"] for s in valuation_tables(cells, ALPHA, delta=DELTA, resamples=200)["settings"]]


STUDIES = 200


def test_decoupled_false_rate_at_most_alpha_when_tau_is_at_least_delta():
    """n = 8 models whose noise-free tau is 0.357 or 0.429 (9 or 8 discordant pairs of 28), 100-400
    questions: the study calls 'decoupled' at most alpha of the time."""
    rng = np.random.default_rng(9)
    verdicts = []
    for k in range(STUDIES):
        ind, comp = _strengths_with_tau(8, 9 - k % 2, rng)
        assert sps.kendalltau(ind, comp).statistic >= DELTA
        verdicts += _verdicts([synthetic_cell(ind, comp, (100, 200, 400)[k % 3], rng)])
    assert verdicts.count("decoupled") / STUDIES <= ALPHA, verdicts.count("decoupled")


def test_decoupled_is_found_when_tau_is_zero_and_untestable_never_counts_as_uncorrelated():
    rng = np.random.default_rng(3)
    cells = [synthetic_cell(*_strengths_with_tau(8, 14, rng), 1000, rng, pool=f"eight{k}") for k in range(20)]
    cells += [synthetic_cell(*_strengths_with_tau(4, 3, rng), 1000, rng, pool=f"four{k}") for k in range(5)]
    t = valuation_tables(cells, ALPHA, delta=DELTA, resamples=200)
    verdicts = [s["verdict"] for s in t["settings"]]
    assert set(verdicts[20:]) == {"untestable"}  # 4 models: min p 1/12, whatever the data
    assert "coupled" not in verdicts[:20] and verdicts[:20].count("decoupled") >= 4, verdicts
    assert t["summary"]["counts"]["untestable"] == 5
    assert sum(t["summary"]["counts"].values()) == 25
    assert "uncorrelated" not in t["summary"]


def test_pooled_test_is_calibrated_under_the_null_with_shared_individual_vectors():
    """4 pools x 3 protocols; each pool's settings share one individual vector and a common compositional
    model effect independent of individual strength: one permutation per pool holds alpha, permuting each
    setting on its own does not."""
    rng = np.random.default_rng(5)
    grouped = stratified = 0
    for _ in range(STUDIES):
        pairs, groups = [], []
        for pool in range(4):
            x = rng.random(5)
            common = rng.random(5)
            for _protocol in range(3):
                pairs.append((x, common + 0.3 * rng.random(5)))
                groups.append(pool)
        grouped += stats.grouped_permutation_test(pairs, groups)["p_value"] <= ALPHA
        stratified += stats.grouped_permutation_test(pairs)["p_value"] <= ALPHA
    assert grouped / STUDIES <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES), grouped
    assert stratified / STUDIES > 2 * ALPHA, stratified  # the old test: anti-conservative here


# ---------------------------------------------------------------------- the tables
def test_tables_per_setting_and_per_pool_family_recomputed():
    rng = np.random.default_rng(2)
    ind = np.linspace(0.3, 0.9, 6)
    table = (rng.random((6, 300)) < ind[:, None]).astype(float)
    cells = [synthetic_cell(ind, np.linspace(0.1, 0.7, 6), 300, rng, pool="six", protocol=p, individual_table=table)
             for p in ("vote", "moa")]
    cells.append(synthetic_cell(ind[:3], np.linspace(0.1, 0.7, 3), 300, rng, pool="three", protocol="cascade"))
    t = valuation_tables(cells, ALPHA, delta=DELTA, families={"vote": "agg", "moa": "agg"}, resamples=300)
    for cell, s in zip(cells, t["settings"]):
        rep = cell["report"]["measures"]
        x = np.mean(rep["individual"]["per_question"], 1)
        for m, y in (("shapley", np.mean(rep["shapley"]["per_question"], 1)),
                     ("loo", np.mean(rep["loo"]["per_question"], 1)),
                     ("shapley_minus_singleton", np.mean(np.asarray(rep["shapley"]["per_question"])
                                                         - np.asarray(rep["individual"]["per_question"]) / len(x), 1))):
            got = s["measures"][m]
            # the paper's same-question tau, kept beside the verdict's cross-fit tau
            assert got["same_questions"]["kendall_tau"] == pytest.approx(sps.kendalltau(x, y).statistic)
            a, b = stats.crossfit_halves(cell["report"]["example_ids"])
            per_q = np.asarray(rep["individual"]["per_question"])
            yq = {"shapley": np.asarray(rep["shapley"]["per_question"]), "loo": np.asarray(rep["loo"]["per_question"]),
                  "shapley_minus_singleton": np.asarray(rep["shapley"]["per_question"]) - per_q / len(x)}[m]
            ref = sps.kendalltau(per_q[:, a].mean(1), yq[:, b].mean(1))
            assert got["kendall_tau"] == pytest.approx(ref.statistic) and got["crossfit_questions"] == [len(a), len(b)]
            lo, hi = got["tau_ci"]
            assert lo <= hi
        assert s["min_p_value"] == pytest.approx(2 / math.factorial(len(x)))
        assert s["verdict"] in stats.VERDICTS and s["verdict"] == s["measures"]["shapley"]["verdict"]
    assert [s["family"] for s in t["settings"]] == ["agg", "agg", "aggregation"]
    assert t["settings"][2]["verdict"] == "untestable"
    pf = {(c["pool"], c["family"]): c for c in t["summary"]["pool_families"]}
    six = pf[("six", "agg")]
    # the pool's two settings share the individual vector: one permutation of 6 labels for both
    a, b = stats.crossfit_halves(cells[0]["report"]["example_ids"])
    xs = [np.asarray(c["report"]["measures"]["individual"]["per_question"])[:, a].mean(1) for c in cells[:2]]
    ys = [np.asarray(c["report"]["measures"]["shapley"]["per_question"])[:, b].mean(1) for c in cells[:2]]
    values = np.array([sum(sps.kendalltau(x, y[list(p)]).statistic for x, y in zip(xs, ys))
                       for p in itertools.permutations(range(6))])
    observed = sum(sps.kendalltau(x, y).statistic for x, y in zip(xs, ys))
    assert six["pooled"]["p_value"] == pytest.approx(np.mean(np.abs(values) >= abs(observed) - 1e-9))
    assert six["kendall_tau"] == pytest.approx(observed / 2)
    assert pf[("three", "aggregation")]["verdict"] == "untestable"
    md = valuation_markdown(t)
    assert "untestable" in md and "does not predict" not in md and "(pool, family) units" in md
    d = valuation_design([(s["pool"], s["n"], s["questions"]) for s in t["settings"]], resamples=50)
    assert d["untestable_settings"] == 1 and "can never reject" in d["paragraph"]
    assert pf[("six", "agg")]["min_p_value"] == pytest.approx(2 / math.factorial(6))  # one permutation: one floor


def test_design_reports_min_p_and_power_per_pool():
    d = valuation_design([("a", 8, 200)] * 3 + [("b", 4, 200)] * 2)
    a, b = d["pools"]
    assert (a["settings"], a["min_p_value"], b["min_p_value"]) == (3, pytest.approx(2 / 40320), pytest.approx(1 / 12))
    assert a["power"]["coupled"]["graded"] == stats.verdict_power(8, 200).to_dict()
    assert b["power"]["coupled"]["graded"]["value"] == 0.0
    assert d["untestable_settings"] == 2 and "2 setting(s) can never reject" in d["paragraph"]


def test_config_families_and_pool_tasks():
    config = study.load_config({
        "pools": {"four": [{"expert": a} for a in (0.8, 0.7, 0.6, 0.5)], "three": [{"expert": a} for a in (0.8, 0.6, 0.4)]},
        "tasks": {"arith": {"n": 10}, "logic": {"n": 10}},
        "protocols": {"vote": {}, "debate": {}, "routing": {}},
        "valuation": {"families": {"api": ["routing"], "text": ["aggregation", "debate"]},
                      "pool_tasks": {"three": ["logic"]}}})
    v = config.valuation
    assert v.families == {"vote": "text", "debate": "text", "routing": "api"} and v.delta == DELTA
    ids = [c.id for c in study.plan(config) if c.kind == "valuation"]
    assert len(ids) == 3 * 2 + 3 * 1 and not any(c.startswith("valuation/three/") and "/arith/" in c for c in ids)
    d = design(config)
    assert [(p["pool"], p["settings"]) for p in d["pools"]] == [("four", 6), ("three", 3)]


# ---------------------------------------------------------------------- shared questions, as in a real study
def _played_cell(digits: np.ndarray, study: int, protocol: str = "vote", pool: str = "p") -> dict:
    """A cell whose individual, LOO and Shapley tables all come from one game the real protocol played
    (tests/planted_games.py): the same questions for every measure, as in a study."""
    sys.path.insert(0, str(Path(__file__).parent))
    from planted_games import profile_table

    n = digits.shape[1]
    table = profile_table(protocol, n)
    values = table[:, (digits * 3 ** np.arange(n)).sum(axis=1)]
    ids = [f"model_{i}" for i in range(n)]
    full = (1 << n) - 1
    alone = values[[1 << i for i in range(n)]]
    loo = values[full] - values[[full & ~(1 << i) for i in range(n)]]
    shap = shapley_weights(n) @ values
    report = ValuationReport(protocol=protocol, task="t", ids=ids, names=ids, estimator="exact",
                             example_ids=[f"s{study}-q{j}" for j in range(digits.shape[0])],
                             individual=Measure("individual", ids, alone), loo=Measure("loo", ids, loo),
                             shapley=Measure("shapley", ids, shap), banzhaf=None, system=values[full],
                             empty_value=0.0, bootstrap_resamples=10)
    d = report.to_dict()
    d["family"] = "aggregation"
    return {"report": d, "labels": {"pool": pool, "protocol": protocol, "task": "t"}}


def test_copies_of_one_model_are_not_coupled_by_the_study_but_are_by_the_same_question_tau():
    """200 studies of 6 exchangeable models (accuracy 0.7, 100 shared questions, vote played for real, wrong
    answers shared): the study's verdict (cross-fit) says 'coupled' at most alpha + 3 SE; the same-question
    tau it reports beside it is significant and positive far more often (the artefact of issue #43)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from planted_games import draw_profiles

    rng = np.random.default_rng(21)
    coupled = same = 0
    for k in range(STUDIES):
        s = valuation_tables([_played_cell(draw_profiles(rng, np.full((100, 6), 0.7)), k)], ALPHA, delta=DELTA,
                             resamples=50)["settings"][0]
        coupled += s["verdict"] == "coupled"
        sq = s["measures"]["shapley"]["same_questions"]
        same += sq["p_value"] is not None and sq["p_value"] <= ALPHA and sq["kendall_tau"] > 0
    assert coupled / STUDIES <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES), coupled
    assert same / STUDIES > 0.3, same


def test_a_pool_family_of_opposite_settings_is_heterogeneous_not_decoupled():
    """A +1 and a -1 setting of one pool and family: pooled tau 0 with a narrow interval, but the settings
    disagree: 'heterogeneous', never 'decoupled'."""
    ind = np.linspace(0.2, 0.9, 6)
    up = (np.arange(400)[None, :] % 100 < 100 * ind[:, None]).astype(float)  # deterministic, exact rates
    cells = []
    for p, comp in (("vote", ind), ("moa", ind[::-1])):
        c = synthetic_cell(ind, comp, 400, np.random.default_rng(0), pool="six", protocol=p, individual_table=up)
        c["report"]["measures"]["shapley"]["per_question"] = (np.roll(up, 7, axis=1) if p == "vote"
                                                              else np.roll(up[::-1], 7, axis=1)).tolist()
        cells.append(c)
    t = valuation_tables(cells, ALPHA, delta=DELTA, families={"vote": "agg", "moa": "agg"}, resamples=200)
    taus = [s["kendall_tau"] for s in t["settings"]]
    assert taus == [pytest.approx(1.0), pytest.approx(-1.0)]
    unit = t["summary"]["pool_families"][0]
    assert unit["kendall_tau"] == pytest.approx(0.0) and unit["heterogeneity"]["opposite"]
    assert unit["verdict"] == "heterogeneous"
    assert "heterogeneous" in valuation_markdown(t)
