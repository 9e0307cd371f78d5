"""The shared machinery of every protocol env: a PettingZoo ``ParallelEnv`` driven by a generator.

A protocol subclass writes its phases as a generator, :meth:`ProtocolEnv._play`::

    def _play(self):
        answers = yield Phase("answer", {a: self.messages("solve") for a in self.members})
        ...
        return Outcome(answer=..., answers=..., standalone=...)

Each ``yield`` is one ``step`` of the env: the agents named in the phase are *active* and observe
their chat transcript; the env receives their actions (text) and sends them back into the
generator. The env never calls an LLM. The base class owns everything else: the pool, the task,
coalitions, spaces (cached per instance), action validation, rewards, infos and rendering.
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from agents import Agent, Message, Pool, SamplingParams
from agents import pool as make_pool
from crl_envs import tasks as task_registry
from crl_envs.options import keyword_options, unknown_option_message
from crl_envs.spaces import TextSpace, prompt_space
from crl_envs.tasks import Example, Task
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import check_int

MAX_ACTION_CHARS = 4096
"""Default limit on an action's length; longer text is truncated (never an error)."""
MAX_OBSERVATION_CHARS = 65536


@dataclass
class Phase:
    """One step of a protocol: which agents must answer, and what each one sees."""

    name: str
    prompts: dict[str, list[Message]]


@dataclass
class Outcome:
    """The end of an episode.

    ``answer`` is the system's final answer (already extracted). ``answers`` holds each agent's
    final extracted answer; ``standalone`` each agent's correctness when it answered alone (where
    the protocol has such a phase). ``score`` defaults to the task's score of ``answer``.
    """

    answer: str | None
    answers: dict[str, str | None] = field(default_factory=dict)
    standalone: dict[str, float] = field(default_factory=dict)
    score: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PendingTurn:
    """One turn the env waits for: an active agent of the current phase and the chat it answers.

    The typed view of what PettingZoo's ``infos[agent_id]`` says of an active agent (``"phase"``,
    ``"phase_index"``, ``"messages"``); see :meth:`ProtocolEnv.pending_turns`."""

    agent_id: str
    phase: str
    phase_index: int
    messages: list[Message]


class Reply(str):
    """A turn's text and how its generation ended: ``finish_reason`` is ``"stop"`` (the model ended
    it), ``"length"`` (cut off at ``max_new_tokens``) or ``None`` (not known).

    The reason belongs to the turn, not to the text: two agents saying the same words keep their own
    reasons. A ``Reply`` is a ``str``, so it passes unchanged through PettingZoo wrappers into
    ``env.step`` and a protocol reads it as text; the env hands the protocol each turn's text as a
    ``Reply`` and :meth:`ProtocolEnv.extract` reads its reason. ``strip()`` keeps the reason (spaces
    around a text do not make it complete); any other string operation gives a plain ``str``.

    Example:
        >>> cut = Reply("The answer is 1", "length")
        >>> cut == "The answer is 1", cut.finish_reason, cut.strip().finish_reason
        (True, 'length', 'length')
    """

    finish_reason: str | None

    def __new__(cls, text: str, finish_reason: str | None = None) -> Reply:
        if finish_reason is not None and not isinstance(finish_reason, str):
            raise ConfigTypeError(f"a Reply's finish_reason must be a str ('stop', 'length') or None, got {finish_reason!r}")
        reply = super().__new__(cls, text)
        reply.finish_reason = finish_reason
        return reply

    def __reduce__(self) -> tuple:
        return Reply, (str(self), self.finish_reason)

    def strip(self, chars: str | None = None) -> Reply:
        return Reply(str.strip(self, chars), self.finish_reason)


@dataclass
class Turn:
    """One agent's action in one phase."""

    phase: int
    phase_name: str
    agent: str
    messages: list[Message]
    text: str


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each non-negative int64 (numpy >= 2 has it built in; older numpy counts bytes)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    table = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)
    x = np.ascontiguousarray(x, dtype=np.int64)
    return table[x.view(np.uint8).reshape(*x.shape, 8)].sum(axis=-1)


