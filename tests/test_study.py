"""The study layer: config validation before any work, a scripted study whose statistics the test
recomputes on its own, resume after a SIGKILL mid-cell, reruns of exactly the changed cells, the same
numbers on every executor, and the presets validated and dry-run."""

from __future__ import annotations

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
from crl_envs import run_episodes, study, tasks
from crl_envs import stats as crl_stats
from crl_envs.study import StudyConfigError, load_config
from crl_envs.study.stats import training_tables

REPO = Path(__file__).resolve().parents[1]


def scripted_config(out: Path, **changes) -> dict:
    config = {
        "study": {"name": "scripted", "out": str(out)},
        "pools": {"four": [{"expert": 0.85}, {"expert": 0.6}, {"expert": 0.45}, {"expert": 0.7}],
                  "three": [{"expert": 0.8, "seed": 1}, {"expert": 0.5, "seed": 1}, {"expert": 0.65, "seed": 1}]},
        "tasks": {"arith": {"n": 60, "seed": 2}},
        "protocols": {"vote": {}, "debate": {"options": {"rounds": 2}}, "cascade": {}},
        "valuation": {"alpha": 0.05, "bootstrap_resamples": 200},
    }
    for key, value in changes.items():
        config[key] = value
    return config


# ---------------------------------------------------------------------- validation
BAD = [
    ({"pools": {"p": "zooo"}}, r"pools\.p: unknown named pool 'zooo' \(did you mean 'zoo'\?\)"),
    ({"pools": {"p": ["zo:zoo-small"]}}, r"pools\.p\[0\]: unknown agent backend 'zo' \(did you mean 'zoo'\?\)"),
    ({"pools": {"p": [{"expert": 1.5}]}}, r"pools\.p\[0\]\.expert: must be a number in \[0, 1\]"),
    ({"tasks": {"arith": {"n": 0}}}, r"tasks\.arith\.n: must be an int >= 1"),
    ({"tasks": {"arith": {"name": "arithm"}}}, r"tasks\.arith\.name: unknown task 'arithm' \(did you mean 'arith'\?\)"),
    ({"tasks": {"arith": {"options": {"digit": 2}}}}, r"tasks\.arith\.options\.digit: unknown key \(did you mean 'digits'\?\)"),
    ({"protocols": {"debate": {"options": {"round": 2}}}}, r"protocols\.debate\.options: .*did you mean 'rounds'"),
    ({"protocols": {"debat": {}}}, r"protocols\.debat\.protocol: unknown protocol 'debat' \(did you mean 'debate'\?\)"),
    ({"valuation": {"estimator": "exakt"}}, r"valuation\.estimator: unknown estimator 'exakt' \(did you mean 'exact'\?\)"),
    ({"valuation": {"estimator": "permutation"}}, r"valuation\.budget: .*need budget = <permutations>"),
    ({"valuation": {"pools": ["fuor"]}}, r"valuation\.pools: unknown pool 'fuor' \(did you mean 'four'\?\)"),
    ({"valuation": {"alpha": 5}}, r"valuation\.alpha: must be a number in \[0, 1\]"),
    ({"valuation": {"seed": [0]}}, r"valuation\.seed: unknown key \(did you mean 'seeds'\?\)"),
    ({"valuation": {"delta": 0}}, r"valuation\.delta: must lie strictly between 0 and 1 \(e\.g\. 0\.3\)"),
    ({"valuation": {"families": {"api": ["cascade"]}}},
     r"valuation\.families: protocols \['vote', 'debate'\] are in no family; add them"),
    ({"valuation": {"families": {"api": ["casade"]}}}, r"valuation\.families\.api: 'casade' is neither a valued protocol"),
    ({"valuation": {"families": {"a": ["cascade"], "b": ["cascade", "aggregation", "text exchange"]}}},
     r"valuation\.families\.b: protocol 'cascade' is already in family 'a'"),
    ({"valuation": {"pool_tasks": {"fuor": ["arith"]}}}, r"valuation\.pool_tasks\.fuor: is not a valued pool"),
    ({"executor": {"kind": "rey"}}, r"executor\.kind: unknown executor 'rey' \(did you mean 'ray'\?\)"),
    ({"executor": {"kind": "ray", "address": "http://head:6379"}}, r"executor\.address: malformed Ray address"),
    ({"executor": {"coalitions_per_task": 0}}, r"executor\.coalitions_per_task: must be an int >= 1"),
    ({"training": {"pool": "four", "learner": "model_0", "trainers": ["crl", "gpro"], "setups": {"vote": {}}}},
     r"training\.trainers: unknown trainer 'gpro' \(did you mean 'grpo'\?\)"),
    ({"training": {"pool": "four", "learner": "rookie", "setups": {"vote": {}}}}, r"training\.learner: must be a pool agent id"),
    ({"samplng": {}}, r"samplng: unknown key \(did you mean 'sampling'\?\)"),
    ({"pools": {"zoo": "zoo"}, "training": {"pool": "zoo", "learner": "model_4", "setups": {"vote": {"tasks": ["arihm"]}}}},
     r"training\.setups\.vote\.tasks: unknown training task 'arihm' \(did you mean 'arith'\?\)"),
]


