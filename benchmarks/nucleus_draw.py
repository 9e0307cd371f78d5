"""The sampled-token draw per decoding step: a full sort of the vocabulary vs the windowed draw.

HFAgent draws each sampled row's token by inverse CDF over the sorted top-p nucleus.
``agents.sampling.sorted_nucleus_draw`` sorts the whole vocabulary per row per step;
``agents.sampling.nucleus_draw`` ranks the most likely tokens only and gives the same tokens (checked
here on every draw). Rows are softmax(logits / T) with logits ~ N(0, scale²) over the
vocabulary sizes of SmolLM2 (49,152) and Gemma-3 (262,144); the time is per step (one draw for
each of ``--batch`` rows), best of ``--repeats``, on one thread.

    python benchmarks/nucleus_draw.py [--batch 64] [--temperature 0.7] [--top-p 1.0]
"""

from __future__ import annotations

import argparse
import time

import torch

from agents.sampling import nucleus_draw, sorted_nucleus_draw


def best_ms(draw, args: tuple, repeats: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = draw(*args)
        best = min(best, time.perf_counter() - t0)
    return 1000 * best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--scales", type=float, nargs="+", default=[3.0, 6.0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print(f"batch {args.batch}, T = {args.temperature}, top-p {args.top_p}, one thread, best of {args.repeats}")
    print("| vocabulary | logit scale | full sort ms/step | windowed ms/step | speed-up | same tokens |")
    print("|---:|---:|---:|---:|---:|---|")
    for vocab in (49_152, 262_144):
        for scale in args.scales:
            probs = torch.softmax(torch.randn(args.batch, vocab, generator=g) * scale / args.temperature, -1)
            top_p = torch.full((args.batch,), args.top_p)
            uniform = torch.rand(args.batch, generator=g)
            slow, want = best_ms(sorted_nucleus_draw, (probs, top_p, uniform), args.repeats)
            fast, got = best_ms(nucleus_draw, (probs, top_p, uniform), args.repeats)
            same = int((want == got).sum())
            print(f"| {vocab:,} | {scale:g} | {slow:.1f} | {fast:.1f} | **{slow / fast:.1f}x** | {same}/{args.batch} |",
                  flush=True)


if __name__ == "__main__":
    main()
