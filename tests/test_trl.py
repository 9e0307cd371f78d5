"""C-RL on TRL's GRPOTrainer (trainers.trl): same rollouts and same maths as CRLTrainer, real TRL on both sides.

The learner is the zoo's rookie as a candidate *and* the judge of judge_v0 (two turns per episode), so
every test also covers the multi-turn layout (one completion row per learner turn).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

import agents  # noqa: E402
import agents.zoo  # noqa: E402
import trainers.rollout as rollout_module  # noqa: E402
from crl_envs import tasks  # noqa: E402
from trainers import LossInputs, compute_advantages, learner_sequences, token_logprobs  # noqa: E402
from trainers.losses import get_loss  # noqa: E402
from trainers.trl import CRLRollout, loo_reward, standalone_reward, system_reward  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
LEARNER, G, K, TOKENS = "model_4", 4, 2, 24
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def zoo():
    return agents.pool("zoo")


@pytest.fixture(scope="module")
def train():
    return tasks.load("arith", split="train", n=40, **agents.zoo.TASK_OPTIONS)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (conftest's ``one_thread``)."""


def make(zoo, train, tmp_path, *, reward="system", questions=2, **overrides):
    rollout = CRLRollout("judge", zoo, train, learner=LEARNER, protocol_options={"judge": LEARNER},
                         turns_per_episode=K, reward=reward, seed=3)
    settings = dict(max_completion_length=TOKENS, learning_rate=1e-3, max_steps=2, seed=0)
    args = rollout.grpo_config(str(tmp_path / "trl"), num_generations=G, questions_per_step=questions,
                               **{**settings, **overrides})
    return rollout, rollout.grpo_trainer(args)


def prepared_batch(trainer, questions):
    """TRL's own preparation of one step's batch (rollout_func -> rewards -> advantages), in training mode."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop; GA = 1 here
    inputs = [{"prompt": q} for q in questions for _ in range(G * K)]
    return trainer._generate_and_score_completions(inputs)


def our_loss(trainer, rollout, advantages_per_episode, loss_type):
    """CRLTrainer's loss (trainers.base.PolicyGradientTrainer.optimise, one micro-batch) on the same episodes."""
    tokenizer = trainer.processing_class
    seqs = learner_sequences(rollout.episodes, LEARNER, advantages_per_episode, eos_token_id=tokenizer.eos_token_id)
    model = trainer.model
    logprobs, mask = token_logprobs(model, [s.prompt_ids for s in seqs], [s.completion_ids for s in seqs],
                                    temperature=trainer.args.temperature, pad_id=tokenizer.pad_token_id)
    old = torch.zeros_like(logprobs)
    for row, s in enumerate(seqs):
        old[row, : len(s.logprobs)] = torch.tensor(s.logprobs)
    old = torch.where(torch.isnan(old), logprobs.detach(), old)
    inputs = LossInputs(logprobs=logprobs, old_logprobs=old, advantages=torch.tensor([s.advantage for s in seqs]),
                        mask=mask, total_tokens=sum(len(s.completion_ids) for s in seqs), total_sequences=len(seqs),
                        max_len=TOKENS)
    loss, _ = get_loss(loss_type)(inputs)
    return loss, seqs


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_trl_advantages_and_loss_equal_crltrainer_on_the_same_episodes(zoo, train, tmp_path, loss_type):
    rollout, trainer = make(zoo, train, tmp_path, loss_type=loss_type)
    questions = [train[0].question, train[1].question]
    batch = prepared_batch(trainer, questions)
    assert len(rollout.episodes) == 2 * G  # G system episodes per question, not G x K

    # advantages: TRL (scale_rewards="none") == our group_mean, row by row (each row = its episode's)
    rewards = torch.tensor([ep.score for ep in rollout.episodes], dtype=torch.float64).reshape(2, G)
    ours = compute_advantages("group_mean", rewards).reshape(-1)
    assert rewards.std(dim=1).sum() > 0, "no reward variance: the test would compare zeros"
    expected = torch.tensor([float(ours[rollout.row_episode[r]]) for r in range(2 * G * K)])
    torch.testing.assert_close(batch["advantages"].double().cpu(), expected.double(), atol=1e-6, rtol=0)

    # loss over the learner's tokens: TRL's compute_loss == ours, within 1e-5, and so are the gradients
    trainer.model.zero_grad()
    trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad()
    loss, seqs = our_loss(trainer, rollout, ours.tolist(), loss_type)
    loss.backward()
    assert abs(float(trl_loss) - float(loss)) < 1e-5 and float(loss) != 0.0
    for name, grad in trl_grads.items():
        torch.testing.assert_close(grad, dict(trainer.model.named_parameters())[name].grad, atol=1e-5, rtol=1e-4)

    # what gets gradient: exactly the learner's own tokens (each turn + its stop token), nothing of the partners'
    assert int(batch["num_items_in_batch"]) == sum(len(s.completion_ids) for s in seqs)
    rows = [batch["completion_ids"][r][batch["completion_mask"][r].bool()].tolist() for r in range(2 * G * K)]
    assert sorted(rows) == sorted(s.completion_ids for s in seqs)
    for ep in rollout.episodes:
        assert len(ep.turns_of(LEARNER)) == K and len(ep.transcript) > K  # partners spoke too, in no completion row


