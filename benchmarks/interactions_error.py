"""How far shapiq's sampling approximators (what ``interactions`` uses beyond 12 models) land from the
exact pairwise k-SII at n = 8, where exact is affordable: mean and largest absolute error over the 36
pairs (and the 8 singles), averaged over approximator seeds, per coalition budget (of 256).

The game is a real coalition game: eight scripted models under ``vote`` on 60 arith questions (two noisy
members, then six specialists each blind to one of three question kinds), every coalition played
once. Run: ``PYTHONPATH=. python benchmarks/interactions_error.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import agents
from agents import ScriptedAgent
from crl_envs import tasks
from crl_envs.valuation import CoalitionGame
from crl_envs.valuation.interactions import APPROXIMATORS, least_budget, per_question_indices

KINDS = 3


def planted_pool(task) -> agents.Pool:
    kind = {e.id: k % KINDS for k, e in enumerate(task.examples)}
    right = [set(), set(), {1, 2}, {0, 2}, {0, 1}, {1, 2}, {0, 2}, {0, 1}]

    def agent(i: int, kinds: frozenset) -> ScriptedAgent:
        def respond(ex, msgs, i=i, kinds=kinds, kind=kind):
            return f"The answer is {ex.answer if kind[ex.id] in kinds else int(ex.answer) + 100 + i}."

        return ScriptedAgent(f"m{i}", respond)

    return agents.pool([agent(i, frozenset(k)) for i, k in enumerate(right)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=60)
    p.add_argument("--budgets", type=int, nargs="+", default=[40, 80, 160, 256])
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args()
    task = tasks.load("arith", n=args.questions, seed=0)
    game = CoalitionGame("vote", planted_pool(task), task, cache_dir=False, progress=False)
    n, q = game.n, len(game.example_ids)

    def values(masks):  # the mean game: every index is linear in the game, so its error is the mean one's
        return game.table([int(m) for m in masks]).mean(axis=1, keepdims=True)

    t0 = time.perf_counter()
    wanted, exact = per_question_indices(values, n, 1, index="k-SII", order=2)
    exact = exact.mean(axis=1)
    pairs = np.array([len(t) == 2 for t in wanted])
    print(f"n = {n} models, {q} questions, every coalition played and exact k-SII (order 2) in {time.perf_counter() - t0:.1f} s; "
          f"pairs: mean |index| {np.abs(exact[pairs]).mean():.4f}, largest {np.abs(exact[pairs]).max():.4f}")
    print(f"{'approximator':14s} {'budget':>6s} {'pairs MAE':>10s} {'pairs max':>10s} {'singles MAE':>12s}  (mean over "
          f"{args.seeds} seeds)")
    for name in APPROXIMATORS:
        for budget in args.budgets:
            if budget < least_budget(name, n, 2):  # refused by per_question_indices (issue #57)
                print(f"{name:14s} {budget:6d} refused: fewer than {least_budget(name, n, 2)} coalitions")
                continue
            mae, worst, single = [], [], []
            for seed in range(args.seeds):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _, approx = per_question_indices(values, n, 1, index="k-SII", order=2, approximator=name,
                                                     budget=budget, seed=seed)
                err = np.abs(approx.mean(axis=1) - exact)
                mae.append(err[pairs].mean())
                worst.append(err[pairs].max())
                single.append(err[~pairs].mean())
            print(f"{name:14s} {budget:6d} {np.mean(mae):10.4f} {np.mean(worst):10.4f} {np.mean(single):12.4f}")


if __name__ == "__main__":
    main()
