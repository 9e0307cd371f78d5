"""Compositional strength: what each model of a pool adds to a system, against how good it is alone.

``evaluate(protocol, pool, task)`` plays the coalition game ``v(S)`` (per-question scores of the
system run by coalition ``S``, cached on disk, resumable), and reports per model:

- ``individual`` — the model alone on the task, without the protocol (``vote_v0`` with one member:
  a single answer to the task's prompt);
- ``loo`` — leave-one-out ``v(N) - v(N \\ {i})`` (n + 1 coalition runs);
- ``shapley`` — exact (2^n - 1 runs; ``v(∅)`` comes from the protocol without running) or sampled
  by (antithetic) permutations with a budget;
- ``banzhaf`` — exact only;

with bootstrap CIs over questions (and over permutations for sampled Shapley) and rank correlations (exact permutation p-values) between
individual and compositional strength. With 3-4 models no single setting can be significant
(smallest two-sided p = 1/3 at n = 3, 1/12 at n = 4): pool settings with :func:`pooled_test`.
Coalition runs execute locally or, with ``executor="ray"``, as Ray tasks on a cluster (same numbers,
same cache; see :mod:`crl_envs.valuation.executors`).

Example:
    >>> import agents, crl_envs
    >>> pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.8, 0.6, 0.4)])
    >>> task = crl_envs.tasks.load("arith", n=20)
    >>> report = crl_envs.valuation.evaluate("vote", pool, task, cache_dir=False, progress=False)
    >>> report.individual_evaluations, report.system_evaluations   # vote plays the models alone; the rest is computed
    (3, 0)
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crl_kit.errors import ConfigError

#: ``module -> the names it exports here``. Names load on first use (PEP 562), so ``crl-envs value
#: --help`` (which reads :data:`ESTIMATORS`) pays for neither torch nor scipy.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "crl_envs.valuation.estimators": (
        "MAX_EXACT_PLAYERS", "Estimator", "banzhaf_weights", "exact_masks", "loo_weights", "permutation_draws",
        "permutation_weights", "register", "sample_permutations", "shapley_weights",
    ),
    "crl_envs.valuation.executors": ("Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor"),
    "crl_envs.valuation.game": (
        "CoalitionGame", "aggregate_scores", "default_cache_dir", "individual_game", "mask_of", "members_of",
        "play_coalitions",
    ),
    "crl_envs.valuation.fronts": ("Front", "front_of"),
    "crl_envs.valuation.interactions": ("Interactions", "game_interactions"),
    "crl_envs.valuation.pooled": ("PooledTest", "pooled_test"),
    "crl_envs.valuation.spend": ("CoalitionCosts", "Spend"),
    "crl_envs.valuation.report": ("Correlation", "Measure", "ValuationReport", "correlation"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'crl_envs.valuation' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover
    from agents import Agent, Pool, SamplingParams
    from crl_envs.runner import ProtocolFactory
    from crl_envs.tasks import Task
    from crl_envs.valuation.estimators import (
        MAX_EXACT_PLAYERS,
        Estimator,
        banzhaf_weights,
        exact_masks,
        loo_weights,
        permutation_draws,
        permutation_weights,
        register,
        sample_permutations,
        shapley_weights,
    )
    from crl_envs.valuation.executors import Executor, LocalExecutor, ProcessExecutor, RayExecutor
    from crl_envs.valuation.fronts import Front, front_of
    from crl_envs.valuation.game import (
        CoalitionGame,
        aggregate_scores,
        default_cache_dir,
        individual_game,
        mask_of,
        members_of,
        play_coalitions,
    )
    from crl_envs.valuation.interactions import Interactions, game_interactions
    from crl_envs.valuation.pooled import PooledTest, pooled_test
    from crl_envs.valuation.report import Correlation, Measure, ValuationReport, correlation
    from crl_envs.valuation.spend import CoalitionCosts, Spend

from crl_envs.valuation.estimators import ESTIMATORS  # noqa: E402  (numpy only: the CLI's --help reads it)


def evaluate(
    protocol: ProtocolFactory | str, pool: Pool | Sequence[Agent | str] | str, task: Task | str, *,
    estimator: str = "exact", samples: int = 1, seed: int = 0, cache_dir: str | os.PathLike | None | bool = None,
    progress: bool = True, sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    options: Mapping[str, Any] | None = None, budget: int | None = None, permutation_seed: int | None = None,
    ci_level: float = 0.95, bootstrap_resamples: int = 2000, executor: Executor | str = "local", memo: bool = True,
    cost_lambda: float | None = None, interactions: int | None = None, interaction_index: str = "SII",
    interaction_approximator: str | None = None, interaction_budget: int | None = None,
) -> ValuationReport:
    """Value every model of ``pool`` inside ``protocol`` (a factory or name) on ``task`` (a Task or name).

    ``estimator`` names an :class:`~crl_envs.valuation.estimators.Estimator` of :data:`ESTIMATORS`: ``"exact"``
    (Shapley + Banzhaf + LOO, 2^n - 1 coalitions), ``"loo"`` (n + 1), ``"permutation"`` / ``"antithetic"``
    (sampled Shapley from ``budget`` permutations drawn with ``permutation_seed``, default ``seed``, plus LOO).
    ``samples``: episodes per question; ``seed``: the run's seed; ``cache_dir``: the coalition cache (default
    ``~/.cache/crl_envs/valuation``; ``False``: none); ``sampling``, ``options``: as in
    :func:`crl_envs.run_episodes`; ``ci_level``, ``bootstrap_resamples``: the bootstrap CIs over questions (and
    over a sampled estimator's draws); ``executor``: ``"local"``, ``"processes"``, ``"ray"`` or an
    :class:`Executor` (same numbers, same cache); ``memo``: generate each distinct request once (identical
    results; ``False`` generates every request, for comparisons). ``cost_lambda``: also value ``v(S) -
    cost_lambda * c(S)``, ``c(S)`` the coalition's 1k tokens per question (``report.tradeoff``).
    ``interactions``: also compute shapiq's ``interaction_index`` (SII, k-SII, Moebius) up to this order,
    exactly or, for more than 12 models, with ``interaction_approximator`` and ``interaction_budget``
    (:mod:`crl_envs.valuation.interactions`).

    Options are checked before the first run. Coalition costs are kept (``report.coalition_costs``), the cost
    game valued by the same estimator (``report.cost``); individual strength costs n one-member ``vote`` runs.
    """
    from crl_envs.valuation.estimators import estimator_class
    from crl_envs.valuation.executors import resolve_executor
    from crl_envs.valuation.game import CoalitionGame, individual_game, play_coalitions
    from crl_envs.valuation.report import ValuationReport

    kind = estimator_class(estimator)
    kind.check_budget(budget)  # then the options, the game (the pool's size) and the estimator: all before any run
    _check_options(samples, seed, permutation_seed, ci_level, bootstrap_resamples, cost_lambda, progress)
    executor = resolve_executor(executor)
    game = CoalitionGame(protocol, pool, task, samples=samples, seed=seed, sampling=sampling, options=options,
                         cache_dir=cache_dir, progress=progress, executor=executor, memo=memo)
    est = kind(game.n, budget=budget, seed=seed if permutation_seed is None else permutation_seed, computed=game.computed)
    if interactions is not None:
        _check_interactions(game.n, interaction_index, interactions, interaction_approximator, interaction_budget)
    alone = individual_game(game)
    alone = game if alone.key == game.key else alone  # protocol "vote": its one-member coalitions are the models alone
    plan, singles = est.coalitions(), [1 << i for i in range(game.n)]
    executor.start()  # connect (a bad address fails here, before any run)
    ran = play_coalitions([(alone, singles), (game, plan)])  # one submission: a cluster stays busy across both
    values, spends = game.values(plan), game.spends(plan)
    found = None if interactions is None else _interactions(
        game, interactions, interaction_index, interaction_approximator, interaction_budget, seed=seed,
        ci_level=ci_level, bootstrap_resamples=bootstrap_resamples)
    return ValuationReport(
        protocol=game.protocol_name, task=game.task.name, ids=list(game.ids), estimator=est.name,
        names=[game.pool.name_of(a) for a in game.ids], example_ids=list(game.example_ids),
        system=values[(1 << game.n) - 1], empty_value=game.empty_value, samples=samples, seed=seed, budget=budget,
        ci_level=ci_level, bootstrap_resamples=bootstrap_resamples, cost_lambda=cost_lambda, interactions=found,
        **_runs(ran, plan, singles, alone, game),
        **_measures(est, list(game.ids), game.protocol_name, alone.table(singles), values, spends, cost_lambda))


def concatenate(reports: Sequence[ValuationReport]) -> ValuationReport:
    """One report over the questions of ``reports`` (in order): what :func:`evaluate` gives on their union, from
    the coalition tables they carry (each measure recomputed by the same estimator from every coalition's values
    over all the questions, so a sampled estimator's draws are those of the union). Run counts add up. A study
    that plays its questions in batches (:mod:`crl_envs.sequential`) values each batch with :func:`evaluate` (the
    coalition cache keeps each batch) and reads the questions so far as one report.

    Raises:
        ValueError: no reports; reports of other models, protocols, estimators or settings; shared questions; a
            report without its coalition table, or with interactions or a cost trade-off.
    """
    import numpy as np

    from crl_envs.valuation.estimators import estimator
    from crl_envs.valuation.report import Measure, ValuationReport
    from crl_envs.valuation.spend import FIELDS, Spend

    if not reports:
        raise ConfigError("concatenate needs at least one report")
    first = reports[0]
    same = ("protocol", "task", "ids", "names", "estimator", "samples", "seed", "budget", "empty_value", "ci_level",
            "bootstrap_resamples")
    for r in reports[1:]:
        differ = [k for k in same if getattr(r, k) != getattr(first, k)]
        if differ:
            raise ConfigError(f"concatenate: the reports differ in {', '.join(differ)}; concatenate one setting's batches")
    questions = [q for r in reports for q in r.example_ids]
    if len(set(questions)) != len(questions):
        raise ConfigError("concatenate: the reports share questions; pass disjoint batches of one task")
    if any(r.coalition_costs is None or r.interactions is not None or r.cost_lambda is not None for r in reports):
        raise ConfigError("concatenate needs reports with their coalition table and no interactions or cost_lambda "
                          "(evaluate's defaults)")
    masks = first.coalition_costs.masks
    if any(r.coalition_costs.masks != masks for r in reports):
        raise ConfigError("concatenate: the reports played other coalitions; value every batch with one estimator")
    values = {m: np.concatenate([r.coalition_costs.values[j] for r in reports]) for j, m in enumerate(masks)}
    spends = {m: Spend(*(np.concatenate([getattr(r.coalition_costs.spends[j], f) for r in reports]) for f in FIELDS))
              for j, m in enumerate(masks)}
    n = len(first.ids)
    values[0], spends[0] = np.full(len(questions), first.empty_value), Spend.zero(len(questions))
    # computed=True lifts only exact's size limit for played games: the coalitions are already in the tables
    est = estimator(first.estimator, n, budget=first.budget, seed=first.seed, computed=True)
    individual = np.concatenate([r.individual.per_question for r in reports], axis=1)
    measures = _measures(est, list(first.ids), first.protocol, individual, values, spends, None)
    measures["individual"] = Measure("individual", list(first.ids), individual)
    counts = {k: sum(getattr(r, k) for r in reports)
              for k in ("system_evaluations", "individual_evaluations", "cached_evaluations")}
    return ValuationReport(
        protocol=first.protocol, task=first.task, ids=list(first.ids), estimator=first.estimator,
        names=list(first.names), example_ids=questions, system=values[(1 << n) - 1], empty_value=first.empty_value,
        samples=first.samples, seed=first.seed, budget=first.budget, ci_level=first.ci_level,
        bootstrap_resamples=first.bootstrap_resamples, coalitions=first.coalitions, **counts, **measures)


def _check_options(samples: int, seed: int, permutation_seed: int | None, ci_level: float, bootstrap_resamples: int,
                   cost_lambda: float | None, progress: bool) -> None:
    """:func:`evaluate`'s checks that need no game."""
    import numpy as np

    from crl_envs.stats import check_ci_options
    from crl_kit.validation import check_int

    check_int("samples", samples, minimum=1, why="episodes per question, e.g. samples=4")
    check_int("seed", seed, why="e.g. seed=0")
    if permutation_seed is not None:
        check_int("permutation_seed", permutation_seed, why="e.g. permutation_seed=1, or None for seed")
    check_ci_options(ci_level, bootstrap_resamples)
    if cost_lambda is not None and (isinstance(cost_lambda, bool) or not isinstance(cost_lambda, (int, float))
                                    or not np.isfinite(cost_lambda) or cost_lambda < 0):
        raise ConfigError(f"cost_lambda must be a finite number >= 0 (accuracy per 1k tokens, e.g. 0.01), "
                          f"got {cost_lambda!r}")
    if not isinstance(progress, bool):
        raise ConfigError(f"progress must be True or False, got {progress!r}")


def _check_interactions(n: int, index: str, order: int, approximator: str | None, budget: int | None) -> None:
    from crl_envs.valuation.interactions import check_options, import_shapiq

    check_options(n, index, order, approximator, budget)
    import_shapiq()


def _interactions(game: CoalitionGame, order: int, index: str, approximator: str | None, budget: int | None,
                  **kw: Any) -> Interactions:
    from crl_envs.valuation.interactions import game_interactions

    return game_interactions(game, index=index, order=order, approximator=approximator, budget=budget, **kw)


def _runs(ran: list, plan: list[int], singles: list[int], alone: CoalitionGame, game: CoalitionGame) -> dict[str, int]:
    """The report's run counts: executed by this call (the protocol's and the models' alone), the
    coalitions the estimator used, and the distinct runs it needed that came from the cache (a game that
    computes its coalitions from answers needs only its one-member runs)."""
    individual = sum(1 for g, m in ran if g is alone and m in singles)
    played = [m for m in plan if m]
    runs = [1 << i for i in range(game.n)] if game.computed else played  # a computed game plays its singles
    needed = len(set(runs) | set(singles)) if alone is game else len(runs) + len(singles)
    return {"system_evaluations": len(ran) - individual, "individual_evaluations": individual,
            "coalitions": len(played), "cached_evaluations": needed - len(ran)}


def _measures(est: Estimator, ids: list[str], protocol_name: str, individual: Any, values: dict[int, Any],
              spends: dict[int, Any], cost_lambda: float | None) -> dict[str, Any]:
    """The report's measures: each of the estimator's on the game, its compositional one on the cost game
    ``c(S)`` (1k tokens per question) and, with ``cost_lambda``, on the trade-off game, and the coalition costs."""
    import numpy as np

    from crl_envs.valuation.report import Measure
    from crl_envs.valuation.spend import CoalitionCosts

    def measure(name: str, which: str, game_values: dict[int, Any]) -> Measure:
        per_question, draws = est.estimate(game_values, which)
        return Measure(name, ids, per_question, draws=draws)

    tokens = {m: spends[m].tokens / 1000 for m in values}
    out = {m: measure(m, m, values) for m in est.measures}
    out.update(individual=Measure("individual", ids, individual), cost=measure("cost", est.compositional, tokens))
    if cost_lambda is not None:
        out["tradeoff"] = measure("tradeoff", est.compositional, {m: values[m] - cost_lambda * tokens[m] for m in values})
    played = [m for m in values if m]
    out["coalition_costs"] = CoalitionCosts(protocol_name, ids, played, np.stack([values[m] for m in played]),
                                            [spends[m] for m in played])
    return {"shapley": None, "banzhaf": None, "tradeoff": None, **out}


__all__ = [
    "evaluate", "concatenate", "ESTIMATORS", "CoalitionGame", "aggregate_scores", "ValuationReport", "Measure",
    "Correlation", "correlation",
    "pooled_test", "PooledTest", "shapley_weights", "banzhaf_weights", "loo_weights", "permutation_weights",
    "sample_permutations", "exact_masks", "mask_of", "members_of", "default_cache_dir", "MAX_EXACT_PLAYERS",
    "individual_game", "permutation_draws", "Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor",
    "play_coalitions", "Front", "front_of", "Estimator", "register", "Interactions", "game_interactions", "CoalitionCosts", "Spend",
]
