"""A learner's credit: which coalitions its training plays, the reward an episode earns from their outcomes,
and how many episodes a question costs.

The estimators (:mod:`crl_envs.valuation.estimators`) value every model of a pool from a coalition table; a
credit values *one learner's episode*, for training. The native trainers (:mod:`trainers.baselines`,
:mod:`trainers.crl`), the TRL rollout (:class:`trainers.trl.CRLRollout`) and the learner's seat
(:class:`crl_envs.integrations.seat.SeatGame`) all ask a :class:`Credit`; nothing else spells one out.

| credit | coalitions played for learner ``i`` (per question) | reward of an episode |
|---|---|---|
| ``system`` (:class:`SystemCredit`) | N, G episodes | v(N): the system's score (C-RL) |
| ``standalone`` (:class:`StandaloneCredit`) | {i} alone in ``vote``, G episodes | v({i}): the learner's own correctness (GRPO) |
| ``loo`` (:class:`LOOCredit`) | N (G), then N∖{i} (``samples``) | v(N) − v(N∖{i}) |
| ``shapley`` (:class:`ShapleyCredit`) | every S ∪ {i} (G each), then every S | Σ_S w(S) [v(S ∪ {i}) − v(S)] |

A credit is one :class:`Credit` subclass registered by name (:func:`register`; :data:`CREDITS` lists them).
:meth:`Credit.coalitions` lists the coalitions containing a learner that its episodes play (G per question,
the learner sampled and trained), each with the counterfactual its term subtracts (``without``; played
:attr:`Credit.samples` times per question, :meth:`Credit.counterfactuals`; the empty one is the protocol's
``v(∅)``, never played). :meth:`Credit.reward` turns the outcomes into the learner's reward, and
:meth:`Credit.episodes_per_question` says what a trainer step plays. Under a group baseline a
counterfactual's value is constant within a group and cancels: the Shapley trainer never plays its v(S),
and its :meth:`~Credit.episodes_per_question` counts only the coalitions containing a learner; the seat,
which hands out the reward itself, plays them.

Example:
    >>> loo = credit("loo", samples=2)
    >>> played = loo.coalitions(["a", "b", "c"], "b")
    >>> [(c.members, c.without) for c in played], loo.counterfactuals(played)
    ([(('a', 'b', 'c'), ('a', 'c'))], [('a', 'c')])
    >>> loo.reward(played, {("a", "b", "c"): 1.0, ("a", "c"): 0.25})
    0.75
    >>> loo.episodes_per_question(8, players=3)  # G + samples
    10
    >>> [round(c.weight, 4) for c in credit("shapley").coalitions(["a", "b", "c"], "b")]  # w(S ∪ b), n = 3
    [0.3333, 0.1667, 0.1667, 0.3333]

This module needs numpy only; its Shapley weights are the estimators' (:func:`~crl_envs.valuation.estimators.shapley_weight`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from crl_envs.valuation.estimators import shapley_weight  # the one place the weights are written
from crl_kit.errors import ConfigError
from crl_kit.validation import check_int

Members = tuple[str, ...]


@dataclass(frozen=True)
class Coalition:
    """One coalition containing the learner that a credit plays, and its term in the credit.

    Attributes:
        members: its players, in the pool's order; the learner's own episodes play it (G per question, the
            learner sampled and recorded).
        without: the counterfactual its term subtracts, ``members`` less the learner (played
            :attr:`Credit.samples` times per question; ``()`` is the protocol's ``v(∅)``, never played), or
            ``None``: nothing is subtracted.
        weight: the weight of its term (Shapley: w = (|S|-1)!(n-|S|)!/n!; one of k draws: 1/k).
        group_weight: the weight of its groups in a policy-gradient step, averaging 1 over the learner's
            coalitions (Shapley: w times their number; a draw: 1).
    """

    members: Members
    without: Members | None = None
    weight: float = 1.0
    group_weight: float = 1.0


def ordered(players: Sequence[str], members: Sequence[str]) -> Members:
    """``members`` in the players' order (a coalition's key everywhere)."""
    inside = set(members)
    return tuple(p for p in players if p in inside)


def _partners(players: Sequence[str], learner: str) -> list[str]:
    if learner not in players:
        raise ConfigError(f"learner {learner!r} is not among the players {list(players)}")
    return [p for p in players if p != learner]


class Credit:
    """A learner's credit: the coalitions to play (:meth:`coalitions`, :meth:`counterfactuals`), the reward
    their outcomes give (:meth:`reward`) and the episodes per question of a trainer step
    (:meth:`episodes_per_question`).

    The reward is ``Σ_c c.weight · [v(c.members) − v(c.without)]`` over the learner's coalitions (no subtraction
    where ``c.without`` is ``None``). A subclass sets :attr:`name` and :attr:`help` and overrides
    :meth:`coalitions` (and :meth:`episodes_per_question` where it plays more than G episodes per question);
    :func:`register` makes its name known to the trainers, the TRL rollout and the seat.
    """

    #: the name the TRL rollout and the seat take (``reward=``)
    name: ClassVar[str] = ""
    #: one line
    help: ClassVar[str] = ""
    #: the protocol the learner's own episodes play instead of the trainer's (``"vote"``: the learner alone)
    protocol: ClassVar[str | None] = None
    #: whether the learner's own episodes are system episodes (False: the learner alone, one call each)
    plays_system: ClassVar[bool] = True
    #: episodes per question of each counterfactual (its value is their mean)
    samples: int = 1

    def coalitions(self, players: Sequence[str], learner: str, *, seed: Sequence[int] = ()) -> list[Coalition]:
        """The coalitions containing ``learner`` to play, with their terms. ``seed``: a sampled credit's draw
        (the same seed, the same coalitions)."""
        _partners(players, learner)
        return [Coalition(tuple(players))]

    @staticmethod
    def counterfactuals(coalitions: Sequence[Coalition]) -> list[Members]:
        """The distinct counterfactuals (coalitions without the learner) whose values :meth:`reward` reads, in
        order; the empty one, ``()``, is the protocol's ``v(∅)`` and is never played."""
        return list(dict.fromkeys(c.without for c in coalitions if c.without is not None))

    def reward(self, coalitions: Sequence[Coalition], values: Mapping[Members, float]) -> float:
        """The learner's reward from ``values``: the outcome of each coalition of ``coalitions`` (an episode's
        score for the one it played) and of each counterfactual (its mean value; ``v(∅)`` for ``()``)."""
        total = 0.0
        for c in coalitions:
            total += c.weight * (values[c.members] - (0.0 if c.without is None else values[c.without]))
        return total

    def episodes_per_question(self, generations: int, players: int, learners: int = 1) -> int:
        """Episodes a trainer step plays per question, ``learners`` of ``players`` trained: G = ``generations`` per
        coalition played, plus the counterfactuals that do not cancel under its baseline (here: one coalition
        that every learner shares, G)."""
        return generations