def test_mask_relative_positions_scores_left_padded_rows_as_generation_does(zoo):
    """TRL's GRPO forward passes no position_ids with left padding; GPT-2 then scores shifted positions."""
    from trainers.trl import mask_relative_positions

    agent = zoo[LEARNER]
    ids = agent.encode_prompt([{"role": "user", "content": "What is 12 + 34?"}])
    pad = agent.tokenizer.pad_token_id
    padded = torch.tensor([[pad] * 5 + ids, ids + [pad] * 5])
    mask = torch.tensor([[0] * 5 + [1] * len(ids), [1] * len(ids) + [0] * 5])
    model = copy.deepcopy(agent.model)
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([ids])).logits[0]
        shifted = model(input_ids=padded, attention_mask=mask).logits[0, 5:]
        handle = mask_relative_positions(model)
        fixed = model(input_ids=padded, attention_mask=mask).logits
        handle.remove()
    assert (shifted - alone).abs().max() > 1.0  # without the hook: a different distribution
    torch.testing.assert_close(fixed[0, 5:], alone, atol=1e-4, rtol=0)
    torch.testing.assert_close(fixed[1, : len(ids)], alone, atol=1e-4, rtol=0)  # right padding unchanged


def test_a_step_plays_g_system_episodes_per_question_and_trains_only_the_copy(zoo, train, tmp_path, monkeypatch):
    seen = []
    real = rollout_module.run_episodes

    def spy(protocol, pool, task, **kw):
        episodes = real(protocol, pool, task, **kw)
        seen.append({"samples": kw["samples"], "examples": list(kw["examples"]), "members": [ep.coalition for ep in episodes]})
        return episodes

    monkeypatch.setattr(rollout_module, "run_episodes", spy)
    before = {a: {n: p.detach().clone() for n, p in zoo[a].model.named_parameters()} for a in zoo.ids}
    rollout, trainer = make(zoo, train, tmp_path, questions=2)
    start = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert len(seen) == 2  # one runner call per step
    for call in seen:
        assert call["samples"] == G and len(call["examples"]) == 2
        assert all(set(m) == set(zoo.ids) for m in call["members"])  # never a coalition without the learner
    assert rollout.rollouts == 2 * 2 * G
    assert [c["step"] for c in rollout.calls] == [0, 1]
    assert any(not torch.equal(start[n], p) for n, p in trainer.model.named_parameters())
    for a in zoo.ids:  # the pool (partners and the learner's original) is never modified
        assert all(torch.equal(before[a][n], p) for n, p in zoo[a].model.named_parameters())


