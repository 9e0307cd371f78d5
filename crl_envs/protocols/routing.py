"""Routing: a router picks one pool model per question, and that model answers.

| | |
|---|---|
| Import | ``crl_envs.routing_v0(pool, task, router="llm", router_agent=None, descriptions=None)`` |
| Family | routing (MoCo's API level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the router ``router_0`` (a fixed role, never masked, not a player of the coalition game) |
| Phases | 2: ``route`` — only ``router_0`` acts; ``answer`` — only the chosen member answers the question |
| Observation | members: ``{"prompt": str}``; ``router_0``: ``{"prompt": str}`` (``router="llm"``) or ``{"prompt": str, "action_mask": int8 array over the pool, 1 for coalition members}`` (``router="discrete"``) |
| Action | members: ``str``; ``router_0``: ``str`` (``"llm"``) or ``Discrete(len(pool))``, a pool index (``"discrete"``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the chosen member's answer |
| Final infos | ``answer``, ``score``, ``answers`` and ``standalone`` (the chosen member only) |
| Arguments | ``router`` (``"llm"`` or ``"discrete"``), ``router_agent``, ``descriptions``, ``prompts``, ``max_action_chars``, ``render_mode`` |

``router="llm"`` (default): the router is prompted with the question and the present members'
descriptions as lines "Model 1: <description>", numbered by position among the *present* members
(nothing reveals who is absent); the first integer in its text picks the model.
``router="discrete"``: the router's action is a pool index; its observation carries an
``action_mask`` of the coalition's members (PettingZoo's samplers and MaskablePPO respect it).
When the runner plays a discrete router, the first integer in the router agent's text is the index.

**Fallback:** an unparseable choice, a number out of range, or (discrete) a masked or out-of-range
index routes to the first present member (pool order). A masked model never answers.

``router_agent``: the :class:`agents.Agent` (or spec string) that plays ``router_0``. Default: the
pool's first model (``model_0``'s Agent) for ``"llm"``; none for ``"discrete"`` (step the env with
integer actions, e.g. from a stable-baselines3 policy, or pass an agent whose text is an index).
``descriptions``: per pool member, the text shown to an LLM router (a mapping ``agent id -> str`` or
a sequence in pool order); default: each model's name.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the router sees one model; whatever it picks, that member answers alone |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from agents import Agent, Generation, Request
from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers
from crl_envs.protocols.roles import parse_choice
from crl_kit.errors import ConfigError, ModelError

ROUTER = "router_0"
_INTEGER = re.compile(r"-?\d+")


class _NoRouter(Agent):
    """Placeholder for a discrete router nobody supplied: fails with the fix when asked to generate."""

    name = "no-router"

    def _generate(self, requests: list[Request]) -> list[Generation]:
        raise ModelError(
            "routing_v0(router='discrete') has no router model: pass router_agent=<an Agent whose text is a pool "
            "index>, or step the env yourself with integer actions (e.g. from a stable-baselines3 policy)"
        )


class RoutingEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("routing"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "routing"
    PROMPTS = {
        "route": "{question}\n{models}\nWhich model should answer this question? Reply with its number.",
        "answer": "{question}",
    }
    empty_value = 0.0

    def __init__(
        self,
        pool,
        task,
        *,
        router: str = "llm",
        router_agent: Agent | str | None = None,
        descriptions: Mapping[str, str] | Sequence[str] | None = None,
        **kwargs,
    ):
        super().__init__(pool, task, **kwargs)
        if router not in ("llm", "discrete"):
            raise ConfigError(f"routing router must be 'llm' or 'discrete', got {router!r}")
        self.router = router
        if router_agent is None:
            router_agent = self.pool[self.pool.ids[0]] if router == "llm" else _NoRouter()
        self.add_role(ROUTER, router_agent)
        self.descriptions = self._resolve_descriptions(descriptions)

    def _resolve_descriptions(self, descriptions) -> dict[str, str]:
        if descriptions is None:
            return {a: self.pool.name_of(a) for a in self.pool.ids}
        if isinstance(descriptions, Mapping):
            missing = set(self.pool.ids) - set(descriptions)
            extra = set(descriptions) - set(self.pool.ids)
            if missing or extra:
                raise ConfigError(f"descriptions must have one entry per pool agent {self.pool.ids}; "
                                 f"missing {sorted(missing)}, unknown {sorted(extra)}")
            return {a: str(descriptions[a]) for a in self.pool.ids}
        if isinstance(descriptions, str) or len(descriptions) != len(self.pool):
            raise ConfigError(f"descriptions must be a mapping or a sequence of {len(self.pool)} strings (pool order)")
        return {a: str(d) for a, d in zip(self.pool.ids, descriptions)}

    # ------------------------------------------------------------------ spaces and observations
    def _make_observation_space(self, agent: str) -> spaces.Space:
        space = super()._make_observation_space(agent)
        if agent == ROUTER and self.router == "discrete":
            return spaces.Dict({**space.spaces, "action_mask": spaces.Box(0, 1, (len(self.pool),), np.int8)})
        return space

    def _make_action_space(self, agent: str) -> spaces.Space:
        if agent == ROUTER and self.router == "discrete":
            return spaces.Discrete(len(self.pool))
        return super()._make_action_space(agent)

    def action_mask(self) -> np.ndarray:
        """``int8`` array over the pool: 1 for the coalition's members."""
        return np.array([a in self.members for a in self.pool.ids], dtype=np.int8)

    def _with_mask(self, obs: dict[str, Any]) -> dict[str, Any]:
        if self.router == "discrete" and ROUTER in obs:
            obs[ROUTER] = {**obs[ROUTER], "action_mask": self.action_mask()}
        return obs

    def _observe(self):
        obs, infos = super()._observe()
        return self._with_mask(obs), infos

    def step(self, actions, *args, **kwargs):
        obs, rewards, terms, truncs, infos = super().step(actions, *args, **kwargs)
        return self._with_mask(obs), rewards, terms, truncs, infos

    def _sanitize(self, agent: str, action: Any) -> str:
        if agent == ROUTER and self.router == "discrete" and isinstance(action, str):
            found = _INTEGER.search(action)  # a runner-played router answers text: its first integer
            return found.group() if found else ""
        return super()._sanitize(agent, action)

    # ------------------------------------------------------------------ protocol
    def _choose(self, text: str) -> tuple[str, bool]:
        if self.router == "discrete":
            index = int(text) if _INTEGER.fullmatch(text or "") else -1
            if 0 <= index < len(self.pool) and self.pool.ids[index] in self.members:
                return self.pool.ids[index], True
            return self.members[0], False
        k = parse_choice(text, len(self.members))
        return (self.members[k], True) if k is not None else (self.members[0], False)

    def _play(self):
        models = format_answers([self.descriptions[a] for a in self.members], label="Model")
        routed = yield Phase("route", {ROUTER: self.messages("route", models=models)})
        chosen, valid = self._choose(routed[ROUTER])
        texts = yield Phase("answer", {chosen: self.messages("answer")})
        answer = self.extract(texts[chosen])
        return Outcome(
            answer=answer,
            answers={chosen: answer},
            standalone={chosen: self.task.score_answer(answer, self.example)},
            details={"routed_to": chosen, "valid_choice": valid},
        )


def env(pool, task, **options) -> RoutingEnv:
    """Make a ``routing_v0`` env (see the module docstring for options)."""
    return RoutingEnv(pool, task, **options)
