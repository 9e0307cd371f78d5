"""What a coalition's run costs, measured without a model: the protocol played by scripted stand-ins.

A protocol env is a state machine, so the number of model calls an episode makes depends on the
coalition and the protocol's options, rarely on what the models say (a cascade stops early on a
confident answer). :func:`calls_per_episode` plays one question with every agent replaced by a
:class:`agents.ScriptedAgent` of the same name and id, and counts the calls: milliseconds, no model
loaded. Progress bars weight each run by it (so the ETA does not jump when cheap one-model runs come
before 5-model debates).

:func:`distinct_calls` counts the calls a valuation really makes: coalitions share requests (the
same model, messages, sampling and seed) and the request memo generates each once. It plays every
run of the plan with stand-ins that answer differently per model (so prompts quoting different peers
differ) through one memo, on one question, and scales by questions and samples. ``crl-envs study
--dry-run`` and ``valuation.evaluate``'s progress bar use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Agent, Pool, SamplingParams, ScriptedAgent, stable_hash
from crl_envs import protocols
from crl_envs.runner import ProtocolFactory, RequestMemo, run_coalitions, run_episodes, total_usage
from crl_envs.tasks import Task


def _stand_in(name: str) -> ScriptedAgent:
    return ScriptedAgent(name, lambda example, messages: "The answer is 0. Confidence: 9")


class _DistinctStandIn(ScriptedAgent):
    """A stand-in with its own constant answer (per name and slot), memoisable: it reads nothing but
    its own identity, so its answer is a function of its fingerprint."""

    deterministic = True

    def __init__(self, name: str, slot: str):
        value = stable_hash(name, slot) % 997
        super().__init__(name, lambda example, messages: f"The answer is {value}. Confidence: 9")
        self._fingerprint = f"stand-in:{slot}:{name}"


def _replace_agents(value: Any, make: Any = _stand_in) -> Any:
    if isinstance(value, Agent):
        return make(value.name)
    if isinstance(value, Mapping):
        return {k: _replace_agents(v, make) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_replace_agents(v, make) for v in value)
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


Run = tuple[ProtocolFactory | str, Mapping[str, Any], int]


def distinct_calls(runs: Sequence[Run], names: Sequence[str], questions: int, samples: int = 1,
                   task: Task | None = None) -> float:
    """Model calls that the coalition runs ``runs`` make with the request memo: distinct requests,
    each generated once across all of them.

    Args:
        runs: ``(protocol, options, coalition mask)`` of every run (masks over ``names``' order; e.g.
            a valuation's coalitions and the ``("vote", {}, 1 << i)`` runs of each model alone).
        names: the pool's model names, in order.
        questions, samples: questions per run and episodes per question (calls scale with both:
            request seeds differ per question and sample).
        task: the question the stand-ins play (default: one arith question; a protocol's requests
            do not depend on the task).

    Raises:
        ValueError: a mask outside the pool or a run that is not ``(protocol, options, mask)``.
    """
    from crl_envs import tasks as task_registry

    task = task if task is not None else task_registry.load("arith", n=1)
    pool = Pool([_DistinctStandIn(name, f"model_{i}") for i, name in enumerate(names)])
    full = (1 << len(pool)) - 1
    memo = RequestMemo()
    groups: dict[tuple, tuple[ProtocolFactory, dict[str, Any], list[list[str]]]] = {}
    for run in runs:
        if not (isinstance(run, tuple) and len(run) == 3):
            raise ValueError(f"each run must be (protocol, options, coalition mask), got {run!r}")
        protocol, options, mask = run
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= full:
            raise ValueError(f"coalition mask {mask!r} out of range for a pool of {len(pool)} (1..{full})")
        factory = protocols.get(protocol)
        key = (factory, repr(sorted((options or {}).items(), key=lambda kv: kv[0])))
        if key not in groups:
            groups[key] = (factory, _replace_agents(dict(options or {}), lambda n: _DistinctStandIn(n, "role")), [])
        groups[key][2].append([pool.ids[i] for i in range(len(pool)) if mask >> i & 1])
    for factory, options, coalitions in groups.values():
        run_coalitions(factory, pool, task, coalitions, examples=[0], options=options, memo=memo, progress=False,
                       sampling=SamplingParams(temperature=0.0, max_new_tokens=1))
    return float(memo.generated * questions * samples)