#: name -> :class:`Credit` subclass: the one registry (:func:`register` adds to it).
REGISTRY: dict[str, type[Credit]] = {}


def register(cls: type[Credit]) -> type[Credit]:
    """Register a :class:`Credit` subclass under its :attr:`~Credit.name` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Credit)) or not cls.name or not isinstance(cls.name, str):
        raise ConfigError(f"register takes a Credit subclass with a name, got {cls!r}")
    REGISTRY[cls.name] = cls
    return cls


def credit(name: str | Credit, **options: Any) -> Credit:
    """The credit called ``name`` with its ``options`` (a :class:`Credit` is returned as it is).

    Raises:
        ConfigError: an unknown name (one line listing the registered ones).
    """
    if isinstance(name, Credit):
        return name
    if not isinstance(name, str) or name not in REGISTRY:
        raise ConfigError(f"unknown credit {name!r}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name](**options)


@register
class SystemCredit(Credit):
    """C-RL: the system's score is the learner's reward. Its counterfactual v(N∖{i}) does not depend on the
    learner's actions and cancels under the group baseline, so nothing but the G system episodes is played."""

    name = "system"
    help = "the system's score (C-RL)"


@register
class StandaloneCredit(Credit):
    """GRPO's reward: the learner's own correctness, answering alone (``vote`` with it as the only member)."""

    name = "standalone"
    help = "the learner alone: its own correctness (GRPO)"
    protocol = "vote"
    plays_system = False

    def coalitions(self, players: Sequence[str], learner: str, *, seed: Sequence[int] = ()) -> list[Coalition]:
        _partners(players, learner)
        return [Coalition((learner,))]


