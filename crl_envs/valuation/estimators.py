"""Value estimators: which coalitions each needs, and its values as weight matrices over them.

Every estimator here is linear in the coalition values: ``phi = W @ V`` where ``V`` is the
``(coalitions, questions)`` score table and ``W`` an ``(n, coalitions)`` weight matrix. So one
matrix product gives every player's value on every question, and means and bootstrap CIs over
questions follow for free. Coalitions are bitmasks (bit ``i`` = player ``i``).

An estimator is one :class:`Estimator` subclass, registered by name (:func:`register`; :data:`ESTIMATORS`
lists the names): built for ``n`` players, a budget and a seed, it knows the coalitions it needs
(:meth:`Estimator.coalitions`), what they cost (:meth:`Estimator.coalitions_per_size`) and the values a
coalition table gives (:meth:`Estimator.estimate`). :func:`crl_envs.valuation.evaluate`, a study's plan and
``crl-envs value`` ask it; nothing else spells an estimator out. The registered ones:

- ``exact`` (:class:`ExactEstimator`): Shapley (:func:`shapley_weights`) and Banzhaf
  (:func:`banzhaf_weights`, every coalition weighted ``1 / 2^(n-1)``) over all ``2^n`` coalitions;
- ``loo`` (:class:`LOOEstimator`): leave-one-out ``v(N) - v(N \\ {i})`` (:func:`loo_weights`), on ``n + 1``
  coalitions; every estimator reports it;
- ``permutation`` / ``antithetic`` (:class:`PermutationEstimator`, :class:`AntitheticEstimator`): Monte Carlo
  Shapley from ``budget`` sampled permutations (:func:`permutation_weights`; antithetic: each permutation
  paired with its reverse), on the distinct prefixes only; :func:`permutation_draws` splits the estimate
  into its independent Monte Carlo draws (one per permutation, or per antithetic pair), which the bootstrap
  resamples along with the questions;
- ``regression`` (:class:`RegressionEstimator`): Shapley by the kernel's constrained weighted least squares
  (:func:`regression_weights`) over the ``2n + 1`` border coalitions and ``budget`` sampled ones, stratified by
  size and paired with their complements; its Monte Carlo error is a stratified jackknife (95% intervals
  cover 0.94-0.96). At equal coalition counts (100-350) its RMSE is 0.23-0.58x antithetic's on vote games of
  zoo v4 unions and a planted vote game at n = 10-12 (at most 0.5x from ~190 coalitions on, except the last),
  0.58-0.85x on a pool of near-clones and 0.8-1.1x on an oracle router's game (``benchmarks/regression_shapley.py``).

A protocol whose coalitions are computed from its members' answers (``vote``) values up to
:data:`MAX_COMPUTED_EXACT_PLAYERS` models exactly; played coalitions up to :data:`MAX_EXACT_PLAYERS`.

This module needs numpy only (no model, no torch): the trainers take their Shapley weights from it
(:func:`shapley_weight`), and ``crl-envs value --help`` reads :data:`ESTIMATORS`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from math import comb, factorial
from typing import Any

import numpy as np

from crl_kit.errors import ConfigError

MAX_EXACT_PLAYERS = 12
"""Exact estimators enumerate 2^n coalitions; beyond this many played ones, use a sampled estimator."""
MAX_COMPUTED_EXACT_PLAYERS = 16
"""The limit where coalitions are computed from the members' answers, not played (a protocol with an
``aggregate`` rule, as vote): 2^16 coalitions cost no generation, and their weights fit in memory."""


def _check_exact(n: int, limit: int = MAX_COMPUTED_EXACT_PLAYERS) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"the number of players must be an int >= 1, got {n!r}")
    if n > limit:
        raise ConfigError(
            f"exact valuation enumerates 2^n coalitions: {2**n} for a pool of {n}, too many "
            f"(limit {limit} players{' whose coalitions are played' if limit < MAX_COMPUTED_EXACT_PLAYERS else ''}). "
            f"Use estimator='permutation', 'antithetic' or 'regression' with a budget, or estimator='loo' (n+1 coalitions)."
        )


def coalition_sizes(n: int) -> np.ndarray:
    """``|S|`` for every mask ``0 .. 2^n - 1``."""
    masks = np.arange(1 << n)
    return np.array([bin(m).count("1") for m in masks])


def membership(n: int) -> np.ndarray:
    """``(n, 2^n)`` boolean: ``[i, S]`` is whether player ``i`` belongs to coalition ``S``."""
    masks = np.arange(1 << n)
    return (masks[None, :] >> np.arange(n)[:, None]) & 1 == 1


def shapley_weight(size: int, n: int) -> float:
    """The Shapley weight of a coalition of ``size`` members containing player ``i``, out of ``n``:
    ``(size-1)! (n-size)! / n!``; they sum to 1 over all coalitions containing ``i``. The one place the
    weight is written (:func:`shapley_weights` and the trainers' Shapley credit use it).

    >>> shapley_weight(1, 3), shapley_weight(2, 3), shapley_weight(3, 3)
    (0.3333333333333333, 0.16666666666666666, 0.3333333333333333)
    """
    return factorial(size - 1) * factorial(n - size) / factorial(n)


def shapley_weights(n: int) -> np.ndarray:
    """``(n, 2^n)``: ``phi_i = sum_S W[i, S] v(S)`` is the exact Shapley value.

    ``W[i, S] = w(|S|)`` if ``i`` in ``S``, else ``-w(|S| + 1)``, ``w`` the :func:`shapley_weight`
    (``v(S + i) - v(S)`` weighted by the weight of ``S + i``).
    """
    _check_exact(n)
    size = coalition_sizes(n)
    inside = membership(n)
    plus = np.array([shapley_weight(s, n) if s >= 1 else 0.0 for s in size])
    minus = np.array([-shapley_weight(s + 1, n) if s <= n - 1 else 0.0 for s in size])
    return np.where(inside, plus[None, :], minus[None, :])


def banzhaf_weights(n: int) -> np.ndarray:
    """``(n, 2^n)``: the Banzhaf value, ``mean over S not containing i of v(S + i) - v(S)``."""
    _check_exact(n)
    return np.where(membership(n), 1.0, -1.0) / 2 ** (n - 1)


def loo_masks(n: int) -> list[int]:
    """The ``n + 1`` coalitions leave-one-out needs: ``N`` then ``N \\ {i}`` for each ``i``."""
    full = (1 << n) - 1
    return [full] + [full & ~(1 << i) for i in range(n)]


def loo_weights(n: int) -> tuple[list[int], np.ndarray]:
    """``(masks, W)`` with ``W @ table(masks)`` = ``v(N) - v(N \\ {i})`` per player."""
    masks = loo_masks(n)
    w = np.zeros((n, len(masks)))
    w[:, 0] = 1.0
    w[np.arange(n), np.arange(1, n + 1)] = -1.0
    return masks, w


def sample_permutations(n: int, budget: int, seed: int = 0, antithetic: bool = False) -> np.ndarray:
    """``(budget, n)`` permutations of the players; antithetic draws come in (pi, reversed pi) pairs."""
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ConfigError(f"budget (the number of permutations) must be an int >= 1, got {budget!r}")
    rng = np.random.default_rng(seed)
    if not antithetic:
        return np.stack([rng.permutation(n) for _ in range(budget)])
    if budget % 2:
        raise ConfigError(
            f"antithetic sampling pairs each permutation with its reverse, so budget must be even, got {budget}"
        )
    half = np.stack([rng.permutation(n) for _ in range(budget // 2)])
    out = np.empty((budget, n), dtype=half.dtype)
    out[0::2], out[1::2] = half, half[:, ::-1]
    return out


def permutation_weights(perms: np.ndarray) -> tuple[list[int], np.ndarray]:
    """``(masks, W)``: the Monte Carlo Shapley estimate ``mean over perms of v(P + i) - v(P)``,
    ``P`` the players before ``i``. Each distinct coalition appears once in ``masks`` (a coalition
    cache: a prefix shared by many permutations is evaluated once)."""
    perms = np.asarray(perms)
    if perms.ndim != 2 or perms.shape[0] < 1 or not np.issubdtype(perms.dtype, np.integer):
        raise ConfigError(f"permutation_weights expects a (budget, n) int array of permutations of 0..n-1, "
                         f"got shape {perms.shape} and dtype {perms.dtype}")
    budget, n = perms.shape
    bad = np.flatnonzero((np.sort(perms, axis=1) != np.arange(n)).any(axis=1))
    if bad.size:
        raise ConfigError(f"permutation_weights: row {int(bad[0])} ({perms[bad[0]].tolist()}) is not a permutation of "
                         f"0..{n - 1} ({bad.size} such rows); draw rows with sample_permutations(n, budget, seed)")
    column: dict[int, int] = {}
    entries: list[tuple[int, int, float]] = []

    def col(mask: int) -> int:
        if mask not in column:
            column[mask] = len(column)
        return column[mask]

    for perm in perms:
        before = 0
        for player in perm:
            after = before | (1 << int(player))
            entries.append((int(player), col(after), 1.0 / budget))
            entries.append((int(player), col(before), -1.0 / budget))
            before = after
    w = np.zeros((n, len(column)))
    for player, c, weight in entries:
        w[player, c] += weight
    return list(column), w


def permutation_draws(perms: np.ndarray, value: Mapping[int, float] | Callable[[int], float],
                      antithetic: bool = False) -> np.ndarray:
    """``(n, draws)``: each independent Monte Carlo draw of the sampled Shapley value, ``value(S)``
    being ``v(S)`` (e.g. its mean over questions). A draw is one permutation's marginal contributions
    ``v(P + i) - v(P)``, or, when ``antithetic``, the mean of a permutation's and its reverse's (the
    pair is the unit drawn independently). The mean over draws is :func:`permutation_weights`' estimate.
    """
    perms = np.asarray(perms)
    budget, n = perms.shape
    get = value.__getitem__ if isinstance(value, Mapping) else value
    marginals = np.zeros((budget, n))
    for b, perm in enumerate(perms):
        before = 0
        for player in perm:
            after = before | (1 << int(player))
            marginals[b, int(player)] = get(after) - get(before)
            before = after
    if antithetic:
        if budget % 2:
            raise ConfigError(f"antithetic draws come in pairs: got {budget} permutations")
        marginals = (marginals[0::2] + marginals[1::2]) / 2
    return marginals.T


def exact_masks(n: int) -> list[int]:
    """All ``2^n`` coalitions, the empty one first."""
    _check_exact(n)
    return list(range(1 << n))


def estimator_for(n: int, estimator: str | Mapping[str, Any], *, computed: bool = False) -> str:
    """The estimator for a pool of ``n`` models: ``estimator`` itself, or, for a rule
    ``{"exact_up_to": k, "larger": name}`` (a study's ``[valuation] estimator``), ``"exact"`` up to ``k``
    models and ``name`` above; a rule's ``"computed"`` estimator, where it names one, for a game whose coalitions
    are ``computed`` from its members' answers (vote: exact costs no generation there). The one place the rule
    is written (the config, the plan and the cells read it).

    >>> estimator_for(5, "loo"), estimator_for(5, {"exact_up_to": 6, "larger": "loo"}), \\
    ...     estimator_for(7, {"exact_up_to": 6, "larger": "loo"})
    ('loo', 'exact', 'loo')
    >>> rule = {"exact_up_to": 8, "larger": "regression", "computed": "exact"}
    >>> estimator_for(16, rule), estimator_for(16, rule, computed=True)
    ('regression', 'exact')
    """
    if isinstance(estimator, str):
        return estimator
    if computed and estimator.get("computed") is not None:
        return estimator["computed"]
    return "exact" if n <= estimator["exact_up_to"] else estimator["larger"]


# ---------------------------------------------------------------------- estimators as objects
def _by_size(n: int, masks: list[int]) -> dict[int, float]:
    """Size -> how many of the non-empty ``masks`` have that many members."""
    out: dict[int, float] = {}
    for m in masks:
        if m:
            out[bin(m).count("1")] = out.get(bin(m).count("1"), 0.0) + 1.0
    return out


class Estimator:
    """An estimator of the models' values, built for ``n`` players (and, for a sampled one, a ``budget`` and
    the ``seed`` of its draws). Like a shapiq ``Approximator`` it is one class per method, but it plays
    nothing: it names the coalitions it needs, and turns their per-question values into the values
    (``phi = W @ V``), so a study can plan and cost it without playing a game.

    ``computed``: the game computes its coalitions from its members' answers instead of playing them (a protocol
    with an ``aggregate`` rule, as vote), so ``exact`` takes up to :data:`MAX_COMPUTED_EXACT_PLAYERS` players.

    A subclass sets :attr:`name` and :attr:`help`, the measures it adds to LOO (:attr:`measures`) and their
    weights (:meth:`weights`); one that samples sets :attr:`budget_unit`. Register it with :func:`register`:
    :func:`crl_envs.valuation.evaluate`, ``crl-envs value --estimator`` and a study's ``[valuation]
    estimator`` then take its name.

    Example:
        >>> e = estimator("loo", 3)
        >>> e.coalitions(), e.measures, e.compositional
        ([7, 6, 5, 3], ('loo',), 'loo')
        >>> values = {7: np.array([1.0, 1.0]), 6: np.array([1.0, 0.0]), 5: np.array([0.0, 0.0]), 3: np.array([1.0, 1.0])}
        >>> e.estimate(values, "loo")[0].tolist()   # per player, per question
        [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    """

    #: the name :func:`crl_envs.valuation.evaluate` takes (``estimator=``)
    name: str = ""
    #: one line for ``crl-envs value --help``
    help: str = ""
    #: what a budget counts (``"permutations"``), or ``None``: the estimator takes no budget
    budget_unit: str | None = None
    #: the smallest budget it accepts
    min_budget: int = 2
    #: the measures it reports (of :data:`crl_envs.valuation.report.COMPOSITIONAL`), LOO always first
    measures: tuple[str, ...] = ("loo",)

    def __init__(self, n: int, *, budget: int | None = None, seed: int = 0, computed: bool = False) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(f"the number of players must be an int >= 1, got {n!r}")
        type(self).check_budget(budget)
        self.n, self.budget, self.seed, self.computed = int(n), budget, seed, computed

    @property
    def compositional(self) -> str:
        """The measure it values the cost and trade-off games with: Shapley where it computes it, else LOO."""
        return "shapley" if "shapley" in self.measures else "loo"

    @classmethod
    def check_budget(cls, budget: int | None, *, flags: bool = False) -> None:
        """Refuse a missing, unwanted or bad budget, in one line spelled for the API (``budget=``) or, with
        ``flags``, for the command line (``--budget``)."""
        est = f"--estimator {cls.name}" if flags else f"estimator={cls.name!r}"
        opt, eg = ("--budget", "--budget 200") if flags else ("budget", "budget=200")
        if cls.budget_unit is None:
            if budget is not None:
                names = [e if flags else repr(e) for e in SAMPLED_ESTIMATORS]
                takers = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
                raise ConfigError(f"{opt} only applies to {'--estimator ' if flags else 'estimator='}{takers}, "
                                  f"not {cls.name if flags else repr(cls.name)}")
            return
        if budget is None:
            need = "--budget N, the number of" if flags else "budget=<number of"
            raise ConfigError(f"{est} needs {need} {cls.budget_unit}{'' if flags else '>'} (e.g. {eg})")
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < cls.min_budget:
            raise ConfigError(f"{opt} must be an int >= {cls.min_budget} {cls.budget_unit} (e.g. {eg}), got {budget!r}")
        problem = cls.budget_problem(int(budget))
        if problem:
            raise ConfigError(f"{est} {problem}")

    @classmethod
    def budget_problem(cls, budget: int) -> str | None:
        """What else is wrong with an int budget of at least :attr:`min_budget`, as a phrase following the
        estimator's name (``None``: nothing)."""
        return None

    def coalitions(self) -> list[int]:
        """The coalitions it needs, in the order they are played (the empty one, where it appears, is the
        protocol's ``v(∅)`` and never played): LOO's, then each measure's."""
        out = list(loo_masks(self.n))
        for measure in self.measures:
            out += self.weights(measure)[0]
        return list(dict.fromkeys(out))

    @classmethod
    def coalitions_per_size(cls, n: int, budget: int | None = None) -> dict[int, float]:
        """Size -> the number of distinct non-empty coalitions it plays on ``n`` players (for a sampled
        estimator, the number expected over its draws): what a study's plan costs without drawing them."""
        return _by_size(n, cls(n, budget=budget).coalitions())

    def weights(self, measure: str) -> tuple[list[int], np.ndarray]:
        """``(masks, W)``: ``W @ V`` (``V`` the values of ``masks``, one row each) is ``measure`` per player."""
        if measure == "loo":
            return loo_weights(self.n)
        raise ConfigError(f"estimator {self.name!r} does not compute {measure!r}; it reports {', '.join(self.measures)}")

    def draws(self, measure: str, value: Mapping[int, float]) -> np.ndarray | None:
        """``(n, draws)``: the independent Monte Carlo draws of a sampled ``measure`` (``value``: each
        coalition's mean value), which the bootstrap resamples; ``None`` for a measure that draws nothing."""
        return None

    def estimate(self, values: Mapping[int, np.ndarray], measure: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``(per_question, draws)`` of ``measure`` from the coalitions' values (``values[mask]``: per question,
        every mask of :meth:`coalitions`): ``(n, questions)`` and, for a sampled measure, ``(n, draws)``."""
        masks, w = self.weights(measure)
        draws = self.draws(measure, {m: float(values[m].mean()) for m in values})
        return w @ np.stack([values[m] for m in masks]), draws


#: name -> :class:`Estimator` subclass: the one registry (:func:`register` adds to it).
REGISTRY: dict[str, type[Estimator]] = {}


def register(cls: type[Estimator]) -> type[Estimator]:
    """Register an :class:`Estimator` subclass under its :attr:`~Estimator.name` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Estimator)) or not cls.name or not isinstance(cls.name, str):
        raise ConfigError(f"register takes an Estimator subclass with a name, got {cls!r}")
    if not cls.measures or cls.measures[0] != "loo" or not set(cls.measures) <= {"loo", "shapley", "banzhaf"}:
        raise ConfigError(f"estimator {cls.name!r}: measures must start with 'loo' and be among loo, shapley, "
                          f"banzhaf, got {cls.measures!r}")
    REGISTRY[cls.name] = cls
    return cls


