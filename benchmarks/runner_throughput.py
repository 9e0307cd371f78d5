"""Batched runner vs a naive loop that plays one episode at a time.

Same three HFAgents (small randomly initialised GPT-2s written with ``save_pretrained`` and loaded
back, or three debaters sharing one real model with ``--model``), 64 debate episodes, 2 rounds,
greedy decoding of 32 new tokens. The naive loop drives the PettingZoo API directly and calls
``generate`` with one request per agent per phase. Prints the wall time of each and the speed-up
(median of ``--repeats`` runs), and checks both give the same texts.

    python benchmarks/runner_throughput.py [--episodes 64] [--repeats 3]
    python benchmarks/runner_throughput.py --model pretrained:smollm2-135m-instruct --episodes 16 --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import agents
import crl_envs
from agents import HFAgent, Request, SamplingParams
from agents.tiny import tiny_gpt2

PARAMS = SamplingParams(temperature=0.0, max_new_tokens=32)


class ForwardClock:
    """Seconds and tokens of every model forward, split into prompt forwards (prefill) and decoding steps."""

    def __init__(self, members):
        self.totals = {}
        for model in {id(agent.model): agent.model for agent in members}.values():  # shared weights: once
            model.forward = self._timed(model.forward)

    def _timed(self, forward):
        def timed(*args, **kwargs):
            ids = kwargs["input_ids"]
            t0 = time.perf_counter()
            out = forward(*args, **kwargs)
            kind = "prefill" if ids.shape[1] > 1 else "decode step"
            calls, seconds, tokens = self.totals.get(kind, (0, 0.0, 0))
            self.totals[kind] = (calls + 1, seconds + time.perf_counter() - t0, tokens + ids.numel())
            return out
        return timed

    def report(self, label, wall) -> str:
        parts = ", ".join(f"{k}: {c} forwards, {s:.2f} s, {t} tokens ({1000 * s / c:.1f} ms each)"
                          for k, (c, s, t) in sorted(self.totals.items()))
        line = (f"{label:7s} {wall:6.2f} s wall; {parts}; the rest (env, sampling, text) "
                f"{wall - sum(s for _, s, _ in self.totals.values()):.2f} s")
        self.totals = {}
        return line


def naive(pool, task, n):
    """One episode at a time, one request per generate call."""
    texts = []
    for i in range(n):
        env = crl_envs.debate_v0(pool, task)
        _, infos = env.reset(seed=0, options={"example": i})
        ep = []
        while env.agents:
            actions = {}
            for a in env.agents:
                if infos[a]["active"]:
                    req = Request(infos[a]["messages"], PARAMS, {"example": task[i], "phase": infos[a]["phase"]})
                    actions[a] = pool[a].generate([req])[0].text
                    ep.append(actions[a])
            _, _, _, _, infos = env.step(actions)
        texts.append(ep)
    return texts


def batched(pool, task, n):
    eps = crl_envs.run_episodes(crl_envs.debate_v0, pool, task, sampling=PARAMS, examples=range(n), progress=False)
    return [[t.text for t in e.transcript] for e in eps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--model", help="an agent spec (e.g. pretrained:smollm2-135m-instruct): three debaters "
                        "sharing its weights, instead of the random GPT-2s")
    parser.add_argument("--breakdown", action="store_true",
                        help="after the timing, one more run of each with every forward timed: where the time goes")
    args = parser.parse_args()
    torch.set_num_threads(2)
    task = crl_envs.tasks.load("arith", n=args.episodes)
    with tempfile.TemporaryDirectory() as tmp:
        members = []
        if args.model:
            base = agents.from_spec(args.model)
            members = [HFAgent(base.model, tokenizer=base.tokenizer, name=f"{base.name}-{k}") for k in range(3)]
            label = base.name
        else:
            for k in range(3):
                path = tiny_gpt2(f"{tmp}/m{k}", seed=k, n_layer=args.layers, n_embd=args.width, n_head=4)
                members.append(HFAgent(path, name=f"gpt2-random-{k}"))
            label = f"GPT-2 {args.layers}x{args.width} (random)"
        pool = agents.pool(members)
        batched(pool, task, 4)  # warm-up
        t_naive, t_batched = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            a = naive(pool, task, args.episodes)
            t_naive.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = batched(pool, task, args.episodes)
            t_batched.append(time.perf_counter() - t0)
        same = sum(x == y for x, y in zip(a, b))
        breakdown = []
        if args.breakdown:
            clock = ForwardClock(members)
            for mode, run in (("naive", naive), ("batched", batched)):
                t0 = time.perf_counter()
                run(pool, task, args.episodes)
                breakdown.append(clock.report(mode, time.perf_counter() - t0))
    n_naive, n_batched = statistics.median(t_naive), statistics.median(t_batched)
    print(f"debate_v0, {args.episodes} episodes, 3 agents x 2 rounds, {PARAMS.max_new_tokens} new tokens, "
          f"{label}, median of {args.repeats}")
    print(f"naive loop     {n_naive:8.2f} s")
    print(f"batched runner {n_batched:8.2f} s")
    print(f"speed-up       {n_naive / n_batched:8.1f}x   (identical transcripts: {same}/{args.episodes})")
    for line in breakdown:
        print(line)


if __name__ == "__main__":
    main()
