"""``[training.pilot]`` (#55 item 2): the rule on planted curves, the config's one-line errors, the plan (cells
shared by a fit group, training cells keyed on the pilot's cells), studies without a pilot unchanged, and one
tiny pilot run through the real study."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crl_envs import study
from crl_envs.study.config import StudyConfigError, load_config
from crl_envs.study.gates import learner_kept
from crl_envs.study.pilot import PilotConfig, choose_pilot, pilot_curve
from crl_kit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _row(lr, adapter, steps, before, after, system):
    return {"learning_rate": lr, "adapter": adapter, "steps": steps, "before": before, "after": after, "system": system}


# ---------------------------------------------------------------------- the rule on planted curves
def test_the_rule_takes_the_fewest_steps_near_the_best_kept_system_score():
    rows = [_row(1e-4, "full", 20, 0.30, 0.31, 0.60), _row(1e-4, "full", 50, 0.30, 0.20, 0.75),  # 50: not kept
            _row(3e-5, "full", 20, 0.30, 0.30, 0.55), _row(3e-5, "full", 50, 0.30, 0.32, 0.61)]
    choice = choose_pilot(rows, margin=0.02)  # best kept 0.61; within 0.02: 1e-4@20 (0.60) and 3e-5@50
    assert (choice["steps"], choice["learning_rate"], choice["adapter"], choice["kept"]) == (20, 1e-4, "full", 3)
    tight = choose_pilot(rows, margin=0.0)  # only the best kept remains
    assert (tight["steps"], tight["learning_rate"]) == (50, 3e-5)
    loose = choose_pilot(rows, tolerance=0.1, margin=0.0)  # 1e-4@50 now counts as kept, and is best
    assert (loose["steps"], loose["learning_rate"], loose["kept"]) == (50, 1e-4, 4)


def test_ties_go_to_the_higher_score_then_the_smaller_rate_then_full_before_lora():
    same = [_row(1e-4, "lora", 20, 0.3, 0.3, 0.6), _row(1e-4, "full", 20, 0.3, 0.3, 0.6),
            _row(3e-5, "lora", 20, 0.3, 0.3, 0.6), _row(3e-5, "full", 20, 0.3, 0.3, 0.6)]
    assert (choose_pilot(same)["learning_rate"], choose_pilot(same)["adapter"]) == (3e-5, "full")
    lora_first = [_row(1e-4, "lora", 20, 0.3, 0.3, 0.6), _row(1e-4, "full", 20, 0.3, 0.3, 0.6)]
    assert choose_pilot(lora_first)["adapter"] == "full"
    higher = [_row(3e-5, "full", 20, 0.3, 0.3, 0.60), _row(1e-4, "lora", 20, 0.3, 0.3, 0.61)]
    assert choose_pilot(higher)["adapter"] == "lora"  # the same steps: the higher score wins before the rate


def test_nothing_kept_falls_back_to_the_smallest_rate_at_the_fewest_steps_and_says_so():
    fallen = [_row(lr, a, k, 0.4, 0.1, 0.9) for lr in (1e-4, 1e-5) for a in ("lora", "full") for k in (50, 20)]
    choice = choose_pilot(fallen)
    assert (choice["steps"], choice["learning_rate"], choice["adapter"], choice["kept"]) == (20, 1e-5, "full", 0)
    assert choice["reason"] == ("no (rate, adapter, steps) kept the learner's own accuracy: the smallest rate at the "
                                "fewest steps")
    with pytest.raises(ValueError, match="at least one row"):
        choose_pilot([])


def test_most_steps_kept_takes_the_most_training_the_learner_keeps_through():
    rows = [_row(1e-4, "full", 200, 0.30, 0.25, 0.9),   # the best system score, but the learner fell: not kept
            _row(1e-5, "full", 200, 0.30, 0.31, 0.5), _row(3e-5, "full", 200, 0.30, 0.30, 0.4),
            _row(3e-4, "lora", 200, 0.30, 0.32, 0.6), _row(1e-4, "full", 50, 0.30, 0.35, 0.7)]
    choice = choose_pilot(rows, select="most_steps_kept")  # 200 steps kept by 1e-5 / 3e-5 full and 3e-4 lora
    assert (choice["steps"], choice["learning_rate"], choice["adapter"], choice["kept"]) == (200, 3e-5, "full", 4)
    assert choice["reason"].startswith("the most steps whose fit kept the learner's own accuracy (0.300 -> 0.300)")
    assert choose_pilot(rows[3:], select="most_steps_kept")["adapter"] == "lora"  # 200 steps kept only by lora
    fallen = [_row(1e-4, "full", 200, 0.3, 0.1, 0.9), _row(1e-5, "full", 20, 0.3, 0.2, 0.9)]
    assert choose_pilot(fallen, select="most_steps_kept")["kept"] == 0  # the shared fallback
    with pytest.raises(ValueError, match="select must be one of"):
        choose_pilot(rows, select="largest")


def test_the_rule_reads_the_one_learner_kept_rule():
    """The pilot and the lr rule share gates.learner_kept: a fall of exactly the tolerance is kept by both."""
    assert learner_kept(0.30, 0.28, 0.02) and not learner_kept(0.30, 0.28, 0.01)
    rows = [_row(1e-4, "full", 20, 0.30, 0.28, 0.9), _row(1e-5, "full", 20, 0.30, 0.30, 0.5)]
    assert choose_pilot(rows, tolerance=0.02)["learning_rate"] == 1e-4
    assert choose_pilot(rows, tolerance=0.01)["learning_rate"] == 1e-5


def test_the_curve_is_the_mean_over_seeds_per_rate_adapter_and_checkpoint():
    def cell(lr, adapter, seed, alone, system):
        return {"learning_rate": lr, "adapter": adapter, "seed": seed,
                "before": {"alone": 0.5, "systems": {"vote": 0.6, "judge": 0.7}},
                "curve": [{"steps": k, "alone": a, "systems": {"vote": s, "judge": 0.0}}
                          for k, a, s in zip((1, 2), alone, system)]}
    results = [cell(1e-5, "full", 0, (0.4, 0.6), (0.5, 0.7)), cell(1e-5, "full", 1, (0.6, 0.8), (0.7, 0.9)),
               cell(1e-4, "lora", 0, (0.1, 0.2), (0.3, 0.4))]
    rows = pilot_curve(results, "vote")
    assert [(r["learning_rate"], r["adapter"], r["steps"], r["seeds"]) for r in rows] == [
        (1e-4, "lora", 1, 1), (1e-4, "lora", 2, 1), (1e-5, "full", 1, 2), (1e-5, "full", 2, 2)]
    assert rows[3]["after"] == pytest.approx(0.7) and rows[3]["system"] == pytest.approx(0.8)
    assert rows[3]["before"] == 0.5 and rows[3]["system_before"] == 0.6
    # several seeds: each fit's learner-alone Δ, in seed order (the spread one seed cannot show); one seed: none
    assert rows[3]["alone_deltas"] == pytest.approx([0.1, 0.3]) and rows[2]["alone_deltas"] == pytest.approx([-0.1, 0.1])
    assert "alone_deltas" not in rows[0]
    # the rule keeps a row on the mean over seeds: 1e-5 at step 1 fell on seed 0 but not on average (0.5 -> 0.5)
    assert choose_pilot(rows[2:], margin=1.0)["steps"] == 1


def test_the_report_prints_each_pilot_seeds_delta_only_when_there_are_several():
    from crl_envs.study.tables import pilot_markdown

    rule = {"trainer": "grpo", "seeds": [1000, 1001], "steps": [20], "n": 400, "split": "train", "task_seed": 2,
            "select": "fewest_steps_near_best", "tolerance": 0.0, "margin": 0.02}
    one = {**_row(1e-5, "full", 20, 0.5, 0.52, 0.6), "system_before": 0.6, "seeds": 1, "kept": True}
    two = {**one, "seeds": 2, "alone_deltas": [-0.013, 0.053]}
    single = pilot_markdown({"rule": rule, "settings": {"judge/arith": {"curve": [one], **choose_pilot([one])}}})
    several = pilot_markdown({"rule": rule, "settings": {"judge/arith": {"curve": [two], **choose_pilot([two])}}})
    assert single[4].endswith("| kept |") and single[6].endswith("| yes |")
    assert several[4].endswith("| learner alone Δ per pilot seed (points) |")
    assert several[6].endswith("| yes | -1.3 +5.3 |")


def test_the_pilot_curve_is_plotted_per_setting_with_its_choice(tmp_path):
    """One PNG per setting with a curve (none for a setting whose pilot has not finished a fit)."""
    import matplotlib.image

    from crl_envs.study.tables import plots

    rows = [{**_row(lr, a, k, 0.4, 0.4 - k / 1000, 0.6 + k / 1000), "system_before": 0.6, "seeds": 1,
             "kept": k < 50} for lr in (1e-4, 1e-5) for a in ("full", "lora") for k in (20, 50)]
    chosen = choose_pilot(rows)
    record = {"name": "s", "config": {"training": {"trainers": []}},
              "training": {"settings": [], "pilot": {"settings": {
                  "judge/arith": {"curve": rows, **chosen}, "vote/arith": {"curve": [], "fits": 0, "cells": 4}}}}}
    written = plots(record, tmp_path)
    assert [p.name for p in written] == ["study_pilot_judge_arith.png"]
    assert matplotlib.image.imread(written[0]).shape[:2] == (418, 1100)  # 10 x 3.8 in at 110 dpi


# ---------------------------------------------------------------------- config
def pilot_config(tmp_path, pilot=None, **training):
    return {"study": {"out": str(tmp_path)}, "pools": {"zoo": "zoo"}, "tasks": {"arith": {"n": 10}},
            "training": {"pool": "zoo", "learner": "model_4", "tasks": ["arith"], "trainers": ["crl", "placebo"],
                         "seeds": [0], "setups": {"vote": {}, "judge": {"protocol": "judge",
                                                                      "options": {"judge": "{learner}"}}},
                         "pilot": {"steps": [1, 2], "rates": [1e-4, 1e-5], "n": 4} if pilot is None else pilot,
                         **training}}


@pytest.mark.parametrize("pilot, training, message", [
    ({}, {"lr_rule": {"candidates": [1e-3]}}, r"^study config: training\.lr_rule: \[training\.pilot\] fixes the "
                                              r"learning rate \(it supersedes \[training\.lr_rule\]\); remove"),
    ({}, {"steps": 10}, r"training\.steps: \[training\.pilot\] fixes steps and learning rate; remove it"),
    ({}, {"learning_rate": 1e-4}, r"training\.learning_rate: \[training\.pilot\] fixes"),
    ({"seeds": [0]}, {}, r"training\.pilot\.seeds: seed 0 is also a comparison seed"),
    ({"split": "test"}, {}, r"training\.pilot\.split: 'test' is the eval split"),
    ({"steps": []}, {}, r"training\.pilot\.steps must be a non-empty list of integers >= 1"),
    ({"steps": [20, 20]}, {}, r"training\.pilot\.steps lists a value twice"),
    ({"rates": [0.0]}, {}, r"training\.pilot\.rates must be a non-empty list of learning rates in \(0, 1\]"),
    ({"adapters": ["qlora"]}, {}, r"training\.pilot\.adapters must be a non-empty list of \['full', 'lora'\]"),
    ({"select": "best"}, {}, r"training\.pilot\.select must be one of \['fewest_steps_near_best', 'most_steps_kept'\]"),
    ({"margin": 1.5}, {}, r"training\.pilot\.margin must be a number in \[0, 1\)"),
    ({"trainer": "gpro"}, {}, r"training\.pilot\.trainer: unknown trainer 'gpro' \(did you mean 'grpo'\?\)"),
    ({"step": [20]}, {}, r"training\.pilot\.step: unknown key"),
    ({}, {"setups": {"duo": {"protocol": "vote", "learners": ["model_3", "model_4"]}}, "trainers": ["crl"]},
     r"training\.setups\.duo\.learners: trains several learners; \[training\.pilot\] fits one learner"),
])
def test_pilot_config_errors_are_one_line(tmp_path, pilot, training, message):
    with pytest.raises(StudyConfigError, match=message) as e:
        load_config(pilot_config(tmp_path, pilot, **training))
    assert "\n" not in str(e.value)


def test_the_config_dataclass_sorts_and_checks_on_its_own():
    p = PilotConfig(steps=(100, 20), rates=(1e-5, 3e-4), adapters=("lora", "full"))
    assert p.steps == (20, 100) and p.rates == (3e-4, 1e-5) and p.adapters == ("full", "lora") and p.fits == 4
    with pytest.raises(ConfigError, match=r"training\.pilot\.n must be an integer >= 1, got 0"):
        PilotConfig(n=0)


# ---------------------------------------------------------------------- the plan
def test_the_plan_shares_a_learner_alone_fit_across_settings_and_keys_training_on_it(tmp_path):
    cfg = load_config(pilot_config(tmp_path))
    planned = study.plan(cfg)
    pilots = [c for c in planned if c.kind == "pilot"]
    # GRPO fits the learner alone: one fit group serves vote and judge, scored in both systems
    assert [c.id for c in pilots] == [f"pilot/alone/model_4/arith/{a}/lr{lr}/seed1000" for a in ("full", "lora")
                                      for lr in ("0.0001", "1e-05")]
    assert all([s["setup_label"] for s in c.spec.systems] == ["vote", "judge"] for c in pilots)
    assert all(c.spec.steps == 2 and c.spec.checkpoints == [1, 2] and c.spec.validation["split"] == "train"
               for c in pilots)
    assert [c.spec.lora is not None for c in pilots] == [False, False, True, True]
    runs = [c for c in planned if c.kind == "training"]
    assert {c.spec.pilot["setup_label"] for c in runs} == {"vote", "judge"}
    assert all([x["fingerprint"] for x in c.spec.pilot["cells"]] == [p.fingerprint for p in pilots] for c in runs)
    assert all(c.spec.steps == 2 for c in runs)  # priced at the largest checkpoint
    assert [c.stage for c in pilots] == [0] * 4 and all(c.stage == 1 for c in runs)
    text = study.describe_plan(cfg, planned)
    assert "pilot: 4 cells = 1 fit group(s) x 2 rates (0.0001, 1e-05) x 2 adapters (full, lora) x 1 seed(s)" in text
    assert "steps fixed by [training.pilot] (cost planned at its largest, 2)" in text
    # another grid: other pilot cells, so other training fingerprints
    other = study.cells(load_config(pilot_config(tmp_path, {"steps": [1, 3], "rates": [1e-4, 1e-5], "n": 4})))
    assert {c.fingerprint for c in other if c.kind == "training"}.isdisjoint({c.fingerprint for c in runs})


def test_without_a_pilot_the_committed_studys_cells_keep_their_ids_and_fingerprints():
    """paper-small (docs/study.json, committed) planned by this checkout: every cell's id and fingerprint as
    recorded there; the study.json config of a study without a pilot holds no pilot key."""
    from crl_envs.study import _config_dict

    config = load_config(ROOT / "studies" / "paper-small.toml")
    recorded = json.loads((ROOT / "docs" / "study.json").read_text())
    planned = study.cells(config)
    assert {c.id: c.fingerprint for c in planned} == {k: v["fingerprint"] for k, v in recorded["cells"].items()}
    assert "pilot" not in _config_dict(config)["training"]


def test_the_pilot_preset_is_paper_cpu_with_a_pilot_in_place_of_the_lr_rule():
    base = load_config(ROOT / "studies" / "paper-cpu.toml")
    piloted = load_config(ROOT / "studies" / "paper-cpu-pilot.toml")
    assert piloted.training.lr_rule is None and piloted.training.pilot is not None
    assert piloted.training.setups.keys() == base.training.setups.keys()
    assert set(piloted.training.pilot.seeds).isdisjoint(piloted.training.seeds)


# ---------------------------------------------------------------------- a tiny run through the study
@pytest.mark.slow
def test_a_tiny_pilot_runs_one_fit_per_combination_and_the_training_cells_take_its_choice(tmp_path):
    """vote on the zoo, C-RL trained after a pilot of 2 rates x 2 adapters to 2 steps (a smoke test of the
    machinery, not evidence: 2 steps train nothing)."""
    cfg = pilot_config(tmp_path, {"steps": [1, 2], "rates": [1e-4, 1e-5], "n": 4}, trainers=["crl"],
                       setups={"vote": {}}, questions_per_step=2, num_generations=2, n_train=8, n_eval=6,
                       bootstrap_resamples=50)
    result = study.run(cfg, progress=False)
    pilot = result["training"]["pilot"]
    (setting,) = pilot["settings"].values()
    assert [(r["learning_rate"], r["adapter"], r["steps"]) for r in setting["curve"]] == [
        (lr, a, k) for lr in (1e-4, 1e-5) for a in ("full", "lora") for k in (1, 2)]
    cells = [json.loads(p.read_text()) for p in (tmp_path / "cells").glob("*.json")]
    pilots = [c for c in cells if c["kind"] == "pilot"]
    assert len(pilots) == 4 and all(c["fits"] == 1 and c["steps_trained"] == 2 and
                                    [p["steps"] for p in c["curve"]] == [1, 2] for c in pilots)
    chosen = choose_pilot(setting["curve"])
    assert {k: setting[k] for k in ("steps", "learning_rate", "adapter")} == \
        {k: chosen[k] for k in ("steps", "learning_rate", "adapter")}
    (run,) = [c for c in cells if c["kind"] == "training"]
    assert (run["steps"], run["learning_rate"], run["adapter"]) == (chosen["steps"], chosen["learning_rate"],
                                                                    chosen["adapter"])
    metrics = (tmp_path / "train" / run["fingerprint"] / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == chosen["steps"]  # the training cell trained the chosen steps
    (st,) = result["training"]["settings"]
    assert st["budget"]["steps"] == chosen["steps"] and st["budget"]["adapter"] == chosen["adapter"]
    text = (tmp_path / "study.md").read_text()
    assert "**Steps, learning rate and adapter, fixed by the pilot before the comparison**" in text
    assert f"chosen: {chosen['steps']} steps, lr {chosen['learning_rate']:g}, {chosen['adapter']}" in text
    assert (tmp_path / "study_pilot_vote_arith.png").is_file()


@pytest.mark.slow
def test_scoring_at_checkpoints_leaves_the_fit_bit_identical_to_an_unscored_fit(tmp_path):
    """The pilot's one fit, scored at every checkpoint, must be the fit an unscored trainer makes: the same
    weights bit for bit after the last step and the same per-step metrics but timings. Full fine-tuning. (The
    fit samples from per-request generators, so even a scorer drawing from torch's global generator leaves it
    as it is: checked by hand; what this guards is scoring's other effects: modes, caches, the policy's state.)"""
    import torch

    from crl_envs.study.cells.build import build_task
    from crl_envs.study.cells.pilot import checkpoint_scorer
    from crl_envs.study.cells.trained import build_trainer

    cfg = load_config(pilot_config(tmp_path, {"steps": [1, 2, 3], "rates": [1e-4], "adapters": ["full"], "n": 4},
                                   learner="model_0", questions_per_step=4, num_generations=4, n_train=16,
                                   n_eval=4))
    (cell,) = [c for c in study.cells(cfg) if c.kind == "pilot"]
    spec = cell.spec
    v = spec.validation
    questions = build_task({**spec.task, "seed": v["seed"]}, split=v["split"], n=v["n"])

    def weights(trainer):
        return {k: p.detach().clone() for k, p in trainer.policy.model.state_dict().items()}

    def fit(scored: bool):
        trainer = build_trainer(spec, spec.trainer, spec.seed, None)
        start = weights(trainer)
        curve: list = []
        if scored:
            trainer.callbacks.append(checkpoint_scorer(spec, questions, curve))
        trainer.fit()
        untimed = [{k: v for k, v in row.items() if "seconds" not in k and k != "tokens_per_second"}
                   for row in trainer.history]
        return start, weights(trainer), untimed, curve

    start, plain, plain_history, _ = fit(False)
    _, scored, scored_history, curve = fit(True)
    assert [point["steps"] for point in curve] == [1, 2, 3]
    assert any(not torch.equal(start[k], plain[k]) for k in start)  # the fit moved the weights
    assert plain.keys() == scored.keys()
    assert [k for k in plain if not torch.equal(plain[k], scored[k])] == []
    assert plain_history == scored_history


def test_the_dose_preset_shares_the_pilots_fits_and_changes_only_the_rule():
    """studies/paper-cpu-dose.toml: paper-cpu-pilot with select = most_steps_kept; its pilot cells are the same
    fits (fingerprints), so a run can reuse paper-cpu-pilot's; its training cells are other cells."""
    pilot, dose = (load_config(ROOT / "studies" / f"{name}.toml") for name in ("paper-cpu-pilot", "paper-cpu-dose"))
    assert dose.training.pilot.select == "most_steps_kept" and pilot.training.pilot.select == "fewest_steps_near_best"
    assert {**vars(dose.training.pilot), "select": None} == {**vars(pilot.training.pilot), "select": None}
    a, b = study.cells(pilot), study.cells(dose)
    assert {c.id: c.fingerprint for c in a if c.kind != "training"} == \
        {c.id: c.fingerprint for c in b if c.kind != "training"}
    assert {c.fingerprint for c in a if c.kind == "training"}.isdisjoint({c.fingerprint for c in b if c.kind == "training"})