@register
class LOOCredit(Credit):
    """Leave-one-out: v(N) − v(N∖{i}), the coalition without the learner played ``samples`` times per
    question (its mean; 1 is exact when the partners are greedy)."""

    name = "loo"
    help = "the system's score minus v(N∖{i}), the coalition without the learner"

    def __init__(self, samples: int = 1) -> None:
        check_int("LOOCredit.samples", samples, minimum=1)
        self.samples = samples

    def coalitions(self, players: Sequence[str], learner: str, *, seed: Sequence[int] = ()) -> list[Coalition]:
        return [Coalition(tuple(players), without=tuple(_partners(players, learner)))]

    def episodes_per_question(self, generations: int, players: int, learners: int = 1) -> int:
        """G, plus ``samples`` for each learner's coalition without it (none for a pool of one: that is v(∅))."""
        return generations + (learners * self.samples if players > 1 else 0)


@register
class ShapleyCredit(Credit):
    """The learner's Shapley value φ_i = Σ_S w(S ∪ i) [v(S ∪ i) − v(S)] over the coalitions S of its partners.

    ``coalitions=None`` enumerates every S (exact; each term weighted by
    :func:`~crl_envs.valuation.estimators.shapley_weight`); an int ``k`` draws k coalitions from the Shapley
    distribution (size uniform in 0..n-1, then members uniform), each weighted 1/k: an unbiased estimate for
    large pools, seeded by ``seed`` (the trainer's: its config seed, the step, the learner's position).
    The v(S) terms are constant within a group and cancel under a group baseline: the trainer plays only
    the coalitions containing the learner.
    """

    name = "shapley"
    help = "the learner's Shapley value over the coalitions of its partners"

    def __init__(self, coalitions: int | None = None) -> None:
        if coalitions is not None:
            check_int("ShapleyCredit.coalitions", coalitions, minimum=1)
        self.draws = coalitions

    def coalitions(self, players: Sequence[str], learner: str, *, seed: Sequence[int] = ()) -> list[Coalition]:
        others, n = _partners(players, learner), len(players)
        if self.draws is None:
            every = [c for size in range(len(others) + 1) for c in itertools.combinations(others, size)]
            return [Coalition(ordered(players, [learner, *c]), ordered(players, c), shapley_weight(len(c) + 1, n),
                              len(every) * shapley_weight(len(c) + 1, n)) for c in every]
        rng = np.random.default_rng(list(seed))
        drawn = []
        for _ in range(self.draws):
            size = int(rng.integers(0, n))  # partners: 0 .. n-1, uniformly (the Shapley distribution)
            partners = list(rng.choice(others, size=size, replace=False)) if size else []
            drawn.append(Coalition(ordered(players, [learner, *partners]), ordered(players, partners),
                                   1.0 / self.draws, 1.0))
        return drawn

    def episodes_per_question(self, generations: int, players: int, learners: int = 1) -> int:
        """Exact: G x (2^n − 2^(n−k)), every coalition containing one of the k learners (each trains the
        learners in it); sampled: G x k x ``coalitions`` (each learner draws its own)."""
        if self.draws is None:
            return generations * (2**players - 2 ** (players - learners))
        return generations * learners * self.draws


#: The credits the trainers, the TRL rollout and the seat take, by name, in registration order.
CREDITS: tuple[str, ...] = tuple(REGISTRY)
