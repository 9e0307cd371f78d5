"""Several learners and cross-play in a study (#34): config errors, the fingerprints of existing training
and baseline cells unchanged, the dry-run pricing crossplay cells, and a tiny zoo study whose report
gives each learner's own Δ and the cross-play gap, checked against its cells."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from crl_envs import study
from crl_envs.study import StudyConfigError, load_config
from crl_envs.study.plan import cells

DATA = Path(__file__).resolve().parent / "data"
ARITH = {"n": 6, "max_new_tokens": 24, "options": {"digits": 2, "operations": ["+", "-"]}}
TRIO = ["zoo:zoo-small", "zoo:zoo-positive", "zoo:zoo-rookie"]

#: studies/paper-small.toml's [pools], [tasks] and [training] as they were when a run of it started: its
#: baseline and training cells must keep the fingerprints in data/paper_small_training_fingerprints.json.
PAPER_SMALL = """
[pools]
zoo = "zoo"
zoo-specialists = ["zoo:zoo-nocarry", "zoo:zoo-noborrow", "zoo:zoo-small", "zoo:zoo-positive"]
zoo-trio = ["zoo:zoo-small", "zoo:zoo-positive", "zoo:zoo-rookie"]
[tasks.arith]
name = "arith"
split = "test"
n = 100
max_new_tokens = 24
options = {digits = 2, operations = ["+", "-"]}
[training]
pool = "zoo"
learner = "model_4"
tasks = ["arith"]
seeds = [0, 1, 2]
steps = 20
learning_rate = 1e-3
questions_per_step = 8
num_generations = 8
n_train = 1000
n_eval = 200
[training.setups.judge-plurality]
protocol = "judge"
options = {judge = "{learner}"}
[training.setups.vote]
[training.setups.debate]
options = {rounds = 2}
[sampling]
temperature = 0.0
max_new_tokens = 24
"""


def fingerprints(raw: dict) -> dict[str, str]:
    return {c.id: c.fingerprint for c in cells(load_config(raw)) if c.kind in ("baseline", "training")}


def test_existing_training_cells_keep_their_fingerprints():
    raw = tomllib.loads(PAPER_SMALL)
    frozen = json.loads((DATA / "paper_small_training_fingerprints.json").read_text())
    now = fingerprints(raw)  # the roster grew a placebo (#46): its cells are the only new ones
    assert {k: v for k, v in now.items() if k in frozen} == frozen
    assert sorted(set(now) - set(frozen)) == sorted(f"training/{s}/arith/placebo/seed{n}" for n in (0, 1, 2)
                                                    for s in ("judge-plurality", "vote", "debate"))
    raw["training"]["trainers"] = ["crl", "grpo", "loo_reward", "shapley_credit"]
    # several learners / a schedule / cross-play change only what they name
    raw["training"]["crossplay"] = True
    raw["training"]["trainers"] = ["crl", "loo_reward", "shapley_credit"]
    raw["training"]["setups"]["vote"] = {"learners": ["model_3", "model_4"], "schedule": "round_robin"}
    now = fingerprints(raw)
    for cell_id, fp in now.items():
        assert (fp == frozen[cell_id]) == ("/vote/" not in cell_id and "grpo" not in cell_id), cell_id
    crossplay = [c for c in cells(load_config(raw)) if c.kind == "crossplay"]
    assert len(crossplay) == 3 * 3 * 3  # one per training cell
    assert {c.spec.training_fingerprint for c in crossplay} == {fp for i, fp in now.items() if i.startswith("training/")}


def multi_config(out: Path, **training) -> dict:
    return {"study": {"name": "multi", "out": str(out)}, "pools": {"trio": TRIO}, "tasks": {"arith": ARITH},
            "training": {"pool": "trio", "tasks": ["arith"], "trainers": ["crl"], "seeds": [0], "steps": 2,
                         "questions_per_step": 2, "num_generations": 2, "n_train": 20, "n_eval": 6,
                         "bootstrap_resamples": 200, "setups": {"vote": {}}, **training}}


@pytest.mark.parametrize("training, message", [
    ({"learners": ["model_1", "model_1"]}, r"training\.learners: learners lists 'model_1' twice"),
    ({"learners": ["model_1", "model_5"]}, r"training\.learners: learner 'model_5' is not in the pool; pool agents "
                                           r"are \['model_0', 'model_1', 'model_2'\]"),
    ({"learner": "model_3"}, r"training\.learner: learner 'model_3' is not in the pool"),
    ({"learners": "model_1"}, r"training\.learners: learners must be a list of agent ids"),
    ({"learners": []}, r"training\.learners: learners=\[\] trains nobody"),
    ({"learner": "model_1", "learners": ["model_2"]}, r"training\.learners: give learner = .* not both"),
    ({"learners": ["model_1", "model_2"], "schedule": "alternate"},
     r"training\.schedule: must be one of \['joint', 'round_robin'\]"),
    ({"setups": {"vote": {"learners": ["model_1", "model_2"]}}, "trainers": ["crl", "grpo"]},
     r"training\.setups\.vote\.learners: 2 learners, but trainers \['grpo'\] train one learner each"),
    ({"setups": {"vote": {"learners": ["model_1", "model_9"]}}}, r"training\.setups\.vote\.learners: learner 'model_9'"),
    ({"pool": "mixed", "learners": ["model_0", "model_1"]},
     r"training\.learners: learner 'model_1' is a scripted agent \('expert-0\.8'\), which has no weights"),
    ({"pool": "pair", "crossplay": True},
     r"training\.crossplay: setup 'vote': learner 'model_0' has no unseen setting"),
    ({"crossplay": "yes"}, r"training\.crossplay: must be true or false"),
])
def test_bad_multi_learner_config_is_one_line(training, message, tmp_path):
    raw = multi_config(tmp_path, **training)
    raw["pools"].update(mixed=["zoo:zoo-small", {"expert": 0.8}], pair=["zoo:zoo-small", "zoo:zoo-rookie"])
    with pytest.raises(StudyConfigError, match=message) as e:
        load_config(raw)
    assert "\n" not in str(e.value) and str(e.value).startswith("study config: ")


def test_dry_run_prices_crossplay_cells(tmp_path):
    config = load_config(multi_config(tmp_path, learners=["model_1", "model_2"], crossplay=True))
    planned = study.plan(config)
    (cross,) = [c for c in planned if c.kind == "crossplay"]
    # two learners in a trio: home with both / one / neither trained, and every 2-member coalition with a
    # learner in it with both / one trained: 3 + 3 (model_0+model_1: with and without model_1 trained)
    # + 3 (model_0+model_2) + 4 (model_1+model_2: both, model_2, model_1, none) distinct settings, minus the shared
    settings = {("012", "12"), ("012", "2"), ("012", "1"), ("012", ""), ("01", "1"), ("01", ""), ("02", "2"),
                ("02", ""), ("12", "12"), ("12", "2"), ("12", "1")}
    assert cross.cost["episodes"] == len(settings) * 6
    assert cross.cost["runs"] == 0
    text = study.describe_plan(config, planned)
    assert "| crossplay | 1 | 0 |" in text and "vote: 11 settings" in text
    assert "several learners: vote: model_1, model_2 (joint)" in text


@pytest.mark.slow
def test_tiny_zoo_study_reports_each_learners_delta_and_the_crossplay_gap(tmp_path):
    raw = multi_config(tmp_path, learner="model_2", crossplay=True, learning_rate=0.05, questions_per_step=4,
                       num_generations=8, setups={"vote": {"learners": ["model_1", "model_2"]},
                                                  "vote-one": {"protocol": "vote"}})
    result = study.run(raw, progress=False)
    config = load_config(raw)
    planned = {c.id: c for c in study.plan(config)}
    cell = lambda i: json.loads((tmp_path / "cells" / f"{planned[i].fingerprint}.json").read_text())  # noqa: E731
    base, trained = cell("baseline/vote/arith"), cell("training/vote/arith/crl/seed0")
    cross = cell("crossplay/vote/arith/crl/seed0")
    by = {(s["protocol"], s["task"]): s for s in result["training"]["settings"]}
    multi, one = by[("vote", "arith")], by[("vote-one", "arith")]
    # each learner's own Δ from its cells
    for j in ("model_1", "model_2"):
        own = multi["learners_alone"][j]
        assert own["before"] == pytest.approx(np.mean(base["learners"][j]))
        assert own["delta"]["crl"]["value"] == pytest.approx(np.mean(trained["learners"][j]) - np.mean(base["learners"][j]))
    assert multi["learners_alone"]["model_1"]["delta"]["crl"]["value"] != 0  # training changed the learners
    assert "learners_alone" not in one and "learners" not in cell("training/vote-one/arith/crl/seed0")
    # cross-play played the trained policies restored from the checkpoint: its trained-with setting is the
    # training cell's own evaluation, its all-untrained one the baseline
    assert cross["settings"]["model_0+model_1+model_2 | trained: model_1, model_2"] == pytest.approx(
        np.mean(trained["system"]))
    assert cross["settings"]["model_0+model_1+model_2 | trained: none"] == pytest.approx(np.mean(base["system"]))
    # untrained policies give every gain exactly 0 (tests/test_multi_learner.py): the restored weights play
    assert any(np.any(cross["learners"][j][k]) for j in cross["learners"] for k in ("trained_with_gain", "unseen_gain"))
    gap = np.mean([np.subtract(cross["learners"][j]["trained_with_gain"], cross["learners"][j]["unseen_gain"])
                   for j in ("model_1", "model_2")])
    assert multi["crossplay"]["crl"]["gap"]["value"] == pytest.approx(gap)
    assert one["crossplay"]["crl"]["learners"].keys() == {"model_2"}
    md = (tmp_path / "study.md").read_text()
    assert "**Several learners:**" in md and "| vote | arith | crl |" in md and "| model_1 |" in md
    assert "**Cross-play:**" in md and "| vote-one | arith | crl |" in md
