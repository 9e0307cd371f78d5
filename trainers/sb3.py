"""Discrete roles (a router, a picker) trained with stable-baselines3: a single-agent gymnasium view
of any protocol env.

:class:`SingleAgentEnv` controls one agent whose action space is ``Discrete(n)`` (e.g.
``routing_v0(router="discrete")``'s ``router_0``); every other active agent is played by its model
from the pool. Observations are a bounded ``Box`` of features of the question (SB3 cannot buffer
``Text`` spaces), actions are the discrete choice, and :meth:`SingleAgentEnv.action_masks` follows
sb3-contrib's ``MaskablePPO`` convention (read from the protocol observation's ``"action_mask"``).

SB3 steps one env at a time and needs the protocol to wait for each decision, so the wrapper steps ONE
episode with the runner's episode driver (:class:`crl_envs.runner.EpisodeStepper`: the same requests,
seeds and finish reasons as :func:`crl_envs.run_episodes`), with one batched ``generate`` per Agent per
phase. Greedy answers are cached by (agent, prompt): the router's choice only selects which model
answers, so after the first visit of a question every answer is a cache hit and an SB3 step costs no
model call.

Example:
    >>> import agents, crl_envs
    >>> from sb3_contrib import MaskablePPO  # the [sb3] extra
    >>> pool = agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.9, 0.6, 0.3)])
    >>> env = SingleAgentEnv(crl_envs.routing_v0, pool, "arith", agent="router_0", options={"router": "discrete"})
    >>> MaskablePPO("MlpPolicy", env, n_steps=16, batch_size=16, n_epochs=1, seed=0).learn(16).num_timesteps
    16
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from agents import Agent, Generation, Pool, SamplingParams
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.runner import EpisodeStepper, generate_grouped
from crl_envs.tasks import Example, Task
from crl_kit.errors import ConfigError

Featurizer = Callable[[str], np.ndarray]


class HashedFeatures:
    """A question as a fixed-size bag of hashed character n-grams and words, frequencies in [0, 1].

    Cheap, deterministic and model-free; swap in any ``Callable[[str], np.ndarray]`` (e.g. a sentence
    embedding) with values in ``[low, high]``.
    """

    low, high = 0.0, 1.0

    def __init__(self, dim: int = 64, ngrams: Sequence[int] = (1, 2, 3)):
        if dim < 1:
            raise ConfigError(f"feature dim must be >= 1, got {dim}")
        self.dim, self.ngrams = dim, tuple(ngrams)

    def __call__(self, text: str) -> np.ndarray:
        out = np.zeros(self.dim, dtype=np.float32)
        grams = [text[i : i + n] for n in self.ngrams for i in range(len(text) - n + 1)] + text.split()
        for g in grams:
            out[zlib.crc32(g.encode()) % self.dim] += 1.0
        return out / max(len(grams), 1)


class SingleAgentEnv(gymnasium.Env):
    """One agent of a protocol env as a gymnasium ``Env``; the pool plays everyone else.

    Args:
        protocol: a protocol factory or name.
        pool, task: the models and the questions (an episode is one question).
        agent: the controlled agent id; its action space must be ``Discrete``.
        options: protocol options (e.g. ``{"router": "discrete"}``).
        featurizer: question text -> feature vector (default :class:`HashedFeatures`).
        sampling: the other agents' sampling (default greedy, 64 tokens); answers are cached when greedy.
        coalition: pool members taking part (default all).
        examples: question order: ``"random"`` (drawn with the env's RNG, default) or ``"cycle"``
            (every question in turn, for evaluation).

    ``info`` at the end of an episode carries the protocol's final infos (``answer``, ``score``, ...).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        protocol: Any,
        pool: Pool | Sequence[Agent | str] | str,
        task: Task | str,
        agent: str = "router_0",
        *,
        options: Mapping[str, Any] | None = None,
        featurizer: Featurizer | None = None,
        sampling: SamplingParams | None = None,
        coalition: Sequence[str | int] | None = None,
        examples: str = "random",
    ):
        self.factory = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        self.task = task if isinstance(task, Task) else task_registry.load(task)
        self.options = dict(options or {})
        self.agent = agent
        self.coalition = list(coalition) if coalition is not None else None
        if examples not in ("random", "cycle"):
            raise ConfigError(f"examples must be 'random' or 'cycle', got {examples!r}")
        self.order = examples
        self.sampling = sampling or SamplingParams(temperature=0.0, max_new_tokens=64)
        self.featurizer = featurizer or HashedFeatures()
        self._env = self.factory(self.pool, self.task, **self.options)
        if agent not in self._env.possible_agents:
            raise ConfigError(f"no agent {agent!r} in {self._env.metadata['name']}; agents are {self._env.possible_agents}")
        inner = self._env.action_space(agent)
        if not isinstance(inner, spaces.Discrete):
            raise ConfigError(
                f"{self._env.metadata['name']}'s {agent!r} has a {type(inner).__name__} action space; the SB3 wrapper "
                "needs a Discrete one (e.g. routing_v0 with options={'router': 'discrete'})"
            )
        self.action_space = spaces.Discrete(int(inner.n))
        probe = np.asarray(self.featurizer(self.task.prompt(self.task[0])), dtype=np.float32)
        low, high = getattr(self.featurizer, "low", -np.inf), getattr(self.featurizer, "high", np.inf)
        self.observation_space = spaces.Box(low, high, probe.shape, np.float32)
        self._cache: dict[tuple, Generation] = {}
        self.model_calls = 0
        self._cursor = 0
        self._stepper: EpisodeStepper | None = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        example = options.get("example")
        if example is None:
            if self.order == "cycle":
                example, self._cursor = self.task[self._cursor % len(self.task)], self._cursor + 1
            else:
                example = self.task[int(self.np_random.integers(len(self.task)))]
        episode_seed = int(self.np_random.integers(2**31))
        self._stepper = EpisodeStepper(self._env, example, coalition=self.coalition, seed=episode_seed,
                                       sampling=self.sampling)
        reward, done, info = self._advance()
        if done:
            raise RuntimeError(f"{self._env.metadata['name']} ended before {self.agent!r} acted")
        return self._features(), info

    def step(self, action):
        if self._stepper is None or self._stepper.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self._stepper.give(self._others_generations(), actions={self.agent: int(action)})
        reward = float(self._stepper.rewards.get(self.agent, 0.0))
        more, done, info = (0.0, True, self._final_info()) if self._stepper.done else self._advance()
        return self._features(), reward + more, done, False, info

    def action_masks(self) -> np.ndarray:
        """Valid actions now (MaskablePPO's convention): the protocol's ``action_mask``, else all."""
        obs = self._stepper.observations.get(self.agent) if self._stepper is not None else None
        if isinstance(obs, Mapping) and "action_mask" in obs:
            return np.asarray(obs["action_mask"], dtype=bool)
        return np.ones(self.action_space.n, dtype=bool)

    def prefill(self, episodes) -> int:
        """Load answers already played through :func:`crl_envs.run_episodes` (greedy, with the same
        ``max_new_tokens``) into the answer cache: batched precomputation for the sb3 path. Returns
        how many answers were added."""
        if self.sampling.temperature != 0:
            raise ConfigError("prefill needs greedy sampling (answers are only cached when temperature == 0)")
        added = 0
        for ep in episodes:
            for turn in ep.transcript:
                if turn.agent == self.agent:
                    continue
                key = (id(self._env.agent_for(turn.agent)), turn.agent, repr(turn.messages))
                added += key not in self._cache
                self._cache[key] = Generation(turn.text, finish_reason=turn.finish_reason)
        return added

    @property
    def example(self) -> Example | None:
        return self._env.example

    # ------------------------------------------------------------------ internals
    def _features(self) -> np.ndarray:
        return np.asarray(self.featurizer(self.task.prompt(self._env.example)), dtype=np.float32)

    def _advance(self) -> tuple[float, bool, dict]:
        """Play phases without the controlled agent until it must act or the episode ends."""
        total, stepper = 0.0, self._stepper
        while not stepper.done and self.agent not in {agent_id for agent_id, _, _ in stepper.requests}:
            stepper.give(self._others_generations())
            total += float(stepper.rewards.get(self.agent, 0.0))
        if stepper.done:
            return total, True, self._final_info()
        return total, False, {}

    def _final_info(self) -> dict[str, Any]:
        infos = self._stepper.infos
        return dict(next(iter(infos.values()), {})) if infos else {}

    def _others_generations(self) -> list[Generation]:
        """The generations of every other active agent's request, in the stepper's order: one batched
        ``generate`` per Agent for this phase, greedy answers cached (finish reasons included)."""
        greedy = self.sampling.temperature == 0
        planned = [(model, request, (id(model), agent_id, repr(request.messages)))
                   for agent_id, model, request in self._stepper.requests if agent_id != self.agent]
        todo = [(model, request, key) for model, request, key in planned if not (greedy and key in self._cache)]
        generations = generate_grouped([(model, request) for model, request, _ in todo])
        self.model_calls += len({id(model) for model, _, _ in todo})
        made = {key: g for (_, _, key), g in zip(todo, generations)}
        if greedy:
            self._cache.update(made)
        return [made[key] if key in made else replace(self._cache[key]) for _, _, key in planned]
