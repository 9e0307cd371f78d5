"""vote_v0 and debate_v0 on the pretrained pool, played directly (HFAgent) and through real
OpenAI-compatible servers (``transformers serve``, llama.cpp's server) with ``openai:`` specs.

Prints, per route and protocol: system accuracy on arith, wall seconds, completion tokens and the
wall ratio to the direct route, all measured in one run.

    python benchmarks/openai_servers.py --n 20                   # both servers, both protocols
    python benchmarks/openai_servers.py --n 20 --routes hf llamacpp --protocols vote

Each server runs as a subprocess on 127.0.0.1 (``tests/servers.py``) and is stopped at the end.
``transformers serve`` cannot chat with gemma-3-270m (a base model: no chat template), so on that
route Gemma is played directly by HFAgent and only SmolLM2 goes through the server.
llama.cpp chats with Gemma through its own fallback template, not HFAgent's plain format.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from servers import free_port, llamacpp_server, transformers_serve  # noqa: E402

import agents  # noqa: E402
import crl_envs  # noqa: E402
from agents import SamplingParams  # noqa: E402
from agents import pretrained as pre  # noqa: E402


def play(protocol, pool, task, n, sampling):
    t0 = time.perf_counter()
    episodes = crl_envs.run_episodes(protocol, pool, task, examples=range(n), sampling=sampling, progress=False)
    wall = time.perf_counter() - t0
    usage = crl_envs.total_usage(episodes)
    tokens = sum(u.completion_tokens for u in usage.values())
    return sum(e.score for e in episodes) / len(episodes), wall, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="arith questions")
    parser.add_argument("--routes", nargs="+", default=["hf", "transformers", "llamacpp"])
    parser.add_argument("--protocols", nargs="+", default=["vote", "debate"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()

    task = crl_envs.tasks.load("arith", n=args.n, seed=0)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    direct = agents.pool("pretrained")  # model_0 SmolLM2 (HFAgent), model_1 Gemma (HFAgent)
    logs = Path(tempfile.mkdtemp(prefix="crl-servers-"))
    rows: dict[tuple[str, str], tuple[float, float, int]] = {}
    for route in args.routes:
        server = None
        if route == "hf":
            pool = direct
        elif route == "transformers":
            server = transformers_serve(free_port(), logs / "transformers.log").start()
            smol = f"openai:{server.url}#{pre.model_dir(pre.SMOLLM2)}?name=smollm2-served"
            pool = agents.pool(smol, direct["model_1"])
        elif route == "llamacpp":
            gemma_file, _ = pre.gemma3_gguf()
            server = llamacpp_server(free_port(), logs / "llamacpp.log", pre.smollm2_gguf(), alias="smollm2",
                                     n_threads=args.threads).start()
            server2 = llamacpp_server(free_port(), logs / "llamacpp-gemma.log", gemma_file, alias="gemma",
                                      n_threads=args.threads).start()
            pool = agents.pool(f"openai:{server.url}#smollm2?name=smollm2-llama",
                               f"openai:{server2.url}#gemma?name=gemma-llama")
        else:
            raise SystemExit(f"unknown route {route!r}; routes are hf, transformers, llamacpp")
        try:
            for protocol in args.protocols:
                rows[route, protocol] = play(protocol, pool, task, args.n, sampling)
                acc, wall, tokens = rows[route, protocol]
                print(f"{route:12s} {protocol:7s} acc {acc:.3f}  wall {wall:7.1f} s  tokens {tokens:6d}", flush=True)
        finally:
            if server is not None:
                server.stop()
            if route == "llamacpp":
                server2.stop()
    print(f"\narith n={args.n}, greedy, max_new_tokens={args.max_new_tokens}; pool {direct.names}")
    print(f"{'route':12s} {'protocol':8s} {'accuracy':>8s} {'wall s':>8s} {'tokens':>7s} {'tok/s':>7s} {'wall/hf':>8s}")
    for (route, protocol), (acc, wall, tokens) in rows.items():
        base = rows.get(("hf", protocol))
        ratio = f"{wall / base[1]:8.2f}" if base else "       -"
        print(f"{route:12s} {protocol:8s} {acc:8.3f} {wall:8.1f} {tokens:7d} {tokens / wall:7.1f} {ratio}")


if __name__ == "__main__":
    main()
