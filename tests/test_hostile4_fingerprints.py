"""Issue #47, fingerprints that cover everything that changes an answer: each LoRA learner on a shared
base its own adapter (by content and name); HFAgent the chat template rendered on every role and the
eos ids of generation_config; VLLMAgent its adapter by content and every element of its weights;
LlamaCppAgent its context length."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import agents
import agents.zoo
from agents.hf import HFAgent
from trainers import CRLConfig, CRLTrainer, LoraSettings


@pytest.fixture
def model_copy(tmp_path):
    path = tmp_path / "model"
    shutil.copytree(agents.zoo.model_dir("zoo-nocarry"), path)
    return path


def test_lora_learners_on_one_base_have_their_own_fingerprints():
    pool = agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])
    config = CRLConfig(steps=1, questions_per_step=2, num_generations=2, max_new_tokens=8, progress=False, seed=1,
                       lora=LoraSettings(r=2, alpha=4), lora_shared_base=True)
    trainer = CRLTrainer("vote", pool, "arith", learners=["model_1", "model_2"], config=config)
    one, two = trainer.policies["model_1"], trainer.policies["model_2"]
    assert one.name == two.name  # copies of one base: the same pool name
    before = one.fingerprint, two.fingerprint
    assert before[0] != before[1]
    with torch.no_grad():
        for name, p in two.adapter_state().items():
            if "lora_B" in name:
                p.add_(0.01)  # train learner 2's adapter only
    assert two.fingerprint != before[1]
    assert one.fingerprint == before[0]  # learner 1 answers as before: its fingerprint stays


def test_hf_fingerprint_covers_the_eos_ids_of_generation_config(model_copy):
    before = HFAgent(model_copy).fingerprint
    config = json.loads((model_copy / "generation_config.json").read_text())
    config["eos_token_id"] = [1, 5]
    (model_copy / "generation_config.json").write_text(json.dumps(config))
    assert HFAgent(model_copy).fingerprint != before


def test_hf_fingerprint_covers_how_the_template_renders_a_system_message(model_copy):
    before = HFAgent(model_copy).fingerprint
    template = (model_copy / "chat_template.jinja").read_text()
    assert "system" not in template
    (model_copy / "chat_template.jinja").write_text(template.replace(
        "{% if m['role'] == 'user' %}", "{% if m['role'] == 'system' %}<user>{{ m['content'] }}{% elif m['role'] == 'user' %}"))
    after = HFAgent(model_copy)
    assert after.render([{"role": "user", "content": "x"}]) == HFAgent(agents.zoo.model_dir("zoo-nocarry")).render(
        [{"role": "user", "content": "x"}])  # one user message renders as before
    assert after.fingerprint != before


def test_vllm_weights_tag_covers_every_element():
    from agents.vllm import _checksum

    a = torch.zeros(1000)
    b = a.clone()
    b[645] = 1.0
    assert _checksum([("w", a)]) != _checksum([("w", b)])
    assert _checksum([("w", a)]) == _checksum([("w", a.clone())])


def test_vllm_lora_adapter_is_fingerprinted_by_content(tmp_path):
    pytest.importorskip("vllm")
    from agents.vllm import VLLMAgent, _Engine

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"step 1")
    agent = VLLMAgent.__new__(VLLMAgent)  # the identity alone: no engine is started
    agent.name, agent.source, agent.engine = "smol", "/models/smol", _Engine(None)
    agent.tokenizer, agent.eos_ids = HFAgent(agents.zoo.model_dir("zoo-nocarry")).tokenizer, {1}
    agent.set_lora(adapter)
    first = agent.fingerprint
    (adapter / "adapter_model.safetensors").write_bytes(b"step 2")  # the trainer re-saves to the same directory
    agent.set_lora(adapter)
    assert agent.fingerprint != first
    (adapter / "adapter_model.safetensors").write_bytes(b"step 1")
    agent.set_lora(adapter)
    assert agent.fingerprint == first


def test_llamacpp_fingerprint_covers_n_ctx():
    pytest.importorskip("llama_cpp")
    from agents.llamacpp import LlamaCppAgent

    try:
        gguf = agents.pretrained.smollm2_gguf()
    except ImportError as e:
        pytest.skip(str(e))
    short, long = LlamaCppAgent(gguf, n_ctx=512), LlamaCppAgent(gguf, n_ctx=1024)
    try:
        assert short.fingerprint != long.fingerprint
    finally:
        short.close()
        long.close()


LEARNERS = """
import agents, agents.zoo, torch
from trainers import CRLConfig, CRLTrainer, LoraSettings
torch.set_num_threads(1)
pool = agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])
config = CRLConfig(steps=1, questions_per_step=2, num_generations=2, max_new_tokens=8, progress=False, seed=1,
                   lora=LoraSettings(r=2, alpha=4), lora_shared_base=True)
trainer = CRLTrainer("vote", pool, "arith", learners=["model_1", "model_2"], config=config)
print(trainer.policies["model_1"].fingerprint, trainer.policies["model_2"].fingerprint)
"""


@pytest.mark.slow
def test_lora_learner_fingerprints_are_the_same_in_every_process():
    """The adapter's settings are hashed as canonical JSON (peft keeps target_modules in a set, whose repr
    follows the process's string hashing): caches shared by processes keep matching."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    outs = {subprocess.run([sys.executable, "-c", LEARNERS], capture_output=True, text=True, cwd=root, check=True,
                           env={**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": seed}).stdout.split()[-2:]
            .__repr__() for seed in ("1", "2", "3")}
    assert len(outs) == 1
