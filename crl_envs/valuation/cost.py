"""What a coalition's run costs, measured without a model: the protocol played by scripted stand-ins.

A protocol env is a state machine, so the number of model calls an episode makes depends on the
coalition and the protocol's options, rarely on what the models say (a cascade stops early on a
confident answer). :func:`calls_per_episode` plays one question with every agent replaced by a
:class:`agents.ScriptedAgent` of the same name and id, and counts the calls: milliseconds, no model
loaded. Progress bars weight each run by it (so the ETA does not jump when cheap one-model runs come
before 5-model debates).

:func:`distinct_calls` counts the calls a valuation really makes: coalitions share requests (the
same model, messages, sampling and seed) and the request memo generates each once. It plays every
run of the plan with stand-ins that agree on the answer as often as real models do (:data:`AGREEMENT`:
agreeing models send their peers the same prompts; :data:`SHARED_WRONG`: wrong ones often give the same
wrong answer) through one memo, on a few questions, and scales by questions and samples;
:func:`distinct_calls_in_turn` counts several cells that share one memo, each adding what the ones
before it did not make. ``crl-envs study --dry-run`` and ``valuation.evaluate``'s progress bar use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Agent, Pool, SamplingParams, ScriptedAgent, stable_hash
from crl_envs import protocols
from crl_envs.runner import ProtocolFactory, RequestMemo, run_coalitions, run_episodes, total_usage
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError


def _stand_in(name: str) -> ScriptedAgent:
    return ScriptedAgent(name, lambda example, messages: "The answer is 0. Confidence: 9")


#: The chance that a model's answer is the question's reference (then its text is the same as every
#: other such model's), for :func:`distinct_calls`' stand-ins. Models that agree send their peers the
#: same prompts, so agreement decides how many later-phase requests coalitions share.
AGREEMENT = 0.55
#: The chance that a wrong stand-in gives the question's common wrong answer (the same text as other
#: models wrong that way) rather than a wrong answer of its own: real models share wrong answers (a
#: dropped carry gives the same number), so 0 (all own) over-counts distinct requests and 1 (all
#: shared) under-counts. Chosen among 0, 0.5 and 1 on three workloads (docs/valuation.md, "The
#: estimate": 0 gives +7.2%, +2.7% and +5.6%, 1 gives -15%, -15% and below -6%); with 0.5 they are
#: +1.8%, -3.6% and -1.2%, and a fourth, held out, -3.1%. Single pools miss by up to -38% and +114%.
SHARED_WRONG = 0.5
#: Questions the stand-ins of :func:`distinct_calls` play (their counts are scaled to the real number).
STAND_IN_QUESTIONS = 16


class _AgreeingStandIn(ScriptedAgent):
    """A stand-in right (the reference answer, confident) with chance ``agreement`` per prompt, else
    wrong: with chance :data:`SHARED_WRONG` the question's common wrong answer, else its own;
    memoisable: its answer is a function of its fingerprint and the prompt."""

    deterministic = True

    def __init__(self, name: str, slot: str, agreement: float, memoised: bool = True):
        self.deterministic = memoised

        def respond(example: Any, messages: list) -> str:
            prompt = messages[-1]["content"]
            if stable_hash(slot, name, prompt) % 10_000 < agreement * 10_000:
                return f"The answer is {example.answer}. Confidence: 9"
            if stable_hash("shared", slot, name, prompt) % 10_000 < SHARED_WRONG * 10_000:
                return f"The answer is {stable_hash('common wrong', example.id) % 997}. Confidence: 9"
            return f"The answer is {stable_hash(slot, name, example.id) % 997}. Confidence: 9"

        super().__init__(name, respond)
        self._fingerprint = f"stand-in:{slot}:{name}:{agreement}:{SHARED_WRONG}"


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
                   agreement: float | Sequence[float] = AGREEMENT, memoised: bool | Sequence[bool] = True) -> float:
    """Model calls that the coalition runs ``runs`` make with the request memo: distinct requests,
    each generated once across all of them.

    Stand-ins play every run through one memo on :data:`STAND_IN_QUESTIONS` arith questions (a
    protocol's requests do not depend on the task), and the count is scaled to ``questions`` x
    ``samples`` (request seeds differ per question and sample, so no request is shared across them).
    An estimate: how many later-phase requests coalitions share depends on how often the models
    give the same answer (``agreement``, :data:`SHARED_WRONG`).

    Args:
        runs: ``(protocol, options, coalition mask)`` of every run (masks over ``names``' order; e.g.
            a valuation's coalitions and the ``("vote", {}, 1 << i)`` runs of each model alone).
        names: the pool's model names, in order.
        questions, samples: questions per run and episodes per question.
        agreement: the chance a model answers with the reference (see :data:`AGREEMENT`), one for all
            or one per model (e.g. their measured accuracies alone; role agents get the mean).
        memoised: whether each model (or all) is memoised (``Agent.deterministic``); the requests
            of the others are all counted. Role agents (a judge) count as memoised.

    Raises:
        ValueError: a mask outside the pool or a run that is not ``(protocol, options, mask)``.
    """
    return distinct_calls_in_turn([runs], names, questions, samples, agreement, memoised)[0]


def distinct_calls_in_turn(parts: Sequence[Sequence[Run]], names: Sequence[str], questions: int, samples: int = 1,
                           agreement: float | Sequence[float] = AGREEMENT,
                           memoised: bool | Sequence[bool] = True) -> list[float]:
    """:func:`distinct_calls` of each part when the parts play one after another through one memo, as a
    study's valuation cells of one pool, task and sampling do in one process: each part's count is the
    requests it adds (a model's request another protocol already made is not generated again).

    Example:
        >>> alone = [("vote", {}, 1), ("vote", {}, 2)]
        >>> distinct_calls_in_turn([alone, alone + [("vote", {}, 3)]], ["a", "b"], questions=10)
        [20.0, 0.0]

    Raises:
        ValueError: as :func:`distinct_calls`.
    """
    from crl_envs import tasks as task_registry

    flags = [memoised] * len(names) if isinstance(memoised, bool) else list(memoised)
    if len(flags) != len(names):
        raise ConfigError(f"memoised names {len(flags)} models for a pool of {len(names)}")
    rates = [float(agreement)] * len(names) if isinstance(agreement, (int, float)) else [float(a) for a in agreement]
    if len(rates) != len(names) or not all(0.0 <= a <= 1.0 for a in rates):
        raise ConfigError(f"agreement must be one rate in [0, 1] or one per model of the pool of {len(names)}, "
                          f"got {agreement!r}")
    role_rate = sum(rates) / len(rates)
    pool = Pool([_AgreeingStandIn(name, f"model_{i}", rates[i], flags[i]) for i, name in enumerate(names)])
    full = (1 << len(pool)) - 1
    played: list[list[tuple[ProtocolFactory, dict[str, Any], list[list[str]]]]] = []
    for runs in parts:
        groups: dict[tuple, tuple[ProtocolFactory, dict[str, Any], list[list[str]]]] = {}
        for run in runs:
            if not (isinstance(run, tuple) and len(run) == 3):
                raise ConfigError(f"each run must be (protocol, options, coalition mask), got {run!r}")
            protocol, options, mask = run
            if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= full:
                raise ConfigError(f"coalition mask {mask!r} out of range for a pool of {len(pool)} (1..{full})")
            factory = protocols.get(protocol)
            key = (factory, repr(sorted((options or {}).items(), key=lambda kv: kv[0])))
            if key not in groups:
                role = _replace_agents(dict(options or {}), lambda n: _AgreeingStandIn(n, "role", role_rate))
                groups[key] = (factory, role, [])
            groups[key][2].append([pool.ids[i] for i in range(len(pool)) if mask >> i & 1])
        played.append(list(groups.values()))
    # without a memoised model every request counts, whatever the answers: one question suffices
    played_questions = STAND_IN_QUESTIONS if any(flags) else 1
    key = (repr([[(f"{f.__module__}.{f.__qualname__}", o, c) for f, o, c in part] for part in played]),
           tuple(names), tuple(flags), tuple(rates), played_questions, SHARED_WRONG)
    if key not in _COUNTS:
        task = task_registry.load("arith", n=played_questions, seed=0)
        memo = RequestMemo()
        _COUNTS[key] = [_count(part, pool, task, memo) / played_questions for part in played]
    return [per_question * questions * samples for per_question in _COUNTS[key]]


#: distinct_calls_in_turn's counts per question and part, by everything they depend on (a study's cells
#: share them)
_COUNTS: dict[tuple, list[float]] = {}


def _count(groups: Any, pool: Pool, task: Task, memo: RequestMemo) -> int:
    """Requests generated when the stand-ins play every group ``(factory, options, coalitions)``."""
    generated = 0
    for factory, options, coalitions in groups:
        played = run_coalitions(factory, pool, task, coalitions, options=options, memo=memo, progress=False,
                                sampling=SamplingParams(temperature=0.0, max_new_tokens=1))
        generated += sum(u.generated_calls for episodes in played for u in total_usage(episodes).values())
    return generated


def memoised_models(pool: Any, n: int) -> list[bool]:
    """Whether each model of a study's pool description is memoised, without building it: the class a
    named pool or spec string builds (:func:`agents.agent_class`) sets ``Agent.deterministic``, the rule
    the runner's memo reads; scripted experts (dicts) are :class:`agents.ScriptedAgent`. ``n`` is the
    pool's size."""
    from agents import ScriptedAgent, agent_class

    def one(entry: Any) -> bool:
        return bool((agent_class(entry) if isinstance(entry, str) else ScriptedAgent).deterministic)

    return [one(pool)] * n if isinstance(pool, str) else [one(m) for m in pool]
