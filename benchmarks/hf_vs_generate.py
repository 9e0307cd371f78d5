"""HFAgent against ``model.generate`` and the teacher-forced forward, side by side, on real models.

For each model and batch size the same left-padded chat prompts (arith questions) are decoded
greedily for exactly ``--new-tokens`` tokens (EOS ignored, so every row does the same work) by:

- ``HFAgent.generate`` (our decoding loop: per-request seeds, stop strings, log-probs);
- ``model.generate`` (transformers' loop, greedy, no scores);
- one teacher-forced forward of the model over the same prompt + generated tokens, no cache,
  at the largest batch: the arithmetic generation needs at the least, done all at once.

The two generators run interleaved, ``--repeats`` times each; the medians are compared. Also
checks that both give the same tokens (the greedy contract). Ratios above 1 favour HFAgent.

    python benchmarks/hf_vs_generate.py                               # SmolLM2 + Gemma, batch 1 16 64
    python benchmarks/hf_vs_generate.py --models zoo --batches 1 64
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

import agents
from agents import HFAgent, Request, SamplingParams
from agents.hf import left_pad
from agents.sampling import cpu_threads
from crl_envs import tasks

MODELS = {
    "smollm2": "pretrained:smollm2-135m-instruct",
    "gemma": "pretrained:gemma-3-270m",
    "zoo": "zoo:zoo-small",
}


def chats(n: int, shots: int = 0) -> list[list[dict]]:
    """``n`` arith questions, each after ``shots`` worked examples (longer prompts, as in debate rounds)."""
    task = tasks.load("arith", n=n + shots, seed=3)
    solved = "".join(f"{task.prompt(ex)}\nThe answer is {ex.answer}.\n\n" for ex in task.examples[n:])
    return [[{"role": "user", "content": solved + task.prompt(ex)}] for ex in task.examples[:n]]


@torch.no_grad()
def hf_generate(agent: HFAgent, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0) -> list[list[int]]:
    """transformers' own loop on the same left-padded prompts, exactly ``new_tokens`` tokens:
    greedy, or sampling at ``temperature`` from the whole distribution (no top-k, top-p 1)."""
    ids, mask, _ = left_pad(prompts, agent.tokenizer.pad_token_id)
    config = copy.deepcopy(agent.model.generation_config)
    config.eos_token_id = len(agent.tokenizer) + 10**6  # no real token: every row runs to max_new_tokens
    if temperature > 0:
        config.do_sample, config.temperature, config.top_p, config.top_k = True, temperature, 1.0, 0
    else:
        config.do_sample, config.temperature, config.top_p, config.top_k = False, None, None, None
    config.max_new_tokens, config.pad_token_id = new_tokens, agent.tokenizer.pad_token_id
    with cpu_threads(agent.num_threads):  # the threads HFAgent decodes on (one for small models)
        out = agent.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return out[:, ids.shape[1]:].tolist()


@torch.no_grad()
def teacher_forced(agent: HFAgent, sequences: list[list[int]]) -> None:
    ids, mask, positions = left_pad(sequences, agent.tokenizer.pad_token_id)
    with cpu_threads(agent.prefill_threads):
        agent.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)


@contextlib.contextmanager
def decoding_before_17(agent: HFAgent):
    """HFAgent as it decoded before #17: transformers' dynamic cache and a full sort per sampled row."""
    import agents.sampling as sampling

    draw, agent.growing_cache, sampling.nucleus_draw = sampling.nucleus_draw, False, sampling.sorted_nucleus_draw
    try:
        yield
    finally:
        agent.growing_cache, sampling.nucleus_draw = True, draw


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t0, result


@contextlib.contextmanager
def no_default_stops():
    """Every row runs its course: no stop at the next plain-format turn marker (Gemma has no chat
    template, so HFAgent would stop it there while ``model.generate`` goes on)."""
    import agents.hf as hf

    default, hf.default_stop = hf.default_stop, lambda tokenizer: ()
    try:
        yield
    finally:
        hf.default_stop = default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma"], choices=sorted(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (seeded per request for HFAgent; no token check)")
    parser.add_argument("--shots", type=int, default=0, help="worked examples before each question (longer prompts)")
    parser.add_argument("--before", action="store_true",
                        help="also time HFAgent as it decoded before #17 (transformers' dynamic cache, a full sort "
                             "per sampled row per step): the speed-up of the in-place cache and the windowed draw")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with no_default_stops():
        run(args)


def run(args: argparse.Namespace) -> None:
    mode = f"sampling at T={args.temperature}" if args.temperature > 0 else "greedy"
    print(f"{mode}, {args.new_tokens} new tokens per row (EOS ignored), {args.threads} threads, "
          f"{args.shots} worked examples per prompt, median of {args.repeats} interleaved runs; ratio = model.generate s / HFAgent s")
    extra = ("| before s | now / before |", "---:|---:|") if args.before else ("", "")
    print(f"| model | batch | prompt tok | HFAgent s | generate s | HFAgent / generate | same tokens {extra[0]}")
    print(f"|---|---:|---:|---:|---:|---:|---|{extra[1]}")
    bounds = []
    for key in args.models:
        agent = agents.from_spec(MODELS[key])
        agent.eos_ids = set()
        params = [SamplingParams(temperature=args.temperature, max_new_tokens=args.new_tokens, seed=i)
                  for i in range(max(args.batches))]
        for batch in args.batches:
            messages = chats(batch, args.shots)
            requests = [Request(m, p) for m, p in zip(messages, params)]
            prompts = [agent.encode_prompt(m) for m in messages]
            hf_generate(agent, prompts[:2], 2)
            agent.generate(requests[:2])  # warm-up
            ours, theirs, before, gens, ref = [], [], [], None, None
            for _ in range(args.repeats):
                t, gens = timed(agent.generate, requests)
                ours.append(t)
                t, ref = timed(hf_generate, agent, prompts, args.new_tokens, args.temperature)
                theirs.append(t)
                if args.before:
                    with decoding_before_17(agent):
                        t, old = timed(agent.generate, requests)
                    before.append(t)
                    assert [g.token_ids for g in old] == [g.token_ids for g in gens], "before and now must agree"
            a, b = statistics.median(ours), statistics.median(theirs)
            same = "—" if args.temperature > 0 else f"{sum(g.token_ids == r for g, r in zip(gens, ref))}/{batch}"
            width = max(len(p) for p in prompts)
            row = f"| {agent.name} | {batch} | {width} | {a:.3f} | {b:.3f} | **{b / a:.2f}x** | {same} |"
            if args.before:
                c = statistics.median(before)
                row += f" {c:.3f} | **{c / a:.2f}x** |"
            print(row, flush=True)
        batch = max(args.batches)
        sequences = [g.prompt_token_ids + g.token_ids for g in gens]
        forward = min(timed(teacher_forced, agent, sequences)[0] for _ in range(args.repeats))
        bounds.append((agent.name, batch, forward, a))
    print()
    print("| model | batch | teacher-forced forward s | HFAgent s | forward / HFAgent |")
    print("|---|---:|---:|---:|---:|")
    for name, batch, forward, ours in bounds:
        print(f"| {name} | {batch} | {forward:.3f} | {ours:.3f} | **{forward / ours:.2f}** |")


if __name__ == "__main__":
    main()
