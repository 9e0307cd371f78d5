"""What a coalition's run costs, measured without a model: the protocol played by scripted stand-ins.

A protocol env is a state machine, so the number of model calls an episode makes depends on the
coalition and the protocol's options, rarely on what the models say (a cascade stops early on a
confident answer). :func:`calls_per_episode` plays one question with every agent replaced by a
:class:`agents.ScriptedAgent` of the same name and id, and counts the calls: milliseconds, no model
loaded. Progress bars weight each run by it (so the ETA does not jump when cheap one-model runs come
before 5-model debates), and ``crl-envs study --dry-run`` sizes a study with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Agent, Pool, SamplingParams, ScriptedAgent
from crl_envs.runner import ProtocolFactory, run_episodes, total_usage
from crl_envs.tasks import Task


def _stand_in(name: str) -> ScriptedAgent:
    return ScriptedAgent(name, lambda example, messages: "The answer is 0. Confidence: 9")


def _replace_agents(value: Any) -> Any:
    if isinstance(value, Agent):
        return _stand_in(value.name)
    if isinstance(value, Mapping):
        return {k: _replace_agents(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_replace_agents(v) for v in value)
    return value


def calls_per_episode(factory: ProtocolFactory, names: Sequence[str], task: Task, coalition: Sequence[str],
                      options: Mapping[str, Any] | None = None) -> float:
    """Model calls one episode of ``coalition`` makes (its members' and role agents'), played by
    scripted stand-ins on the task's first question. ``names`` are the pool's model names, in order."""
    pool = Pool([_stand_in(n) for n in names])
    episodes = run_episodes(factory, pool, task, coalition=list(coalition), examples=[0],
                            sampling=SamplingParams(temperature=0.0, max_new_tokens=1),
                            options=_replace_agents(dict(options or {})), progress=False)
    return float(sum(u.calls for u in total_usage(episodes).values()) / max(1, len(episodes)))
