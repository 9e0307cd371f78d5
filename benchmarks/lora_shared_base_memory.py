"""Parameters held by k learners: one model per learner (each with its LoRA adapter) vs one shared base with k
named adapters (``CRLConfig(lora_shared_base=True)``). Counts, not timings: they do not depend on the machine.

For each model it builds both trainers with ``learners=[...]`` (k copies of the model in a pool) and counts
the distinct parameter tensors the learners' models hold (a tensor shared by two learners counts once), the
trainable ones (the adapters) and the AdamW state those imply (2 tensors per trainable parameter), in
elements and in MiB at the model's dtype.

Usage:
    python benchmarks/lora_shared_base_memory.py                 # the zoo's rookie, k = 2 and 4
    python benchmarks/lora_shared_base_memory.py --smollm2       # also SmolLM2-135M-Instruct (the pretrained extra)
"""

from __future__ import annotations

import argparse

import torch

import agents
import agents.zoo
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, LoraSettings


def held(trainer: CRLTrainer) -> tuple[int, int, int]:
    """(elements, bytes, trainable elements) of the distinct parameters the learners' models hold."""
    seen: dict[int, torch.nn.Parameter] = {}
    for policy in trainer.policies.values():
        for p in policy.model.parameters():
            seen.setdefault(id(p), p)
    trainable = sum(p.numel() for s in trainer.learner_states.values() for p in s.params)
    return (sum(p.numel() for p in seen.values()), sum(p.numel() * p.element_size() for p in seen.values()),
            trainable)


def measure(label: str, spec: str, k: int, lora: LoraSettings, task) -> None:
    pool = agents.pool([spec] * k)
    ids = list(pool.ids)
    rows = []
    for shared in (False, True):
        cfg = CRLConfig(lora=lora, lora_shared_base=shared, progress=False, max_new_tokens=8)
        trainer = CRLTrainer("vote", pool, task, learners=ids, config=cfg)
        elements, size, trainable = held(trainer)
        rows.append((shared, elements, size, trainable))
        del trainer
    base = rows[0][1]
    for shared, elements, size, trainable in rows:
        how = f"1 base + {k} adapters" if shared else f"{k} models + {k} adapters"
        print(f"{label:10s} k={k}  {how:22s} params {elements:>12,d} ({size / 2**20:8.2f} MiB)  "
              f"trainable {trainable:>9,d}  AdamW state {2 * trainable:>9,d}  vs separate {elements / base:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct (needs the pretrained extra)")
    args = parser.parse_args()
    task = tasks.load("arith", split="train", n=8, **agents.zoo.TASK_OPTIONS)
    for k in (2, 4):
        measure("zoo-rookie", "zoo:zoo-rookie", k, LoraSettings(r=8, alpha=16), task)
    if args.smollm2:
        lora = LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
        measure("smollm2", "pretrained:smollm2-135m-instruct", 2, lora, task)


if __name__ == "__main__":
    main()
