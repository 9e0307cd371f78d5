"""Issue #46's controls: the placebo trainer, the system without the learner, the learning-rate rule and bound,
and the gates that refuse to compare a broken training setting."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import agents
from agents import SamplingParams
from crl_envs import study, tasks
from crl_envs.runner import run_episodes
from crl_envs.study.config import StudyConfigError, load_config
from crl_envs.study.gates import LearningRateRule, choose_learning_rate, setting_gates
from crl_envs.study.stats import training_tables
from trainers import CRLConfig, CRLTrainer, PlaceboConfig, PlaceboTrainer, placebo_rewards
from trainers.controls import FULL_FINETUNE_LR_BOUND, answer_rates, without_learner

FAST = dict(num_generations=4, questions_per_step=2, max_new_tokens=6, progress=False)


@pytest.fixture
def pool(tiny_model_dir):
    return agents.pool([agents.ScriptedAgent.expert("e0", 0.7), agents.HFAgent(str(tiny_model_dir), name="tiny"),
                        agents.ScriptedAgent.expert("e2", 0.5)])


@pytest.fixture
def train_task():
    return tasks.load("arith", split="train", n=8, seed=2)


# ---------------------------------------------------------------------- placebo
def test_placebo_rewards_are_seeded_coin_flips_or_a_within_group_permutation():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 500, dtype=torch.float64)
    coin = placebo_rewards(rewards, "coin", 3)
    assert torch.equal(coin, placebo_rewards(rewards, "coin", 3)) and not torch.equal(coin, placebo_rewards(rewards, "coin", 4))
    assert set(coin.unique().tolist()) == {0.0, 1.0} and abs(float(coin.mean()) - 0.5) < 0.03  # 2000 fair flips
    perm = placebo_rewards(rewards, "permuted", 3)
    assert torch.equal(perm.sum(1), rewards.sum(1))  # each group keeps its rewards...
    assert {int(i) for i in perm.argmax(1)} == {0, 1, 2, 3}  # ...in a shuffled order


def test_placebo_plays_c_rls_rollouts_and_takes_the_same_updates_on_coin_flips(pool, train_task):
    crl = CRLTrainer("vote", pool, train_task, learner="model_1", config=CRLConfig(steps=2, **FAST))
    placebo = PlaceboTrainer("vote", pool, train_task, learner="model_1", config=PlaceboConfig(steps=2, **FAST))
    got, want = placebo.fit(), crl.fit()
    assert len(got) == len(want) == 2  # as many optimizer steps, each on as many rollouts and learner turns
    for a, b in zip(got, want):
        assert a["rollouts"] == b["rollouts"] and a["learner_sequences"] == b["learner_sequences"]
    assert got[0]["system_score"] == want[0]["system_score"]  # identical first-step episodes
    batch = placebo.collect(placebo.questions_for(0), placebo.rollout_seed(0))
    assert set(batch.rewards.unique().tolist()) <= {0.0, 1.0}
    truth = torch.tensor([ep.score for ep in batch.episodes], dtype=torch.float64).reshape(batch.rewards.shape)
    assert not torch.equal(batch.rewards, truth) or bool((truth == truth[:, :1]).all())


# ---------------------------------------------------------------------- the system without the learner
def test_without_learner_is_the_coalition_without_it_played_through_the_runner(pool):
    held_out = tasks.load("arith", split="test", n=6, seed=2)
    got = without_learner("vote", pool, held_out, ["model_1"], max_new_tokens=6)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    ref = run_episodes("vote", pool, held_out, coalition=["model_0", "model_2"], sampling=greedy, progress=False)
    assert got.tolist() == [ep.score for ep in ref]
    trainer = CRLTrainer("vote", pool, tasks.load("arith", split="train", n=8, seed=2), learner="model_1",
                         config=CRLConfig(**FAST), eval_task=held_out)
    result = trainer.evaluate()
    assert result.without_learner.tolist() == got.tolist() and result.zero_variance_share is None
    assert f"without the learner {got.mean():.3f}" in str(result)
    assert "without_learner" in result.to_dict() and trainer.evaluate(controls=False).without_learner is None


def test_answer_rates_count_unparsed_answers_and_invalid_verdicts(pool):
    q = tasks.load("arith", split="test", n=4, seed=2)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    episodes = run_episodes("judge", pool, q, sampling=greedy, progress=False, options={"judge": "model_1"})
    rates = answer_rates(episodes, "model_1")
    parsed = [ep.answers["model_1"] is not None for ep in episodes]
    assert rates["parse_rate"] == pytest.approx(np.mean(parsed))
    assert rates["verdict_rate"] is not None and 0 <= rates["verdict_rate"] <= 1
    assert answer_rates(episodes, "model_0")["verdict_rate"] is None  # it never judged


# ---------------------------------------------------------------------- the learning rate
def test_a_full_fine_tune_above_the_bound_warns_in_one_line():
    with pytest.warns(UserWarning, match=r"^CRLConfig\.learning_rate=0\.001 is above 0\.0001, the bound") as record:
        CRLConfig(learning_rate=1e-3)
    assert "\n" not in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CRLConfig(learning_rate=FULL_FINETUNE_LR_BOUND)  # at the bound: quiet
        CRLConfig(learning_rate=1e-3, lora={"r": 4})  # LoRA: quiet


def test_the_lr_rule_picks_by_its_definition_on_a_planted_sweep():
    sweep = {1e-3: {"before": 0.25, "after": 0.05}, 1e-4: {"before": 0.25, "after": 0.25},
             3e-5: {"before": 0.25, "after": 0.27}}
    assert choose_learning_rate(sweep, "largest_kept")["learning_rate"] == 1e-4  # 1e-3 falls, 1e-4 keeps
    assert choose_learning_rate(sweep, "best")["learning_rate"] == 3e-5
    assert choose_learning_rate(sweep, "largest_kept", tolerance=0.25)["learning_rate"] == 1e-3
    fallen = {lr: {"before": 0.3, "after": 0.1} for lr in sweep}
    assert choose_learning_rate(fallen, "largest_kept") == {
        "learning_rate": 3e-5, "reason": "every rate lowered the learner alone: the smallest"}
    tie = {1e-3: {"before": 0.2, "after": 0.3}, 1e-4: {"before": 0.2, "after": 0.3}}
    assert choose_learning_rate(tie, "best")["learning_rate"] == 1e-4  # a tie goes to the smaller rate
    assert LearningRateRule(candidates=(3e-5, 1e-3)).candidates == (1e-3, 3e-5)


def rule_config(tmp_path, rule=None, **training):
    return {"study": {"out": str(tmp_path)}, "pools": {"zoo": "zoo"}, "tasks": {"arith": {"n": 10}},
            "training": {"pool": "zoo", "learner": "model_4", "tasks": ["arith"], "setups": {"vote": {}, "debate": {}},
                         "lr_rule": {"candidates": [1e-3, 1e-4]} if rule is None else rule, **training}}


@pytest.mark.parametrize("rule, training, message", [
    ({"candidates": []}, {}, r"^study config: training\.lr_rule\.candidates must be a non-empty list"),
    ({"candidates": [1e-3, 1e-3]}, {}, r"lists a learning rate twice"),
    ({"select": "median"}, {}, r"training\.lr_rule\.select must be one of \['largest_kept', 'best'\]"),
    ({"split": "test"}, {}, r"training\.lr_rule\.split: 'test' is the eval split: the rule never looks at the test"),
    ({"trainer": "gpro"}, {}, r"training\.lr_rule\.trainer: unknown trainer 'gpro' \(did you mean 'grpo'\?\)"),
    ({"candidate": [1e-3]}, {}, r"training\.lr_rule"),
    ({}, {"learning_rate": 1e-3}, r"training\.learning_rate: the learning rate is chosen by \[training\.lr_rule\]"),
    ({"n": 0}, {}, r"training\.lr_rule\.n must be an integer >= 1"),
])
def test_lr_rule_config_errors_are_one_line(tmp_path, rule, training, message):
    with pytest.raises(StudyConfigError, match=message) as e:
        load_config(rule_config(tmp_path, rule, **training))
    assert "\n" not in str(e.value)


def test_the_plan_sweeps_first_shares_grpos_sweep_and_keys_training_on_it(tmp_path):
    cfg = load_config(rule_config(tmp_path, trainers=["crl", "placebo"], seeds=[0]))
    planned = study.plan(cfg)
    sweeps = [c for c in planned if c.kind == "lr_sweep"]  # GRPO plays the learner alone: one sweep, both setups
    assert [c.id for c in sweeps] == ["lr_sweep/alone/model_4/arith/20steps/lr0.001",
                                      "lr_sweep/alone/model_4/arith/20steps/lr0.0001"]
    assert {c.spec.selection["split"] for c in sweeps} == {"train"} and {c.spec.seed for c in sweeps} == {1000}
    runs = [c for c in planned if c.kind == "training"]
    assert len(runs) == 4 and all(c.spec.learning_rate["sweep"] == {"0.001": sweeps[0].fingerprint,
                                                                        "0.0001": sweeps[1].fingerprint} for c in runs)
    assert all(c.cost["calls"] > 0 for c in sweeps)
    assert "lr by [training.lr_rule] (grpo sweep over 0.001, 0.0001, largest_kept)" in study.describe_plan(cfg, planned)
    raw = rule_config(tmp_path, trainers=["crl"], seeds=[0], setups={"vote": {}, "debate": {"steps": 5}})
    other = [c for c in study.plan(load_config(raw)) if c.kind == "lr_sweep"]  # another budget: its own sweep
    assert [c.spec.steps for c in other] == [20, 20, 5, 5] and len({c.fingerprint for c in other}) == 4


# ---------------------------------------------------------------------- gates
def _d(value, lo, hi):
    return {"value": value, "ci": [lo, hi]}


def test_gates_fire_on_a_planted_collapse_whatever_the_systems_delta():
    g = setting_gates(alone_before=0.25, alone_delta={"grpo": _d(0.01, -0.02, 0.04), "crl": _d(-0.25, -0.3, -0.2)},
                      system_delta={"crl": _d(-0.01, -0.03, 0.0), "grpo": _d(0.0, 0, 0), "placebo": _d(0, 0, 0)},
                      trainers=["crl", "grpo", "placebo"], without_learner=None, before=0.8)
    assert not g["comparable"] and g["reason"].startswith("no_collapse: learner alone collapses under crl")


def test_gates_fire_when_the_gain_equals_deleting_the_learner_and_when_grpo_lowers_it():
    g = setting_gates(alone_before=0.25, alone_delta={"grpo": _d(-0.2, -0.25, -0.15), "crl": _d(0.0, -0.01, 0.01)},
                      system_delta={"crl": _d(0.02, 0.0, 0.04), "grpo": _d(0.0, 0, 0), "placebo": _d(0.02, 0, 0.04)},
                      trainers=["crl", "grpo", "placebo"], without_learner=0.85, before=0.83)
    failed = {x["name"] for x in g["gates"] if not x["passed"]}
    assert failed == {"grpo_keeps_learner", "not_deletion", "no_collapse"}
    assert "crl, placebo: the system's gain does not beat the system without the learner (0.850)" in g["reason"]
    ok = setting_gates(alone_before=0.25, alone_delta={"grpo": _d(0.02, -0.01, 0.05)},
                       system_delta={"crl": _d(0.05, 0.02, 0.08), "grpo": _d(0, 0, 0), "placebo": _d(0, 0, 0)},
                       trainers=["crl", "grpo", "placebo"], without_learner=0.85, before=0.83,
                       vs_without_learner={"crl": _d(0.03, 0.01, 0.05)})  # the gain's difference CI above 0
    assert ok["comparable"] and ok["reason"] is None


def test_training_tables_report_a_deletion_as_not_comparable_with_the_placebo_beside():
    """vote at lr 1e-3 (issue #46): every trainer's system 0.83 -> 0.85, the learner alone -> 0, and the system
    without the learner is 0.85: a deletion; the tables say so and count no win or loss."""
    rng = np.random.default_rng(0)
    q = 200
    before = (rng.random(q) < 0.83).astype(float)
    without = before.copy()
    without[np.flatnonzero(before == 0)[:4]] = 1.0  # 0.85 without the learner
    alone = (rng.random(q) < 0.25).astype(float)
    base = {"system": before.tolist(), "standalone": alone.tolist(), "without_learner": without.tolist(),
            "rates": {"parse_rate": 1.0, "verdict_rate": None}}
    runs = {t: {s: {"system": without.tolist(), "standalone": [0.0] * q, "zero_variance": 0.95,
                    "rates": {"parse_rate": 0.97, "verdict_rate": None}} for s in (0, 1, 2)}
            for t in ("crl", "grpo", "placebo")}
    out = training_tables({("vote", "arith"): base}, {("vote", "arith"): runs}, ["crl", "grpo", "placebo"],
                          resamples=200)
    (st,) = out["settings"]
    assert st["without_learner"] == pytest.approx(without.mean())
    assert st["delta_vs_without_learner"]["crl"]["value"] == pytest.approx(0.0)
    assert st["vs_placebo"]["crl"]["difference"] == pytest.approx(0.0)
    assert not st["comparable"] and {g["name"] for g in st["gates"] if not g["passed"]} == \
        {"grpo_keeps_learner", "no_collapse", "not_deletion"}
    assert out["summary"]["crl_vs"]["placebo"] == {"settings": 0, "not_comparable": 1}
    from crl_envs.study.tables import training_markdown

    text = training_markdown(out, ["crl", "grpo", "placebo"])
    assert "**vote on arith: not comparable: grpo_keeps_learner:" in text
    assert f"without the learner {without.mean():.3f}" in text and "Zero-variance groups: crl 95%, grpo 95%, placebo 95%" in text
    assert "Learner's parse rate before 1.00, after: crl 0.97, grpo 0.97, placebo 0.97." in text


@pytest.mark.slow
def test_tiny_zoo_study_chooses_the_rate_first_and_prints_the_gates(tmp_path):
    """vote on the zoo, 1 step, C-RL, GRPO and the placebo, the rate chosen by a two-rate sweep: study.json
    records the sweep and the choice, without_learner per setting and the gates; every training cell ran at the
    chosen rate (a smoke test of the design, not evidence: 1 step trains nothing)."""
    cfg = rule_config(tmp_path, {"candidates": [1e-3, 1e-5], "n": 10}, trainers=["crl", "grpo", "placebo"], seeds=[0],
                      steps=1, questions_per_step=2, num_generations=2, n_train=8, n_eval=10, bootstrap_resamples=50,
                      setups={"vote": {}})
    with pytest.warns(UserWarning, match="above 0.0001, the bound"):  # the sweep's 1e-3 full fine-tune
        result = study.run(cfg, progress=False)
    t = result["training"]
    (sweep,) = t["lr_sweep"]["settings"].values()
    assert set(sweep["sweep"]) == {"0.001", "1e-05"}
    assert sweep["learning_rate"] == choose_learning_rate({float(k): v for k, v in sweep["sweep"].items()},
                                                          "largest_kept")["learning_rate"]
    (st,) = t["settings"]
    assert st["budget"]["learning_rate"] == sweep["learning_rate"] and 0 <= st["without_learner"] <= 1
    assert {g["name"] for g in st["gates"]} == {"grpo_keeps_learner", "placebo_present", "no_collapse", "not_deletion"}
    text = (tmp_path / "study.md").read_text()
    assert "**Learning rate, chosen before the comparison**" in text and "**Gates, vote on arith:**" in text


def test_the_dry_runs_probe_counts_groups_whose_system_scores_are_all_equal(tmp_path):
    from crl_envs.study.probe import zero_variance_probe

    cfg = load_config(rule_config(tmp_path, trainers=["crl"], seeds=[0], num_generations=4,
                                  setups={"cascade-first": {"protocol": "cascade", "options": {"order": [4, 0, 1, 2, 3]}}}))
    shares = zero_variance_probe(cfg, questions=3)
    qs = tasks.load("arith", split="train", n=3, **cfg.tasks["arith"].describe()["options"])
    sampling = {a: SamplingParams(temperature=0.0, max_new_tokens=24) for a in agents.pool("zoo").ids}
    sampling["model_4"] = SamplingParams(temperature=1.0, max_new_tokens=24)
    episodes = run_episodes("cascade", "zoo", qs, samples=4, seed=0, sampling=sampling, progress=False,
                            options={"order": [4, 0, 1, 2, 3]})
    scores = np.array([ep.score for ep in episodes]).reshape(3, 4)
    assert shares == {"cascade-first/arith": float((scores.std(axis=1) == 0).mean())}
