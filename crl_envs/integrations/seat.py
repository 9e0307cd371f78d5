"""The learner's seat of one episode, driven from outside: the bridge every trainer adapter stands on.

:class:`LearnerSeat` plays one episode of a protocol through the one runner
(:func:`crl_envs.run_episodes`), with every partner served by its backend, and hands the learner's turns
to the caller: :meth:`~LearnerSeat.reset` plays the partners up to the learner's first turn and returns
what the learner sees; :meth:`~LearnerSeat.say` carries the learner's message in and returns what it sees
next (``None`` once the episode is over). The runner runs in a worker thread whose learner is a
:class:`agents.ScriptedAgent` answering from the caller's messages, so the rollout is the library's own,
request seeds and stop sequences included: the finished :attr:`~LearnerSeat.episode` is exactly the
episode ``run_episodes`` plays with a scripted learner saying the same things (``tests/test_integrations.py``).

Rewards (``reward=``), the trainers' own definitions (:mod:`trainers.baselines`):

- ``"system"``: the system's score (C-RL).
- ``"loo"``: the system's score minus v(N∖{i}), the coalition without the learner played on the same
  question and seed (cached per question: it does not depend on the learner).
- ``"shapley"``: φ_i = Σ_S w(S) [v(S ∪ i) − v(S)] with :func:`trainers.shapley_weight`; v(S ∪ i) replays
  the learner's messages of this episode, phase by phase, in the smaller coalition (the credit of *what
  it said*), v(S) is cached per question. Exact over every coalition: 2^(n-1) − 1 extra episodes per
  learner episode, for small pools.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agents import Message, Pool, SamplingParams, ScriptedAgent
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.runner import Episode, RequestMemo, run_episodes
from crl_envs.tasks import Example, Task
from crl_kit.errors import ConfigError
from trainers.baselines import shapley_weight

REWARDS = ("system", "loo", "shapley")


class _Stop(Exception):
    """Sent into the worker thread to end an episode the caller abandoned."""


def render(messages: Sequence[Message]) -> str:
    """A learner's request as one text (what a trainer appends to the learner's user prompt): the contents of
    its system and user messages, in order, a blank line apart; other roles (an earlier assistant turn) are
    marked ``[role]``."""
    return "\n\n".join(m["content"] if m["role"] in ("system", "user") else f"[{m['role']}]\n{m['content']}"
                         for m in messages)


class SeatGame:
    """A protocol, a pool, a task and a learner: everything a seat needs, checked once; shared by the
    seats of one trainer (and their caches of counterfactual values).

    Args:
        protocol: a protocol factory or name (``"debate"``); ``options``: its keyword options.
        pool: the models (``agents.pool("zoo")``); ``learner``: the pool member whose seat is external.
        task: the questions (a Task or a name).
        reward: ``"system"``, ``"loo"`` or ``"shapley"`` (module docstring).
        partner_sampling: the partners' sampling (default: greedy, 256 tokens).
        seed: the runner's seed (a question's episode is the same whoever asks).
        memo: a :class:`crl_envs.runner.RequestMemo` for the partners' and counterfactuals' requests.
    """

    def __init__(self, protocol: Any, pool: Pool | Sequence[Any] | str, task: Task | str, learner: str, *,
                 reward: str = "system", options: Mapping[str, Any] | None = None,
                 partner_sampling: SamplingParams | None = None, seed: int = 0, memo: RequestMemo | None = None):
        self.factory = protocols.get(protocol)  # an unknown protocol fails here, naming the known ones
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        if learner not in self.pool.ids:
            raise ConfigError(f"learner {learner!r} is not in the pool; pool agents are {self.pool.ids}")
        if reward not in REWARDS:
            raise ConfigError(f"reward must be one of {REWARDS}, got {reward!r}")
        self.task = task if isinstance(task, Task) else task_registry.load(task)
        self.options = dict(options or {})
        protocols.check_options(self.factory, self.options)
        self.name = self.factory(self.pool, self.task, **self.options).metadata["name"]
        self.learner, self.reward, self.seed, self.memo = learner, reward, seed, memo
        self.partner_sampling = partner_sampling or SamplingParams(temperature=0.0, max_new_tokens=256)
        self._values: dict[tuple[str, tuple[str, ...]], float] = {}  # (example id, coalition) -> v, learner absent
        #: held while the models compute: seats of one game in several threads (an OpenEnv server's sessions)
        #: share the pool's models, whose backends are not thread-safe; released while a seat waits for its learner
        self.lock = threading.RLock()

    def example(self, row: Mapping[str, Any]) -> Example:
        """The task example a dataset row names (``example_id``) or asks (``question``)."""
        if "example_id" in row:
            return self.task.by_id(row["example_id"])
        for ex in self.task:
            if ex.question == row.get("question"):
                return ex
        raise ConfigError(f"row {dict(row)!r} names no example of the task: give it an 'example_id' column "
                          "(SeatGame.dataset() does)")

    def play(self, example: Example, learner: ScriptedAgent, coalition: Sequence[str] | None = None) -> Episode:
        """One episode through the runner with ``learner`` in the learner's seat."""
        return run_episodes(self.factory, self.pool, self.task, coalition=coalition, examples=[example.id],
                            seed=self.seed, policies={self.learner: learner}, sampling=self.partner_sampling,
                            options=self.options, progress=False, memo=self.memo)[0]

    def value_without(self, example: Example, members: Sequence[str]) -> float:
        """v(S) of a coalition without the learner (cached: it does not depend on the learner)."""
        key = (example.id, tuple(members))
        if key not in self._values:
            if members:
                self._values[key] = run_episodes(self.factory, self.pool, self.task, coalition=list(members),
                                                 examples=[example.id], seed=self.seed, sampling=self.partner_sampling,
                                                 options=self.options, progress=False, memo=self.memo)[0].score
            else:
                self._values[key] = float(self.factory(self.pool, self.task, **self.options).empty_value)
        return self._values[key]

    def credit(self, episode: Episode, example: Example) -> float:
        """The learner's reward for ``episode`` under :attr:`reward`."""
        if self.reward == "system":
            return episode.score
        others = [a for a in self.pool.ids if a != self.learner]
        if self.reward == "loo":
            return episode.score - self.value_without(example, others)
        said = [t.text for t in episode.turns_of(self.learner)]
        n, total = len(self.pool), 0.0
        for size in range(len(others) + 1):
            for partners in itertools.combinations(others, size):
                members = [a for a in self.pool.ids if a in {self.learner, *partners}]
                if len(partners) == len(others):
                    with_learner = episode.score
                else:
                    with_learner = self.play(example, replay(self.learner, said), coalition=members).score
                total += shapley_weight(size + 1, n) * (with_learner - self.value_without(example, list(partners)))
        return total

    def dataset_rows(self) -> dict[str, list]:
        """One row per question: ``example_id`` (what :meth:`example` reads) and the question."""
        return {"example_id": [ex.id for ex in self.task], "question": [ex.question for ex in self.task]}


