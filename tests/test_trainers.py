"""Trainers: rollouts, costs, checkpoints, LoRA, metrics, errors (tiny random GPT-2 + scripted partners)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import agents
import trainers.rollout as rollout_module
from agents import Request, SamplingParams
from crl_envs import tasks
from trainers import (
    CRLConfig,
    CRLTrainer,
    GRPOConfig,
    GRPOTrainer,
    LOORewardConfig,
    LOORewardTrainer,
    LoraSettings,
    RolloutBatch,
    ShapleyCreditConfig,
    ShapleyCreditTrainer,
    learner_sequences,
    paired_bootstrap_ci,
    token_logprobs,
)

FAST = dict(num_generations=4, questions_per_step=2, max_new_tokens=6, progress=False)


@pytest.fixture
def learner(tiny_model_dir):
    return agents.HFAgent(str(tiny_model_dir), name="tiny")


@pytest.fixture
def pool(learner):
    return agents.pool([agents.ScriptedAgent.expert("e0", 0.7), learner, agents.ScriptedAgent.expert("e2", 0.5)])


@pytest.fixture
def train_task():
    return tasks.load("arith", split="train", n=8, seed=2)


@pytest.fixture
def eval_task():
    return tasks.load("arith", split="test", n=5, seed=2)


class DigitRewardTrainer(CRLTrainer):
    """A custom trainer (reward: the learner's answer contains a digit), so a random model gets signal."""

    def collect(self, examples, seed):
        episodes = self.play(examples, seed)
        rewards = [float(any(c.isdigit() for c in ep.turns_of(self.learner)[0].text)) for ep in episodes]
        r, index = self.group(episodes, rewards, len(examples))
        return RolloutBatch(episodes, r, index, rollouts=len(episodes))


# ---------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_the_sampler(learner, temperature):
    msgs = [[{"role": "user", "content": q}] for q in ("What is 1 + 2?", "What is 47 - 5?", "Hi")]
    gens = learner.generate([Request(m, SamplingParams(temperature=temperature, max_new_tokens=7, seed=k))
                             for k, m in enumerate(msgs)])
    lp, mask = token_logprobs(learner.model, [g.prompt_token_ids for g in gens], [g.token_ids for g in gens],
                              temperature=temperature, pad_id=learner.tokenizer.pad_token_id)
    for row, g in enumerate(gens):
        n = len(g.token_ids)
        assert mask[row].sum() == n
        assert torch.allclose(lp[row, :n], torch.tensor(g.logprobs), atol=1e-4)
    # a wrong temperature gives different numbers: the division is really applied
    lp2, _ = token_logprobs(learner.model, [g.prompt_token_ids for g in gens], [g.token_ids for g in gens],
                            temperature=temperature * 2, pad_id=learner.tokenizer.pad_token_id)
    assert not torch.allclose(lp, lp2, atol=1e-3)


def test_stopped_turns_also_train_their_stop_token():
    from crl_envs.runner import Episode, TurnRecord

    def turn(agent, reason):
        return TurnRecord(0, "answer", agent, "m", [], "x", [1, 2], [5, 6], [-0.5, -0.25], reason)

    ep = Episode("vote_v0", "q", 0, ["model_0", "model_1"], 1.0, "3", "3", {}, {},
                 [turn("model_1", "stop"), turn("model_0", "stop"), turn("model_1", "length")])
    seqs = learner_sequences([ep], "model_1", [0.5], eos_token_id=99)
    assert [s.completion_ids for s in seqs] == [[5, 6, 99], [5, 6]]  # partner turn ignored; no stop at "length"
    assert seqs[0].logprobs[:2] == [-0.5, -0.25] and seqs[0].logprobs[2] != seqs[0].logprobs[2]  # nan: filled later
    assert [s.completion_ids for s in learner_sequences([ep], "model_1", [0.5])] == [[5, 6], [5, 6]]


# ---------------------------------------------------------------------- costs
@pytest.fixture
def calls(monkeypatch):
    """Every run_episodes call the trainers make: (protocol, coalition, samples, examples)."""
    seen = []
    real = rollout_module.run_episodes

    def spy(protocol, pool, task, **kw):
        episodes = real(protocol, pool, task, **kw)
        seen.append({"coalition": kw.get("coalition"), "samples": kw["samples"], "examples": len(kw["examples"]),
                     "episodes": len(episodes), "members": [ep.coalition for ep in episodes], "played": episodes})
        return episodes

    monkeypatch.setattr(rollout_module, "run_episodes", spy)
    return seen


def test_crl_costs_g_system_rollouts_per_question_and_never_drops_the_learner(pool, train_task, calls):
    trainer = CRLTrainer("debate", pool, train_task, learner="model_1", config=CRLConfig(steps=2, **FAST))
    history = trainer.fit()
    assert len(calls) == 2
    for c in calls:
        assert c["samples"] == 4 and c["episodes"] == 2 * 4
        assert all(set(m) == {"model_0", "model_1", "model_2"} for m in c["members"])
    assert trainer.rollouts == history[-1]["rollouts"] == 2 * 2 * 4  # steps x questions x G


def test_baselines_costs(pool, train_task, calls):
    GRPOTrainer("debate", pool, train_task, learner="model_1", config=GRPOConfig(steps=1, **FAST)).fit()
    assert [c["members"][0] for c in calls] == [["model_1"]] and calls[0]["episodes"] == 8  # alone, G per question
    calls.clear()
    loo = LOORewardTrainer("debate", pool, train_task, learner="model_1", config=LOORewardConfig(steps=1, **FAST))
    loo.fit()
    assert [c["members"][0] for c in calls] == [["model_0", "model_1", "model_2"], ["model_0", "model_2"]]
    assert loo.rollouts == 2 * 4 + 2  # G per question + one counterfactual per question
    calls.clear()
    shap = ShapleyCreditTrainer("vote", pool, train_task, learner="model_1", config=ShapleyCreditConfig(steps=1, **FAST))
    shap.fit()
    coalitions = sorted(tuple(c["members"][0]) for c in calls)
    assert coalitions == sorted([("model_1",), ("model_0", "model_1"), ("model_1", "model_2"),
                                 ("model_0", "model_1", "model_2")])
    assert shap.rollouts == 4 * 2 * 4
    weights = [w for _, w in shap.coalitions(0)]
    assert sorted(weights) == pytest.approx(sorted([4 / 3, 4 / 6, 4 / 6, 4 / 3]))  # K * w(T), n = 3


def test_sampled_shapley_coalitions_always_contain_the_learner(pool, train_task):
    cfg = ShapleyCreditConfig(coalitions_per_question=20, **FAST)
    shap = ShapleyCreditTrainer("vote", pool, train_task, learner="model_1", config=cfg)
    drawn = shap.coalitions(seed=3)
    assert len(drawn) == 20 and all("model_1" in m and w == 1.0 for m, w in drawn)
    assert len({len(m) for m, _ in drawn}) == 3  # every coalition size appears
    assert drawn == shap.coalitions(seed=3)


# ---------------------------------------------------------------------- training, checkpoints, metrics
def _weights(trainer):
    return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}