def plurality_winners(codes: np.ndarray, masks: Sequence[int] | np.ndarray) -> np.ndarray:
    """The plurality rule over many coalitions at once: for each row of answers and each coalition, the member
    whose answer the plurality picks (the first member, in pool order, giving it), or ``-1`` if no member
    answered. :func:`plurality` and every coalition value computed from answers (:mod:`crl_envs.valuation.game`)
    use it, so the rule is written once.

    Args:
        codes: ``(rows, n)`` ints, one row per question (and sample): member ``j``'s answer as a code, equal
            codes for equal answers, ``-1`` for no answer (unparseable; it does not vote).
        masks: coalitions as bitmasks over the ``n`` members (bit ``j``: member ``j`` takes part), ``n <= 62``.

    Returns:
        ``(rows, len(masks))`` member indices. Ties between answers go to the answer whose first giver comes
        first in pool order.

    Example:
        >>> plurality_winners(np.array([[0, 1, 1, 0, -1]]), [0b11111, 0b00101, 0b10000]).tolist()
        [[0, 0, -1]]
    """
    codes = np.asarray(codes, dtype=np.int64)
    rows, n = codes.shape
    if n > 62:
        raise ConfigError(f"plurality_winners takes at most 62 members (int64 bitmasks), got {n}")
    masks = np.asarray(masks, dtype=np.int64).reshape(1, -1)
    if rows == 1 and masks.shape[1] == 1:  # one question, one coalition (a protocol's step): the same rule, scalar
        return np.array([[_plurality_winner(codes[0].tolist(), int(masks[0, 0]))]], dtype=np.int64)
    bits = np.int64(1) << np.arange(n, dtype=np.int64)
    # class_mask[r, j]: the members answering as member j does (nobody when j gave no answer)
    same = (codes[:, :, None] == codes[:, None, :]) & (codes[:, :, None] >= 0)
    class_mask = (same * bits[None, None, :]).sum(axis=2)
    winner = np.full((rows, masks.shape[1]), -1, dtype=np.int64)
    best = np.zeros((rows, masks.shape[1]), dtype=np.int64)
    for j in range(n):  # j first in its class within S, with strictly more votes than any earlier class
        present = masks & class_mask[:, j:j + 1]
        first = (present & (bits[j] - 1)) == 0
        votes = np.where(first & (masks >> j & 1 == 1), _popcount(present), 0)
        better = votes > best
        winner[better], best[better] = j, votes[better]
    return winner


def _plurality_winner(codes: list[int], mask: int) -> int:
    """:func:`plurality_winners` for one row and one coalition, in plain Python (a protocol's step calls the rule
    with one of each, where numpy's fixed cost is most of the time): the answer classes in order of their first
    giver within the coalition, the first with strictly more votes than every earlier one winning."""
    first_and_votes: dict[int, list[int]] = {}
    for j, code in enumerate(codes):
        if code >= 0 and mask >> j & 1:
            first_and_votes.setdefault(code, [j, 0])[1] += 1
    winner, best = -1, 0
    for first, votes in first_and_votes.values():
        if votes > best:
            winner, best = first, votes
    return winner


def plurality(answers: Sequence[str | None]) -> str | None:
    """Most frequent non-``None`` answer; ties go to the tied answer given first (:func:`plurality_winners`).

    Example:
        >>> plurality(["3", "4", "4", "3", None])
        '3'
    """
    return pick_answer(plurality_winners, answers)


def answer_codes(answers: Sequence[str | None]) -> list[int]:
    """Answers as codes for an aggregation rule: equal answers share a code, ``None`` (no answer) is ``-1``.

    >>> answer_codes(["7", None, "8", "7"])
    [0, -1, 1, 0]
    """
    code = {a: k for k, a in enumerate(dict.fromkeys(a for a in answers if a is not None))}
    return [-1 if a is None else code[a] for a in answers]


def pick_answer(rule: Callable[[np.ndarray, Sequence[int]], np.ndarray], answers: Sequence[str | None]) -> str | None:
    """The answer an aggregation ``rule`` (as :func:`plurality_winners`) picks from all of ``answers``."""
    if not answers:
        return None
    winner = int(rule(np.array([answer_codes(answers)]), [(1 << len(answers)) - 1])[0, 0])
    return None if winner < 0 else answers[winner]


