"""The logit and weight levels: protocols whose coalition answers as **one model built from its members**.

MoCo's four levels of model collaboration are routing/API, text, logit and weight. At the logit level
the members' next-token logits are fused at every decoding step (:class:`agents.logit.LogitEnsemble`);
at the weight level their weights are merged into one network (:func:`agents.merge.merged_agent`).
Either way the coalition ``S`` becomes one model, ``model(S)``, which answers the task: ``v(S)`` is its
accuracy. :class:`SeatEnv` is that game as a protocol env: one phase, ``answer``, whose one active
agent is a fixed **seat** (``ensemble`` or ``merged``) played by ``model(coalition)``; the members are
agents of the env (masked in and out as in every protocol, rewarded with the system's score) that act
through the seat. So :func:`crl_envs.run_episodes`, :func:`crl_envs.valuation.evaluate`, the coalition
cache, the request memo and ``crl-envs value`` play these games unchanged, and the runner batches a
coalition's questions into one call of its model (for an ensemble: the members' forwards in lockstep,
each with its KV cache, :meth:`agents.logit.LogitEnsemble.decode`).

These protocols read the members' logits or weights, so they play transformers models (``HFAgent``)
only, and a pool they cannot combine fails at construction with one line (another vocabulary, another
architecture, another base). They are listed in :data:`crl_envs.roster.MODEL_LEVEL`, apart from the text
protocols' table (whose tests play scripted pools).

``logit_fusion_v0`` also has the step-level form the issue describes, :class:`LogitStepEnv`: every decoding
step is one phase in which every member's action is its next-token logits.
"""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Generator, Sequence
from typing import Any

from agents import Agent, Generation, Request
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv


class Seat(Agent):
    """The fixed agent id that answers for a coalition; the env plays it with ``model(coalition)``
    (:meth:`SeatEnv.agent_for`), so this object itself never generates."""

    def __init__(self, name: str, rule: str):
        self.name = name
        self.rule = rule

    @property
    def fingerprint(self) -> str:
        """The seat and the env's rule; the coalition's members are keyed by the coalition cache."""
        return f"seat:{self.name}:{self.rule}"

    def _generate(self, requests: list[Request]) -> list[Generation]:
        raise RuntimeError(f"the {self.name!r} seat is played by env.agent_for({self.name!r}), the coalition's model")


def versions(agent: Any) -> tuple:
    """The in-place write counters of an HF agent's parameters: they move whenever its weights do."""
    model = getattr(agent, "model", None)
    return tuple(p._version for p in model.parameters()) if model is not None else ()


class SeatEnv(ProtocolEnv, abc.ABC):
    """A coalition answering as one model built from its members (see the module docstring).

    Subclasses set :attr:`SEAT` and write :meth:`check_pool` (one-line errors, run once per pool) and
    :meth:`build` (the coalition's model). ``model(S)`` is built once per coalition and reused across the
    episodes of a run (cached by the members' identity and their weights' write counters).
    """

    PROMPTS = {"answer": "{question}"}
    empty_value = 0.0
    SEAT = "seat"
    _CHECKED: OrderedDict[tuple, list[Agent]] = OrderedDict()
    _MODELS: OrderedDict[tuple, tuple[Agent, list[Agent]]] = OrderedDict()
    CACHE_SIZE = 1024

    def __init__(self, pool, task, **kwargs):
        super().__init__(pool, task, **kwargs)
        members = [self.pool[a] for a in self.pool.ids]
        key = (type(self), self.rule(), tuple(id(m) for m in members))
        if key not in SeatEnv._CHECKED:
            self.check_pool(members)
            _remember(SeatEnv._CHECKED, key, members, self.CACHE_SIZE)  # held, so their ids stay theirs
        self.add_role(self.SEAT, Seat(self.SEAT, self.rule()))

    # ------------------------------------------------------------------ what subclasses write
    @abc.abstractmethod
    def rule(self) -> str:
        """How the members combine, in words with every parameter (the seat's fingerprint holds it)."""

    @abc.abstractmethod
    def check_pool(self, members: Sequence[Agent]) -> None:
        """Raise one ``ValueError`` line when these models cannot be combined."""

    @abc.abstractmethod
    def build(self, members: Sequence[str]) -> Agent:
        """The model of a coalition, given its member ids in pool order."""

    # ------------------------------------------------------------------ the seat
    def coalition_model(self, members: Sequence[str]) -> Agent:
        """``model(S)`` for the member ids ``members``, built once and reused while the weights stand."""
        agents = [self.pool[a] for a in members]
        key = (type(self), self.rule(), tuple((a, id(m), versions(m)) for a, m in zip(members, agents)))
        if key not in SeatEnv._MODELS:  # the members are held with it, so their ids stay theirs
            _remember(SeatEnv._MODELS, key, (self.build(list(members)), agents), self.CACHE_SIZE)
        return SeatEnv._MODELS[key][0]

    def agent_for(self, agent_id: str) -> Agent:
        if agent_id == self.SEAT and self.members:
            return self.coalition_model(self.members)
        return super().agent_for(agent_id)

    def _play(self) -> Generator[Phase, dict[str, str], Outcome]:
        texts = yield Phase("answer", {self.SEAT: self.messages("answer")})
        answer = self.extract(texts[self.SEAT])
        return Outcome(answer=answer, answers={self.SEAT: answer})


def _remember(store: OrderedDict, key: tuple, value: Any, size: int) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > size:
        store.popitem(last=False)


__all__ = ["SeatEnv", "Seat", "versions"]