def test_loo_reward_gives_c_rl_advantages_and_standalone_plays_the_learner_alone(zoo, train, tmp_path, monkeypatch):
    questions = [train[2].question, train[3].question]
    rollout, trainer = make(zoo, train, tmp_path / "crl")
    crl = prepared_batch(trainer, questions)
    seen = []
    real = rollout_module.run_episodes
    monkeypatch.setattr(rollout_module, "run_episodes",
                        lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    loo_rollout, loo_trainer = make(zoo, train, tmp_path / "loo", reward="loo")
    loo = prepared_batch(loo_trainer, questions)
    assert [ep.score for ep in loo_rollout.episodes] == [ep.score for ep in rollout.episodes]  # same seeds, same play
    torch.testing.assert_close(loo["advantages"], crl["advantages"])  # v(N \ {i}) cancels under the group mean
    without = [kw for kw in seen if kw["coalition"] is not None]
    assert len(without) == 1 and LEARNER not in without[0]["coalition"] and without[0]["samples"] == 1
    assert loo_rollout.rollouts == 2 * G + 2

    seen.clear()
    alone_rollout, alone_trainer = make(zoo, train, tmp_path / "alone", reward="standalone")
    prepared_batch(alone_trainer, questions)
    assert len(seen) == 1 and seen[0]["coalition"] == [LEARNER]
    assert all(ep.coalition == [LEARNER] and ep.protocol == "vote_v0" for ep in alone_rollout.episodes)


def test_reward_functions_read_their_field_or_name_the_fix():
    assert system_reward(["a", "b"], system_score=[1.0, 0.0]) == [1.0, 0.0]
    assert loo_reward(["a"], loo_reward=[-1.0]) == [-1.0]
    with pytest.raises(ValueError, match="reward='standalone'"):
        standalone_reward(["a"], system_score=[1.0])


def test_bad_setups_fail_before_any_episode(zoo, train, tmp_path):
    with pytest.raises(ValueError, match="learner 'model_9' is not in the pool"):
        CRLRollout("judge", zoo, train, learner="model_9")
    with pytest.raises(ValueError, match="reward must be one of"):
        CRLRollout("judge", zoo, train, learner=LEARNER, reward="shapley")
    with pytest.raises(TypeError, match="make the learner an agents.HFAgent"):
        CRLRollout("vote", agents.pool([agents.ScriptedAgent.expert("e", 0.5)]), train, learner="model_0")
    rollout = CRLRollout("judge", zoo, train, learner=LEARNER, protocol_options={"judge": LEARNER})  # K = 1: wrong
    with pytest.raises(ValueError, match="G x turns_per_episode|num_generations"):
        rollout.grpo_config(str(tmp_path), num_generations=1)
    trainer = rollout.grpo_trainer(rollout.grpo_config(str(tmp_path), num_generations=2, questions_per_step=1,
                                                       max_completion_length=TOKENS))
    trainer.model.train()
    with pytest.raises(ValueError, match="the learner spoke 2 times.*raise turns_per_episode"):
        trainer._generate_and_score_completions([{"prompt": train[0].question}] * 2)
    with pytest.raises(ValueError, match="not a question of the rollout's task"):
        rollout(["What is the capital of France?"] * 2, trainer)


# ---------------------------------------------------------------------- a real multi-process run
DDP_SCRIPT = r'''
import json, os, sys, torch
import agents, agents.zoo
from crl_envs import tasks
from trainers.trl import CRLRollout
torch.set_num_threads(1)
pool = agents.pool("zoo")
train = tasks.load("arith", split="train", n=40, **agents.zoo.TASK_OPTIONS)
rollout = CRLRollout("judge", pool, train, learner="model_4", protocol_options={"judge": "model_4"}, turns_per_episode=2)
args = rollout.grpo_config(sys.argv[1], num_generations=4, questions_per_step=4, max_completion_length=24,
                           learning_rate=1e-3, max_steps=2, seed=0)
trainer = rollout.grpo_trainer(args)
backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
trainer.train()
rank = trainer.accelerator.process_index
weights = {n: p.detach().cpu() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()}
torch.save(weights, os.path.join(sys.argv[1], f"weights-{rank}.pt"))
with open(os.path.join(sys.argv[1], f"calls-{rank}.json"), "w") as f:
    json.dump({"calls": rollout.calls, "world": trainer.accelerator.num_processes,
               "backend": backend, "device": str(trainer.accelerator.device),
               "per_device_rows": args.per_device_train_batch_size}, f)
'''


@pytest.mark.slow
def test_accelerate_two_cpu_processes_play_different_questions_and_stay_in_sync(tmp_path):
    script = tmp_path / "ddp_crl.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # `accelerate launch --cpu --num_processes 2` starts ONE process unless MPI is installed (accelerate 1.15's
    # simple launcher); `--multi_gpu` is its torchrun launcher, which on a machine without GPUs runs 2 CPU
    # processes over gloo (DistributedType.MULTI_CPU), as the issue asks.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
           "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads((tmp_path / f"calls-{r}.json").read_text()) for r in (0, 1)]
    assert all(c["world"] == 2 and c["backend"] == "gloo" and c["device"].startswith("cpu") for c in calls)
    assert all(c["per_device_rows"] == 4 * 4 * 2 // 2 for c in calls)  # questions x G x turns, split over 2 ranks
    for step in (0, 1):
        mine = [next(x for x in c["calls"] if x["step"] == step) for c in calls]
        assert all(m["rows"] == [8, 8] and m["episodes"] == 2 * 4 for m in mine)  # 4 questions over 2 ranks, G = 4
        assert not set(mine[0]["questions"]) & set(mine[1]["questions"])  # each rank plays different questions
    w0, w1 = (torch.load(tmp_path / f"weights-{r}.pt") for r in (0, 1))
    assert all(torch.equal(w0[n], w1[n]) for n in w0)  # DDP: identical weights on every rank afterwards
    start = agents.pool("zoo")["model_4"].model.state_dict()
    assert any(not torch.equal(w0[n], start[n]) for n in w0 if n in start)  # and they did train