def test_training_changes_the_learner_copy_not_the_pool(pool, train_task):
    before = _weights_of(pool["model_1"])
    trainer = DigitRewardTrainer("vote", pool, train_task, learner="model_1",
                                 config=CRLConfig(steps=2, learning_rate=1e-2, **FAST))
    history = trainer.fit()
    assert any(h["grad_norm"] > 0 for h in history)
    after = _weights(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert all(torch.equal(before[n], w) for n, w in _weights_of(pool["model_1"]).items())


def _weights_of(agent):
    return {n: p.detach().clone() for n, p in agent.model.named_parameters()}


def test_resume_after_a_kill_reproduces_an_uninterrupted_run(pool, train_task, tmp_path):
    def make(out):
        cfg = CRLConfig(steps=3, save_steps=1, learning_rate=1e-2, output_dir=str(out), **FAST)
        return DigitRewardTrainer("vote", pool, train_task, learner="model_1", config=cfg)

    straight = make(tmp_path / "a")
    straight.fit()
    interrupted = make(tmp_path / "b")
    interrupted.fit(steps=2)
    (tmp_path / "b" / ".tmp-checkpoint-000003-999").mkdir()  # debris of a kill during a save
    (tmp_path / "b" / "checkpoint-000009").mkdir()  # a checkpoint dir without state.json
    resumed = make(tmp_path / "b")
    assert resumed.load_checkpoint() and resumed.step == 2 and resumed.rollouts == 2 * 2 * 4
    resumed.fit()
    a, b = _weights(straight), _weights(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert lines[-1]["rollouts"] == 3 * 2 * 4
    for key in ("system_score", "standalone_score", "reward_std", "zero_variance_groups", "kl", "clip_fraction",
                "tokens_per_second"):
        assert key in lines[-1]
    assert list((tmp_path / "b" / "tensorboard").glob("events.out.tfevents.*"))


def test_lora_trains_only_the_adapter_and_checkpoints_it(pool, train_task, tmp_path):
    cfg = CRLConfig(steps=1, learning_rate=1e-2, lora=LoraSettings(r=4, alpha=8), beta=0.1, output_dir=str(tmp_path), **FAST)
    trainer = DigitRewardTrainer("vote", pool, train_task, learner="model_1", config=cfg)
    trainable = [n for n, p in trainer.policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen_before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if not p.requires_grad}
    history = trainer.fit()
    assert history[0]["grad_norm"] > 0 and history[0]["kl"] >= 0
    for n, p in trainer.policy.model.named_parameters():
        if not p.requires_grad:
            assert torch.equal(p, frozen_before[n])
    saved = torch.load(tmp_path / "checkpoint-000001" / "trainable.pt")
    assert set(saved) == set(trainable)
    out = trainer.save_model(tmp_path / "adapter")
    assert (out / "adapter_config.json").exists()


def test_kl_to_the_reference_grows_from_zero(pool, train_task):
    cfg = CRLConfig(steps=3, learning_rate=3e-2, beta=0.05, **FAST)
    history = DigitRewardTrainer("vote", pool, train_task, learner="model_1", config=cfg).fit()
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the first step's policy is the reference
    assert history[-1]["kl"] > 1e-6


def test_evaluate_is_greedy_and_deterministic(pool, train_task, eval_task):
    trainer = CRLTrainer("debate", pool, train_task, learner="model_1", config=CRLConfig(**FAST), eval_task=eval_task)
    a, b = trainer.evaluate(), trainer.evaluate()
    assert a.example_ids == [ex.id for ex in eval_task] and a.system.shape == (5,)
    assert (a.system == b.system).all() and (a.standalone == b.standalone).all()
    assert a.standalone_accuracy == 0.0  # a random model never answers arithmetic
    # routing defines standalone only for the chosen model: the learner then answers alone
    routed = CRLTrainer("routing", pool, train_task, learner="model_1", config=CRLConfig(**FAST), eval_task=eval_task)
    assert routed.evaluate().standalone.shape == (5,)


def test_paired_bootstrap_ci():
    mean, lo, hi = paired_bootstrap_ci([0, 0, 1, 0] * 25, [1, 0, 1, 1] * 25)
    assert mean == pytest.approx(0.5) and lo < 0.5 < hi and lo > 0.3
    with pytest.raises(ValueError):
        paired_bootstrap_ci([], [])


# ---------------------------------------------------------------------- errors
def test_bad_input_raises_clear_errors(pool, train_task):
    with pytest.raises(ValueError, match="learner 'model_9' is not in the pool"):
        CRLTrainer("vote", pool, train_task, learner="model_9")
    with pytest.raises(TypeError, match="make the learner an agents.HFAgent"):
        CRLTrainer("vote", pool, train_task, learner="model_0")
    with pytest.raises(ValueError, match="unknown loss_type 'ppo2'"):
        CRLTrainer("vote", pool, train_task, learner="model_1", config=CRLConfig(loss_type="ppo2"))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        CRLTrainer("vote", pool, train_task, learner="model_1", config=CRLConfig(advantage="median"))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        CRLConfig(temperature=0)
    with pytest.raises(ValueError, match="num_generations must be an int >= 1"):
        CRLConfig(num_generations=0)
    with pytest.raises(ValueError, match="evaluate\\(\\) needs held-out questions"):
        CRLTrainer("vote", pool, train_task, learner="model_1", config=CRLConfig(**FAST)).evaluate()


# ---------------------------------------------------------------------- end to end on the zoo
@pytest.mark.slow
def test_crl_on_the_zoo_end_to_end(calls):
    """C-RL trains the zoo's weakest model (zoo-rookie) as the judge of the 5-model judge_v0 (48 steps x
    8 questions x G=8, lr 1e-3) and raises the system's accuracy on 400 held-out questions.

    What must hold: exactly steps x questions x G system rollouts, every one with the full coalition;
    the CI of the gain excludes 0 and the gain is at least 5 points; and *how* it is gained. The
    rookie's verdicts are worse than the protocol's fallback (the candidates' plurality, used when a
    verdict names no candidate), and C-RL finds that: after training it names nobody on most
    questions, so the system votes. The system's outcome is the only reward, so this is what C-RL
    should find; judge_v0(fallback="none") removes the shortcut (see examples/compare_trainers.py).
    Measured: 0.703 -> 0.855 (+15.3 [+11.5, +19.0]) at 24 steps, seed 0; seeds 1 and 2 +2.8 and
    +16.5. At 48 steps all three seeds reach 0.850 on 200 questions (compare_trainers, judge-plurality).
    """
    import agents.zoo
    from crl_envs.protocols.roles import parse_choice

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is several times faster on a busy 2-core CPU
    try:
        pool = agents.pool("zoo")
        learner = pool.ids[agents.zoo.NAMES.index("zoo-rookie")]
        train = tasks.load("arith", split="train", n=1000, **agents.zoo.TASK_OPTIONS)
        held_out = tasks.load("arith", split="test", n=400, **agents.zoo.TASK_OPTIONS)
        config = CRLConfig(steps=48, questions_per_step=8, num_generations=8, temperature=1.0, learning_rate=1e-3,
                           max_new_tokens=24, protocol_options={"judge": learner}, progress=False)
        trainer = CRLTrainer("judge", pool, train, learner=learner, config=config, eval_task=held_out)
        before = trainer.evaluate()
        trainer.fit()
        after = trainer.evaluate()
    finally:
        torch.set_num_threads(threads)
    evaluation_before, *training, evaluation_after = calls  # evaluate() plays the held-out questions once

    def verdicts_naming_a_candidate(evaluation) -> float:
        return float(np.mean([parse_choice(ep.turns_of(learner)[-1].text, len(pool)) is not None
                              for ep in evaluation["played"]]))

    named_before, named_after = verdicts_naming_a_candidate(evaluation_before), verdicts_naming_a_candidate(evaluation_after)
    assert trainer.rollouts == 48 * 8 * 8 == sum(c["episodes"] for c in training)
    assert all(set(m) == set(pool.ids) for c in training for m in c["members"])
    mean, low, high = paired_bootstrap_ci(before.system, after.system)
    figures = (f"system accuracy {before.system_accuracy:.3f} -> {after.system_accuracy:.3f}, "
               f"Δ {mean:+.3f} [{low:+.3f}, {high:+.3f}]; verdicts naming a candidate {named_before:.2f} -> "
               f"{named_after:.2f}")
    assert low > 0 and mean >= 0.05, f"C-RL did not raise the system significantly: {figures}"
    assert named_before > 0.9 and named_after < 0.5, f"C-RL gained otherwise than by deferring to the vote: {figures}"
