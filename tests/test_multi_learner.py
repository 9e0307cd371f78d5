"""Several learners at once (``learners=[...]``): per-learner credit and baselines, schedules, checkpoints,
errors before anything loads, and cross-play. Zoo pool of three: zoo-nocarry and two zoo-rookies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import agents
import agents.zoo
import trainers.rollout as rollout_module
from agents import SamplingParams
from crl_envs import run_episodes, tasks
from trainers import (
    CRLConfig,
    CRLTrainer,
    GRPOConfig,
    GRPOTrainer,
    LOORewardConfig,
    LOORewardTrainer,
    LoraSettings,
    ShapleyCreditConfig,
    ShapleyCreditTrainer,
    crossplay,
    shapley_weight,
    trainer_crossplay,
)

FAST = dict(steps=2, questions_per_step=2, num_generations=4, max_new_tokens=24, learning_rate=1e-3, progress=False,
            seed=1)
ROOKIES = ["model_1", "model_2"]

#: The same runs on the code before several learners existed (learner="model_1", vote, FAST): loss and grad
#: norm per step, rollouts, and the sum of |weights| after training.
BEFORE = {
    "crl": {"loss": [0.008503399789333344, 0.0], "grad_norm": [0.4750332236289978, 0.0], "rollouts": 16,
            "weights": 11870.397238383981},
    "loo": {"loss": [0.12925170361995697, 0.0], "grad_norm": [0.5108646750450134, 0.0], "rollouts": 20,
            "weights": 11871.872742031077},
    "shapley": {"loss": [0.002248451579362154, 0.0], "grad_norm": [0.09387370944023132, 0.0], "rollouts": 64,
                "weights": 11870.739828299684},
}
KINDS = {"crl": (CRLTrainer, CRLConfig), "loo": (LOORewardTrainer, LOORewardConfig),
         "shapley": (ShapleyCreditTrainer, ShapleyCreditConfig)}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster on a busy CPU
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pool():
    return agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])


@pytest.fixture(scope="module")
def train():
    return tasks.load("arith", split="train", n=40, **agents.zoo.TASK_OPTIONS)


@pytest.fixture(scope="module")
def held_out():
    return tasks.load("arith", split="test", n=8, **agents.zoo.TASK_OPTIONS)


def _abs_sum(agent) -> float:
    return float(sum(p.detach().double().abs().sum() for p in agent.model.parameters()))


def _weights(agent) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in agent.model.named_parameters()}


@pytest.mark.parametrize("kind, as_list", [("crl", False), ("crl", True), ("loo", True), ("shapley", True)])
def test_one_learner_gives_the_numbers_of_before(pool, train, kind, as_list):
    trainer_class, config_class = KINDS[kind]
    who = dict(learners=["model_1"]) if as_list else dict(learner="model_1")
    trainer = trainer_class("vote", pool, train, config=config_class(**FAST), **who)
    history = trainer.fit()
    assert [h["loss"] for h in history] == pytest.approx(BEFORE[kind]["loss"], abs=1e-7)
    assert [h["grad_norm"] for h in history] == pytest.approx(BEFORE[kind]["grad_norm"], rel=1e-5)
    assert trainer.rollouts == BEFORE[kind]["rollouts"]
    # rel 5e-7: recorded on another CPU; on an AMD EPYC the sums differ by up to 5.4e-8 (float kernels),
    # while this training moves them by 1.3e-5 (crl) to 1.1e-4 (loo) of their size
    assert _abs_sum(trainer.policy) == pytest.approx(BEFORE[kind]["weights"], rel=5e-7)
    assert list(trainer.policies) == ["model_1"] and trainer.policies["model_1"] is trainer.policy
    assert "loss/model_1" not in history[0]  # one learner: the metric names of before


def test_round_robin_first_step_is_the_one_learner_step(pool, train):
    """Round robin, step 1 updates model_1 while model_2 plays greedily as a partner: exactly the
    one-learner step; model_2 is untouched until its turn."""
    alone = CRLTrainer("vote", pool, train, learner="model_1", config=CRLConfig(**FAST))
    alone.fit(steps=1)
    rr = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST, schedule="round_robin"))
    metrics = rr.train_step()
    assert metrics["training"] == ["model_1"] and "loss/model_2" not in metrics
    a, b = _weights(alone.policy), _weights(rr.policies["model_1"])
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(torch.equal(w, _weights(pool["model_2"])[n]) for n, w in _weights(rr.policies["model_2"]).items())
    assert rr.learners_for(1) == ["model_2"] and rr.learners_for(2) == ["model_1"]


def test_joint_advantages_are_each_learners_credit_minus_its_groups_mean(pool, train):
    """C-RL: every learner's advantage is the system score minus its group's mean. LOO: each learner's
    reward is the score minus v(N \\ {j}), recomputed here by playing N \\ {j} independently."""
    crl = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST))
    examples, seed = crl.questions_for(0), crl.rollout_seed(0)
    batch = crl.collect(examples, seed)
    scores = np.array([ep.score for ep in batch.episodes]).reshape(len(examples), FAST["num_generations"])
    advantages = crl.advantages(batch)
    assert set(advantages) == set(ROOKIES)
    for j in ROOKIES:
        np.testing.assert_allclose(advantages[j].numpy(), scores - scores.mean(1, keepdims=True))
    assert all(set(ep.coalition) == {"model_0", *ROOKIES} for ep in batch.episodes)
    recorded = {j for ep in batch.episodes for j in ROOKIES if ep.turns_of(j)[0].token_ids is not None}
    assert recorded == set(ROOKIES)  # both learners' tokens are kept for training

    loo = LOORewardTrainer("vote", pool, train, learners=ROOKIES, config=LOORewardConfig(**FAST))
    batch = loo.collect(examples, seed)
    assert batch.rollouts == len(examples) * (FAST["num_generations"] + 2)  # G + one counterfactual per learner
    advantages = loo.advantages(batch)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=FAST["max_new_tokens"])
    scores = np.array([ep.score for ep in batch.episodes]).reshape(len(examples), FAST["num_generations"])
    for j in ROOKIES:
        without = run_episodes("vote", pool, train, coalition=[a for a in pool.ids if a != j], seed=seed,
                               sampling=greedy, examples=examples, progress=False)
        v = np.array([ep.score for ep in without])
        np.testing.assert_allclose(advantages[j].numpy(), scores - v[:, None])


def test_exact_shapley_plays_each_coalition_with_a_learner_once(pool, train):
    shap = ShapleyCreditTrainer("vote", pool, train, learners=ROOKIES, config=ShapleyCreditConfig(**FAST))
    examples = shap.questions_for(0)
    batch = shap.collect(examples, shap.rollout_seed(0))
    played = {tuple(ep.coalition) for ep in batch.episodes}
    with_a_learner = {c for c in [("model_1",), ("model_2",), ("model_0", "model_1"), ("model_0", "model_2"),
                                  ("model_1", "model_2"), ("model_0", "model_1", "model_2")]}
    assert played == with_a_learner  # 2^3 - 2^(3-2) = 6 coalitions
    assert batch.rollouts == 6 * len(examples) * FAST["num_generations"]
    for j in ROOKIES:
        view = batch.of(j)
        assert {tuple(ep.coalition) for ep in view.episodes} == {c for c in with_a_learner if j in c}
        sizes = [len(view.episodes[g[0]].coalition) for g in view.index]
        np.testing.assert_allclose(view.context["weights"].numpy(), [4 * shapley_weight(s, 3) for s in sizes])


def test_joint_training_is_deterministic_and_each_learner_keeps_its_own_state(pool, train, tmp_path):
    def run(out, steps=None):
        cfg = CRLConfig(**{**FAST, "steps": 3}, save_steps=1, output_dir=str(out))
        trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=cfg)
        trainer.fit(steps=steps)
        return trainer

    a = run(tmp_path / "a")
    run(tmp_path / "b", steps=2)
    assert a.policies["model_1"] is not a.policies["model_2"]
    assert a.learner_states["model_1"].optimizer is not a.learner_states["model_2"].optimizer
    assert all(any(h[f"grad_norm/{j}"] > 0 for h in a.history) for j in ROOKIES)
    assert (tmp_path / "b" / "checkpoint-000002" / "model_2" / "trainable.pt").exists()
    resumed = run(tmp_path / "b")  # resumes from step 2, one learner's files per folder
    assert resumed.step == 3
    for j in ROOKIES:
        wa, wb = _weights(a.policies[j]), _weights(resumed.policies[j])
        assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert not all(torch.equal(w, _weights(pool["model_1"])[n]) for n, w in _weights(a.policies["model_1"]).items())


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(learners=["model_1", "model_9"]), ValueError, r"learner 'model_9' is not in the pool; pool agents are \["),
    (dict(learners=["model_1", "model_1"]), ValueError, "learners lists 'model_1' twice"),
    (dict(learners=["model_0", "model_1"]), TypeError, "learner 'model_0' is a scripted agent"),
    (dict(learner="model_1", learners=["model_2"]), ValueError, r"pass learner= \(one\) or learners= \(several\)"),
    (dict(learners="model_1"), TypeError, "learners must be a list of agent ids"),
    (dict(learners=[]), ValueError, "learners=\\[\\] trains nobody"),
])
def test_bad_learners_raise_one_line(train, kwargs, error, message):
    pool = agents.pool([agents.ScriptedAgent.expert("e0", 0.7), "zoo:zoo-rookie", "zoo:zoo-rookie"])
    with pytest.raises(error, match=message) as info:
        CRLTrainer("vote", pool, train, config=CRLConfig(**FAST), **kwargs)
    assert "\n" not in str(info.value)


def test_errors_before_any_model_loads(train, monkeypatch):
    """Spec-string pools: a learner past the pool's end, or LoRA / training on a served backend, fail
    before any agent is built."""
    import sys

    pool_module = sys.modules["agents.pool"]
    monkeypatch.setattr(pool_module, "from_spec", lambda spec: pytest.fail(f"built {spec} before checking"))
    specs = ["zoo:zoo-nocarry", "openai:http://127.0.0.1:9/v1#m", "zoo:zoo-rookie"]
    with pytest.raises(ValueError, match=r"config.lora is set but learner 'model_1' is the openai backend"):
        CRLTrainer("vote", specs, train, learners=["model_1", "model_2"], config=CRLConfig(lora=LoraSettings()))
    with pytest.raises(TypeError, match="learner 'model_1' is the openai backend"):
        CRLTrainer("vote", specs, train, learner="model_1")
    with pytest.raises(ValueError, match="learner 'model_3' is not in the pool"):
        CRLTrainer("vote", specs, train, learners=["model_2", "model_3"])
    with pytest.raises(ValueError, match="GRPOTrainer trains one learner"):
        GRPOTrainer("vote", specs, train, learners=["model_0", "model_2"], config=GRPOConfig())
    with pytest.raises(ValueError, match=r"CRLConfig.schedule must be one of \['joint', 'round_robin'\]"):
        CRLConfig(schedule="alternate")


def test_one_learner_names_stay_and_several_refuse_them(pool, train):
    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST))
    with pytest.raises(ValueError, match=r"trains 2 learners \['model_1', 'model_2'\]: trainer.policy names one"):
        trainer.policy  # noqa: B018
    assert list(trainer.policies) == ROOKIES and all(isinstance(p, agents.Agent) for p in trainer.policies.values())


def test_crossplay_of_untrained_policies_has_no_gain_and_matches_evaluate(pool, train, held_out):
    untrained = {j: pool[j] for j in ROOKIES}
    result = crossplay("vote", pool, held_out, untrained, max_new_tokens=24)
    for r in result.learners.values():
        assert tuple(r.trained_with_gain) == tuple(r.unseen_gain) == tuple(r.gap) == (0.0, 0.0, 0.0)
        # the whole pool with the other rookie untrained + the 2 two-member coalitions containing the learner
        assert len(r.unseen) == 1 + 2
    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST), eval_task=held_out)
    trainer.fit(steps=1)
    cross = trainer_crossplay(trainer)
    assert cross.learners["model_1"].trained_with_accuracy == pytest.approx(trainer.evaluate().system_accuracy)
    everyone = cross.settings["model_0+model_1+model_2 | trained: model_1, model_2"]
    half = cross.settings["model_0+model_1+model_2 | trained: model_2"]
    assert cross.learners["model_1"].trained_with_gain.delta == pytest.approx(float(np.mean(everyone - half)))
    with pytest.raises(ValueError, match="must be a non-empty list of pool agents"):
        crossplay("vote", pool, held_out, untrained, coalitions=[["model_1", "model_7"]])
    with pytest.raises(ValueError, match="learner 'model_1' has no unseen setting"):
        crossplay("vote", pool, held_out, {"model_1": pool["model_1"]}, coalitions=[])


def test_rollouts_spy_sees_one_call_per_step_for_joint_crl(pool, train, monkeypatch):
    calls = []
    real = rollout_module.run_episodes
    monkeypatch.setattr(rollout_module, "run_episodes", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST)).fit()
    assert len(calls) == FAST["steps"] and all(sorted(c["record"]) == ROOKIES for c in calls)
    assert all(c["sampling"]["model_1"].temperature == 1.0 == c["sampling"]["model_2"].temperature for c in calls)


def test_two_learners_with_lora_train_their_own_adapters(pool, train, tmp_path):
    cfg = CRLConfig(**{**FAST, "steps": 1}, lora=LoraSettings(r=2, alpha=4), beta=0.1, output_dir=str(tmp_path))
    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=cfg)
    before = {j: trainer.trainable_state(j) for j in ROOKIES}
    assert all(before[j] and all("lora_" in n for n in before[j]) for j in ROOKIES)
    metrics = trainer.fit()[-1]
    assert all(metrics[f"kl/{j}"] is not None for j in ROOKIES)
    assert all(any(not torch.equal(before[j][n], w) for n, w in trainer.trainable_state(j).items()) for j in ROOKIES
               if metrics[f"grad_norm/{j}"] > 0)
    saved = torch.load(tmp_path / "checkpoint-000001" / "model_2" / "trainable.pt")
    assert saved.keys() == before["model_2"].keys()
    assert trainer.policies["model_1"].model is not trainer.policies["model_2"].model