def estimator_class(name: str) -> type[Estimator]:
    """The registered estimator called ``name``, or one line listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown estimator {name!r}; choose one of {', '.join(ESTIMATORS)}") from None


def estimator(name: str, n: int, *, budget: int | None = None, seed: int = 0, computed: bool = False) -> Estimator:
    """The estimator ``name`` for ``n`` players (``budget`` and ``seed``: a sampled estimator's draws;
    ``computed``: the game's coalitions are computed from answers, not played, so exact takes up to
    :data:`MAX_COMPUTED_EXACT_PLAYERS`)."""
    return estimator_class(name)(n, budget=budget, seed=seed, computed=computed)


class _Names(Sequence):
    """The registered names, in registration order (a live view: a name registered later appears)."""

    def __init__(self, which: Callable[[type[Estimator]], bool]) -> None:
        self._which = which

    def _names(self) -> tuple[str, ...]:
        return tuple(name for name, cls in REGISTRY.items() if self._which(cls))

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


#: The estimators :func:`crl_envs.valuation.evaluate` takes, by name (the CLI's ``--estimator`` and a study's
#: ``[valuation] estimator`` read it): the names of :data:`REGISTRY`.
ESTIMATORS: Sequence[str] = _Names(lambda cls: True)
#: The estimators that take a ``budget`` (they sample).
SAMPLED_ESTIMATORS: Sequence[str] = _Names(lambda cls: cls.budget_unit is not None)


@register
class ExactEstimator(Estimator):
    name = "exact"
    help = "Shapley + Banzhaf + LOO over every coalition: 2^n-1 coalitions"
    measures = ("loo", "shapley", "banzhaf")

    def __init__(self, n: int, *, budget: int | None = None, seed: int = 0, computed: bool = False) -> None:
        super().__init__(n, budget=budget, seed=seed, computed=computed)
        _check_exact(n, MAX_COMPUTED_EXACT_PLAYERS if computed else MAX_EXACT_PLAYERS)

    def coalitions(self) -> list[int]:
        """LOO's, then every coalition, the largest first."""
        return list(dict.fromkeys(loo_masks(self.n) + sorted(exact_masks(self.n), key=lambda m: -bin(m).count("1"))))

    @classmethod
    def coalitions_per_size(cls, n: int, budget: int | None = None) -> dict[int, float]:
        return {k: float(comb(n, k)) for k in range(1, n + 1)}

    def weights(self, measure: str) -> tuple[list[int], np.ndarray]:
        if measure == "shapley":
            return exact_masks(self.n), shapley_weights(self.n)
        if measure == "banzhaf":
            return exact_masks(self.n), banzhaf_weights(self.n)
        return super().weights(measure)


