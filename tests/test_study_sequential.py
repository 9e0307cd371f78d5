"""A study's valuation cells played look by look ([valuation.sequential], issue #54): the table's one-line errors,
nothing moved without it, one report over batches equal to one over all their questions, a planted coupled setting
stopped at an early look through the real study, and a run that dies between looks resumed without replaying the
finished ones."""

from __future__ import annotations

import numpy as np
import pytest

import agents
from crl_envs import sequential, study, tasks, valuation
from crl_envs.stats import crossfit_tau
from crl_envs.study import StudyConfigError, load_config
from crl_envs.study.cells.valuation import ValuationCell

SIX = [0.97, 0.78, 0.59, 0.4, 0.21, 0.02]  # experts' accuracies, widely spaced: a planted coupled vote setting
LOOKS = [80, 160]


def config(out, sequential_table=None, **valuation_keys) -> dict:
    v = {"alpha": 0.05, "bootstrap_resamples": 200, **valuation_keys}
    if sequential_table is not None:
        v["sequential"] = sequential_table
    return {"study": {"name": "seq", "out": str(out)},
            "pools": {"six": [{"expert": a, "seed": 3} for a in SIX]},
            "tasks": {"arith": {"n": LOOKS[-1], "seed": 2}},
            "protocols": {"vote": {}}, "valuation": v}


# ---------------------------------------------------------------------- config
BAD = [
    ({"looks": [160, 80]}, r"valuation\.sequential: SequentialDesign\.looks must be increasing"),
    ({"looks": 160}, r"valuation\.sequential\.looks: must be a list of question counts"),
    ({"looks": [40, "80"]}, r"valuation\.sequential\.looks: must be a list of question counts"),
    ({"look": LOOKS}, r"valuation\.sequential\.look: unknown key \(did you mean 'looks'\?\)"),
    ({"looks": LOOKS, "coupled_spending": "pocok"}, r"valuation\.sequential: unknown spending function 'pocok'"),
    ({"looks": LOOKS, "decoupled_spending": "power:-1"}, r"valuation\.sequential: unknown spending function"),
    ({"looks": LOOKS, "futility_tau": 2}, r"valuation\.sequential\.futility_tau: must be a number in \[-1, 1\]"),
    ({"looks": [40, 100]}, r"valuation\.sequential\.looks: the last look \(100\) must be the question count of every "
                           r"valued task, but tasks\.arith\.n is 160"),
]


@pytest.mark.parametrize("table, message", BAD, ids=[m.split(":")[0].replace("\\", "") + str(i)
                                                     for i, (_, m) in enumerate(BAD)])
def test_bad_sequential_table_refused_in_one_line(table, message, tmp_path):
    with pytest.raises(StudyConfigError, match=message) as e:
        load_config(config(tmp_path, table))
    assert "\n" not in str(e.value) and str(e.value).startswith("study config: valuation.sequential")


def test_defaults_are_the_designs_and_levels_the_studys(tmp_path):
    """Left out, each key is SequentialDesign's default; the design's levels are [valuation]'s alpha, delta and
    resamples, its seed the cell's."""
    cfg = load_config(config(tmp_path, {"looks": LOOKS}, alpha=0.1, delta=0.25, seeds=[3]))
    design = study.cells(cfg)[0].spec.design()
    default = sequential.SequentialDesign()
    assert (design.coupled_spending, design.decoupled_spending, design.futility_tau) == \
        (default.coupled_spending, default.decoupled_spending, default.futility_tau)
    assert (design.looks, design.alpha, design.decoupled_alpha, design.delta, design.resamples, design.seed) == \
        (tuple(LOOKS), 0.1, 0.1, 0.25, 200, 3)


# Computed on main before [valuation.sequential] existed (commit f8b8111), for this config.
FINGERPRINTS_ON_MAIN = {"valuation/six/vote/arith/seed0": "4dde5595f37363bdcebd821f0c98495f",
                        "valuation/six/cascade/arith/seed0": "542bb83a7ea3d10c7a07a2ba28c82ab4",
                        "valuation/four/vote/arith/seed0": "043d3d99471eba6bd3a523f33155caf8",
                        "valuation/four/cascade/arith/seed0": "a970f157bdeb122bcd523f4527b2722f"}


