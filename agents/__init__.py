"""LLM policies behind one batched interface.

- :class:`Agent` — the interface: ``generate(list[Request]) -> list[Generation]``.
- :class:`HFAgent` — transformers models (spec ``hf:<path or hub id>``).
- :class:`OpenAIAgent` — OpenAI-compatible servers (spec ``openai:<base url>#<model>``).
- :class:`VLLMAgent` — vLLM's offline engine (spec ``vllm:<hub id or path>``; the ``vllm`` extra).
- :class:`LlamaCppAgent` — a GGUF file run by llama.cpp on CPU (spec ``llamacpp:<file.gguf>``; the ``llamacpp``
  extra); ``agents.pool("pretrained-llamacpp")`` is the pretrained pool through it, ``agents.pool("pretrained-vllm")``
  through vLLM (:class:`VLLMAgent`, on a GPU or vLLM's CPU build).
- :class:`ScriptedAgent` — deterministic answers, for tests and analysis.
- ``agents.pool("zoo")`` — the tiny shipped models; ``agents.pool("pretrained")`` — SmolLM2-135M-Instruct
  and gemma-3-270m from PyPI wheels (:mod:`agents.pretrained`; also ``hf:<file.gguf>`` specs).
- :func:`pool` / :class:`Pool` — the ordered roster ``model_0 .. model_{n-1}`` a protocol plays.
"""

from agents.base import (
    Agent,
    Generation,
    Message,
    Request,
    RequestContext,
    SampledAgent,
    SamplingParams,
    sample_n,
    stable_hash,
)
from agents.hf import HFAgent
from agents.pool import (
    Pool,
    agent_class,
    backend_names,
    from_spec,
    pool,
    pool_names,
    pool_size,
    register_backend,
    register_pool,
)
from agents.scripted import ScriptedAgent


def _openai_from_spec(target: str) -> Agent:
    from agents.openai import OpenAIAgent

    return OpenAIAgent.from_spec(target)


def _vllm_from_spec(target: str) -> Agent:
    from agents.vllm import VLLMAgent

    return VLLMAgent.from_spec(target)


def _llamacpp_from_spec(target: str) -> Agent:
    from agents.llamacpp import LlamaCppAgent

    return LlamaCppAgent.from_spec(target)


def _lazy_class(name: str):
    """``target -> the backend's class``, importing its module (never its library) on first ask."""
    return lambda target: __getattr__(name)


register_backend("hf", HFAgent.from_spec, lambda target: HFAgent)
register_backend("openai", _openai_from_spec, _lazy_class("OpenAIAgent"))
register_backend("vllm", _vllm_from_spec, _lazy_class("VLLMAgent"))
register_backend("llamacpp", _llamacpp_from_spec, _lazy_class("LlamaCppAgent"))
import agents.zoo  # noqa: E402,F401  (registers agents.pool("zoo") and "zoo:<name>"; models load on first use)
from agents import pretrained as _pretrained  # noqa: E402  (light: loads nothing until asked)

for _backend, _pool_name in (("hf", "pretrained"), ("llamacpp", "pretrained-llamacpp"), ("vllm", "pretrained-vllm")):
    register_pool(_pool_name, lambda _backend=_backend: _pretrained.load(backend=_backend),
                  lambda _backend=_backend: _pretrained._backend_class(_backend))
register_backend("pretrained", _pretrained.agent_from_spec, _pretrained.class_of_spec)

_LAZY = {"OpenAIAgent": "agents.openai", "VLLMAgent": "agents.vllm", "LlamaCppAgent": "agents.llamacpp"}


def __getattr__(name: str):
    """Backends with heavy or optional dependencies load on first use (vLLM only when asked for)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")


__all__ = [
    "Agent", "Generation", "Message", "Request", "RequestContext", "SampledAgent", "SamplingParams", "sample_n", "stable_hash",
    "HFAgent", "OpenAIAgent", "VLLMAgent", "LlamaCppAgent", "ScriptedAgent", "Pool", "pool", "from_spec", "register_backend",
    "register_pool", "pool_size", "pool_names", "backend_names", "agent_class",
]