@register
class LOOEstimator(Estimator):
    name = "loo"
    help = "leave-one-out v(N) - v(N \\ {i}): n+1 coalitions"


@register
class PermutationEstimator(Estimator):
    name = "permutation"
    help = "Monte Carlo Shapley from --budget sampled permutations, + LOO"
    budget_unit = "permutations"
    measures = ("loo", "shapley")
    antithetic = False

    def __init__(self, n: int, *, budget: int | None = None, seed: int = 0, computed: bool = False) -> None:
        super().__init__(n, budget=budget, seed=seed, computed=computed)
        self.permutations = sample_permutations(self.n, budget, seed=seed, antithetic=self.antithetic)
        self._shapley = permutation_weights(self.permutations)

    @classmethod
    def coalitions_per_size(cls, n: int, budget: int | None = None) -> dict[int, float]:
        """A permutation's size-``k`` prefix is uniform over the ``C(n, k)`` coalitions of that size: ``budget``
        permutations give ``C(n, k) (1 - (1 - 1 / C(n, k))^budget)`` distinct ones in expectation (LOO's always)."""
        cls.check_budget(budget)
        loo = _by_size(n, loo_masks(n))
        out = {}
        for k in range(1, n + 1):
            c = comb(n, k)
            expected = 1.0 if c == 1 else -c * math.expm1(budget * math.log1p(-1.0 / c))
            out[k] = max(expected, loo.get(k, 0.0))
        return out

    def weights(self, measure: str) -> tuple[list[int], np.ndarray]:
        return self._shapley if measure == "shapley" else super().weights(measure)

    def draws(self, measure: str, value: Mapping[int, float]) -> np.ndarray | None:
        if measure != "shapley":
            return None
        return permutation_draws(self.permutations, value, antithetic=self.antithetic)