@pytest.mark.parametrize("change, message", BAD, ids=[m.split(":")[0].replace("\\", "") for _, m in BAD])
def test_bad_config_rejected_before_any_work(change, message, tmp_path):
    config = scripted_config(tmp_path / "out")
    for section, value in change.items():
        if isinstance(value, dict) and isinstance(config.get(section), dict) and section != "pools":
            config[section] = {**config[section], **value}
        else:
            config[section] = value
    with pytest.raises(StudyConfigError, match=f"^study config: {message}") as e:
        study.run(config, progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing was written


def test_a_setup_trains_on_its_own_tasks_and_the_settings_are_setups_x_their_tasks(tmp_path):
    """``[training.setups.<label>] tasks``: the probe chooses (setup, task) pairs, so a preset trains exactly those
    and not the cross product; a setup without ``tasks`` trains on every training task (ids unchanged)."""
    from crl_envs.study.cells.setting import training_settings

    raw = scripted_config(tmp_path / "out", tasks={"arith": {"n": 60, "seed": 2}, "add": {
        "name": "arith", "n": 60, "seed": 2, "options": {"digits": 2, "operations": ["+"]}}})
    raw["pools"] = {"zoo": "zoo"}
    raw["valuation"] = {"pools": ["zoo"], "protocols": ["vote"]}
    raw["training"] = {"pool": "zoo", "learner": "model_4", "trainers": ["crl", "placebo"], "seeds": [0],
                       "setups": {"vote": {}, "debate": {"tasks": ["add"]}}}
    config = load_config(raw)
    assert [(s.label, s.task) for s in training_settings(config)] == [("vote", "arith"), ("vote", "add"),
                                                                       ("debate", "add")]
    ids = [c.id for c in study.plan(config) if c.kind == "training"]
    assert len(ids) == 3 * 2 and not any(i.startswith("training/debate/arith/") for i in ids)
    raw["training"]["tasks"] = ["arith"]  # a setup's task must be one the training trains on
    with pytest.raises(StudyConfigError, match=r"^study config: training\.setups\.debate\.tasks: unknown training "
                                               r"task 'add'; defined training tasks: arith$"):
        load_config(raw)


def test_cli_bad_config_is_one_line_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[pools]\nzoo = "zooo"\n[tasks.arith]\n[protocols.vote]\n')
    proc = subprocess.run([sys.executable, "-m", "crl_envs.commands", "study", str(path), "--dry-run"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    import agents

    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "crl-envs study: error: study config: pools.zoo: unknown named pool 'zooo' (did you mean 'zoo'?); named pools: "
        f"{', '.join(agents.pool_names())}, or give a list of agent specs such as [\"zoo:zoo-small\", "
        "\"hf:path/to/model\"]"]


# ---------------------------------------------------------------------- a scripted study, checked independently
def shapley_by_hand(protocol: str, pool, task, options: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Individual, LOO and exact Shapley means, from the runner and the textbook formulas."""
    ids = pool.ids
    n = len(ids)
    v = {frozenset(): 0.0}
    for k in range(1, n + 1):
        for members in itertools.combinations(ids, k):
            eps = run_episodes(protocol, pool, task, coalition=list(members), options=options, progress=False,
                               sampling=agents.SamplingParams(temperature=0.0, max_new_tokens=256))
            v[frozenset(members)] = float(np.mean([e.score for e in eps]))
    alone = np.array([np.mean([e.score for e in run_episodes("vote", pool, task, coalition=[a], progress=False)])
                      for a in ids])
    full = frozenset(ids)
    loo = np.array([v[full] - v[full - {a}] for a in ids])
    shapley = np.zeros(n)
    for i, a in enumerate(ids):
        for k in range(n):
            for s in itertools.combinations([b for b in ids if b != a], k):
                w = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                shapley[i] += w * (v[frozenset(s) | {a}] - v[frozenset(s)])
    return alone, loo, shapley


def test_scripted_study_statistics_recomputed_independently(tmp_path):
    config = load_config(scripted_config(tmp_path / "out"))
    result = study.run(config, progress=False)
    settings = result["valuation"]["settings"]
    assert len(settings) == 2 * 3
    families = {"vote": "aggregation", "debate": "text exchange", "cascade": "cascade"}
    alpha = result["valuation"]["summary"]["alpha"]
    counts, per_family = dict.fromkeys(crl_stats.VERDICTS, 0), {}
    for s in settings:
        assert s["family"] == families[s["protocol"]]
        pool = agents.pool([agents.ScriptedAgent.expert(f"expert-{m['expert']}", m["expert"], seed=m.get("seed", 0))
                            for m in config.pools[s["pool"]].members])
        task = tasks.load("arith", n=60, seed=2)
        alone, loo, shapley = shapley_by_hand(s["protocol"], pool, task, config.protocols[s["protocol"]].options)
        names = pool.names
        np.testing.assert_allclose([s["individual"][m] for m in names], alone, atol=1e-12)
        np.testing.assert_allclose([s["loo"][m] for m in names], loo, atol=1e-12)
        np.testing.assert_allclose([s["shapley"][m] for m in names], shapley, atol=1e-12)
        assert len(set(alone)) == len(alone) and len(set(np.round(shapley, 12))) == len(shapley)  # no ties: scipy's exact p
        tau = stats.kendalltau(alone, shapley, method="exact")
        same = s["measures"]["shapley"]["same_questions"]  # the paper's tau, beside the cross-fit verdict
        assert same["kendall_tau"] == pytest.approx(tau.statistic) and same["p_value"] == pytest.approx(tau.pvalue)
        # 3 and 4 models: the exact test's floor 2/n! is above alpha, whatever the data
        # (the cross-fit halves may hold ties, which raise the floor further)
        assert s["min_p_value"] >= 2 / math.factorial(len(names)) - 1e-12 and s["min_p_value"] > alpha
        assert s["verdict"] == "untestable" and s["n"] == len(names)
        counts[s["verdict"]] += 1
        per_family[s["family"]] = per_family.get(s["family"], 0) + 1
        minus = stats.kendalltau(alone, shapley - alone / len(names)).statistic
        ms = s["measures"]
        assert ms["shapley_minus_singleton"]["same_questions"]["kendall_tau"] == pytest.approx(minus)
        assert ms["loo"]["same_questions"]["kendall_tau"] == pytest.approx(stats.kendalltau(alone, loo).statistic)
        agree = stats.kendalltau(loo, shapley).statistic
        if not math.isnan(agree):
            assert s["loo_vs_shapley"]["kendall_tau"] == pytest.approx(agree)
        assert s["loo_vs_shapley"]["mean_abs_error"] == pytest.approx(np.abs(loo - shapley).mean())
    summary = result["valuation"]["summary"]
    assert summary["counts"] == counts and summary["settings"] == 6 and "uncorrelated" not in summary
    assert {f: c["settings"] for f, c in summary["families"].items()} == per_family
    # a (pool, family) unit of one pool keeps the pool's floor: untestable too
    assert {c["verdict"] for c in summary["pool_families"]} == {"untestable"}
    on_disk = json.loads((tmp_path / "out" / "study.json").read_text())
    assert on_disk["valuation"] == result["valuation"]
    md = (tmp_path / "out" / "study.md").read_text()
    assert "does not predict" not in md and "0 coupled, 0 decoupled, 0 inconclusive, 6 untestable" in md
    assert "What this design can and cannot show" in md
    assert (tmp_path / "out" / "study_valuation_heatmap.png").stat().st_size > 10_000


def test_rerun_is_free_and_a_changed_config_reruns_exactly_its_cells(tmp_path):
    out = tmp_path / "out"
    first = study.run(scripted_config(out), progress=False)
    assert first["run"]["executed"] == 6
    again = study.run(scripted_config(out), progress=False)
    assert (again["run"]["executed"], again["run"]["cached"]) == (0, 6)
    assert again["valuation"] == first["valuation"]
    changed = scripted_config(out, protocols={"vote": {}, "debate": {"options": {"rounds": 3}}, "cascade": {}})
    third = study.run(changed, progress=False)
    assert third["run"]["executed"] == 2  # the two debate cells, nothing else
    log = sorted(p.name for p in (out / "logs").glob("*debate*"))
    assert log == ["valuation__four__debate__arith__seed0.log", "valuation__three__debate__arith__seed0.log"]
    assert (out / "logs" / log[0]).read_text().count("start ") == 2  # rounds=2, then rounds=3
    # --report: the tables of what has finished, the rest listed as missing
    cell = next(c for c in study.plan(changed) if c.id == "valuation/three/cascade/arith/seed0")
    (out / "cells" / f"{cell.fingerprint}.json").unlink()
    partial = study.report(changed)
    assert partial["run"]["missing"] == [cell.id] and len(partial["valuation"]["settings"]) == 5
    assert "**Incomplete**: 1 of 6 cells" in (out / "study.md").read_text()


def test_dry_run_counts_runs_calls_and_shared_coalitions(tmp_path):
    config = load_config(scripted_config(tmp_path / "out", protocols={"vote": {}, "debate": {"options": {"rounds": 2}}}))
    planned = {c.id: c for c in study.plan(config)}
    # "four" first: vote plays its 4 singles (the models alone; its other coalitions are computed from their
    # answers); debate 15 + the same singles
    four_vote = planned["valuation/four/vote/arith/seed0"].cost
    four_debate = planned["valuation/four/debate/arith/seed0"].cost
    assert (four_vote["runs"], four_debate["runs"]) == (4, 15)
    assert four_vote["calls"] == 60 * 4  # each model once per question
    # debate with 2 rounds: each member answers twice; sum over coalitions of 2|S| calls per question
    assert four_debate["calls"] == 60 * sum(2 * bin(m).count("1") for m in range(1, 16))
    assert four_debate["tokens"] == four_debate["calls"] * 256
    text = study.describe_plan(config, list(planned.values()))
    assert "| valuation | 4 | 0 | 29 coalition runs |" in text  # 4 + 15 + 3 + 7: vote's coalitions come from its 4 solo runs
    assert "| four | 4 | 60 | 2 | 0.0833 | 0.00 (untestable: 4 models never give p <= 0.05 (smallest p 0.0833)) |" \
        in text and "4 setting(s) can never reject" in text
    assert not (tmp_path / "out").exists()


def test_dry_run_counts_a_request_once_across_cells_sharing_the_memo(tmp_path):
    """With the local executor one request memo serves every valuation cell of a pool: the cascade cell
    counts only what the vote cell before it did not generate (its members' first answers are the
    models' answers alone). On processes each cell is counted on its own."""
    import agents.zoo
    from crl_envs.valuation.cost import distinct_calls

    def calls(kind: str) -> list[float]:
        config = {"pools": {"zoo": "zoo"}, "tasks": {"arith": {"n": 10}}, "protocols": {"vote": {}, "cascade": {}},
                  "study": {"out": str(tmp_path / kind)}, "executor": {"kind": kind, "workers": 2}}
        if kind == "local":
            del config["executor"]["workers"]
        return [c.cost["calls"] for c in study.plan(load_config(config)) if c.kind == "valuation"]

    (vote, cascade), (vote_alone, cascade_alone) = calls("local"), calls("processes")
    assert vote == vote_alone == 5 * 10  # each model once per question
    assert cascade_alone - cascade == 5 * 10  # the five models' answers, already made by the vote cell
    every = [(p, {}, m) for p in ("vote", "cascade") for m in range(1, 32)]
    assert vote + cascade == pytest.approx(distinct_calls(every, agents.zoo.NAMES, 10))
    assert not (tmp_path / "local").exists()


def test_every_request_bound_counts_votes_models_alone_once(tmp_path):
    """``distinct=False`` (the dry run's upper bound without stand-ins) counts every request of a cell: for
    vote, whose one-member coalitions are the models alone, each model once per question, not twice (it
    counted 2n for n models); debate still adds the models alone to its own coalitions."""
    from crl_envs.study.plan import estimate

    config = load_config(scripted_config(tmp_path / "out", protocols={"vote": {}, "debate": {"options": {"rounds": 2}}}))
    bound = {c.id: c.cost for c in estimate(config, study.cells(config), distinct=False)}
    vote, debate = bound["valuation/four/vote/arith/seed0"], bound["valuation/four/debate/arith/seed0"]
    assert (vote["runs"], vote["calls"]) == (4, 60 * 4)
    assert debate["runs"] == 15 + 4
    assert debate["calls"] == 60 * (sum(2 * bin(m).count("1") for m in range(1, 16)) + 4)


def test_training_statistics_recomputed_independently():
    """Δ per trainer and seed, the learner's own accuracy, wins/ties/losses of C-RL against each baseline
    (ties stay ties) and the mean gains, recomputed here (tests/test_study_training_verdicts.py checks
    the tests and CIs)."""
    rng = np.random.default_rng(4)
    q, trainers_ = 40, ["crl", "grpo", "loo_reward", "placebo"]
    baselines, runs = {}, {}
    lift = {("judge", "arith"): {"crl": 0.3, "grpo": 0.05, "loo_reward": 0.3, "placebo": 0.04},
            ("vote", "arith"): {"crl": 0.1, "grpo": 0.05, "loo_reward": 0.15, "placebo": 0.04},
            ("debate", "arith"): {"crl": 0.02, "grpo": -0.02, "loo_reward": 0.0, "placebo": 0.04}}
    for key, by_trainer in lift.items():
        before = (rng.random(q) < 0.5).astype(float)
        alone = (rng.random(q) < 0.3).astype(float)
        baselines[key] = {"system": before.tolist(), "standalone": alone.tolist()}

        def after(t, p, before=before, alone=alone):  # GRPO keeps the learner (else the gates refuse the setting)
            system, dropped = np.where(rng.random(q) < p, 1.0, before), np.where(rng.random(q) < 0.1, 0.0, alone)
            return {"system": system.tolist(), "standalone": (alone if t == "grpo" else dropped).tolist()}

        runs[key] = {t: {s: after(t, p) for s in (0, 1)} for t, p in by_trainer.items()}
    runs[("judge", "arith")]["loo_reward"] = runs[("judge", "arith")]["crl"]  # the same outcomes: a tie
    out = training_tables(baselines, runs, trainers_, resamples=500)
    deltas = {}
    for st in out["settings"]:
        key = (st["protocol"], st["task"])
        before = np.asarray(baselines[key]["system"])
        d = {t: np.mean([np.mean(np.asarray(runs[key][t][s]["system"]) - before) for s in (0, 1)]) for t in trainers_}
        deltas[key] = d
        for t in trainers_:
            assert st["delta"][t]["value"] == pytest.approx(d[t])
            lo, hi = st["delta"][t]["ci"]
            assert lo <= d[t] <= hi
            assert st["learner_alone"]["after"][t] == [np.mean(runs[key][t][s]["standalone"]) for s in (0, 1)]
        assert st["strongest"] == [t for t in trainers_ if d[t] == pytest.approx(max(d.values()))]
    s = out["summary"]
    assert s["settings"] == 3 and s["seeds"] == [2]
    for b in ("grpo", "loo_reward"):
        diffs = [d["crl"] - d[b] for d in deltas.values()]
        c = s["crl_vs"][b]
        assert (c["wins"], c["ties"], c["losses"]) == (sum(x > 1e-12 for x in diffs), sum(abs(x) <= 1e-12 for x in diffs),
                                                       sum(x < -1e-12 for x in diffs))
    assert s["crl_vs"]["loo_reward"]["ties"] >= 1 and out["settings"][0]["tie"]  # judge: identical outcomes
    mean = {t: np.mean([d[t] for d in deltas.values()]) for t in trainers_}
    for t in trainers_:
        assert s["mean_gain"][t] == pytest.approx(mean[t])
    for b in ("grpo", "loo_reward"):  # a ratio only where the denominator's CI lies above 0, else the difference
        r = s["crl_vs"][b]["ratio"]
        assert r["difference"]["value"] == pytest.approx(mean["crl"] - mean[b])
        assert r["value"] is None or r["value"] == pytest.approx(mean["crl"] / mean[b])
    best = max(d[t] for d in deltas.values() for t in trainers_)
    assert s["largest_gain"]["value"] == pytest.approx(best)
    assert [(b["trainer"], b["protocol"]) for b in s["largest_gain"]["by"]] == \
        [(t, k[0]) for k, d in deltas.items() for t in trainers_ if d[t] == pytest.approx(best)]


# ---------------------------------------------------------------------- resume after a kill mid-cell
KILL_SCRIPT = textwrap.dedent('''
    import os, sys, time
    import agents
    from agents import ScriptedAgent
    from agents.pool import register_pool
    from crl_envs import study

    class Slow(ScriptedAgent):
        """An expert that sleeps per batch when SLOW is set (its fingerprint does not depend on it)."""
        def __init__(self, name, accuracy):
            inner = ScriptedAgent.expert(name, accuracy)
            super().__init__(name, lambda ex, msgs: "")
            self.inner, self._fingerprint = inner, "slow-" + inner.fingerprint
        def _generate(self, requests):
            time.sleep(float(os.environ.get("SLOW", "0")))
            return self.inner._generate(requests)

    register_pool("slow", lambda: [Slow(f"s{a}", a) for a in (0.9, 0.7, 0.5, 0.3)])
    # one coalition per lockstep group, so coalitions finish one by one and the kill lands between two
    # of them (a whole game in one group would write every coalition at once)
    CONFIG = {"pools": {"slow": "slow"}, "tasks": {"arith": {"n": 15, "seed": 4}},
              "protocols": {"debate": {}}, "valuation": {"bootstrap_resamples": 100},
              "executor": {"coalitions_per_task": 1}}

    if __name__ == "__main__":
        study.run({**CONFIG, "study": {"name": "kill", "out": sys.argv[1]}}, progress=False)
''')


def test_resume_after_sigkill_mid_cell(tmp_path):
    script = tmp_path / "kill_script.py"
    script.write_text(KILL_SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "SLOW": "0.15", "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    proc = subprocess.Popen([sys.executable, str(script), str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)

    def coalitions() -> list[Path]:
        return list((out / "coalitions").glob("*/*.json"))

    deadline = time.monotonic() + 180
    while len(coalitions()) < 4 + 3 and time.monotonic() < deadline:  # 4 models alone, then >= 3 coalitions
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(coalitions())
    assert 7 <= done < 4 + 15 and not list((out / "cells").glob("*.json")), "the kill must land mid-cell"

    subprocess.run([sys.executable, str(script), str(out)], env={**env, "SLOW": "0"}, check=True, timeout=300)
    (cell,) = (out / "cells").glob("*.json")
    report = json.loads(cell.read_text())["report"]
    assert report["system_evaluations"] + report["individual_evaluations"] == 4 + 15 - done  # only the rest
    resumed = json.loads((out / "study.json").read_text())

    clean = tmp_path / "clean"
    subprocess.run([sys.executable, str(script), str(clean)], env={**env, "SLOW": "0"}, check=True, timeout=300)
    uninterrupted = json.loads((clean / "study.json").read_text())
    assert resumed["valuation"] == uninterrupted["valuation"]


# ---------------------------------------------------------------------- executors
TRAINING = {"pool": "zoo", "learner": "model_4", "trainers": ["crl", "grpo"], "seeds": [0], "questions_per_step": 2,
            "num_generations": 2, "n_train": 16, "n_eval": 12,
            "setups": {"vote": {"steps": 2, "learning_rate": 1e-3}}, "bootstrap_resamples": 200}


@pytest.mark.parametrize("kind, extra, default", [("local", {}, None), ("processes", {"workers": 2}, 1)])
def test_executor_coalitions_per_task_reaches_the_executor(kind, extra, default, tmp_path):
    from crl_envs.study.runner import make_executor

    def built(**per_task):
        config = scripted_config(tmp_path / "out", executor={"kind": kind, **extra, **per_task})
        return make_executor(load_config(config)).coalitions_per_task

    assert (built(), built(coalitions_per_task=3)) == (default, 3)


def executor_config(out: Path, executor: dict) -> dict:
    return scripted_config(out, executor=executor, pools={**scripted_config(out)["pools"], "zoo": "zoo"},
                           valuation={"pools": ["four", "three"], "bootstrap_resamples": 200},
                           tasks={"arith": {"n": 20, "seed": 2, "max_new_tokens": 12,
                                            "options": {"digits": 2, "operations": ["+", "-"]}}},
                           training=TRAINING)


@pytest.mark.slow
def test_same_numbers_local_processes_and_ray(tmp_path):
    """The same study (scripted valuation, zoo training) on each executor: identical tables."""
    pytest.importorskip("ray")
    import ray

    local = study.run(executor_config(tmp_path / "local", {"kind": "local"}), progress=False)
    processes = study.run(executor_config(tmp_path / "processes", {"kind": "processes", "workers": 2}), progress=False)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = study.run(executor_config(tmp_path / "ray", {"kind": "ray"}), progress=False)
    finally:
        ray.shutdown()
    for other in (processes, remote):
        assert other["valuation"] == local["valuation"]
        assert other["training"] == local["training"]
    assert local["training"]["settings"][0]["delta"]["crl"]["per_seed"]  # a real training cell ran


# ---------------------------------------------------------------------- presets
@pytest.mark.parametrize("preset", ["paper-small", "paper"])
def test_presets_validate_and_dry_run(preset, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "crl_envs.commands", "study", str(REPO / "studies" / f"{preset}.toml"),
                           "--dry-run", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"study {preset}:" in proc.stdout and "| training |" in proc.stdout and "| valuation |" in proc.stdout
    assert not (tmp_path / "out").exists()
    # the valuation pools can answer: 8 models each, no setting the exact test could never reject
    from crl_envs.study.plan import design

    d = design(load_config(REPO / "studies" / f"{preset}.toml", out=tmp_path / "out"))
    assert d["untestable_settings"] == 0 and min(p["n"] for p in d["pools"]) >= 8
    assert "What this design can and cannot show" in proc.stdout and "coupled at tau 0.5: graded" in proc.stdout
    assert "Training: power " in proc.stdout and "Monte Carlo SE" in proc.stdout


def test_every_protocol_declares_its_family_in_class_and_docstring():
    import inspect
    import re

    from crl_envs import protocols

    seen = set()
    for name in (*protocols.PROTOCOLS, *protocols.MODEL_LEVEL_PROTOCOLS):  # the logit and weight levels too
        factory = protocols.get(name)
        family = protocols.family(name)
        assert family in protocols.FAMILIES
        doc = inspect.getmodule(factory).__doc__
        (stated,) = re.findall(r"^\| Family \| ([a-z ]+) \(MoCo's (?:API|text|logit|weight) level\) \|$", doc, re.M)
        assert stated == family == protocols.env_class(factory).FAMILY, name
        seen.add(family)
    assert seen == set(protocols.FAMILIES)  # every family has a protocol
    with pytest.raises(ValueError, match="declares no method family"):
        protocols.family(lambda pool, task: None)


def test_option_reference_in_the_docs_is_generated_from_the_declarations():
    """docs/studies.md's option tables are ``option_reference()``'s text, generated from the config dataclasses'
    declarations: a new or changed option that the page does not show fails here (#52)."""
    from crl_envs.study.config import option_reference

    page = (Path(__file__).resolve().parents[1] / "docs" / "studies.md").read_text()
    shown = page.split("<!-- options: generated by crl_envs.study.config.option_reference() -->\n")[1]
    assert shown.split("<!-- end options -->")[0] == option_reference()


def test_the_loader_reads_each_option_by_its_declaration():
    """What a config leaves out is the declared default, what it gives is checked by the declared bounds, and a
    key nobody declared is refused with the declared keys listed: the one loader reads the declarations."""
    from dataclasses import fields

    from crl_envs.study.config import Option, ValuationConfig, options_of

    raw = {"pools": {"p": [{"expert": 0.8}, {"expert": 0.5}]}, "tasks": {"arith": {"n": 5}}, "protocols": {"vote": {}}}
    v = load_config(raw).valuation
    declared = options_of(ValuationConfig)
    assert list(declared) == [f.name for f in fields(ValuationConfig)]  # every field of [valuation] is an option
    for name in ("samples", "seeds", "alpha", "ci_level", "bootstrap_resamples", "delta", "estimator", "budget"):
        assert getattr(v, name) == declared[name].default_value(), name
    alpha: Option = declared["alpha"]
    with pytest.raises(StudyConfigError, match=r"^study config: valuation\.alpha: must lie strictly between 0 and 1 "
                                               r"\(e\.g\. 0\.05\), got 1\.0$"):
        load_config({**raw, "valuation": {"alpha": alpha.high}})
    with pytest.raises(StudyConfigError, match=r"valuation\.samplse: unknown key \(did you mean 'samples'\?\); "
                                               "valid keys: " + ", ".join(declared) + "$"):
        load_config({**raw, "valuation": {"samplse": 2}})