def test_without_the_table_nothing_moves(tmp_path):
    """Without [valuation.sequential] (and with an estimator rule without ``computed``) every cell keeps the
    fingerprint it had before either key existed; with the table, the cells are new ones."""
    cfg = {"study": {"name": "seq", "out": str(tmp_path)},
           "pools": {"six": [{"expert": a, "seed": 3} for a in SIX],
                     "four": [{"expert": a, "seed": 1} for a in (0.8, 0.6, 0.45, 0.7)]},
           "tasks": {"arith": {"n": 120, "seed": 2}}, "protocols": {"vote": {}, "cascade": {}},
           "valuation": {"alpha": 0.05, "bootstrap_resamples": 200,
                         "estimator": {"exact_up_to": 4, "larger": "regression"}, "budget": 20}}
    planned = study.cells(load_config(cfg))
    assert {c.id: c.fingerprint for c in planned} == FINGERPRINTS_ON_MAIN
    assert all("sequential" not in c.spec.payload() for c in planned)
    cfg["valuation"]["sequential"] = {"looks": [60, 120]}
    with_table = study.cells(load_config(cfg))
    assert not {c.fingerprint for c in with_table} & set(FINGERPRINTS_ON_MAIN.values())


def test_computed_estimator_values_vote_exactly_and_the_others_by_the_rule(tmp_path):
    cfg = config(tmp_path, estimator={"exact_up_to": 4, "larger": "regression", "computed": "exact"}, budget=20)
    cfg["protocols"]["cascade"] = {}
    kinds = {c.spec.protocol_label: c.estimator_kind(len(SIX)) for c in study.cells(load_config(cfg))}
    assert (kinds["vote"][0].name, kinds["vote"][1]) == ("exact", None)
    assert (kinds["cascade"][0].name, kinds["cascade"][1]) == ("regression", 20)


# ---------------------------------------------------------------------- one report over batches
@pytest.mark.parametrize("protocol, estimator, budget", [("cascade", "exact", None), ("debate", "regression", 20),
                                                         ("vote", "antithetic", 6)])
def test_concatenated_batches_equal_one_evaluation(protocol, estimator, budget):
    """A report concatenated from batches of questions equals the report of one evaluation on all of them:
    every measure's per-question table, its draws (a sampled estimator's included) and the system."""
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a, seed=2) for a in (0.9, 0.7, 0.5, 0.3, 0.6)])
    task = tasks.load("arith", n=30, seed=4)
    ids = [e.id for e in task.examples]
    kw = dict(estimator=estimator, budget=budget, cache_dir=False, progress=False, bootstrap_resamples=50)
    whole = valuation.evaluate(protocol, pool, task, **kw)
    parts = valuation.concatenate([valuation.evaluate(protocol, pool, task.subset(ids[a:b]), **kw)
                                   for a, b in ((0, 10), (10, 30))])
    assert parts.example_ids == whole.example_ids
    np.testing.assert_allclose(parts.system, whole.system)
    assert parts.measures.keys() == whole.measures.keys()
    for name, m in whole.measures.items():
        np.testing.assert_allclose(parts.measures[name].per_question, m.per_question, atol=1e-12)
        if m.draws is None:
            assert parts.measures[name].draws is None
        else:
            np.testing.assert_allclose(parts.measures[name].draws, m.draws, atol=1e-12)
    np.testing.assert_allclose(parts.coalition_costs.values, whole.coalition_costs.values)
    assert parts.verdict()["verdict"] == whole.verdict()["verdict"]


def test_concatenate_refuses_mixed_or_overlapping_reports():
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.9, 0.5, 0.3)])
    task = tasks.load("arith", n=8)
    one = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, bootstrap_resamples=20)
    other = valuation.evaluate("vote", pool, task, cache_dir=False, progress=False, bootstrap_resamples=20, seed=1)
    with pytest.raises(ValueError, match="share questions"):
        valuation.concatenate([one, one])
    with pytest.raises(ValueError, match="differ in seed"):
        valuation.concatenate([one, other])


# ---------------------------------------------------------------------- through the study
@pytest.fixture
def no_power_simulation(monkeypatch):
    """The design's power (a simulation of planted settings, minutes for 6 models; tests/test_design_power.py
    covers it) left out of the tables: what these tests check is the sequential play."""
    monkeypatch.setattr(study, "design", lambda config: None)


