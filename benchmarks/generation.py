"""HFAgent generation throughput at batch 1, 16 and 256, against the model's own forward-pass bound.

For each batch size the script generates ``--new-tokens`` tokens (seeded sampling, temperature 1)
for ``batch`` different prompts in one ``HFAgent.generate`` call, then times ONE teacher-forced
forward of the same model over the same prompt + generated tokens (same batch, left-padded, no KV
cache). That forward does the work generation must do at the very least, all in parallel, so its
time is a lower bound on the generation time:

    bound ratio = forward time / generation time   (1.0 = generation as fast as one forward)

Usage:
    python benchmarks/generation.py                       # 6-layer x 256 GPT-2, char tokenizer
    python benchmarks/generation.py --layers 4 --width 128 --threads 1
    python benchmarks/generation.py --model path/to/model --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from agents import HFAgent, Request, SamplingParams
from agents.hf import left_pad
from crl_envs import tasks


def build_requests(n: int, new_tokens: int, seed: int) -> list[Request]:
    task = tasks.load("arith", n=max(n, 1), seed=seed)
    return [
        Request(
            [{"role": "user", "content": task.prompt(ex)}],
            SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=seed + i),
        )
        for i, ex in enumerate(task.examples[:n])
    ]


@torch.no_grad()
def forward_seconds(agent: HFAgent, sequences: list[list[int]], repeats: int) -> float:
    """Best-of-``repeats`` time of one left-padded forward over ``sequences`` (no cache)."""
    ids, mask, positions = left_pad(sequences, agent.tokenizer.pad_token_id, agent.device)
    best = float("inf")
    for _ in range(repeats):
        _sync(agent.device)
        t0 = time.perf_counter()
        agent.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        _sync(agent.device)
        best = min(best, time.perf_counter() - t0)
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model directory or hub id (default: a random GPT-2 built here)")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=2, help="best-of repeats per measurement")
    parser.add_argument("--stop-at-eos", action="store_true",
                        help="let requests end at EOS (default: every request generates exactly --new-tokens)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.model:
        source = args.model
    else:
        from agents.tiny import tiny_gpt2

        source = tiny_gpt2(tempfile.mkdtemp(prefix="gen-bench-"), seed=0, n_layer=args.layers, n_embd=args.width,
                           n_head=max(1, args.width // 64), n_positions=1024)
    agent = HFAgent(source, device=args.device, dtype=args.dtype, batch_size=max(args.batches))
    if not args.stop_at_eos:
        agent.eos_ids = set()  # a random model hits EOS at random; fixed lengths make batch sizes comparable
    params = sum(p.numel() for p in agent.model.parameters())
    print(f"model: {source} ({params / 1e6:.2f}M parameters), device {args.device}, "
          f"dtype {next(agent.model.parameters()).dtype}, threads {torch.get_num_threads()}, "
          f"{args.new_tokens} new tokens per request, seeded sampling at temperature 1")
    agent.generate(build_requests(2, 4, seed=99))  # warm-up

    print("| batch | prompt tok | new tok | generate s | tokens/s | forward-bound s | bound ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        reqs = build_requests(batch, args.new_tokens, seed=batch)
        best, gens = float("inf"), None
        for _ in range(args.repeats):
            _sync(agent.device)
            t0 = time.perf_counter()
            gens = agent.generate(reqs)
            _sync(agent.device)
            best = min(best, time.perf_counter() - t0)
        assert gens is not None
        new = sum(len(g.token_ids) for g in gens)
        prompt = sum(len(g.prompt_token_ids) for g in gens)
        bound = forward_seconds(agent, [g.prompt_token_ids + g.token_ids for g in gens], args.repeats)
        print(f"| {batch} | {prompt} | {new} | {best:.3f} | {new / best:,.0f} | {bound:.4f} | {bound / best:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