class ProtocolEnv(ParallelEnv, abc.ABC):
    """Base class of the protocol envs. See the module docstring.

    Args:
        pool: an :class:`agents.Pool` (or anything :func:`agents.pool` accepts).
        task: a :class:`crl_envs.tasks.Task` or a registered task name.
        prompts: overrides of the protocol's prompt templates, by template name.
        max_action_chars: actions longer than this are truncated.
        render_mode: ``None`` or ``"human"`` (prints the transcript of each step).
    """

    metadata = {"name": "protocol_v0", "render_modes": ["human"], "is_parallelizable": True}
    #: Prompt templates (``str.format`` fields), overridable per instance with ``prompts=``.
    PROMPTS: dict[str, str] = {}
    #: v(∅): the system's score when no pool member takes part.
    empty_value: float = 0.0
    #: The method family (a key of :data:`crl_envs.protocols.FAMILIES`): how the models collaborate.
    FAMILY: str = ""
    #: For a protocol whose system answer is picked from its members' independent answers (each member answers
    #: the task's question once, alone, with the same prompt and phase in every coalition, and the episode's
    #: score is the task's score of the picked answer): the rule that picks it, ``aggregate(codes, masks) ->
    #: winners`` as :func:`plurality_winners`, which the protocol's own step uses (:func:`pick_answer`). The
    #: coalition game then computes every coalition from the members' one-member runs, with no generation
    #: (:class:`crl_envs.valuation.CoalitionGame`). ``None``: the protocol interacts; coalitions are played.
    aggregate: Callable[[np.ndarray, Sequence[int]], np.ndarray] | None = None

    def __new__(cls, *args: Any, **options: Any) -> ProtocolEnv:
        """Keep the keyword options the env is made with (:attr:`env_options`), whatever subclass
        ``__init__`` consumes them, so that ``run_episodes`` can play more episodes of the same env."""
        env = super().__new__(cls)
        env._made_with = {k: v for k, v in options.items() if k not in ("pool", "task")}
        return env

    def __init__(
        self,
        pool: Pool | Sequence[Agent | str] | str,
        task: Task | str,
        *,
        prompts: Mapping[str, str] | None = None,
        max_action_chars: int = MAX_ACTION_CHARS,
        render_mode: str | None = None,
        **unknown: Any,
    ):
        if unknown:
            type(self).check_options(unknown)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        self.task = task if isinstance(task, Task) else task_registry.load(task)
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ConfigError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        self.max_action_chars = check_int("max_action_chars", max_action_chars, minimum=1)
        unknown = set(prompts or {}) - set(self.PROMPTS)
        if unknown:
            raise ConfigError(
                f"{self.metadata['name']}: unknown prompt template(s) {sorted(unknown)}; templates are {sorted(self.PROMPTS)}"
            )
        self.prompts = {**self.PROMPTS, **(prompts or {})}
        #: Agents with a fixed role outside the coalition game (``agent id -> Agent``), e.g. a judge.
        self.role_agents: dict[str, Agent] = {}
        self.possible_agents = list(self.pool.ids)
        self.agents: list[str] = []
        self.members: list[str] = []
        self.example: Example | None = None
        self.transcript: list[Turn] = []
        self.outcome: Outcome | None = None
        self._game: Generator | None = None
        self._phase: Phase | None = None
        self._phase_index = 0
        self.np_random = np.random.default_rng()

    # ------------------------------------------------------------------ options
    #: Names that are ``reset`` options or runner arguments, never constructor options: where they go.
    NOT_OPTIONS = {
        "coalition": "a reset option, not a protocol option: pass run_episodes(..., coalition=[...]) or "
                     "env.reset(options={'coalition': [...]})",
        "example": "a reset option, not a protocol option: pass run_episodes(..., examples=[...]) or "
                   "env.reset(options={'example': ...})",
        "seed": "a reset argument: pass run_episodes(..., seed=...) or env.reset(seed=...)",
        "samples": "a runner argument: pass run_episodes(..., samples=...)",
        "sampling": "a runner argument: pass run_episodes(..., sampling=SamplingParams(...))",
    }

    @classmethod
    def option_names(cls) -> list[str]:
        """The keyword options of this protocol's constructor, its own first (walks the class hierarchy)."""
        return keyword_options(*(k.__init__ for k in cls.__mro__ if issubclass(k, ProtocolEnv) and "__init__" in vars(k)))

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Raise a ``ValueError`` naming every option in ``options`` the constructor does not take,
        with the closest valid name and the list of valid ones."""
        valid = cls.option_names()
        unknown = [k for k in options if k not in valid]
        if unknown:
            raise ConfigError(unknown_option_message(cls.metadata["name"], unknown, valid, cls.NOT_OPTIONS))

    @property
    def env_options(self) -> dict[str, Any]:
        """The keyword options this env was made with, as given (e.g. ``{"rounds": 3}``): with
        :attr:`pool` and :attr:`task` they make the same env again."""
        return dict(self.__dict__.get("_made_with", {}))

    def coalition_context(self, members: Sequence[str]) -> Any:
        """What this env derives from the rest of the pool that changes how ``members`` play; ``None``
        (the default) when a coalition's game depends on its members alone. Valuation's coalition cache
        keys it, so a coalition's result is reused across pools only when it is the same game."""
        return None

    # ------------------------------------------------------------------ roles and spaces
    def add_role(self, agent_id: str, agent: Agent | str) -> str:
        """Register a fixed-role agent (not a pool member, never masked). Call from ``__init__``."""
        if agent_id in self.possible_agents:
            raise ConfigError(f"role agent id {agent_id!r} clashes with an existing agent")
        self.role_agents[agent_id] = agent if isinstance(agent, Agent) else make_pool(agent)["model_0"]
        self.possible_agents.append(agent_id)
        return agent_id

    def agent_for(self, agent_id: str) -> Agent:
        """The model that plays ``agent_id`` (a pool member or a role agent)."""
        if agent_id in self.role_agents:
            return self.role_agents[agent_id]
        return self.pool[agent_id]

    def model_name(self, agent_id: str) -> str:
        return self.agent_for(agent_id).name

    def observation_space(self, agent: str) -> spaces.Space:
        """The same object on every call (PettingZoo's seed tests need it), built per instance."""
        return self._cached_space("observation", agent, self._make_observation_space)

    def action_space(self, agent: str) -> spaces.Space:
        return self._cached_space("action", agent, self._make_action_space)

    def _make_observation_space(self, agent: str) -> spaces.Space:
        return prompt_space(MAX_OBSERVATION_CHARS)

    def _make_action_space(self, agent: str) -> spaces.Space:
        """Text by default; a protocol overrides this for discrete roles (e.g. a router)."""
        return TextSpace(self.max_action_chars)

    def _cached_space(self, kind: str, agent: str, make) -> spaces.Space:
        if agent not in self.possible_agents:
            raise KeyError(f"no agent {agent!r} in this env; agents are {self.possible_agents}")
        cache = self.__dict__.setdefault("_space_cache", {})
        if (kind, agent) not in cache:
            cache[(kind, agent)] = make(agent)
        return cache[(kind, agent)]

    # ------------------------------------------------------------------ prompts
    def messages(self, template: str, **fields: Any) -> list[Message]:
        """System instruction of the task + the filled user template. ``question`` is always available."""
        assert self.example is not None
        fields.setdefault("question", self.task.prompt(self.example))
        try:
            user = self.prompts[template].format(**fields)
        except KeyError as e:
            raise ConfigError(f"prompt template {template!r} uses unknown field {e}; available: {sorted(fields)}") from None
        out: list[Message] = []
        if self.task.instruction:
            out.append({"role": "system", "content": self.task.instruction})
        out.append({"role": "user", "content": user})
        return out

    def extract(self, text: str) -> str | None:
        """The task's answer in ``text``, told whether it was cut off: the ``finish_reason`` of the turn
        whose :class:`Reply` ``text`` is (``None``, not known, for any other string)."""
        return self.task.extract(text, getattr(text, "finish_reason", None))

    # ------------------------------------------------------------------ PettingZoo API
    def reset(self, seed: int | None = None, options: dict | None = None):
        """Start an episode.

        Options:
            coalition: the pool members taking part (agent ids or indices); all by default.
            example: the question (an index into the task, an example id, or an ``Example``);
                drawn with the env's RNG by default.
        """
        if seed is not None or not hasattr(self, "_seeded"):
            self.np_random = np.random.default_rng(seed)
            self._seeded = True
        options = options or {}
        self.members = self._resolve_coalition(options.get("coalition"))
        self.example = self._resolve_example(options.get("example"))
        self.agents = list(self.members) + list(self.role_agents)
        self.transcript, self.outcome = [], None
        self._phase_index = 0
        self._game = self._play()
        self._phase = next(self._game)
        self._check_phase(self._phase)
        obs, infos = self._observe()
        return obs, infos

    def step(self, actions: dict[str, Any], finish_reasons: Mapping[str, str] | None = None):
        """PettingZoo's ``step``. A text action may be a :class:`Reply`, which says whether the text
        was cut off at ``max_new_tokens`` (``finish_reason="length"``): the task's extraction reads a
        cut-off answer differently. An action truncated to ``max_action_chars`` counts as cut off.
        ``finish_reasons`` (``agent -> reason``) is deprecated: pass ``Reply`` actions."""
        if self._game is None or self._phase is None:
            raise RuntimeError("step() called before reset() or after the episode ended; call reset()")
        if finish_reasons is not None:
            warnings.warn("step(actions, finish_reasons=...) is deprecated (PettingZoo wrappers drop it): pass "
                          "actions as crl_envs.protocols.base.Reply(text, finish_reason)", DeprecationWarning,
                          stacklevel=2)
            actions = {a: Reply(v, finish_reasons[a]) if isinstance(v, str) and a in finish_reasons else v
                       for a, v in actions.items()}
        texts = {}
        for agent in self._phase.prompts:
            texts[agent] = self._sanitize(agent, actions.get(agent))
            self.transcript.append(
                Turn(self._phase_index, self._phase.name, agent, self._phase.prompts[agent], texts[agent])
            )
        self._phase_index += 1
        try:
            self._phase = self._game.send(texts)
            self._check_phase(self._phase)
        except StopIteration as stop:
            self._phase = None
            self._finish(stop.value)
        if self.render_mode == "human":
            self.render()
        if self._phase is None:
            assert self.outcome is not None
            live = list(self.agents)
            score = float(self.outcome.score)
            rewards = dict.fromkeys(live, score)
            obs = {a: {"prompt": ""} for a in live}
            infos = {a: self._final_info(a) for a in live}
            terms = dict.fromkeys(live, True)
            truncs = dict.fromkeys(live, False)
            self.agents = []
            return obs, rewards, terms, truncs, infos
        obs, infos = self._observe()
        zeros = dict.fromkeys(self.agents, 0.0)
        falses = dict.fromkeys(self.agents, False)
        return obs, zeros, dict(falses), dict(falses), infos

    def render(self) -> str | None:
        lines = []
        for t in self.transcript:
            lines.append(f"[{t.phase}:{t.phase_name}] {t.agent} ({self.model_name(t.agent)}): {t.text}")
        if self.outcome is not None:
            lines.append(f"=> answer {self.outcome.answer!r}  score {self.outcome.score}  (reference {self.example.answer!r})")
        text = "\n".join(lines)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        self._game = None

    # ------------------------------------------------------------------ protocol hook
    @abc.abstractmethod
    def _play(self) -> Generator[Phase, dict[str, str], Outcome]:
        """The protocol: yield each :class:`Phase`, receive the actions, return the :class:`Outcome`."""

    @property
    def phase(self) -> Phase | None:
        """The current phase (``None`` once the episode ended)."""
        return self._phase

    def pending_turns(self) -> list[PendingTurn]:
        """The turns the current phase waits for, in :attr:`agents` order (the order of ``infos``):
        exactly the agents ``infos`` marks active. Empty before ``reset`` and once the episode ended."""
        if self._phase is None:
            return []
        prompts = self._phase.prompts
        return [PendingTurn(a, self._phase.name, self._phase_index, prompts[a])
                for a in self.agents if prompts.get(a) is not None]

    # ------------------------------------------------------------------ internals
    def _resolve_coalition(self, coalition: Sequence[str | int] | None) -> list[str]:
        if coalition is None:
            return list(self.pool.ids)
        if isinstance(coalition, (str, int)):
            coalition = [coalition]
        chosen = set()
        for m in coalition:
            if isinstance(m, (int, np.integer)) and not isinstance(m, bool):
                if not 0 <= m < len(self.pool):
                    raise ConfigError(f"coalition index {m} out of range for a pool of {len(self.pool)}")
                chosen.add(self.pool.ids[m])
            elif isinstance(m, str) and m in self.pool:
                chosen.add(m)
            else:
                raise ConfigError(f"coalition names unknown agent {m!r}; pool agents are {self.pool.ids}")
        if not chosen:
            raise ConfigError(
                f"empty coalition: nothing to play. The value of the empty coalition is "
                f"{type(self).__name__}.empty_value = {self.empty_value}"
            )
        return [a for a in self.pool.ids if a in chosen]

    def _resolve_example(self, example: int | str | Example | None) -> Example:
        if example is None:
            return self.task[int(self.np_random.integers(len(self.task)))]
        if isinstance(example, Example):
            return example
        if isinstance(example, (int, np.integer)) and not isinstance(example, bool):
            if not 0 <= example < len(self.task):
                raise ConfigError(f"example index {example} out of range for a task of {len(self.task)}")
            return self.task[int(example)]
        if isinstance(example, str):
            return self.task.by_id(example)
        raise ConfigTypeError(f"options['example'] must be an index, an example id or an Example, got {type(example).__name__}")

    def _check_phase(self, phase: Phase) -> None:
        stray = set(phase.prompts) - set(self.agents)
        if stray:  # a protocol bug, never user input
            raise RuntimeError(f"{self.metadata['name']} asked non-playing agents {sorted(stray)} to act")

    def _sanitize(self, agent: str, action: Any) -> str:
        space = self.action_space(agent)
        if isinstance(space, spaces.Discrete):
            if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
                return str(int(action))
            if isinstance(action, np.ndarray) and action.shape in ((), (1,)):
                return str(int(action.reshape(())))
            raise ConfigTypeError(f"{agent}'s action must be an int (a choice index), got {type(action).__name__}")
        if action is None:
            raise ConfigError(f"{agent} is active in phase {self._phase.name!r} but no action was given for it")
        if not isinstance(action, str):
            raise ConfigTypeError(f"{agent}'s action must be a str (the text it answers), got {type(action).__name__}")
        if len(action) > self.max_action_chars:
            return Reply(action[: self.max_action_chars], "length")
        return Reply(action, getattr(action, "finish_reason", None))

    def _observe(self):
        assert self._phase is not None
        obs, infos = {}, {}
        pending = {turn.agent_id: turn.messages for turn in self.pending_turns()}
        for a in self.agents:
            msgs = pending.get(a)
            obs[a] = {"prompt": render_messages(msgs)[:MAX_OBSERVATION_CHARS] if msgs else ""}
            infos[a] = {
                "active": msgs is not None,
                "messages": msgs,
                "phase": self._phase.name,
                "phase_index": self._phase_index,
                "model": self.model_name(a),
                "example_id": self.example.id,
            }
        return obs, infos

    def _finish(self, outcome: Outcome) -> None:
        if not isinstance(outcome, Outcome):
            raise RuntimeError(f"{self.metadata['name']}._play must return an Outcome, got {outcome!r}")
        if outcome.score is None:
            outcome.score = self.task.score_answer(outcome.answer, self.example)
        self.outcome = outcome

    def _final_info(self, agent: str) -> dict[str, Any]:
        o = self.outcome
        return {
            "active": False,
            "messages": None,
            "phase": "end",
            "phase_index": self._phase_index,
            "model": self.model_name(agent),
            "example_id": self.example.id,
            "answer": o.answer,
            "score": o.score,
            "answers": dict(o.answers),
            "standalone": dict(o.standalone),
            "reference": self.example.answer,
        }


