"""VLLMAgent without a GPU: spec parsing, SamplingParams translation, the lazy import error, and the
glue code (prompt rendering, output mapping, LoRA, weight loading) against a stand-in ``vllm`` module.

The stand-in only records what VLLMAgent asks of vLLM and answers in vLLM's output shapes; the real
engine runs in ``benchmarks/gpu_check.sh`` on a GPU machine.
"""

from __future__ import annotations

import subprocess
import sys
import types
from types import SimpleNamespace

import pytest
import torch

import agents
from agents import Request, SamplingParams
from agents.tiny import char_tokenizer
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


def test_missing_vllm_gives_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    with pytest.raises(ImportError, match=r"pip install 'crl-envs\[vllm\]'"):
        agents.pool("vllm:Qwen/Qwen2.5-0.5B-Instruct")
    with pytest.raises(ImportError, match=r"pip install 'crl-envs\[vllm\]'"):
        agents.VLLMAgent("some/model")


def test_importing_the_library_does_not_import_vllm():
    code = (
        "import sys, agents, crl_envs; "
        "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', 'agents.vllm', 'agents.openai'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- stand-in vLLM

class FakeLLM:
    """Answers like ``vllm.LLM.generate``: token ids derived from the prompt and seed, EOS on even seeds."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.tokenizer = char_tokenizer()
        self.calls: list[dict] = []
        self.loaded: list = []
        self.prefix_resets = 0

    def get_tokenizer(self):
        return self.tokenizer

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def generate(self, prompts, sampling_params, use_tqdm=True, lora_request=None):
        self.calls.append({"prompts": prompts, "params": sampling_params, "lora": lora_request, "tqdm": use_tqdm})
        eos = self.tokenizer.eos_token_id
        outs = []
        for prompt, sp in zip(prompts, sampling_params):
            ids, kw = prompt["prompt_token_ids"], sp.kwargs
            tokens = [10 + (kw["seed"] + len(ids) + k) % 50 for k in range(kw["max_tokens"])]
            finish = "length"
            if kw["seed"] % 2 == 0 and kw["max_tokens"] > 3:
                tokens, finish = tokens[:3] + [eos], "stop"
            logprobs = None
            if kw["logprobs"] is not None:
                logprobs = [{t: SimpleNamespace(logprob=-0.1 * (k + 1)), 5: SimpleNamespace(logprob=-9.0)}
                            for k, t in enumerate(tokens)]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            completion = SimpleNamespace(text=text, token_ids=tokens, logprobs=logprobs, finish_reason=finish)
            outs.append(SimpleNamespace(prompt_token_ids=ids, outputs=[completion]))
        return outs


class InProcessLLM(FakeLLM):
    """Exposes the model the way older vLLM (and V1 without multiprocessing) does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        model = SimpleNamespace(load_weights=self.loaded.extend)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=SimpleNamespace(model=model))))


class RemoteLLM(FakeLLM):
    """Only ``collective_rpc``, as vLLM V1 with its engine in another process."""

    def collective_rpc(self, method, args=()):
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=SimpleNamespace(
            load_weights=lambda weights: self.loaded.extend(weights))))
        return [method(worker, *args)]


@pytest.fixture
def fake_vllm(monkeypatch):
    def install(llm_class=FakeLLM):
        vllm = types.ModuleType("vllm")
        vllm.LLM = llm_class
        vllm.SamplingParams = lambda **kwargs: SimpleNamespace(kwargs=kwargs)
        lora = types.ModuleType("vllm.lora")
        request = types.ModuleType("vllm.lora.request")
        request.LoRARequest = lambda name, int_id, path: SimpleNamespace(lora_name=name, lora_int_id=int_id, lora_path=path)
        for mod in (vllm, lora, request):
            monkeypatch.setitem(sys.modules, mod.__name__, mod)
        return vllm

    return install


def test_generate_maps_vllm_outputs(fake_vllm):
    fake_vllm()
    agent = agents.from_spec("vllm:/models/tiny-a?gpu_memory_utilization=0.3&max_model_len=512&seed=7")
    assert agent.name == "tiny-a"
    assert agent.llm.kwargs == {"model": "/models/tiny-a", "dtype": "auto", "seed": 7, "enable_lora": False,
                                "enforce_eager": False, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.3,
                                "max_model_len": 512}
    reqs = [Request([{"role": "user", "content": f"question {i}?"}],
                    SamplingParams(temperature=0.5, top_p=0.95, max_new_tokens=6, seed=100 + i)) for i in range(3)]
    gens = agent.generate(reqs)
    (call,) = agent.llm.calls  # one engine call for the whole batch
    assert call["tqdm"] is False and call["lora"] is None
    assert [p.kwargs["seed"] for p in call["params"]] == [100, 101, 102]
    assert call["params"][0].kwargs == vllm_sampling_kwargs(reqs[0].sampling)
    tok = agent.tokenizer
    for req, gen, prompt in zip(reqs, gens, call["prompts"]):
        text = tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        assert prompt["prompt_token_ids"] == gen.prompt_token_ids == tok.encode(text, add_special_tokens=False)
        assert gen.prompt_tokens == len(gen.prompt_token_ids)
    # seed 100 (even) stops on EOS after 3 tokens: the EOS is not part of the answer
    assert gens[0].finish_reason == "stop" and len(gens[0].token_ids) == 3 == gens[0].completion_tokens
    assert gens[0].logprobs == pytest.approx([-0.1, -0.2, -0.3])
    assert gens[1].finish_reason == "length" and len(gens[1].token_ids) == 6
    assert gens[1].logprobs == pytest.approx([-0.1 * k for k in range(1, 7)])
    assert gens[1].text == tok.decode(gens[1].token_ids)


def test_lora_requests_and_weight_loading(fake_vllm, tiny_model_dir):
    fake_vllm(InProcessLLM)
    agent = agents.VLLMAgent("/models/tiny-b", lora_path="/adapters/v1", logprobs=False)
    assert agent.llm.kwargs["enable_lora"] is True and agent.llm.kwargs["max_lora_rank"] == 16
    gen = agent.generate([Request([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=2, seed=1))])[0]
    assert gen.logprobs is None and agent.llm.calls[0]["params"][0].kwargs["logprobs"] is None
    first = agent.llm.calls[0]["lora"]
    assert (first.lora_int_id, first.lora_path) == (1, "/adapters/v1")
    agent.set_lora("/adapters/v1")  # re-saved adapter: a new id so vLLM reloads it
    assert agent.lora_request.lora_int_id == 2

    before = agent.fingerprint
    state = {"w": torch.ones(3), "b": torch.zeros(2)}
    agent.load_weights(state)
    assert [name for name, _ in agent.llm.loaded] == ["w", "b"] and agent.llm.prefix_resets == 1
    assert agent.fingerprint != before
    after_first = agent.fingerprint
    agent.load_weights({"w": torch.full((3,), 2.0), "b": torch.zeros(2)})
    assert agent.fingerprint != after_first

    fake_vllm(RemoteLLM)
    remote = agents.VLLMAgent("/models/tiny-c")
    remote.load_weights(tiny_model_dir)  # a save_pretrained directory
    from safetensors.torch import load_file

    saved = load_file(str(next(tiny_model_dir.glob("*.safetensors"))))
    assert sorted(name for name, _ in remote.llm.loaded) == sorted(saved)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        remote.load_weights(tiny_model_dir / "missing")
