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
    >>> report.individual_evaluations, report.system_evaluations   # vote's 1-member coalitions = individual runs
    (3, 4)
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
        "MAX_EXACT_PLAYERS", "banzhaf_weights", "exact_masks", "loo_weights", "permutation_draws",
        "permutation_weights", "sample_permutations", "shapley_weights",
    ),
    "crl_envs.valuation.executors": ("Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor"),
    "crl_envs.valuation.game": (
        "CoalitionGame", "default_cache_dir", "individual_game", "mask_of", "members_of", "play_coalitions",
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
        banzhaf_weights,
        exact_masks,
        loo_weights,
        permutation_draws,
        permutation_weights,
        sample_permutations,
        shapley_weights,
    )
    from crl_envs.valuation.executors import Executor, LocalExecutor, ProcessExecutor, RayExecutor
    from crl_envs.valuation.fronts import Front, front_of
    from crl_envs.valuation.game import (
        CoalitionGame,
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
    protocol: ProtocolFactory | str,
    pool: Pool | Sequence[Agent | str] | str,
    task: Task | str,
    *,
    estimator: str = "exact",
    samples: int = 1,
    seed: int = 0,
    cache_dir: str | os.PathLike | None | bool = None,
    progress: bool = True,
    sampling: SamplingParams | Mapping[str, SamplingParams] | None = None,
    options: Mapping[str, Any] | None = None,
    budget: int | None = None,
    permutation_seed: int | None = None,
    ci_level: float = 0.95,
    bootstrap_resamples: int = 2000,
    executor: Executor | str = "local",
    memo: bool = True,
    cost_lambda: float | None = None,
    interactions: int | None = None,
    interaction_index: str = "SII",
    interaction_approximator: str | None = None,
    interaction_budget: int | None = None,
) -> ValuationReport:
    """Value every model of ``pool`` inside ``protocol`` on ``task``.

    Args:
        protocol: a protocol factory (``crl_envs.debate_v0``) or name (``"debate"``).
        pool: the models; ``task``: a Task or task name (all its examples are played).
        estimator: ``"exact"`` (Shapley + Banzhaf + LOO, 2^n - 1 coalition runs), ``"loo"`` (LOO only,
            n + 1 runs), ``"permutation"`` / ``"antithetic"`` (sampled Shapley from ``budget``
            permutations, plus LOO; each distinct coalition run once).
        samples: episodes per question; ``seed``: run seed (also seeds permutations and bootstrap).
        cache_dir: the on-disk cache (default ``~/.cache/crl_envs/valuation``); ``False`` disables it.
        progress: progress bars over coalition runs.
        sampling, options: as in :func:`crl_envs.run_episodes`.
        budget: number of permutations for the sampled estimators.
        permutation_seed: seeds the permutation draws (default: ``seed``); the game does not depend on it.
        ci_level, bootstrap_resamples: the bootstrap CIs over questions (and, for the sampled
            estimators, over permutations too: their CIs include the Monte Carlo error).
        executor: where coalition runs execute: ``"local"`` (this process, one after another),
            ``"ray"`` (each coalition a Ray task on the running or a new local cluster), or
            ``RayExecutor("head:6379")``. Same numbers, same cache.
        memo: generate each distinct request once (coalitions share the same questions and per-request
            seeds, so a model asked the same thing in two coalitions answers the same); the results are
            identical with ``memo=False``, which generates every request (for comparisons).
        cost_lambda: also value the trade-off game ``v(S) - cost_lambda * c(S)``, ``c(S)`` the
            coalition's thousands of tokens per question as deployed (so ``cost_lambda`` is accuracy
            given up per 1k tokens), with the same estimator and CIs (``report.tradeoff``).
        interactions: also compute interaction indices up to this order (1-3) with shapiq
            (:mod:`crl_envs.valuation.interactions`; exact plays all ``2^n - 1`` coalitions, whatever the
            estimator): ``interaction_index`` ``"SII"``, ``"k-SII"`` or ``"Moebius"``; for pools of more than
            12 models an ``interaction_approximator`` (``"SVARMIQ"``, ``"KernelSHAPIQ"``) with
            ``interaction_budget`` coalitions.

    Every coalition's cost per question as deployed (calls, prompt and generated tokens, seconds) is
    kept beside its value (``report.coalition_costs``), and the cost game ``c(S)`` (tokens per question)
    is valued with the same estimator (``report.cost``: who costs what; ``report.value_per_1k``: each
    model's compositional value per 1k of the tokens it costs).

    Every option is checked before the first run. Individual strength costs n one-member ``vote``
    runs (cached like any coalition; for ``protocol="vote"`` they are the same runs as its one-member
    coalitions). The report counts the runs this call executed: ``individual_evaluations`` for
    those, ``system_evaluations`` for the protocol's coalitions (exact: 2^n - 1; LOO: n + 1; 0 when
    everything is cached), and ``cached_evaluations`` for the ones read from the cache.
    """
    import numpy as np

    from crl_envs.valuation import estimators
    from crl_envs.valuation.estimators import (
        banzhaf_weights,
        exact_masks,
        loo_weights,
        permutation_draws,
        permutation_weights,
        sample_permutations,
        shapley_weights,
    )
    from crl_envs.valuation.executors import resolve_executor
    from crl_envs.valuation.game import CoalitionGame, individual_game, play_coalitions
    from crl_envs.valuation.report import Measure, ValuationReport, check_ci_options
    from crl_envs.valuation.spend import CoalitionCosts
    from crl_kit.validation import check_int

    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    sampled = estimator in ("permutation", "antithetic")
    if sampled and budget is None:
        raise ConfigError(f"estimator={estimator!r} needs budget=<number of permutations> (e.g. budget=200)")
    if not sampled and budget is not None:
        raise ConfigError(f"budget only applies to estimator='permutation' or 'antithetic', not {estimator!r}")
    check_int("samples", samples, minimum=1, why="episodes per question, e.g. samples=4")
    check_int("seed", seed, why="e.g. seed=0")
    if permutation_seed is not None:
        check_int("permutation_seed", permutation_seed, why="e.g. permutation_seed=1, or None for seed")
    if sampled:
        check_int("budget", budget, minimum=2, why="the number of permutations, e.g. budget=200")
    check_ci_options(ci_level, bootstrap_resamples)
    if cost_lambda is not None and (isinstance(cost_lambda, bool) or not isinstance(cost_lambda, (int, float))
                                    or not np.isfinite(cost_lambda) or cost_lambda < 0):
        raise ConfigError(f"cost_lambda must be a finite number >= 0 (accuracy per 1k tokens, e.g. 0.01), "
                          f"got {cost_lambda!r}")
    if not isinstance(progress, bool):
        raise ConfigError(f"progress must be True or False, got {progress!r}")
    executor = resolve_executor(executor)
    game = CoalitionGame(protocol, pool, task, samples=samples, seed=seed, sampling=sampling, options=options,
                         cache_dir=cache_dir, progress=progress, executor=executor, memo=memo)
    n = game.n
    if estimator == "exact":
        estimators._check_exact(n)  # fail before any run
    if interactions is not None:
        from crl_envs.valuation.interactions import check_options, import_shapiq

        check_options(n, interaction_index, interactions, interaction_approximator, interaction_budget)
        import_shapiq()
    perms = None
    if sampled:
        perms = sample_permutations(n, budget, seed=seed if permutation_seed is None else permutation_seed,
                                    antithetic=estimator == "antithetic")

    alone = individual_game(game)
    if alone.key == game.key:  # protocol "vote": its one-member coalitions are the individual runs
        alone = game
    singles = [1 << i for i in range(n)]
    loo_m, loo_w = loo_weights(n)
    plan: list[int] = list(loo_m)
    if estimator == "exact":
        plan += sorted(exact_masks(n), key=lambda m: -bin(m).count("1"))
    elif sampled:
        perm_m, perm_w = permutation_weights(perms)
        plan += perm_m
    plan = list(dict.fromkeys(plan))
    needed = len({m for m in plan if m} | set(singles)) if alone is game else len([m for m in plan if m]) + n
    executor.start()  # connect (a bad address fails here, before any run)
    ran = play_coalitions([(alone, singles), (game, plan)])  # one submission: a cluster stays busy across both
    individual_runs = sum(1 for g, m in ran if g is alone and m in singles)
    executed = len(ran)
    individual = alone.table(singles)
    values = game.values(plan)
    spends = game.spends(plan)
    tokens = {m: spends[m].tokens / 1000 for m in plan}  # the cost game c(S): 1k tokens per question

    def per_question(masks: list[int], weights: np.ndarray, game_values: dict[int, np.ndarray] = values) -> np.ndarray:
        return weights @ np.stack([game_values[m] for m in masks])

    def compositional(name: str, game_values: dict[int, np.ndarray]) -> Measure:
        """The estimator's measure (Shapley where computed, else LOO) of a game given by its values."""
        if estimator == "exact":
            return Measure(name, list(game.ids), per_question(exact_masks(n), shapley_weights(n), game_values))
        if sampled:
            draws = permutation_draws(perms, {m: float(game_values[m].mean()) for m in game_values},
                                      antithetic=estimator == "antithetic")
            return Measure(name, list(game.ids), per_question(perm_m, perm_w, game_values), draws=draws)
        return Measure(name, list(game.ids), per_question(loo_m, loo_w, game_values))

    shapley = banzhaf = None
    if estimator == "exact":
        shapley = compositional("shapley", values)
        banzhaf = Measure("banzhaf", list(game.ids), per_question(exact_masks(n), banzhaf_weights(n)))
    elif sampled:
        shapley = compositional("shapley", values)
    tradeoff = None
    if cost_lambda is not None:
        tradeoff = compositional("tradeoff", {m: values[m] - cost_lambda * tokens[m] for m in plan})
    found = None
    if interactions is not None:
        from crl_envs.valuation.interactions import game_interactions

        found = game_interactions(game, index=interaction_index, order=interactions,
                                  approximator=interaction_approximator, budget=interaction_budget, seed=seed,
                                  ci_level=ci_level, bootstrap_resamples=bootstrap_resamples)
    ids = list(game.ids)
    played = [m for m in plan if m]
    costs = CoalitionCosts(game.protocol_name, ids, played, np.stack([values[m] for m in played]),
                           [spends[m] for m in played])
    return ValuationReport(
        protocol=game.protocol_name, task=game.task.name, ids=ids, names=[game.pool.name_of(a) for a in ids],
        estimator=estimator, example_ids=list(game.example_ids),
        individual=Measure("individual", ids, individual),
        loo=Measure("loo", ids, per_question(loo_m, loo_w)),
        shapley=shapley, banzhaf=banzhaf,
        system=values[(1 << n) - 1], empty_value=game.empty_value,
        system_evaluations=executed - individual_runs, individual_evaluations=individual_runs,
        coalitions=sum(1 for m in plan if m), cached_evaluations=needed - executed,
        samples=samples, seed=seed, budget=budget, ci_level=ci_level, bootstrap_resamples=bootstrap_resamples,
        coalition_costs=costs, cost=compositional("cost", tokens), tradeoff=tradeoff, cost_lambda=cost_lambda,
        interactions=found,
    )


__all__ = [
    "evaluate", "ESTIMATORS", "CoalitionGame", "ValuationReport", "Measure", "Correlation", "correlation",
    "pooled_test", "PooledTest", "shapley_weights", "banzhaf_weights", "loo_weights", "permutation_weights",
    "sample_permutations", "exact_masks", "mask_of", "members_of", "default_cache_dir", "MAX_EXACT_PLAYERS",
    "individual_game", "permutation_draws", "Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor",
    "play_coalitions", "Front", "front_of", "Interactions", "game_interactions", "CoalitionCosts", "Spend",
]