def render_messages(messages: Sequence[Message]) -> str:
    """A chat transcript as plain text, for observations and printing."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def format_answers(texts: Sequence[str], label: str = "Agent") -> str:
    """Peers' responses as one block: ``"Agent 1: ...\\nAgent 2: ..."`` (numbered by position only,
    so nothing reveals which pool members are absent)."""
    return "\n".join(f"{label} {k + 1}: {t.strip()}" for k, t in enumerate(texts))


def speaker_stops(n_agents: int, label: str = "Agent") -> list[str]:
    """The speaker markers :func:`format_answers` writes before peers' answers, each at a line start:
    stop strings for a base model that goes on to invent the next speaker's turn.

    Example:
        >>> speaker_stops(2)
        ['\\nAgent 1:', '\\nAgent 2:']
    """
    return [f"\n{label} {k}:" for k in range(1, n_agents + 1)]


def with_speaker_stops(sampling: SamplingParams, n_agents: int) -> SamplingParams:
    """``sampling`` that also stops at :func:`speaker_stops`: an answer ends where it starts a peer's
    turn ("\\nAgent 2: ..."), so no model, and no learner played from outside, writes lines that
    readers take for another agent's. The rule the CLI gives models and the learner's seat applies.

    Example:
        >>> with_speaker_stops(SamplingParams(stop=["\\nUser:"]), 2).stop
        ('\\nUser:', '\\nAgent 1:', '\\nAgent 2:')
    """
    return replace(sampling, stop=(*sampling.stop, *speaker_stops(n_agents)))


__all__ = ["ProtocolEnv", "Phase", "Outcome", "PendingTurn", "Reply", "Turn", "plurality", "plurality_winners", "pick_answer", "answer_codes", "render_messages", "format_answers",
           "speaker_stops", "with_speaker_stops", "MAX_ACTION_CHARS"]
