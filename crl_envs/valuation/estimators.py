"""Value estimators as weight matrices over coalitions.

Every estimator here is linear in the coalition values: ``phi = W @ V`` where ``V`` is the
``(coalitions, questions)`` score table and ``W`` an ``(n, coalitions)`` weight matrix. So one
matrix product gives every player's value on every question, and means and bootstrap CIs over
questions follow for free. Coalitions are bitmasks (bit ``i`` = player ``i``).

- :func:`shapley_weights` — exact Shapley over all ``2^n`` coalitions;
- :func:`banzhaf_weights` — exact Banzhaf (every coalition weighted ``1 / 2^(n-1)``);
- :func:`loo_weights` — leave-one-out ``v(N) - v(N \\ {i})``, on ``n + 1`` coalitions;
- :func:`permutation_weights` — Monte Carlo Shapley from sampled permutations (optionally
  antithetic: each permutation paired with its reverse), on the distinct prefixes only;
  :func:`permutation_draws` — the same estimate split into its independent Monte Carlo draws (one per
  permutation, or per antithetic pair), which the bootstrap resamples along with the questions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import factorial
from typing import Any

import numpy as np

from crl_kit.errors import ConfigError

#: The estimators :func:`crl_envs.valuation.evaluate` takes: the one place their names are written (the CLI's
#: ``--estimator`` and a study's ``[valuation] estimator`` read it).
ESTIMATORS = ("exact", "loo", "permutation", "antithetic")
#: The estimators that sample permutations (they need a ``budget``).
SAMPLED_ESTIMATORS = ("permutation", "antithetic")

MAX_EXACT_PLAYERS = 12
"""Exact estimators enumerate 2^n coalitions; beyond this, use permutation sampling."""


def _check_exact(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"the number of players must be an int >= 1, got {n!r}")
    if n > MAX_EXACT_PLAYERS:
        raise ConfigError(
            f"exact valuation enumerates 2^n coalitions: {2**n} for a pool of {n}, too many "
            f"(limit {MAX_EXACT_PLAYERS} players). Use estimator='permutation' or 'antithetic' with a "
            f"budget, or estimator='loo' (n+1 coalitions)."
        )


def coalition_sizes(n: int) -> np.ndarray:
    """``|S|`` for every mask ``0 .. 2^n - 1``."""
    masks = np.arange(1 << n)
    return np.array([bin(m).count("1") for m in masks])


def membership(n: int) -> np.ndarray:
    """``(n, 2^n)`` boolean: ``[i, S]`` is whether player ``i`` belongs to coalition ``S``."""
    masks = np.arange(1 << n)
    return (masks[None, :] >> np.arange(n)[:, None]) & 1 == 1


def shapley_weights(n: int) -> np.ndarray:
    """``(n, 2^n)``: ``phi_i = sum_S W[i, S] v(S)`` is the exact Shapley value.

    ``W[i, S] = (|S|-1)! (n-|S|)! / n!`` if ``i`` in ``S``, else ``-|S|! (n-|S|-1)! / n!``.
    """
    _check_exact(n)
    size = coalition_sizes(n)
    inside = membership(n)
    fact = [factorial(k) for k in range(n + 1)]
    plus = np.array([fact[s - 1] * fact[n - s] / fact[n] if s >= 1 else 0.0 for s in size])
    minus = np.array([-fact[s] * fact[n - s - 1] / fact[n] if s <= n - 1 else 0.0 for s in size])
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


def estimator_for(n: int, estimator: str | Mapping[str, Any]) -> str:
    """The estimator for a pool of ``n`` models: ``estimator`` itself, or, for a rule
    ``{"exact_up_to": k, "larger": name}`` (a study's ``[valuation] estimator``), ``"exact"`` up to ``k``
    models and ``name`` above. The one place the rule is written (the config, the plan and the cells read it).

    >>> estimator_for(5, "loo"), estimator_for(5, {"exact_up_to": 6, "larger": "loo"}), \\
    ...     estimator_for(7, {"exact_up_to": 6, "larger": "loo"})
    ('loo', 'exact', 'loo')
    """
    if isinstance(estimator, str):
        return estimator
    return "exact" if n <= estimator["exact_up_to"] else estimator["larger"]