@pytest.mark.slow
def test_planted_coupled_setting_stops_early_through_the_study(tmp_path, no_power_simulation):
    """Six experts spaced 0.97 .. 0.02 in vote: the study plays 80 questions at a time and stops at the first look
    whose verdict is coupled at that look's spent level (Pocock-type: 0.031 of the 0.05 at the first look). The recorded look, questions and verdict are those of
    an independent walk of the same design over the whole task's tables (read on the questions so far, look by
    look), and it used fewer questions and question x coalition evaluations than the fixed design."""
    cfg = load_config(config(tmp_path / "out", {"looks": LOOKS}))
    result = study.run(cfg, progress=False)
    setting = result["valuation"]["settings"][0]
    seq = setting["sequential"]
    assert setting["verdict"] == seq["verdict"] == "coupled" and seq["stopped"] == "decided"
    assert seq["look"] < len(LOOKS) - 1 and seq["questions"] == LOOKS[seq["look"]] < LOOKS[-1]
    assert seq["evaluations"] == seq["questions"] * 63 < seq["fixed_evaluations"] == LOOKS[-1] * 63
    assert setting["questions"] == seq["questions"]  # the report covers the questions used
    # independently: the whole task valued at once, then the design walked over its tables
    pool = agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a, seed=3) for a in SIX])
    whole = valuation.evaluate("vote", pool, tasks.load("arith", n=LOOKS[-1], seed=2), cache_dir=False,
                               progress=False, bootstrap_resamples=200)
    design = study.cells(cfg)[0].spec.design()
    walked = sequential.sequential_verdict(whole.individual.per_question, whole.shapley.per_question,
                                           whole.example_ids, design)
    assert (walked.verdict, walked.look, walked.questions, walked.stopped) == \
        (seq["verdict"], seq["look"], seq["questions"], seq["stopped"])
    first = crossfit_tau(whole.individual.per_question[:, :LOOKS[0]], whole.shapley.per_question[:, :LOOKS[0]],
                         whole.example_ids[:LOOKS[0]], resamples=200)
    assert walked.trace[0]["p_value"] == pytest.approx(first["p_value"])
    total = result["valuation"]["summary"]["sequential"]
    assert total["evaluations"] == seq["evaluations"] and total["fixed_evaluations"] == seq["fixed_evaluations"]
    md = (tmp_path / "out" / "study.md").read_text()
    assert f"| six | vote | arith | coupled | {seq['look'] + 1} of 2 | {seq['questions']} of 160 | decided |" in md
    assert f"Question x coalition evaluations: {seq['evaluations']:,} against the fixed design's " \
           f"{seq['fixed_evaluations']:,}" in md


@pytest.mark.slow
def test_a_run_that_dies_between_looks_resumes_without_replaying_them(tmp_path, monkeypatch, no_power_simulation):
    """The driver dies as the second look starts (after the first look's coalitions were written): the rerun
    plays none of the first look's coalitions (all from the coalition cache) and gives what an uninterrupted
    run gives."""
    # alpha t^8 leaves the first look 0.0002, below the smallest p of 6 models (0.0028): it cannot decide
    table = {"looks": LOOKS, "coupled_spending": "power:8"}
    cfg = load_config(config(tmp_path / "out", table))
    real = ValuationCell._evaluate
    calls = []

    def dies_at_the_second_look(self, pool, task, context):
        calls.append(len(task))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between looks")
        return real(self, pool, task, context)

    monkeypatch.setattr(ValuationCell, "_evaluate", dies_at_the_second_look)
    with pytest.raises(KeyboardInterrupt):
        study.run(cfg, progress=False)
    assert not list((tmp_path / "out" / "cells").glob("*.json"))  # the cell did not finish
    monkeypatch.setattr(ValuationCell, "_evaluate", real)
    resumed = study.run(cfg, progress=False)
    fresh = study.run(load_config(config(tmp_path / "fresh", table)), progress=False)
    cell = study.cells(cfg)[0]
    trace = study.load_result(cfg.out, cell)["sequential"]["trace"]
    assert len(trace) == 2 and trace[0]["verdict"] not in sequential.DECIDED
    assert trace[0]["played"] == 0 and trace[0]["from_cache"] == len(SIX)  # the first look: nothing replayed
    assert all(look["played"] == len(SIX) for look in trace[1:])  # later looks: played once, now
    r, f = resumed["valuation"]["settings"][0], fresh["valuation"]["settings"][0]
    assert r["sequential"] == f["sequential"] and r["shapley"] == f["shapley"]
