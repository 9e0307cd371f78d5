"""Every committed result file (``docs/*.json``) is reproduced: one cheap cell of each is re-run and must
give the committed numbers bit for bit. A change that moves them re-measures them in the same commit."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import agents.zoo  # registers the zoo pool
from crl_envs import study, tasks
from crl_envs.study.cells import CellContext, run_cell
from crl_envs.study.scheduler import cell_path
from crl_envs.study.stats import valuation_tables
from crl_envs.valuation.game import CoalitionGame
from crl_kit.safe_io import atomic_write_json

DOCS = Path(__file__).resolve().parents[1] / "docs"
RESULTS = sorted(DOCS.rglob("*.json"))

pytestmark = pytest.mark.slow


def test_every_result_file_is_checked_here():
    known = {"valuation_debate_zoo.json", "study.json", "cost_interactions_zoo4.json",
             "multi_learner.json",  # checked in tests/test_multi_learner_figures.py
             "levels.json",  # checked in tests/test_levels.py
             "pools16.json",  # checked in tests/test_pools16.py
             "paper-cpu-probe.json",  # checked in tests/test_paper_cpu.py (the rule replayed, one setting re-played)
             "paper-cpu2-probe.json",  # likewise (with its margin)
             "paper-cpu/study.json",  # checked in tests/test_paper_cpu.py (re-derived from the committed cells)
             "paper-cpu-pilot/study.json",  # likewise
             "paper-cpu2/study.json"}  # likewise
    assert {p.relative_to(DOCS).as_posix() for p in RESULTS} <= known, f"a new docs/*.json needs a check here: {[p.name for p in RESULTS]}"
    assert RESULTS


def test_valuation_debate_zoo_individual_and_system_runs():
    """README's main job (crl-envs value --protocol debate --task arith --pool zoo): each model alone, and v(N)."""
    d = json.loads((DOCS / "valuation_debate_zoo.json").read_text())
    task = tasks.load("arith", n=len(d["example_ids"]), seed=d["seed"])
    assert [e.id for e in task.examples] == d["example_ids"]
    pool = agents.pool("zoo")
    assert pool.names == d["names"]
    sampling = agents.SamplingParams(temperature=0.0, max_new_tokens=256)
    torch.set_num_threads(1)
    alone = CoalitionGame("vote", pool, task, sampling=sampling, seed=d["seed"], cache_dir=False, progress=False)
    individual = np.stack([alone.value(1 << i) for i in range(len(pool))])
    np.testing.assert_array_equal(individual, np.asarray(d["measures"]["individual"]["per_question"]))
    debate = CoalitionGame("debate", pool, task, sampling=sampling, seed=d["seed"], cache_dir=False, progress=False)
    np.testing.assert_array_equal(debate.value((1 << len(pool)) - 1), np.asarray(d["system"]))


def _without_seconds(summary: dict) -> dict:
    """A pool's summary less its seconds (measured wall time, never compared)."""
    front = {k: ({c: x for c, x in v.items() if c != "seconds"} if isinstance(v, dict) else v)
             for k, v in summary["front"].items()}
    return {**summary, "front": front}


def test_cost_interactions_zoo4_pools():
    """docs/cost_interactions_zoo4.json (benchmarks/cost_interactions_zoo4.py): zoo4-clones and
    zoo4-specialists under vote, every coalition's value and tokens, the fronts and the pairwise SII."""
    import sys

    sys.path.insert(0, str(DOCS.parent))
    from benchmarks.cost_interactions_zoo4 import POOLS, measure, summary

    d = json.loads((DOCS / "cost_interactions_zoo4.json").read_text())
    assert list(d["pools"]) == list(POOLS)
    for name in POOLS:
        got = json.loads(json.dumps(summary(*measure(name, d["questions"], d["seed"]))))
        assert _without_seconds(got) == _without_seconds(d["pools"][name]), name


def _cheapest(planned, committed, kind):
    cells = [c for c in planned if c.kind == kind]
    return min(cells, key=lambda c: (committed["cells"][c.id]["seconds"], c.id))


