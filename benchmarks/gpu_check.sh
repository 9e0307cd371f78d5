#!/usr/bin/env bash
# GPU check for the vLLM backend: builds two small random GPT-2s locally (no hub), loads both in
# vLLM on one GPU (gpu_memory_utilization shares), plays a debate through crl_envs.run_episodes,
# and prints tokens/s. Then checks VLLMAgent.load_weights: engine A given model B's weights must
# answer exactly as engine B (greedy). Optionally compares with HFAgent on the same GPU.
#
# Usage: bash benchmarks/gpu_check.sh [questions=256] [layers=12] [width=768]
# Needs: a CUDA GPU and `pip install 'crl-envs[vllm]'`.
set -euo pipefail
cd "$(dirname "$0")/.."

QUESTIONS="${1:-256}"
LAYERS="${2:-12}"
WIDTH="${3:-768}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
# load_weights sends a function to vLLM's engine process (LLM.collective_rpc); recent vLLM asks for this.
export VLLM_ALLOW_INSECURE_SERIALIZATION=1

python - <<'EOF' || { echo "gpu_check: needs a CUDA GPU and vLLM (pip install 'crl-envs[vllm]')"; exit 2; }
import torch, vllm
assert torch.cuda.is_available(), "no CUDA device"
print(f"vllm {vllm.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
EOF

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

python - "$WORK" "$QUESTIONS" "$LAYERS" "$WIDTH" <<'EOF'
import sys, time

import torch

import crl_envs
from agents import HFAgent, Request, SamplingParams, VLLMAgent, pool
from agents.tiny import tiny_gpt2

work, questions, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dirs = [tiny_gpt2(f"{work}/model-{k}", seed=k, n_layer=layers, n_embd=width, n_head=max(1, width // 64),
                  n_positions=1024) for k in range(2)]
task = crl_envs.tasks.load("arith", n=questions, seed=0)
sampling = SamplingParams(temperature=1.0, max_new_tokens=64)


def debate(members, label):
    crl_envs.run_episodes("debate", members, task, examples=[0], sampling=sampling, progress=False)  # warm-up
    t0 = time.perf_counter()
    episodes = crl_envs.run_episodes("debate", members, task, seed=1, sampling=sampling, progress=False)
    seconds = time.perf_counter() - t0
    usage = crl_envs.total_usage(episodes)
    new = sum(u.completion_tokens for u in usage.values())
    prompt = sum(u.prompt_tokens for u in usage.values())
    print(f"{label}: {len(episodes)} debates in {seconds:.2f} s: {new / seconds:,.0f} generated tokens/s "
          f"({prompt:,} prompt + {new:,} generated tokens)")
    for agent_id, u in usage.items():
        print(f"  {agent_id}: {u.calls} calls, {u.prompt_tokens:,} prompt + {u.completion_tokens:,} new tokens, "
              f"{u.seconds:.2f} s")
    return episodes, new / seconds


engines = [VLLMAgent(str(d), name=f"tiny-{k}", gpu_memory_utilization=0.3, max_model_len=1024, seed=0)
           for k, d in enumerate(dirs)]
vllm_episodes, vllm_rate = debate(pool(engines), "vLLM x2")

# load_weights: engine 0 with model 1's weights answers as engine 1 (greedy)
from safetensors.torch import load_file

probe = [Request([{"role": "user", "content": ex.question}], SamplingParams(max_new_tokens=24)) for ex in task.examples[:32]]
want = [g.token_ids for g in engines[1].generate(probe)]
before = [g.token_ids for g in engines[0].generate(probe)]
engines[0].load_weights(dirs[1])
after = [g.token_ids for g in engines[0].generate(probe)]
ok = after == want and before != want
print(f"load_weights check: {'PASS' if ok else 'FAIL'} ({sum(a == w for a, w in zip(after, want))}/32 equal after, "
      f"{sum(b == w for b, w in zip(before, want))}/32 before)")
engines[0].load_weights(load_file(str(next(dirs[0].glob('*.safetensors')))))  # back to model 0

# logprobs: vLLM's sampled-token log-probs vs one HF teacher-forced forward over the same tokens
hf = HFAgent(dirs[0], device="cuda")
for temperature in (0.0, 0.7):
    g = engines[0].generate([Request(probe[0].messages, SamplingParams(temperature=temperature, max_new_tokens=24,
                                                                       seed=3))])[0]
    with torch.no_grad():
        ids = torch.tensor([g.prompt_token_ids + g.token_ids], device="cuda")
        logits = hf.model(input_ids=ids).logits[0].float() / (temperature or 1.0)
    rows = torch.arange(len(g.token_ids), device="cuda") + len(g.prompt_token_ids) - 1
    ref = torch.log_softmax(logits, -1)[rows, torch.tensor(g.token_ids, device="cuda")].tolist()
    gap = max(abs(a - b) for a, b in zip(g.logprobs, ref))
    print(f"logprob check at temperature {temperature}: max |vLLM - HF| = {gap:.2e} over {len(ref)} tokens")

hf_pool = pool([hf, HFAgent(dirs[1], device="cuda")])
for a in hf_pool.values():
    a.batch_size = 512
_, hf_rate = debate(hf_pool, "HFAgent x2 (cuda)")
print(f"vLLM / HFAgent generated tokens/s: {vllm_rate / hf_rate:.2f}x")
EOF
