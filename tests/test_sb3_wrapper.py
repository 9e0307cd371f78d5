"""The single-agent gymnasium wrapper for discrete roles (stable-baselines3 / sb3-contrib)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import agents
import crl_envs
from crl_envs import tasks
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv
from trainers.sb3 import HashedFeatures, SingleAgentEnv


class PickEnv(ProtocolEnv):
    """Test protocol: every member answers, then ``picker_0`` (Discrete) picks whose answer counts."""

    metadata = {"name": "pick_v0", "render_modes": ["human"], "is_parallelizable": True}
    PROMPTS = {"answer": "{question}"}

    def __init__(self, pool, task, **kw):
        super().__init__(pool, task, **kw)
        self.add_role("picker_0", agents.ScriptedAgent("unused", lambda ex, m: "0"))

    def _make_action_space(self, agent):
        return spaces.Discrete(len(self.pool)) if agent == "picker_0" else super()._make_action_space(agent)

    def _observe(self):
        obs, infos = super()._observe()
        if "picker_0" in obs:
            obs["picker_0"] = {**obs["picker_0"], "action_mask": np.array([a in self.members for a in self.pool.ids], np.int8)}
        return obs, infos

    def _play(self):
        texts = yield Phase("answer", {a: self.messages("answer") for a in self.members})
        pick = yield Phase("pick", {"picker_0": self.messages("answer")})
        chosen = self.pool.ids[int(pick["picker_0"])]
        answers = {a: self.extract(texts[a]) for a in self.members}
        return Outcome(answer=answers.get(chosen), answers=answers)


@pytest.fixture
def task():
    return tasks.load("arith", n=30, seed=4)


def _alone_scores(pool, task):
    """Each model's correctness per question, answering alone (independent of the wrapper)."""
    out = {}
    for k, agent_id in enumerate(pool.ids):
        eps = crl_envs.run_episodes("vote", pool, task, coalition=[agent_id], progress=False)
        out[k] = {ep.example_id: ep.score for ep in eps}
    return out


@pytest.mark.parametrize("protocol", ["routing", PickEnv])
def test_reward_is_the_chosen_models_correctness(scripted_pool, task, protocol):
    options = {"router": "discrete"} if protocol == "routing" else {}
    agent = "router_0" if protocol == "routing" else "picker_0"
    env = SingleAgentEnv(protocol, scripted_pool, task, agent=agent, options=options, examples="cycle")
    assert isinstance(env.action_space, spaces.Discrete) and env.action_space.n == 3
    truth = _alone_scores(scripted_pool, task)
    for k in range(3):
        for _ in range(len(task)):
            obs, _ = env.reset()
            assert obs.shape == env.observation_space.shape and env.observation_space.contains(obs)
            assert env.action_masks().tolist() == [True, True, True]
            obs, reward, terminated, truncated, info = env.step(k)
            assert terminated and not truncated
            assert reward == truth[k][env.example.id] == info["score"]


def test_mask_follows_the_coalition_and_cache_saves_calls(scripted_pool, task):
    env = SingleAgentEnv("routing", scripted_pool, task, options={"router": "discrete"}, coalition=["model_0", "model_2"],
                         examples="cycle")
    env.reset(seed=0)
    assert env.action_masks().tolist() == [True, False, True]
    for _ in range(2 * len(task)):
        env.reset()
        env.step(2)
    assert env.model_calls == len(task)  # second pass over the questions: all cache hits




def test_sb3_env_checker_and_maskable_ppo_learns_the_best_model(task, one_thread):
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_checker import check_env

    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.2, 0.95, 0.4)])
    env = SingleAgentEnv("routing", pool, task, options={"router": "discrete"}, featurizer=HashedFeatures(16))
    check_env(env, warn=True)
    model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=4, learning_rate=3e-3, seed=0,
                        verbose=0)
    model.learn(1024)
    picks = []
    for _ in range(40):
        obs, _ = env.reset()
        action, _ = model.predict(obs, action_masks=env.action_masks(), deterministic=True)
        picks.append(int(action))
    assert np.mean(np.array(picks) == 1) > 0.8  # model_1 (95%) is the best single model


def test_non_discrete_agents_are_refused(scripted_pool, task):
    with pytest.raises(ValueError, match="needs a Discrete one"):
        SingleAgentEnv("debate", scripted_pool, task, agent="model_0")
    with pytest.raises(ValueError, match="no agent 'router_9'"):
        SingleAgentEnv("routing", scripted_pool, task, agent="router_9", options={"router": "discrete"})


def test_prefill_from_the_runner_leaves_no_model_calls(scripted_pool, task):
    episodes = []
    for k in range(3):
        router = agents.ScriptedAgent(f"always-{k}", lambda ex, msgs, k=k: str(k))
        episodes += crl_envs.run_episodes("routing", scripted_pool, task, progress=False,
                                          options={"router": "discrete", "router_agent": router})
    env = SingleAgentEnv("routing", scripted_pool, task, options={"router": "discrete"}, examples="cycle")
    assert env.prefill(episodes) == 3 * len(task)
    truth = {(k, ep.example_id): ep.score for k in range(3) for ep in episodes[k * len(task):(k + 1) * len(task)]}
    for step in range(3 * len(task)):
        env.reset()
        _, reward, *_ = env.step(step % 3)
        assert reward == truth[(step % 3, env.example.id)]
    assert env.model_calls == 0