def test_study_cheapest_cells(tmp_path):
    """docs/study.json (studies/paper-small.toml): the cheapest valuation cell, and the cheapest training
    cell with its untrained baseline, re-run from the committed config."""
    committed = json.loads((DOCS / "study.json").read_text())
    config = study.load_config(committed["config_source"], out=tmp_path)
    planned = study.plan(config)
    assert {c.id: c.fingerprint for c in planned} == {k: v["fingerprint"] for k, v in committed["cells"].items()}

    cell = _cheapest(planned, committed, "valuation")
    result = run_cell(cell, CellContext(tmp_path))
    labels = {"pool": cell.spec.pool_label, "protocol": cell.spec.protocol_label, "task": cell.spec.task_label}
    v = config.valuation
    (fresh,) = valuation_tables([{"report": result["report"], "labels": labels}], v.alpha, delta=v.delta,
                                families=v.families, resamples=v.bootstrap_resamples)["settings"]
    (old,) = [s for s in committed["valuation"]["settings"]
              if (s["pool"], s["protocol"], s["task"], s["seed"]) == (*labels.values(), cell.spec.seed)]
    for key in ("individual", "loo", "shapley", "kendall_tau", "p_value", "min_p_value", "tau_ci", "verdict",
                "crossfit_questions", "nan_resamples", "measures", "system"):
        assert fresh[key] == old[key], key

    train = _cheapest(planned, committed, "training")
    (base,) = [c for c in planned if c.kind == "baseline" and c.spec.setup_label == train.spec.setup_label
               and c.spec.task_label == train.spec.task_label]
    # the training cell's rate comes from the learning-rate sweep cells it names: re-run them first, and
    # require the committed sweep figures
    sweeps = [c for c in planned if c.kind == "lr_sweep"
              and c.fingerprint in train.spec.learning_rate["sweep"].values()]
    assert len(sweeps) == len(train.spec.learning_rate["sweep"])
    committed_sweep = committed["training"]["lr_sweep"]["settings"][
        f"{train.spec.setup_label}/{train.spec.task_label}"]["sweep"]
    for c in sweeps:
        r = run_cell(c, CellContext(tmp_path))
        atomic_write_json(cell_path(tmp_path, c), r)
        old_sweep = committed_sweep[str(c.spec.learning_rate)]
        assert (r["before"], r["after"]) == (old_sweep["before"], old_sweep["after"]), c.id
    out = {}
    for c in (base, train):
        out[c.kind] = run_cell(c, CellContext(tmp_path))
    delta = float(np.mean(np.asarray(out["training"]["system"]) - np.asarray(out["baseline"]["system"])))
    (setting,) = [s for s in committed["training"]["settings"]
                  if (s["protocol"], s["task"]) == (train.spec.setup_label, train.spec.task_label)]
    assert np.mean(out["baseline"]["system"]) == setting["before"]
    assert delta == setting["delta"][train.spec.trainer]["per_seed"][setting["seeds"].index(train.spec.seed)]
    alone = setting["learner_alone"]  # the learner's own accuracy, before and after
    assert np.mean(out["baseline"]["standalone"]) == alone["before"]
    assert np.mean(out["training"]["standalone"]) == \
        alone["after"][train.spec.trainer][setting["seeds"].index(train.spec.seed)]


def test_study_verdicts_follow_from_the_committed_numbers():
    """docs/study.json's valuation: every setting carries a verdict and its smallest attainable p, the
    verdicts follow from the numbers beside them by crl_envs.stats.verdict, the counts count them (an
    untestable setting is never counted as uncorrelated), and study.md prints them, not the old headline."""
    from collections import Counter

    from crl_envs import stats

    committed = json.loads((DOCS / "study.json").read_text())
    v = committed["valuation"]
    alpha, delta = v["summary"]["alpha"], v["summary"]["delta"]
    for s in v["settings"]:
        assert s["verdict"] in stats.VERDICTS and s["min_p_value"] >= stats.min_p_value(s["n"]) - 1e-15
        ci = None if s["tau_ci"] is None else tuple(s["tau_ci"])
        assert s["verdict"] == stats.verdict(s["kendall_tau"], s["p_value"], s["min_p_value"], ci, alpha=alpha,
                                             delta=delta, questions=s.get("crossfit_questions"))
        if s["min_p_value"] > alpha or min(s.get("crossfit_questions") or [math.inf]) < stats.MIN_QUESTIONS_PER_HALF:
            assert s["verdict"] == "untestable"
    counts = v["summary"]["counts"]  # a study.json from before 'heterogeneous' has no such key
    assert set(counts) <= set(stats.VERDICTS)
    assert {k: counts.get(k, 0) for k in stats.VERDICTS} == {k: Counter(s["verdict"] for s in v["settings"])[k]
                                                             for k in stats.VERDICTS}
    assert "uncorrelated" not in v["summary"]
    for c in v["summary"]["pool_families"]:
        ci = None if c["tau_ci"] is None else tuple(c["tau_ci"])
        assert c["verdict"] == stats.verdict(c["kendall_tau"], c["p_value"], c["min_p_value"], ci, alpha=alpha,
                                             delta=delta,
                                             heterogeneous=c.get("heterogeneity", {}).get("heterogeneous", False))
    md = (DOCS / "study.md").read_text()
    assert "does not predict" not in md and "What this design can and cannot show" in md


def test_study_md_prints_no_degenerate_interval():
    """#53: no interval in docs/study.md excludes its estimate or has zero width unless printed undefined."""
    sys.path.insert(0, str(DOCS.parent / "tests"))
    from test_inference_calibration import interval_problems

    assert interval_problems((DOCS / "study.md").read_text()) == []
