"""Planted truth played through the real protocols (helpers for tests/test_valuation_crossfit.py).

A question's *profile* is each model's answer on it: 0 the reference, 1 a common wrong answer
(reference + 1, shared by every model that gives it), 2 a rarer wrong answer (reference + 2). Scripted
agents answer a question by its profile, so the real protocol's value ``v_q(S)`` depends only on the
coalition and its members' digits. :func:`profile_table` plays every (coalition, members' digits) once
through :func:`crl_envs.runner.run_coalitions` (``4^n - 1`` episodes: 4,095 for 6 models) and returns
``v(S, profile)``; a study then draws per-question profiles from planted accuracies and reads its
coalition values from the table, so hundreds of studies cost no further episode.

Behaviour per role (deterministic in the profile): a member answers ``The answer is <ref + digit>.``;
in cascade it adds ``Confidence: 2`` to a rare wrong answer (it defers) and ``Confidence: 8`` otherwise
(a common wrong answer is confidently wrong); a judge picks the first candidate that agrees with its own
answer; the router (an outside agent) picks the first listed model whose answer is right (an oracle
router: routing's value is then "anyone right", the complementarity the study should see).
"""

from __future__ import annotations

import functools
import re

import numpy as np

import agents
from agents import ScriptedAgent
from crl_envs import tasks
from crl_envs.runner import run_coalitions
from crl_envs.valuation.estimators import shapley_weights

_ANSWER = re.compile(r"answer is (-?\d+)")
_LISTED = re.compile(r"(?:Agent|Model) (\d+): (.*)")


def _digits(k: int, n: int) -> tuple[int, ...]:
    return tuple(k // 3**i % 3 for i in range(n))


def _index(digits) -> int:
    return int(sum(int(d) * 3**i for i, d in enumerate(digits)))


def _agents(n: int, profiles: dict[str, tuple[int, ...]]) -> list[ScriptedAgent]:
    def member(i: int):
        def respond(example, messages):
            d = profiles[example.id][i]
            own = int(example.answer) + d
            last = messages[-1]["content"]
            if "Which answer is best?" in last:  # judge: the first candidate agreeing with its own answer
                for k, text in _LISTED.findall(last):
                    found = _ANSWER.search(text)
                    if found and int(found.group(1)) == own:
                        return k
                return "1"
            confidence = " Confidence: 2" if d == 2 else " Confidence: 8"
            return f"The answer is {own}.{confidence}"
        return ScriptedAgent(f"m{i}", respond)
    return [member(i) for i in range(n)]


def _router(n: int, profiles: dict[str, tuple[int, ...]]) -> ScriptedAgent:
    def respond(example, messages):
        d = profiles[example.id]
        listed = _LISTED.findall(messages[-1]["content"])
        for k, name in listed:
            if d[int(name.strip()[1:])] == 0:
                return k
        return "1"
    return ScriptedAgent("router", respond)


@functools.lru_cache(maxsize=8)
def profile_table(protocol: str, n: int = 6) -> np.ndarray:
    """``(2^n, 3^n)``: ``v(S, profile)`` of ``protocol`` played by :func:`run_coalitions` (``v(∅) = 0``)."""
    task = tasks.load("arith", n=3**n, seed=7)
    ids = [e.id for e in task.examples]
    profiles = {eid: _digits(k, n) for k, eid in enumerate(ids)}
    pool = agents.pool(_agents(n, profiles))
    options = {"router_agent": _router(n, profiles), "descriptions": [f"m{i}" for i in range(n)]} \
        if protocol == "routing" else {}
    if protocol == "cascade":
        options = {"threshold": 5}
    table = np.zeros((1 << n, 3**n))
    for mask in range(1, 1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        wanted = [k for k in range(3**n) if all(_digits(k, n)[i] == 0 for i in range(n) if i not in members)]
        [episodes] = run_coalitions(protocol, pool, task, [[pool.ids[i] for i in members]], progress=False,
                                    examples=[ids[k] for k in wanted], options=options)
        score = {ep.example_id: ep.score for ep in episodes}
        for k in range(3**n):
            reduced = [_digits(k, n)[i] if i in members else 0 for i in range(n)]
            table[mask, k] = score[ids[_index(reduced)]]
    return table


def draw_profiles(rng: np.random.Generator, accuracy: np.ndarray, common_wrong: float = 0.7) -> np.ndarray:
    """``(questions, n)`` digits: model ``i`` right on question ``q`` with probability ``accuracy[q, i]``
    (independently), else the common wrong answer with probability ``common_wrong``, else the rare one."""
    right = rng.random(accuracy.shape) < accuracy
    common = rng.random(accuracy.shape) < common_wrong
    return np.where(right, 0, np.where(common, 1, 2))


def study_tables(table: np.ndarray, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(individual, shapley)``, each ``(models, questions)``, of questions with these ``digits``."""
    n = digits.shape[1]
    values = table[:, (digits * 3 ** np.arange(n)).sum(axis=1)]  # (2^n, questions)
    singles = values[[1 << i for i in range(n)]]
    return singles, shapley_weights(n) @ values


def true_strengths(table: np.ndarray, accuracy: np.ndarray, *, weights: np.ndarray | None = None,
                   draws: int = 200_000, seed: int = 99) -> tuple[np.ndarray, np.ndarray]:
    """The population individual accuracy and Shapley value per model (Monte Carlo over ``draws``
    questions, accuracy rows drawn with probabilities ``weights``, default equal)."""
    rng = np.random.default_rng(seed)
    acc = accuracy[rng.choice(len(accuracy), draws, p=weights)]
    ind, sh = study_tables(table, draw_profiles(rng, acc))
    return ind.mean(axis=1), sh.mean(axis=1)
