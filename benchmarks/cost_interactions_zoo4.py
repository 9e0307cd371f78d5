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


def measure(pool_name: str, questions: int = QUESTIONS, seed: int = 0, cache_dir: Any = False):
    """The :class:`~crl_envs.valuation.ValuationReport` of ``pool_name`` under vote, exact, with costs
    and pairwise SII, on the v4 models' task (arith test split, two digits, + and -)."""
    import torch

    import agents
    import agents.zoo
    from crl_envs import tasks, valuation

    torch.set_num_threads(1)
    task = tasks.load("arith", split="test", n=questions, seed=seed, **agents.zoo.TASK_OPTIONS)
    return valuation.evaluate(PROTOCOL, agents.pool(pool_name), task, seed=seed, cache_dir=cache_dir, progress=False,
                              sampling=agents.SamplingParams(max_new_tokens=MAX_NEW_TOKENS), interactions=2)


def summary(report) -> dict[str, Any]:
    """What the docs page quotes: values, costs, the fronts and the pairwise interactions."""
    ratio, ratio_ci = report.value_per_1k()
    front = report.front()
    return {
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
        report = measure(name, args.questions, cache_dir=args.cache_dir or False)
        result["pools"][name] = summary(report)
        front = report.front()
        print(f"## {name}\n{report}\n\n{report.interactions.table(report.names)}\n\n{front.table('tokens', WITHIN)}\n"
              f"\n{front.table('seconds', WITHIN)}\n\n{report.cost_table()}\n")
        front.plot(out / f"cost_interactions_{name}_front.png", "tokens",
                   title=f"{name} in {PROTOCOL}: accuracy vs tokens ({args.questions} questions)")
        report.interactions.plot(out / f"cost_interactions_{name}_interactions.png", report.names,
                                 title=f"{name} in {PROTOCOL}: pairwise SII ({args.questions} questions)")
    path = out / "cost_interactions_zoo4.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
