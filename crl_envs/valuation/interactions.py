"""Which models complement each other and which are redundant: interaction indices of the coalition
game, computed by `shapiq <https://github.com/mmschlk/shapiq>`_ (``pip install 'crl-envs[interactions]'``).

- ``SII`` (Shapley interaction index, Grabisch & Roubens): for a pair ``{i, j}``, the Shapley-weighted
  mean over coalitions ``S`` without them of ``v(S+ij) - v(S+i) - v(S+j) + v(S)``. Negative: the two
  together add less than each adds alone (redundant, e.g. near-clones under a vote); positive: they add
  more together (synergy, e.g. specialists whose blind spots differ).
- ``k-SII`` (Bordt & von Luxburg): SII made efficient up to order ``k`` (the orders-1..k terms sum to
  ``v(N) - v(∅)``).
- ``Moebius``: the pure interaction of each coalition (its Harsanyi dividend).

Every index is linear in the game, so it is computed on each question's game (``v(S)`` on that
question) and its mean over questions is the index of the mean game: bootstrap CIs resample questions,
with :func:`crl_envs.stats.bootstrap_cis`, as the valuation's own CIs do. Pools of more than
:data:`~crl_envs.valuation.estimators.MAX_EXACT_PLAYERS` models use a shapiq sampling approximator
(``SVARMIQ``, ``KernelSHAPIQ``) with a coalition budget; with a fixed seed it samples the same
coalitions for every question and is linear in their values, so the same per-question table and CIs
follow (they cover the questions' sampling error, not the approximator's; ``benchmarks/interactions_error.py``
measures that against exact at n = 8).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from crl_envs.stats import bootstrap_cis, check_ci_options
from crl_envs.valuation.estimators import MAX_EXACT_PLAYERS
from crl_kit.errors import ConfigError

INDICES = ("SII", "k-SII", "Moebius")
MAX_ORDER = 3
APPROXIMATORS = ("SVARMIQ", "KernelSHAPIQ")
#: A CI bound within this of 0 counts as 0 (sums of Shapley weights leave ~1e-17 where the index is 0).
TOLERANCE = 1e-9
#: How far past its range a sampled index may land before it is undefined: KernelSHAP-IQ's least squares leave
#: ~1e-8 on exact values (an index of 1 read as 1.00000001); a meaningless one is off by far more (issue #57: 74).
RANGE_TOLERANCE = 1e-6
INSTALL_HINT = "pip install 'crl-envs[interactions]' (or pip install 'shapiq>=1.4,<2')"


def import_shapiq() -> Any:
    """``shapiq``, or one line naming the extra that installs it."""
    try:
        import shapiq
    except ImportError:
        raise ConfigError(f"interaction indices need shapiq: {INSTALL_HINT}") from None
    return shapiq


def check_options(n: int | None, index: str, order: int, approximator: str | None, budget: int | None) -> None:
    """Refuse a bad index, order, approximator or budget before any coalition is played (``n`` None:
    the checks that do not depend on the pool's size)."""
    if index not in INDICES:
        raise ConfigError(f"unknown interaction index {index!r}; choose one of {', '.join(INDICES)}")
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise ConfigError(f"interaction order must be an int in 1..{MAX_ORDER}, got {order!r} (e.g. order=2: pairs)")
    if n is not None and order > n:
        raise ConfigError(f"interaction order {order} exceeds the pool's {n} models")
    if approximator is not None and approximator not in APPROXIMATORS:
        raise ConfigError(f"unknown approximator {approximator!r}; choose one of {', '.join(APPROXIMATORS)}")
    if approximator is None and n is not None and n > MAX_EXACT_PLAYERS:
        raise ConfigError(f"exact interactions enumerate 2^{n} coalitions (limit {MAX_EXACT_PLAYERS} models): pass "
                          f"approximator='SVARMIQ' or 'KernelSHAPIQ' with a budget")
    if approximator is not None:
        if index == "Moebius":
            raise ConfigError("the sampling approximators estimate SII or k-SII, not Moebius; use index='k-SII'")
        least = 4 if n is None else least_budget(approximator, n, order)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < least:
            terms = None if n is None else sum(math.comb(n, k) for k in range(order + 1))
            why = f" (twice the {terms} terms up to order {order} its regression fits; fewer give meaningless " \
                  f"indices)" if approximator == "KernelSHAPIQ" and terms is not None and least == 2 * terms else ""
            raise ConfigError(f"approximator {approximator} needs budget=<coalitions to evaluate>, an int >= "
                              f"{least}" + ("" if n is None else f" for {n} models") + f"{why}, got {budget!r}")
    elif budget is not None:
        raise ConfigError("budget only applies with an approximator (exact interactions use every coalition)")


def least_budget(approximator: str, n: int, order: int) -> int:
    """The fewest coalitions ``approximator`` may evaluate for ``n`` models up to ``order``. KernelSHAP-IQ fits
    one coefficient per interaction of order ``0..order`` by regression: with fewer than twice as many coalitions
    its SII reached ``|74|`` on ``[0, 1]`` games at ``n = 13`` (the index lies in ``[-2, 2]``; issue #57), so it
    needs twice that many (or every coalition, ``2^n``, where that is fewer). SVARM-IQ stays in range from
    ``2n + 2`` (both measured on random ``[0, 1]`` and ``{0, 1}`` games, ``n = 4..13``)."""
    if approximator == "KernelSHAPIQ":
        return min(1 << n, 2 * sum(math.comb(n, k) for k in range(order + 1)))
    return 2 * n + 2


def index_bounds(interactions: Sequence[tuple[int, ...]], lo: float, hi: float) -> np.ndarray:
    """The largest ``|SII|`` of each interaction in a game whose values lie in ``[lo, hi]``: ``2^(k-1) (hi - lo)``
    for ``k`` players, as SII is a weighted mean of ``k``-th order differences of the game."""
    return np.array([2.0 ** (len(t) - 1) * (hi - lo) for t in interactions])


def masks_of(coalitions: np.ndarray) -> np.ndarray:
    """Bitmasks of shapiq's ``(coalitions, players)`` boolean matrix (bit ``i`` = player ``i``)."""
    coalitions = np.asarray(coalitions, dtype=bool)
    return (coalitions.astype(np.int64) << np.arange(coalitions.shape[1], dtype=np.int64)).sum(axis=1)


def per_question_indices(values: Callable[[np.ndarray], np.ndarray], n: int, questions: int, *,
                         index: str = "SII", order: int = 2, approximator: str | None = None,
                         budget: int | None = None, seed: int = 0) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """``(interactions, table)``: every interaction of order 1..``order`` (tuples of player indices, in
    shapiq's order) and its ``(interactions, questions)`` index per question.

    ``values(masks)`` returns the ``(len(masks), questions)`` per-question values of those coalitions
    (the empty one included); it is called once per distinct batch of coalitions shapiq asks for.
    """
    check_options(n, index, order, approximator, budget)
    shapiq = import_shapiq()
    known: dict[int, np.ndarray] = {}

    def table(masks: np.ndarray) -> np.ndarray:
        todo = [int(m) for m in dict.fromkeys(masks.tolist()) if int(m) not in known]
        if todo:
            for m, row in zip(todo, np.asarray(values(np.array(todo)), dtype=float)):
                known[m] = row
        return np.stack([known[int(m)] for m in masks])

    wanted = [t for k in range(1, order + 1) for t in combinations(range(n), k)]

    def read(result: Any) -> list[float]:
        lookup = result.interaction_lookup
        return [result.values[lookup[t]] if t in lookup else 0.0 for t in wanted]

    if approximator is None:  # each distinct question game once (questions every coalition gets right are alike)
        games, which = np.unique(table(np.arange(1 << n)).T, axis=0, return_inverse=True)
        found = np.array([read(shapiq.ExactComputer(lambda c, g=g: g[masks_of(c)], n_players=n)(index, order))
                          for g in games]).reshape(len(games), len(wanted))
        return wanted, found[np.asarray(which).reshape(-1)].T
    out = np.zeros((len(wanted), questions))
    kind = getattr(shapiq, approximator)
    for q in range(questions):
        game = lambda c, q=q: table(masks_of(c))[:, q]  # noqa: E731
        out[:, q] = read(kind(n=n, max_order=order, index=index, random_state=seed).approximate(budget, game))
    if index == "SII":  # a sampled index outside the range any such game allows is undefined, never reported
        seen = np.stack(list(known.values()))
        bound = index_bounds(wanted, min(0.0, float(seen.min())), max(1.0, float(seen.max())))
        out[(np.abs(out) > bound[:, None] + RANGE_TOLERANCE).any(axis=1)] = np.nan
    return wanted, out


@lru_cache(maxsize=8)
def exact_matrix(n: int, index: str = "SII", order: int = 2) -> np.ndarray:
    """``(interactions, 2^n)``: the exact index as a linear map of the coalition values (column ``S``:
    shapiq's index of the game that is 1 on coalition ``S`` and 0 elsewhere). Built once per ``(n, index,
    order)`` from ``2^n`` shapiq calls, then every game's index is one product: what makes a study's
    interactions affordable at table time (many settings, many distinct question games)."""
    check_options(n, index, order, None, None)
    shapiq = import_shapiq()
    wanted = [t for k in range(1, order + 1) for t in combinations(range(n), k)]
    out = np.zeros((len(wanted), 1 << n))
    for s in range(1 << n):
        unit = np.zeros(1 << n)
        unit[s] = 1.0
        result = shapiq.ExactComputer(lambda c, g=unit: g[masks_of(c)], n_players=n)(index, order)
        lookup = result.interaction_lookup
        out[:, s] = [result.values[lookup[t]] if t in lookup else 0.0 for t in wanted]
    return out


def table_interactions(table: np.ndarray, ids: Sequence[str], *, index: str = "SII", order: int = 2, seed: int = 0,
                       ci_level: float = 0.95, bootstrap_resamples: int = 2000) -> Interactions:
    """The exact :class:`Interactions` of a stored coalition table (``(2^n, questions)``, row = bitmask, the
    empty coalition's row included), e.g. a valuation report's; no coalition is played."""
    n = len(ids)
    table = np.asarray(table, dtype=float)
    if table.ndim != 2 or table.shape[0] != 1 << n:
        raise ConfigError(f"an exact interaction table needs 2^{n} = {1 << n} coalition rows, got shape {table.shape}")
    wanted = [t for k in range(1, order + 1) for t in combinations(range(n), k)]
    return Interactions(index, order, list(ids), wanted, exact_matrix(n, index, order) @ table, ci_level=ci_level,
                        bootstrap_resamples=bootstrap_resamples, seed=seed)


@dataclass(eq=False)
class Interactions:
    """Interaction indices of a pool's models (``interactions[k]`` a tuple of player indices, its index
    per question in ``per_question[k]``), with bootstrap CIs over questions."""

    index: str
    order: int
    ids: list[str]
    interactions: list[tuple[int, ...]]
    per_question: np.ndarray
    approximator: str | None = None
    budget: int | None = None
    ci_level: float = 0.95
    bootstrap_resamples: int = 2000
    seed: int = 0
    ci: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))

    def __post_init__(self) -> None:
        self.per_question = np.asarray(self.per_question, dtype=float)
        self.interactions = [tuple(int(i) for i in t) for t in self.interactions]
        check_ci_options(self.ci_level, self.bootstrap_resamples)
        self.ci = bootstrap_cis({"i": self.per_question}, resamples=self.bootstrap_resamples,
                                level=self.ci_level, seed=self.seed)["i"]

    @property
    def means(self) -> np.ndarray:
        return self.per_question.mean(axis=1)

    def of(self, *members: str) -> tuple[float, tuple[float, float]]:
        """``(index, (lo, hi))`` of the interaction among the models with these ids."""
        key = tuple(sorted(self.ids.index(a) for a in members))
        k = self.interactions.index(key)
        return float(self.means[k]), (float(self.ci[k, 0]), float(self.ci[k, 1]))

    def pair_matrix(self) -> np.ndarray:
        """``(n, n)``: the pairwise indices (diagonal: order-1 terms where computed, else 0)."""
        n = len(self.ids)
        out = np.zeros((n, n))
        for t, v in zip(self.interactions, self.means):
            if len(t) == 2:
                out[t[0], t[1]] = out[t[1], t[0]] = v
            elif len(t) == 1:
                out[t[0], t[0]] = v
        return out

    def table(self, names: Sequence[str] | None = None, top: int | None = None) -> str:
        """Pairs (and triples) sorted from most redundant to most synergistic, with CIs."""
        names = list(names or self.ids)
        pct = round(self.ci_level * 100)
        how = f"{self.approximator}, budget {self.budget}" if self.approximator else "exact"
        rows = [(self.means[k], t, self.ci[k]) for k, t in enumerate(self.interactions) if len(t) >= 2]
        rows.sort(key=lambda r: (np.isnan(r[0]), r[0] if not np.isnan(r[0]) else 0.0))  # undefined ones last
        if top is not None and len(rows) > 2 * top:
            rows = rows[:top] + rows[-top:]
        out = [f"interactions ({self.index}, order <= {self.order}, {how}; {pct}% CI over questions; "
               f"< 0 redundant, > 0 synergy):"]
        for v, t, (lo, hi) in rows:
            who = f"  {' + '.join(names[i] for i in t):40s}"
            if np.isnan(v):
                out.append(f"{who} undefined (the approximation left the index's range: raise the budget)")
                continue
            tag = "redundant" if hi < -TOLERANCE else "synergy" if lo > TOLERANCE else ""
            out.append(f"{who} {v:+.3f} [{lo:+.3f}, {hi:+.3f}] {tag}".rstrip())
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "order": self.order, "ids": self.ids, "approximator": self.approximator,
                "budget": self.budget, "ci_level": self.ci_level, "bootstrap_resamples": self.bootstrap_resamples,
                "seed": self.seed, "interactions": [list(t) for t in self.interactions],
                "mean": self.means.tolist(), "ci": self.ci.tolist(), "per_question": self.per_question.tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Interactions:
        return cls(index=d["index"], order=d["order"], ids=list(d["ids"]),
                   interactions=[tuple(t) for t in d["interactions"]], per_question=np.asarray(d["per_question"]),
                   approximator=d.get("approximator"), budget=d.get("budget"), ci_level=d["ci_level"],
                   bootstrap_resamples=d["bootstrap_resamples"], seed=d["seed"])

    def figure(self, names: Sequence[str] | None = None, title: str = ""):
        """A heatmap of the pairwise indices (red: synergy, blue: redundancy); a cell's dot marks a CI
        that excludes 0."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = list(names or self.ids)
        m = self.pair_matrix()
        n = len(names)
        np.fill_diagonal(m, np.nan)
        lim = float(np.nanmax(np.abs(m))) if n > 1 and np.isfinite(m).any() else 1.0
        fig, ax = plt.subplots(figsize=(1.0 + 0.75 * n, 0.6 + 0.7 * n))
        im = ax.imshow(m, cmap="RdBu_r", vmin=-lim or -1, vmax=lim or 1)
        for k, t in enumerate(self.interactions):
            if len(t) != 2:
                continue
            lo, hi = self.ci[k]
            for a, b in (t, t[::-1]):
                ax.text(b, a, f"{self.means[k]:+.2f}" + ("*" if lo > TOLERANCE or hi < -TOLERANCE else ""), ha="center",
                        va="center", fontsize=7)
        ax.set_xticks(range(n), names, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(n), names, fontsize=8)
        fig.colorbar(im, ax=ax, label=f"pairwise {self.index} (* CI excludes 0)")
        ax.set_title(title or f"pairwise {self.index}", fontsize=9)
        fig.tight_layout()
        return fig

    def plot(self, path: str | os.PathLike, names: Sequence[str] | None = None, title: str = "") -> Path:
        from crl_envs.valuation.plots import save_figure

        return save_figure(self.figure(names, title), path, dpi=110, metadata={"Software": None})


def game_interactions(game: Any, *, index: str = "SII", order: int = 2, approximator: str | None = None,
                      budget: int | None = None, seed: int = 0, ci_level: float = 0.95,
                      bootstrap_resamples: int = 2000) -> Interactions:
    """The :class:`Interactions` of a :class:`~crl_envs.valuation.game.CoalitionGame` (coalitions it
    has not played yet are played and cached, like its values)."""
    check_options(game.n, index, order, approximator, budget)
    check_ci_options(ci_level, bootstrap_resamples)
    wanted, table = per_question_indices(lambda masks: game.table([int(m) for m in masks]), game.n,
                                         len(game.example_ids), index=index, order=order,
                                         approximator=approximator, budget=budget, seed=seed)
    return Interactions(index, order, list(game.ids), wanted, table, approximator=approximator, budget=budget,
                        ci_level=ci_level, bootstrap_resamples=bootstrap_resamples, seed=seed)
