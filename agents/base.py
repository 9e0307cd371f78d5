"""The one interface every LLM backend implements: a batched ``generate``.

An :class:`Agent` takes a list of :class:`Request` (chat messages, sampling settings, metadata) and
returns exactly one :class:`Generation` per request, in order. Several samples of one prompt are
several requests with different seeds: every backend stays one-in-one-out and every sample is
reproducible on its own.

Example:
    >>> from agents import ScriptedAgent, Request
    >>> echo = ScriptedAgent("echo", lambda example, messages: messages[-1]["content"])
    >>> echo.generate([Request(messages=[{"role": "user", "content": "hi"}])])[0].text
    'hi'
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Message = dict[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation.

    ``temperature == 0`` means greedy decoding. ``seed`` makes a sampled generation reproducible
    independently of what else is in the batch (backends that cannot promise this say so).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def with_seed(self, seed: int | None) -> SamplingParams:
        return replace(self, seed=seed)


@dataclass
class Request:
    """One prompt to answer.

    ``metadata`` carries what scripted agents and logs need: ``example`` (the task example),
    ``protocol``, ``phase``, ``agent_id``.
    """

    messages: list[Message]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.messages, list) or not self.messages:
            raise ValueError("Request.messages must be a non-empty list of {'role', 'content'} dicts")
        for m in self.messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
                raise ValueError(f"malformed chat message {m!r}: expected {{'role': str, 'content': str}}")


@dataclass
class Generation:
    """One answer. ``token_ids``/``logprobs`` are the generated tokens and their log-probabilities
    under the sampling distribution (logits divided by the temperature; raw logits when greedy),
    where the backend exposes them."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    seconds: float = 0.0


class Agent(abc.ABC):
    """Base class of every LLM backend.

    Subclasses implement :meth:`_generate`; :meth:`generate` validates input and guarantees one
    generation per request. ``name`` is the model's display name; ``fingerprint`` identifies the
    exact weights/configuration (valuation caches key on it).
    """

    name: str = "agent"

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        requests = list(requests)
        if not requests:
            return []
        for r in requests:
            if not isinstance(r, Request):
                raise TypeError(f"{self.name}: generate() takes Request objects, got {type(r).__name__}")
        out = self._generate(requests)
        if len(out) != len(requests):
            raise RuntimeError(
                f"{type(self).__name__} {self.name!r} returned {len(out)} generations for {len(requests)} requests"
            )
        return out

    @abc.abstractmethod
    def _generate(self, requests: list[Request]) -> list[Generation]:
        """One generation per request, in order (the backend's batched call)."""

    @property
    def fingerprint(self) -> str:
        """A string that changes whenever the agent's behaviour may change."""
        return f"{type(self).__name__}:{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def stable_hash(*parts: Any) -> int:
    """A 63-bit hash of ``parts`` that is the same in every process (unlike ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def sample_n(agent: Agent, request: Request, n: int) -> list[Generation]:
    """``n`` samples of one request in one batched call; sample ``k`` uses seed ``seed + k``."""
    base = request.sampling.seed or 0
    reqs = [replace(request, sampling=request.sampling.with_seed(base + k)) for k in range(n)]
    return agent.generate(reqs)


def plain_chat_format(messages: Sequence[Message]) -> str:
    """Fallback chat format for tokenizers without a chat template."""
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(parts) + "\nAssistant:"


def render_chat(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The prompt text of a chat: ``tokenizer``'s chat template, or :func:`plain_chat_format`.
    Every local backend renders through this, so the same chat is the same prompt everywhere."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return plain_chat_format(messages)


def token_id_set(*sources: Any) -> set[int]:
    """The token ids named by ``sources``, each an int, a list/tuple of ints, or ``None`` (e.g. a
    tokenizer's and a generation config's ``eos_token_id``)."""
    ids: set[int] = set()
    for source in sources:
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(x) for x in source)
    return ids