def replay(name: str, texts: Sequence[str]) -> ScriptedAgent:
    """A scripted learner saying ``texts`` in order (then nothing): the same episode, in-process."""
    said = iter(list(texts))
    return ScriptedAgent(name, lambda example, messages: next(said, ""))


class LearnerSeat:
    """One episode at a time of a :class:`SeatGame`, the learner's turns supplied by the caller.

    ``reset(example)`` -> the learner's first context (``None`` if the learner never speaks);
    ``say(text)`` -> the next context, or ``None`` when the episode is over; then :attr:`episode` and
    :attr:`reward`. ``turns`` counts the learner's turns of the current episode."""

    def __init__(self, game: SeatGame):
        self.game = game
        self.episode: Episode | None = None
        self.reward: float | None = None
        self.example: Example | None = None
        self.context: list[Message] | None = None
        self.turns = 0
        self._thread: threading.Thread | None = None
        self._asks: queue.Queue = queue.Queue()
        self._answers: queue.Queue = queue.Queue()

    @property
    def done(self) -> bool:
        return self.episode is not None

    def reset(self, example: Example) -> list[Message] | None:
        """Start an episode on ``example``: the partners play up to the learner's first turn."""
        self.close()
        self.episode, self.reward, self.example, self.context, self.turns = None, None, example, None, 0
        asks, answers = queue.Queue(), queue.Queue()
        self._asks, self._answers = asks, answers

        lock = self.game.lock

        def respond(_example: Example, messages: list[Message]) -> str:
            asks.put(("ask", messages))
            lock.release()
            try:
                text = answers.get()
            finally:
                lock.acquire()
            if isinstance(text, _Stop):
                raise text
            return text

        def work() -> None:
            try:
                with lock:
                    episode = self.game.play(example, ScriptedAgent(self.game.learner, respond))
                asks.put(("done", episode))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                asks.put(("error", e))

        self._thread = threading.Thread(target=work, daemon=True, name=f"seat-{self.game.name}")
        self._thread.start()
        return self._next()

    def say(self, text: str) -> list[Message] | None:
        """The learner's message for its current turn; returns its next context or ``None`` (episode over)."""
        if self.context is None:
            raise ConfigError("say() before reset() or after the episode ended; call reset(example) first")
        if not isinstance(text, str):
            raise ConfigError(f"the learner's message must be a str, got {type(text).__name__}")
        self.turns += 1
        self._answers.put(text)
        return self._next()

    def _next(self) -> list[Message] | None:
        kind, value = self._asks.get()
        if kind == "ask":
            self.context = value
            return value
        self.context = None
        self._thread = None
        if kind == "error":
            raise value
        self.episode = value
        with self.game.lock:
            self.reward = self.game.credit(value, self.example)
        return None

    def close(self) -> None:
        """Abandon an episode in progress (its worker thread ends)."""
        if self._thread is not None and self.context is not None:
            self._answers.put(_Stop())
            self._thread.join(timeout=30)
        self._thread, self.context = None, None
