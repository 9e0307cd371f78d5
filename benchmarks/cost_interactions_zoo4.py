"""Zoo v4's clones and specialists under ``vote``: each pool's cost-quality front and pairwise
interaction heatmap, and what the committed ``docs/cost_interactions_zoo4.json`` holds.

Run: ``PYTHONPATH=. python benchmarks/cost_interactions_zoo4.py --out docs`` (writes the JSON and
``docs/cost_interactions_<pool>_{front,interactions}.png``; about 90 s a pool on 2 loaded cores).
``tests/test_committed_results.py`` re-runs :func:`measure` and compares every deterministic number
(seconds are measured wall time: written, never compared).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

POOLS = ("zoo4-clones", "zoo4-specialists")
PROTOCOL = "vote"
QUESTIONS = 30
WITHIN = 0.02
MAX_NEW_TOKENS = 24  # as tools/zoo/v4.py evaluates the v4 models


def measure(pool_name: str, questions: int = QUESTIONS, seed: int = 0, cache_dir: Any = None):
    """``(report, moebius)``: the :class:`~crl_envs.valuation.ValuationReport` of ``pool_name`` under vote,
    exact, with costs and pairwise SII, on the v4 models' task (arith test split, two digits, + and -),
    and the Moebius interactions up to order 3 of the same coalitions (read back from the cache)."""
    import tempfile

    import torch

    import agents
    import agents.zoo
    from crl_envs import tasks, valuation
    from crl_envs.valuation.interactions import game_interactions

    torch.set_num_threads(1)
    task = tasks.load("arith", split="test", n=questions, seed=seed, **agents.zoo.TASK_OPTIONS)
    pool = agents.pool(pool_name)
    sampling = agents.SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    with tempfile.TemporaryDirectory() as tmp:
        cache = cache_dir or tmp
        report = valuation.evaluate(PROTOCOL, pool, task, seed=seed, cache_dir=cache, progress=False,
                                    sampling=sampling, interactions=2)
        game = valuation.CoalitionGame(PROTOCOL, pool, task, seed=seed, sampling=sampling, cache_dir=cache,
                                       progress=False)
        moebius = game_interactions(game, index="Moebius", order=3, seed=seed)
        assert game.evaluations == 0  # every coalition came from the valuation's runs
    return report, moebius


def triples(moebius) -> dict[str, Any]:
    """The order-3 Moebius terms: how many are positive or negative with a CI excluding 0, and the
    largest of each sign."""
    tol = 1e-9
    rows = [(float(m), [float(x) for x in c], list(t))
            for t, m, c in zip(moebius.interactions, moebius.means, moebius.ci) if len(t) == 3]
    rows.sort()
    return {"count": len(rows), "positive": sum(r[1][0] > tol for r in rows),
            "negative": sum(r[1][1] < -tol for r in rows), "mean": sum(r[0] for r in rows) / len(rows),
            "lowest": rows[:3], "highest": rows[-3:][::-1]}


def summary(report, moebius) -> dict[str, Any]:
    """What the docs page quotes: values, costs, the fronts, the pairwise interactions and the
    order-3 Moebius terms."""
    ratio, ratio_ci = report.value_per_1k()
    front = report.front()
    return {
        "moebius_triples": triples(moebius),
        "protocol": report.protocol, "names": report.names, "example_ids": report.example_ids,
        "system_value": float(report.system.mean()),
        "individual": report.individual.means.tolist(),
        "shapley": report.shapley.means.tolist(), "shapley_ci": [list(report.shapley.ci[a]) for a in report.ids],
        "cost_1k_tokens": report.cost.means.tolist(), "cost_ci": [list(report.cost.ci[a]) for a in report.ids],
        "shapley_per_1k_tokens": ratio.tolist(), "shapley_per_1k_tokens_ci": ratio_ci.tolist(),
        "interactions": {k: v for k, v in report.interactions.to_dict().items() if k != "per_question"},
        "front": front.to_dict(within=WITHIN),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs")
    p.add_argument("--questions", type=int, default=QUESTIONS)
    p.add_argument("--cache-dir", default=None, help="coalition cache (default: none, everything played)")
    args = p.parse_args()
    out = Path(args.out)
    result: dict[str, Any] = {"protocol": PROTOCOL, "questions": args.questions, "seed": 0, "within": WITHIN,
                              "max_new_tokens": MAX_NEW_TOKENS, "pools": {}}
    for name in POOLS:
        report, moebius = measure(name, args.questions, cache_dir=args.cache_dir)
        result["pools"][name] = summary(report, moebius)
        front = report.front()
        print(f"## {name}\n{report}\n\n{report.interactions.table(report.names)}\n\n{front.table('tokens', WITHIN)}\n"
              f"\n{front.table('seconds', WITHIN)}\n\n{report.cost_table()}\n"
              f"\norder-3 Moebius terms: {json.dumps(triples(moebius))}\n")
        front.plot(out / f"cost_interactions_{name}_front.png", "tokens",
                   title=f"{name} in {PROTOCOL}: accuracy vs tokens ({args.questions} questions)")
        report.interactions.plot(out / f"cost_interactions_{name}_interactions.png", report.names,
                                 title=f"{name} in {PROTOCOL}: pairwise SII ({args.questions} questions)")
    path = out / "cost_interactions_zoo4.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