@register
class AntitheticEstimator(PermutationEstimator):
    name = "antithetic"
    help = "as permutation, each permutation paired with its reverse (--budget even)"
    antithetic = True

    @classmethod
    def budget_problem(cls, budget: int) -> str | None:
        if budget % 2:
            return f"pairs each permutation with its reverse, so the budget must be even, got {budget}"
        return None


# ---------------------------------------------------------------------- regression (KernelSHAP-style)
def _size_strata(n: int) -> list[tuple[int, int]]:
    """The sampled strata of :class:`RegressionEstimator`: ``(k, units)`` for each size ``2 <= k <= n / 2``, a
    unit being a coalition of size ``k`` with its complement (``C(n, k)`` of them; ``C(n, k) / 2`` at ``k = n / 2``)."""
    return [(k, comb(n, k) // 2 if 2 * k == n else comb(n, k)) for k in range(2, n // 2 + 1)]


def _allocate(n: int, pairs: int) -> dict[int, int]:
    """Units (coalition + complement) per stratum for ``pairs`` units: proportional to the Shapley kernel's weight
    of the stratum (``1 / (k (n - k))`` per size, both sizes of a unit), a stratum whose share exceeds its units
    enumerated whole and the rest shared again (shapiq's border trick), largest remainders rounding; every
    sampled stratum gets at least 2 units (its variance needs two)."""
    strata = dict(_size_strata(n))
    weight = {k: (1 if 2 * k == n else 2) / (k * (n - k)) for k in strata}
    out: dict[int, int] = {}
    left, open_ = pairs, set(strata)
    while open_:
        total = sum(weight[k] for k in open_)
        full = [k for k in open_ if left * weight[k] / total >= strata[k]]
        if not full:
            break
        for k in full:
            out[k] = strata[k]
            left -= strata[k]
            open_.discard(k)
    if open_:
        total = sum(weight[k] for k in open_)
        share = {k: left * weight[k] / total for k in open_}
        alloc = {k: int(share[k]) for k in open_}
        for k in sorted(open_, key=lambda k: alloc[k] - share[k])[: left - sum(alloc.values())]:
            alloc[k] += 1
        for k in sorted(open_, key=lambda k: -weight[k]):  # two units at least, taken from the heaviest strata
            while alloc[k] < 2:
                donor = max(alloc, key=lambda d: alloc[d] if d != k else -1)
                if alloc[donor] <= 2:
                    raise ConfigError(f"budget too small for the regression estimator on {n} players: it needs two "
                                      f"coalition pairs of every size from 2 to {n - 2}")
                alloc[donor] -= 1
                alloc[k] += 1
        out.update(alloc)
    return out


def _draw_units(rng: np.random.Generator, n: int, k: int, m: int) -> list[int]:
    """``m`` distinct units of stratum ``k`` drawn uniformly without replacement (all of them when ``m`` covers
    them), each as its size-``k`` coalition (at ``k = n / 2``, the one of the pair holding player 0)."""
    units = _size_strata(n)[k - 2][1]
    if units <= 50_000:  # list them and choose
        masks = [sum(1 << i for i in c) for c in itertools.combinations(range(n), k)]
        if 2 * k == n:
            masks = [s for s in masks if s & 1]  # one coalition per complementary pair
        chosen = np.arange(units) if m >= units else np.sort(rng.choice(units, size=m, replace=False))
        return [masks[j] for j in chosen.tolist()]
    seen: dict[int, None] = {}  # too many to list: draw subsets until m distinct (m is far below units)
    while len(seen) < m:
        s = sum(1 << int(i) for i in rng.choice(n, size=k, replace=False))
        seen[s if 2 * k != n or s & 1 else ((1 << n) - 1) & ~s] = None
    return list(seen)


def regression_weights(n: int, rows: Sequence[int], row_weight: np.ndarray) -> tuple[list[int], np.ndarray]:
    """``(masks, W)``: the efficiency-constrained weighted least squares fit of ``v(S) - v(∅) = sum_{i in S}
    phi_i`` over the coalitions ``rows`` (weights ``row_weight``) with ``sum_i phi_i = v(N) - v(∅)`` (KernelSHAP,
    Lundberg & Lee 2017), as a linear map of the values: ``masks`` are ``[∅, N, *rows]``."""
    full = (1 << n) - 1
    a = ((np.asarray(rows)[:, None] >> np.arange(n)[None, :]) & 1).astype(float)  # (rows, n)
    d = np.asarray(row_weight, dtype=float)
    h_inv = np.linalg.inv(a.T @ (d[:, None] * a))
    p = h_inv @ (a.T * d[None, :])  # (n, rows): the unconstrained fit of b
    u = h_inv.sum(axis=1)
    q = p - np.outer(u, p.sum(axis=0)) / u.sum()  # the constrained fit of b = v(rows) - v(∅)
    w = np.zeros((n, len(rows) + 2))
    w[:, 2:] = q
    w[:, 1] = u / u.sum()  # t = v(N) - v(∅)
    w[:, 0] = -q.sum(axis=1) - u / u.sum()
    return [0, full, *rows], w


@register
class RegressionEstimator(Estimator):
    """Sampled Shapley by regression: the Shapley kernel's weighted least squares (KernelSHAP) over the
    coalitions it plays, constrained to efficiency, so an additive game, e.g. the models' individual
    accuracies, is recovered exactly and only the interactions are sampled. What reduces its variance:

    - the border strata are played whole (shapiq's border trick, Fumagalli et al. 2023): the models alone and
      LOO's ``N \\ {i}`` (played anyway), ``N`` and ``∅``;
    - every other size is a stratum with a fixed number of coalitions, proportional to the kernel's weight of
      the size and drawn without replacement (a stratified Horvitz-Thompson weight ``kernel x C(n,k) / m_k``
      per coalition, as in Leverage SHAP's sampling without replacement, Musco & Witter 2025);
    - each coalition is drawn with its complement (the pairing trick, Covert & Lee 2021).

    ``budget``: the coalitions sampled besides the ``2n + 1`` it always plays (a pair counts two). Being a
    fit rather than a mean, it has no independent draws; its Monte Carlo error is the stratified delete-one
    jackknife over the sampled pairs, with the finite-population correction (:meth:`draws` returns pseudo-draws
    whose spread gives that variance, so the reported intervals include it).
    """

    name = "regression"
    help = "Shapley by stratified, paired kernel regression on --budget sampled coalitions (+ the 2n+1 border ones)"
    budget_unit = "coalitions"
    min_budget = 2
    measures = ("loo", "shapley")

    def __init__(self, n: int, *, budget: int | None = None, seed: int = 0, computed: bool = False) -> None:
        super().__init__(n, budget=budget, seed=seed, computed=computed)
        rng = np.random.default_rng(seed)
        full = (1 << self.n) - 1
        self._units: list[tuple[int, list[int]]] = []  # (stratum, its coalitions) of each sampled unit
        self._strata: dict[int, tuple[int, int]] = {}  # stratum -> (units drawn, units in all)
        for k, m in sorted(_allocate(self.n, int(budget) // 2).items()):
            self._strata[k] = (m, _size_strata(self.n)[k - 2][1])
            self._units += [(k, [s, full & ~s]) for s in _draw_units(rng, self.n, k, m)]
        border = [1 << i for i in range(self.n)] + [full & ~(1 << i) for i in range(self.n)]
        self._border = list(dict.fromkeys(m for m in border if m not in (0, full)))
        self._shapley = self._fit(None)

    def _fit(self, without: int | None) -> tuple[list[int], np.ndarray]:
        """The regression's ``(masks, W)``, without sampled unit ``without`` (for the jackknife)."""
        n = self.n
        rows, weights = list(self._border), []
        for m in self._border:
            k = bin(m).count("1")
            weights.append((n - 1) / (comb(n, k) * k * (n - k)))
        drawn = {k: m - (1 if without is not None and self._units[without][0] == k else 0)
                 for k, (m, _) in self._strata.items()}
        for u, (k, masks) in enumerate(self._units):
            if u == without:
                continue
            for s in masks:  # each coalition of a drawn unit: the size's kernel weight over the units drawn
                size = bin(s).count("1")
                rows.append(s)
                weights.append((n - 1) / (size * (n - size)) / (drawn[k] * (2 if 2 * k == n else 1)))
        if n <= 2:  # every coalition is a border one: nothing to fit but exact Shapley
            return exact_masks(n), shapley_weights(n)
        return regression_weights(n, rows, np.array(weights))

    def weights(self, measure: str) -> tuple[list[int], np.ndarray]:
        return self._shapley if measure == "shapley" else super().weights(measure)

    def draws(self, measure: str, value: Mapping[int, float]) -> np.ndarray | None:
        """``(n, units)`` pseudo-draws: centred on the estimate, their variance over their count is the stratified
        jackknife variance ``sum_h (1 - m_h / N_h) (m_h - 1) / m_h sum_j (theta_-hj - mean_h)^2``; ``None`` when
        every stratum was played whole (no sampling error)."""
        if measure != "shapley":
            return None
        random = [u for u, (k, _) in enumerate(self._units) if self._strata[k][0] < self._strata[k][1]]
        if len(random) < 2:
            return None
        masks, w = self._shapley
        estimate = w @ np.array([value[m] for m in masks])
        leave_out = np.zeros((len(random), self.n))
        for j, u in enumerate(random):
            m_masks, m_w = self._fit(u)
            leave_out[j] = m_w @ np.array([value[m] for m in m_masks])
        strata = np.array([self._units[u][0] for u in random])
        deviations = np.zeros_like(leave_out)
        variance = np.zeros(self.n)
        for k in np.unique(strata):
            rows = strata == k
            m, units = self._strata[int(k)]
            deviations[rows] = leave_out[rows] - leave_out[rows].mean(axis=0)
            variance += (1 - m / units) * (m - 1) / m * (deviations[rows] ** 2).sum(axis=0)
        spread = (deviations ** 2).sum(axis=0) / (len(random) - 1)
        scale = np.sqrt(np.divide(variance * len(random), spread, out=np.zeros(self.n), where=spread > 0))
        return (estimate[None, :] + deviations * scale[None, :]).T
