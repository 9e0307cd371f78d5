#!/usr/bin/env bash
# GPU-only checks of the vLLM backend: builds two small random GPT-2s locally (no hub), loads both in
# vLLM on one GPU (gpu_memory_utilization shares, CUDA graphs: VLLMAgent's GPU default), plays a
# debate through crl_envs.run_episodes, and prints tokens/s against HFAgent on the same GPU.
# Everything else about VLLMAgent (greedy tokens and log-probs vs HFAgent, seeds, stops, LoRA,
# load_weights, C-RL with vLLM rollouts and weight sync, vllm serve) runs on CPU in the test suite,
# on vLLM's CPU build: tests/test_vllm.py, tests/test_servers.py.
#
# Usage: bash benchmarks/gpu_check.sh [questions=256] [layers=12] [width=768]
# Needs: a CUDA GPU and `pip install 'crl-envs[vllm]'`.
set -euo pipefail
cd "$(dirname "$0")/.."

QUESTIONS="${1:-256}"
LAYERS="${2:-12}"
WIDTH="${3:-768}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false

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
from agents import HFAgent, SamplingParams, VLLMAgent, pool
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

hf = HFAgent(dirs[0], device="cuda")
hf_pool = pool([hf, HFAgent(dirs[1], device="cuda")])
for a in hf_pool.values():
    a.batch_size = 512
_, hf_rate = debate(hf_pool, "HFAgent x2 (cuda)")
print(f"vLLM / HFAgent generated tokens/s: {vllm_rate / hf_rate:.2f}x")
EOF
