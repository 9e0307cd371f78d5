"""The request memo on the 12-protocol exact valuation: model calls and wall time, before and after.

For every protocol, ``valuation.evaluate(protocol, agents.pool("zoo"), arith, estimator="exact")``
(5 zoo models, greedy, no coalition cache) runs twice: ``memo=False`` (before: every request
generated) and ``memo=True`` (after: each distinct request generated once, coalitions in lockstep).
It prints, per protocol, the requests the valuation makes, the distinct requests, the generations
each way and the wall time each way, checks that the two reports are identical, and prints the
dry-run estimate (:func:`crl_envs.valuation.cost.distinct_calls`) beside the generations made: with
the stand-ins' default agreement (``est. 0.55``, what a dry run knows before any model has run) and with
each model's measured accuracy alone (``est. acc``, what is known once the models alone have run).

Call counts do not depend on the machine's load; wall times do: the script prints ``uptime``'s load
average beside them. Run it alone on an idle machine for timings.

Usage:
    python benchmarks/valuation_memo.py                         # 30 questions, all 12 protocols
    python benchmarks/valuation_memo.py --questions 10 --protocols vote debate
    python benchmarks/valuation_memo.py --pool pretrained-vllm --questions 10 --protocols vote debate routing
    python benchmarks/valuation_memo.py --pool zoo4-ladder --questions 20 --skip-before \
        --protocols vote relay judge cascade routing      # paper-small's valuation protocols on a v4 pool
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import agents
import agents.zoo
from agents.base import Agent
from crl_envs import protocols, tasks, valuation
from crl_envs.valuation import coalition
from crl_envs.valuation.cost import distinct_calls
from crl_envs.valuation.estimators import exact_masks

_generated = {"requests": 0}
_original = Agent.generate


def _counting(self: Agent, requests):  # every request that reaches a model
    out = _original(self, requests)
    _generated["requests"] += len(out)
    return out


def run(protocol: str, pool: agents.Pool, task: tasks.Task, memo: bool) -> tuple[valuation.ValuationReport, int,
                                                                                   int, float]:
    """One valuation: its report, requests made (counted by the memo; 0 without it), requests generated,
    wall seconds."""
    coalition.MEMO.clear()
    before_requests = coalition.MEMO.requests
    _generated["requests"] = 0
    t0 = time.perf_counter()
    report = valuation.evaluate(protocol, pool, task, cache_dir=False, progress=False, memo=memo)
    seconds = time.perf_counter() - t0
    return report, coalition.MEMO.requests - before_requests, _generated["requests"], seconds


def same(a: valuation.ValuationReport, b: valuation.ValuationReport) -> bool:
    return all(np.array_equal(a.measures[k].per_question, b.measures[k].per_question) for k in a.measures) \
        and np.array_equal(a.system, b.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--protocols", nargs="*", default=list(protocols.PROTOCOLS))
    parser.add_argument("--pool", default="zoo", help="a named pool, e.g. pretrained-vllm (vLLM's CPU engine: "
                                                      "not memoised, so only the lockstep batching changes)")
    parser.add_argument("--skip-before", action="store_true",
                        help="only the memo run: requests (= today's generations, every zoo model is memoised) "
                             "and distinct requests, without the memo-off run and its identity check")
    args = parser.parse_args()
    Agent.generate = _counting  # type: ignore[method-assign]
    pool = agents.pool(args.pool)
    task = tasks.load("arith", n=args.questions, **agents.zoo.TASK_OPTIONS)
    print(f"{len(pool)} models of {args.pool}, {len(task)} arith questions, exact, greedy; load average before: "
          f"{os.getloadavg()}")
    print(f"{'protocol':<10} {'requests':>9} {'gen before':>10} {'gen after':>9} {'ratio':>6} {'est. 0.55':>9} "
          f"{'est. acc':>9} {'s before':>8} {'s after':>8} identical")
    totals = np.zeros(7)
    for name in args.protocols:
        after, requests, gen_after, s_after = run(name, pool, task, memo=True)
        gen_before, s_before, identical = requests, float("nan"), "-"
        if not args.skip_before:
            before, _, gen_before, s_before = run(name, pool, task, memo=False)
            identical = str(same(before, after))
            assert gen_before == requests or not all(pool[a].deterministic for a in pool.ids), (gen_before, requests)
        n = len(pool)
        alone = [] if name == "vote" else [("vote", {}, 1 << i) for i in range(n)]  # vote's singles are them
        runs = [(name, {}, m) for m in exact_masks(n) if m] + alone
        memoised = [pool[a].deterministic for a in pool.ids]
        estimate = distinct_calls(runs, pool.names, len(task), memoised=memoised)
        accuracy = [after.individual[a] for a in pool.ids]
        estimate_acc = distinct_calls(runs, pool.names, len(task), memoised=memoised, agreement=accuracy)
        print(f"{name:<10} {requests:>9} {gen_before:>10} {gen_after:>9} {gen_before / gen_after:>5.1f}x "
              f"{estimate:>9.0f} {estimate_acc:>9.0f} {s_before:>8.1f} {s_after:>8.1f} {identical}", flush=True)
        totals += [requests, gen_before, gen_after, estimate, estimate_acc, s_before, s_after]
    print(f"{'all 12' if len(args.protocols) == 12 else 'all':<10} {totals[0]:>9.0f} {totals[1]:>10.0f} "
          f"{totals[2]:>9.0f} {totals[1] / totals[2]:>5.1f}x {totals[3]:>9.0f} {totals[4]:>9.0f} {totals[5]:>8.1f} "
          f"{totals[6]:>8.1f}")
    print(f"estimate vs generated: {totals[3] / totals[2] - 1:+.1%} (agreement 0.55), "
          f"{totals[4] / totals[2] - 1:+.1%} (each model's measured accuracy)")
    print(f"load average after: {os.getloadavg()} (wall times are only comparable on an idle machine)")


if __name__ == "__main__":
    main()
