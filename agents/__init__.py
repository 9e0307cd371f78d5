"""LLM policies behind one batched interface.

- :class:`Agent` — the interface: ``generate(list[Request]) -> list[Generation]``.
- :class:`HFAgent` — transformers models (spec ``hf:<path or hub id>``).
- :class:`ScriptedAgent` — deterministic answers, for tests and analysis.
- :func:`pool` / :class:`Pool` — the ordered roster ``model_0 .. model_{n-1}`` a protocol plays.
"""

from agents.base import Agent, Generation, Message, Request, SamplingParams, sample_n, stable_hash
from agents.hf import HFAgent
from agents.pool import Pool, from_spec, pool, register_backend, register_pool
from agents.scripted import ScriptedAgent

register_backend("hf", lambda target: HFAgent(target))

__all__ = [
    "Agent", "Generation", "Message", "Request", "SamplingParams", "sample_n", "stable_hash",
    "HFAgent", "ScriptedAgent", "Pool", "pool", "from_spec", "register_backend", "register_pool",
]
