"""What each protocol costs: LLM calls and tokens per question for a pool of 4.

One batched run per protocol through :func:`crl_envs.run_episodes` (the one rollout path), greedy
decoding. The pool is the embedded zoo (``agents.pool("zoo")``, its first 4 models) when it is
installed, else 4 randomly initialised tiny GPT-2s (:func:`agents.tiny.tiny_gpt2`, different seeds).
Role agents (the LLM router) are counted like members. Prints a markdown table:
protocol, phases per episode, calls / question, prompt and completion tokens / question, seconds.

    python benchmarks/protocol_cost.py [--n 20] [--max-new-tokens 16] [--protocols moa,judge]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import agents
import crl_envs
from agents import HFAgent, SamplingParams
from agents.tiny import tiny_gpt2
from crl_envs.protocols import PROTOCOLS


def pool_of_four(tmp: str) -> tuple[agents.Pool, str]:
    try:
        import agents.zoo  # noqa: F401  registers agents.pool("zoo")
        zoo = agents.pool("zoo")
        return agents.pool(list(zoo.values())[:4]), "zoo"
    except (KeyError, ValueError, OSError, ImportError):  # zoo not built/installed: FileNotFoundError is an OSError
        members = [HFAgent(tiny_gpt2(f"{tmp}/tiny{s}", seed=s), name=f"tiny{s}") for s in range(4)]
        return agents.pool(members), "4 random tiny GPT-2s (2 layers, width 64, char tokenizer)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="questions (arith)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated protocol names")
    args = parser.parse_args()
    torch.set_num_threads(2)
    task = crl_envs.tasks.load("arith", n=args.n, seed=0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        pool, described = pool_of_four(tmp)
        crl_envs.run_episodes("vote", pool, task, sampling=sampling, examples=[0], progress=False)  # warm-up
        print(f"pool: {described}; {args.n} arith questions; greedy, max_new_tokens={args.max_new_tokens}\n")
        print("| protocol | phases / episode | calls / question | prompt tokens / question "
              "| completion tokens / question | seconds |")
        print("|---|---|---|---|---|---|")
        for name in args.protocols.split(","):
            t0 = time.perf_counter()
            eps = crl_envs.run_episodes(name, pool, task, sampling=sampling, progress=False)
            seconds = time.perf_counter() - t0
            usage = crl_envs.total_usage(eps)
            calls = sum(u.calls for u in usage.values()) / len(eps)
            prompt = sum(u.prompt_tokens for u in usage.values()) / len(eps)
            completion = sum(u.completion_tokens for u in usage.values()) / len(eps)
            phases = [len({t.phase for t in e.transcript}) for e in eps]
            shown = f"{statistics.mean(phases):.1f}" if min(phases) != max(phases) else str(phases[0])
            print(f"| {name} | {shown} | {calls:.2f} | {prompt:.0f} | {completion:.1f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
