"""The weight level's shared machinery: a coalition answers as the merge of its members' weights.

:class:`MergeEnv` is the :class:`~crl_envs.protocols.levels.SeatEnv` whose seat, ``merged``, is played by
:func:`agents.merge.merged_agent` of the coalition's members (cached by content). ``soup_v0``,
``task_arithmetic_v0`` and ``ties_v0`` are its three methods. The methods from a base (task arithmetic,
TIES) take ``base=`` (an agent or a spec string such as ``"hf:/path/to/base"``) and value the empty
coalition as the base answering alone: the merge of no task vectors is the base.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents import Agent, Request, SamplingParams, from_spec
from agents.merge import check_common_base, check_mergeable, merged_agent
from crl_envs.protocols.levels import SeatEnv, versions
from crl_kit.errors import ConfigError, ConfigTypeError

#: v(∅) of the base methods: (base fingerprint, task fingerprint, examples) -> the base's accuracy
_BASE_ALONE: dict[tuple, float] = {}
#: how the base answers for v(∅): greedy, as the runner's default sampling
BASE_SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=256)


_FINGERPRINTS: dict[tuple, tuple[str, Agent]] = {}


def base_fingerprint(base: Agent) -> str:
    """``base.fingerprint``, computed once per base object and weights (every episode's env asks for it)."""
    key = (id(base), versions(base))
    if key not in _FINGERPRINTS:
        if len(_FINGERPRINTS) > 64:
            _FINGERPRINTS.clear()
        _FINGERPRINTS[key] = (base.fingerprint, base)  # the base is held, so its id stays its own
    return _FINGERPRINTS[key][0]


class MergeEnv(SeatEnv):
    """A coalition answering as ``merged_agent(METHOD, members, base, **params)``."""

    FAMILY = "weight"
    SEAT = "merged"
    METHOD = "soup"
    NEEDS_BASE = False

    def __init__(self, pool, task, *, base: Agent | str | None = None, **kwargs):
        params = {k: kwargs.pop(k) for k in list(kwargs) if k in self.PARAMS}
        self.params = self.check_params(params)
        if self.NEEDS_BASE and base is None:
            raise ConfigError(f"{self.METHOD}_v0 needs base=: the members' common base model (an agent or a spec "
                              "such as 'hf:/path/to/base')")
        if not self.NEEDS_BASE and base is not None:
            raise ConfigError(f"{self.METHOD}_v0 takes no base (a uniform soup averages the members); "
                              "task_arithmetic_v0 and ties_v0 do")
        if base is not None and not isinstance(base, (Agent, str)):
            raise ConfigTypeError(f"base must be an agents.Agent or a spec string, got {type(base).__name__}")
        self.base = from_spec(base) if isinstance(base, str) else base
        super().__init__(pool, task, **kwargs)

    #: the method's parameters (keyword options) and their defaults
    PARAMS: dict[str, float] = {}

    def check_params(self, params: dict[str, Any]) -> dict[str, float]:
        out = dict(self.PARAMS)
        for k, v in params.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
                raise ConfigError(f"{self.METHOD}_v0: {k} must be a finite number, got {v!r}")
            out[k] = float(v)
        return out

    def rule(self) -> str:
        base = None if self.base is None else base_fingerprint(self.base)
        return f"{self.METHOD}({sorted(self.params.items())}, base={base})"

    def check_pool(self, members: Sequence[Agent]) -> None:
        if self.base is None:
            check_mergeable(members, what=f"{self.METHOD}_v0")
        else:
            check_common_base(members, self.base, f"{self.METHOD}_v0")

    def build(self, members: Sequence[str]) -> Agent:
        return merged_agent(self.METHOD, [self.pool[a] for a in members], self.base, **self.params)

    @property
    def empty_value(self) -> float:  # type: ignore[override]
        """v(∅): 0 for the soup (no model); for a method from a base, the base answering every question of
        the task alone (greedy), the merge of no task vectors."""
        if self.base is None:
            return 0.0
        key = (base_fingerprint(self.base), self.task.fingerprint, tuple(e.id for e in self.task.examples))
        if key not in _BASE_ALONE:
            _BASE_ALONE[key] = self._base_alone()
        return _BASE_ALONE[key]

    def _base_alone(self) -> float:
        held = self.example
        try:
            requests = []
            for example in self.task.examples:
                self.example = example
                requests.append(Request(self.messages("answer"), BASE_SAMPLING))
        finally:
            self.example = held
        gens = self.base.generate(requests)
        scores = [self.task.score_answer(self.task.extract(g.text, g.finish_reason), e)
                  for g, e in zip(gens, self.task.examples)]
        return float(sum(scores) / len(scores)) if scores else 0.0


__all__ = ["MergeEnv", "BASE_SAMPLING"]
