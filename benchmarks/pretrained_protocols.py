"""vote_v0 and debate_v0 on the pretrained pool (SmolLM2-135M-Instruct + gemma-3-270m) through HFAgent.

One batched run per protocol through :func:`crl_envs.run_episodes`, greedy, on ``arith``; prints each
model alone, vote, debate (2 rounds), with accuracies, a 95% bootstrap CI and wall times.

    python benchmarks/pretrained_protocols.py [--n 20] [--max-new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import agents
import crl_envs
from agents import SamplingParams
from crl_envs import tasks


def ci95(scores: list[float], seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    x = np.asarray(scores, dtype=float)
    means = x[rng.integers(0, len(x), size=(2000, len(x)))].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="arith test questions")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a busy machine)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    pool = agents.pool(agents.pretrained.load(num_threads=args.threads))
    print(f"pool {pool} loaded in {time.perf_counter() - t0:.1f} s")
    task = tasks.load("arith", split="test", n=args.n, seed=0)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    runs = [(f"{pool.name_of(i)} alone", "vote", [i]) for i in pool.ids] + [("vote_v0", "vote", None),
                                                                          ("debate_v0 (2 rounds)", "debate", None)]
    print(f"\n| run | accuracy (n={args.n}) | 95% CI | wall s |\n|---|---|---|---|")
    for label, protocol, coalition in runs:
        t = time.perf_counter()
        episodes = crl_envs.run_episodes(protocol, pool, task, coalition=coalition, sampling=sampling, progress=False)
        wall = time.perf_counter() - t
        scores = [ep.score for ep in episodes]
        low, high = ci95(scores)
        print(f"| {label} | {np.mean(scores):.3f} | [{low:.2f}, {high:.2f}] | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
