"""transformers' ``NewGELUActivation`` (eight elementwise ops) against torch's fused tanh-GELU
(:func:`agents.hf.fuse_gelu_activations`, what ``HFAgent`` runs by default) on the zoo: seconds, and how many
greedy answers moved.

Each mode runs in its own process (``--mode exact`` keeps transformers' module, ``--mode fused`` is the default):
``vote`` and ``debate`` over a zoo pool on ``--n`` arith questions, greedy, every turn's text kept. Without
``--mode`` the script runs both ``--repeats`` times, alternating, and prints the median seconds per protocol, the
ratio, and how many of the turns' texts differ between the modes (the two compute the same function; ~0.5% of the
activations differ by 1-2 ulp, which could move a greedy token where two logits tie to within that).

    python benchmarks/fused_gelu.py [--pool zoo4-ladder] [--n 300] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOLS = ("vote", "debate")


def one_run(mode: str, pool_name: str, n: int, texts_file: str) -> dict[str, float]:
    import agents.hf

    if mode == "exact":
        agents.hf.fuse_gelu_activations = lambda model: 0
    import agents.zoo  # noqa: F401  registers the zoo's pools
    import crl_envs
    from crl_envs import tasks

    pool = agents.pool(pool_name)
    task = tasks.load("arith", n=n)
    seconds, texts = {"load": os.getloadavg()[0]}, {}
    for protocol in PROTOCOLS:
        start = time.perf_counter()
        episodes = crl_envs.run_episodes(protocol, pool, task, progress=False)
        seconds[protocol] = time.perf_counter() - start
        texts[protocol] = [[turn.text for turn in e.transcript] for e in episodes]
    Path(texts_file).write_text(json.dumps(texts))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["exact", "fused"])
    parser.add_argument("--pool", default="zoo4-ladder")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--texts", help="(with --mode) where to write the turns' texts")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(one_run(args.mode, args.pool, args.n, args.texts)))
        return
    runs: dict[str, list[dict[str, float]]] = {"exact": [], "fused": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for mode in runs:
                argv = [sys.executable, __file__, "--mode", mode, "--pool", args.pool, "--n", str(args.n),
                        "--texts", f"{tmp}/{mode}.json"]
                done = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True)
                runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
                r = runs[mode][-1]
                print(f"{mode}: " + ", ".join(f"{p} {r[p]:.1f} s" for p in PROTOCOLS) + f"; load average {r['load']:.2f}",
                      flush=True)
        exact, fused = (json.loads(Path(f"{tmp}/{m}.json").read_text()) for m in runs)
    for p in PROTOCOLS:
        before, after = (statistics.median(r[p] for r in runs[m]) for m in runs)
        turns = [(a, b) for ea, eb in zip(exact[p], fused[p]) for a, b in zip(ea, eb)]
        moved = sum(a != b for a, b in turns)
        print(f"{p} on {args.pool}, {args.n} questions: exact {before:.1f} s, fused {after:.1f} s "
              f"({before / after:.2f}x faster); {moved} of {len(turns)} greedy turn texts differ")
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
