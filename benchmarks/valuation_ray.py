"""Ray executor vs local for the main job's coalitions: debate on arith, the zoo pool, exact (31
coalitions + 5 individual runs), side by side on the same machine, each with a fresh cache.

Prints wall times and ratios: Ray with 1 slot / local is the Ray path's overhead (task
submission, object transfer, each worker loading the zoo once from its specs); Ray with all slots /
local is what parallel coalitions buy. Both give the same numbers (asserted).

``--placement`` measures what decides how local HF models reach the workers: loading the zoo in a
worker (per-worker loading, paid once per worker process) against serving each model from a Ray
actor (paid on every generate call: requests and generations cross processes), for the generate
calls one coalition of the main job makes.

    python benchmarks/valuation_ray.py --n 20 --cpus 2
    python benchmarks/valuation_ray.py --placement --n 20
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20, help="questions (default 20)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats per path (default 2)")
    parser.add_argument("--placement", action="store_true", help="per-worker loading vs model actors instead")
    args = parser.parse_args()
    if args.placement:
        placement(args.n)
        return

    import ray

    import agents
    import agents.zoo
    from crl_envs import tasks
    from crl_envs.valuation import RayExecutor, evaluate

    task = tasks.load("arith", n=args.n, seed=0, **agents.zoo.TASK_OPTIONS)
    pool = agents.pool("zoo")

    def timed(executor):
        with tempfile.TemporaryDirectory() as cache:
            t0 = time.perf_counter()
            report = evaluate("debate", pool, task, cache_dir=cache, progress=False, executor=executor)
            return time.perf_counter() - t0, report

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    evaluate("vote", pool, tasks.load("arith", n=2), cache_dir=False, progress=False, executor="ray")  # warm workers
    warm_s = time.perf_counter() - t0
    paths = {"local": "local", **{f"ray-{slots}": RayExecutor(num_cpus=args.cpus / slots)
                                  for slots in sorted({1, args.cpus})}}
    times: dict[str, list[float]] = {k: [] for k in paths}
    local = None
    for _ in range(args.repeats):  # interleaved, so load from other processes hits every path alike
        for label, executor in paths.items():
            seconds, report = timed(executor)
            times[label].append(seconds)
            if local is None:
                local = report
            for name, m in local.measures.items():
                np.testing.assert_array_equal(report.measures[name].per_question, m.per_question)
    ray.shutdown()
    best = {k: min(v) for k, v in times.items()}
    runs = local.system_evaluations + local.individual_evaluations
    print(f"debate on arith, zoo ({len(pool)} models), {args.n} questions, exact: {local.system_evaluations} coalitions "
          f"+ {local.individual_evaluations} individual runs; numbers identical on every path; best of {args.repeats}")
    print(f"first Ray call (workers import and load the zoo): {warm_s:.1f} s, not included below")
    print(f"local executor              {best['local']:7.1f} s  ({best['local'] / runs:.2f} s per run)  all: "
          + ", ".join(f"{t:.1f}" for t in times["local"]))
    for label in paths:
        if label == "local":
            continue
        slots = int(label.split("-")[1])
        print(f"Ray, {slots} slot(s) of {args.cpus} CPUs    {best[label]:7.1f} s  ray/local = {best[label] / best['local']:.2f}"
              f"  all: " + ", ".join(f"{t:.1f}" for t in times[label]))


def placement(n: int) -> None:
    """Per-worker loading (the zoo built from its specs in a worker) vs a model actor per zoo model."""
    import ray

    import agents
    import agents.zoo
    from agents import Agent
    from crl_envs import run_episodes, tasks

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote
    def load_in_worker() -> float:
        t0 = time.perf_counter()
        agents.pool([agents.from_spec(f"zoo:{name}") for name in agents.zoo.NAMES])
        return time.perf_counter() - t0

    ray.get(load_in_worker.remote())  # warm the worker process (imports), then time a load
    load_s = float(np.median([ray.get(load_in_worker.remote()) for _ in range(3)]))

    @ray.remote
    class ModelActor:
        def __init__(self, spec: str):
            self.agent = agents.from_spec(spec)

        def generate(self, requests):
            return self.agent.generate(requests)

    class ActorAgent(Agent):
        """An agent whose generate runs in a model actor (what the model-actor design would ship)."""

        def __init__(self, name: str, handle):
            self.name, self.handle = name, handle

        def _generate(self, requests):
            return ray.get(self.handle.generate.remote(requests))

    task = tasks.load("arith", n=n, seed=0, **agents.zoo.TASK_OPTIONS)
    local_pool = agents.pool("zoo")
    handles = [ModelActor.remote(f"zoo:{name}") for name in agents.zoo.NAMES]
    actor_pool = agents.pool([ActorAgent(name, h) for name, h in zip(agents.zoo.NAMES, handles)])
    run_episodes("debate", actor_pool, task, progress=False)  # warm the actors

    def timed(pool) -> tuple[float, int, list[float]]:
        calls = 0
        originals = {}
        for a in pool.values():  # count generate calls
            originals[a] = a._generate

            def counted(requests, _f=originals[a]):
                nonlocal calls
                calls += 1
                return _f(requests)

            a._generate = counted
        t0 = time.perf_counter()
        eps = run_episodes("debate", pool, task, progress=False)
        seconds = time.perf_counter() - t0
        for a, f in originals.items():
            a._generate = f
        return seconds, calls, [e.score for e in eps]

    direct, through_actors = [], []
    for _ in range(3):  # interleaved, best of 3: the machine is shared
        direct_s, calls, direct_scores = timed(local_pool)
        actor_s, _, actor_scores = timed(actor_pool)
        assert direct_scores == actor_scores
        direct.append(direct_s)
        through_actors.append(actor_s)
    ray.shutdown()
    direct_s, actor_s = min(direct), min(through_actors)
    print(f"one coalition of the main job (debate, all 5 zoo models, {n} questions): {calls} generate calls; best of 3")
    print(f"  in-process models {direct_s:6.2f} s; through model actors {actor_s:6.2f} s "
          f"(actors/in-process = {actor_s / direct_s:.2f}; {(actor_s - direct_s) / calls * 1000:+.1f} ms per call)")
    print(f"  loading the zoo in a worker: {load_s:.2f} s, once per worker process "
          f"({load_s / direct_s:.2f} of one coalition's run)")


if __name__ == "__main__":
    main()
