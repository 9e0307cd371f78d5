"""Sampled Shapley against exact at n = 10-12 (#54 item 2b): RMSE of the ``regression`` estimator (stratified,
paired kernel regression) and of ``antithetic`` permutation sampling at the same number of coalition evaluations,
and the coverage of each one's Monte Carlo interval.

Games (each ``v(S)`` the mean over questions; exact Shapley over all ``2^n`` coalitions):

- **zoo unions**: vote on arith (the zoo's 2-digit +/- task, 200 questions, greedy) of unions of zoo v4 pools, every
  coalition computed exactly from the models' answers (each model played alone once; no other generation):
  ``ladder+solo`` (n = 10), ``specialists+3`` (n = 11), ``ladder+specialists`` and ``clones+rookies`` (n = 12);
- **planted** (n = 12, 300 questions, no model): a vote game of graded accuracies 0.3-0.8, wrong answers among
  three values, 10% unparseable (the plurality over planted answers); and an oracle router's game (``v(S)`` =
  whether anyone in ``S`` is right, on the same answers), the complementarity an interactive protocol can show.

Budget: the non-empty coalitions each estimator's Shapley weights use. Antithetic draws ``B`` permutations (its
distinct prefixes counted); regression then gets exactly as many (its ``2n + 1`` border coalitions and ``budget =
count - 2n - 1`` sampled ones). RMSE over players and ``--reps`` seeds, each estimator with its own seeds; the
ratio's +-2 s.e. is the delta method on the two mean squared errors. Coverage: how often the exact value lies in
the estimate +- t(draws - 1) x its Monte Carlo s.e. (from :meth:`Estimator.draws`, what the reported intervals
add to the questions' error), at 95%, with its binomial s.e.

Run: ``PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/regression_shapley.py`` (about 10 minutes on 2 idle cores;
``--reps 50`` for a quick look).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from crl_envs.protocols.base import plurality_winners
from crl_envs.valuation.estimators import estimator, shapley_weights

ZOO_UNIONS = {
    "ladder+solo": ("zoo4-ladder", ("zoo4-soloist", "zoo4-rookie-400a")),
    "specialists+3": ("zoo4-specialists", ("zoo4-strong", "zoo4-clone-1", "zoo4-clone-2")),
    "ladder+specialists": ("zoo4-ladder", ("zoo4-nocarry", "zoo4-noborrow", "zoo4-nohundreds", "zoo4-nonegative")),
    "clones+rookies": ("zoo4-clones", ("zoo4-rookie-100b", "zoo4-rookie-200a", "zoo4-rookie-200b", "zoo4-rookie-300a")),
}


def zoo_game(label: str, questions: int) -> np.ndarray:
    """``v(S)`` (mean over questions) for every coalition of a zoo union under vote, computed from answers."""
    import agents.zoo as zoo
    from crl_envs import tasks
    from crl_envs.valuation import CoalitionGame

    base, extra = ZOO_UNIONS[label]
    names = list(zoo.POOLS4[base]) + list(extra)
    task = tasks.load("arith", n=questions, **zoo.TASK_OPTIONS)
    game = CoalitionGame("vote", zoo.load(names), task, cache_dir=False, progress=False)
    assert game.computed
    values = game.values(range(1 << game.n))
    assert game.evaluations == game.n  # the models alone, nothing else generated
    return np.array([values[m].mean() for m in range(1 << game.n)])


def planted_answers(n: int, questions: int, seed: int = 0) -> np.ndarray:
    """``(questions, n)`` answer codes: 0 right, 1-3 wrong values, -1 unparseable; accuracy graded 0.3-0.8."""
    rng = np.random.default_rng(seed)
    right = rng.random((questions, n)) < np.linspace(0.3, 0.8, n)
    codes = np.where(right, 0, rng.integers(1, 4, (questions, n)))
    codes[rng.random((questions, n)) < 0.1] = -1
    return codes


def planted_vote(n: int = 12, questions: int = 300) -> np.ndarray:
    codes = planted_answers(n, questions)
    winner = plurality_winners(codes, np.arange(1 << n))
    right = np.take_along_axis((codes == 0).astype(float), np.maximum(winner, 0), axis=1)
    return np.where(winner < 0, 0.0, right).mean(axis=0)


def planted_router(n: int = 12, questions: int = 300) -> np.ndarray:
    right_mask = ((planted_answers(n, questions) == 0) * (1 << np.arange(n))).sum(axis=1)
    return ((np.arange(1 << n)[None, :] & right_mask[:, None]) > 0).mean(axis=0)


def run_estimator(name: str, n: int, budget: int, seed: int, v: np.ndarray, phi: np.ndarray,
                  level: float) -> tuple[np.ndarray, int, np.ndarray]:
    """One draw: the squared error per player, the coalitions used, and whether each interval covers."""
    est = estimator(name, n, budget=budget, seed=seed)
    masks, w = est.weights("shapley")
    estimate = w @ v[masks]
    draws = est.draws("shapley", {m: v[m] for m in masks})
    if draws is None:
        covered = np.ones(n, bool)
    else:
        se = draws.std(axis=1, ddof=1) / np.sqrt(draws.shape[1])
        half = stats.t.ppf(0.5 + level / 2, draws.shape[1] - 1) * se
        covered = np.abs(estimate - phi) <= half + 1e-12
    return (estimate - phi) ** 2, sum(1 for m in masks if m), covered


def compare(v: np.ndarray, permutations: int, reps: int, level: float = 0.95, seed0: int = 0) -> dict:
    """RMSE of antithetic (``permutations``) and regression at equal coalition counts over ``reps`` seeds each."""
    n = int(np.log2(len(v)))
    phi = shapley_weights(n) @ v
    out = {}
    for name in ("antithetic", "regression"):
        sq, used, cover = [], [], []
        for r in range(reps):
            seed = seed0 + r
            if name == "antithetic":
                e, c, k = run_estimator(name, n, permutations, seed, v, phi, level)
            else:  # as many coalitions as the antithetic draw with the same index used
                count = run_estimator("antithetic", n, permutations, seed0 + reps + r, v, phi, level)[1]
                e, c, k = run_estimator(name, n, count - (2 * n + 1), seed, v, phi, level)
            sq.append(e.mean())
            used.append(c)
            cover.append(k)
        sq = np.array(sq)
        cover = np.concatenate(cover)
        out[name] = {"mse": sq.mean(), "mse_se": sq.std(ddof=1) / np.sqrt(reps), "coalitions": float(np.mean(used)),
                     "coverage": cover.mean(), "coverage_se": np.sqrt(cover.mean() * (1 - cover.mean()) / cover.size)}
    a, r = out["antithetic"], out["regression"]
    ratio = np.sqrt(r["mse"] / a["mse"])
    log_se = 0.5 * np.hypot(r["mse_se"] / r["mse"], a["mse_se"] / a["mse"])
    out["ratio"], out["ratio_se"] = ratio, ratio * log_se
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="seeds per estimator, game and budget")
    parser.add_argument("--questions", type=int, default=200, help="arith questions of the zoo games")
    parser.add_argument("--permutations", type=int, nargs="+", default=[10, 20, 40], help="antithetic budgets")
    args = parser.parse_args()
    t0 = time.perf_counter()
    values = {}
    for key in ZOO_UNIONS:
        v = zoo_game(key, args.questions)
        values[f"zoo {key} (n={int(np.log2(len(v)))})"] = v
    values["planted vote (n=12)"] = planted_vote()
    values["planted oracle router (n=12)"] = planted_router()
    print(f"games ready in {time.perf_counter() - t0:.0f} s; {args.reps} seeds per estimator per cell\n")
    head = (f"{'game':34s} {'perms':>5s} {'coalitions':>10s} {'RMSE antithetic':>16s} {'RMSE regression':>16s} "
            f"{'ratio +- 2se':>14s} {'cover anti':>11s} {'cover regr':>11s}")
    print(head)
    print("-" * len(head))
    for label, v in values.items():
        for b in args.permutations:
            res = compare(v, b, args.reps)
            a, r = res["antithetic"], res["regression"]
            print(f"{label:34s} {b:5d} {a['coalitions']:10.1f} {np.sqrt(a['mse']):16.5f} {np.sqrt(r['mse']):16.5f} "
                  f"{res['ratio']:7.3f} +-{2 * res['ratio_se']:.3f} {a['coverage']:6.3f}+-{2 * a['coverage_se']:.3f} "
                  f"{r['coverage']:6.3f}+-{2 * r['coverage_se']:.3f}")
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
