"""The one interface every LLM backend implements: a batched ``generate``.

An :class:`Agent` takes a list of :class:`Request` (chat messages, sampling settings, context) and
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
import copy
import hashlib
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from crl_kit.errors import ConfigError, ConfigTypeError

Message = dict[str, str]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}``."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation.

    ``temperature == 0`` means greedy decoding. ``seed`` makes a sampled generation reproducible
    independently of what else is in the batch (backends that cannot promise this say so).

    ``stop`` is a list/tuple of non-empty strings (OpenAI's and vLLM's ``stop``): generation ends
    when the answer's text contains one of them, with finish reason ``"stop"``. The answer then
    ends before the stop string, and its token ids and log-probs end at the same place; see
    :func:`cut_at_stop` for what happens when a stop string begins inside a token.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key, kind, example in (("temperature", numbers.Real, "0.7"), ("top_p", numbers.Real, "0.9"),
                                   ("max_new_tokens", numbers.Integral, "64"), ("seed", numbers.Integral, "0")):
            value = getattr(self, key)
            if value is None and key == "seed":
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                what = "a number" if kind is numbers.Real else "an int"
                raise ConfigTypeError(f"SamplingParams.{key} must be {what} (e.g. {key}={example}), "
                                f"got {type(value).__name__} {value!r}")
            object.__setattr__(self, key, float(value) if kind is numbers.Real else int(value))
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # also refuses NaN
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        stop = self.stop
        if isinstance(stop, str):
            raise ConfigTypeError(f"SamplingParams.stop must be a list or tuple of strings, got the string {stop!r}; "
                            f"write stop=[{stop!r}]")
        if not isinstance(stop, (list, tuple)):
            raise ConfigTypeError(f"SamplingParams.stop must be a list or tuple of strings, got {type(stop).__name__}")
        for s in stop:
            if not isinstance(s, str):
                raise ConfigTypeError(f"SamplingParams.stop entries must be strings, got {type(s).__name__} {s!r}")
            if not s:
                raise ConfigError(f"SamplingParams.stop entries must be non-empty strings, got '' in {stop!r}")
        object.__setattr__(self, "stop", tuple(dict.fromkeys(stop)))

    def with_seed(self, seed: int | None) -> SamplingParams:
        """These settings with another ``seed`` (the runner asks once per request: the other fields, checked
        when these were made, are copied, not checked again)."""
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            return replace(self, seed=seed)  # __post_init__ says what is wrong
        new = copy.copy(self)
        object.__setattr__(new, "seed", None if seed is None else int(seed))
        return new


@dataclass(frozen=True)
class RequestContext:
    """Where a request comes from: what scripted agents answer from and error messages name.

    ``example`` is the task example (a ``crl_envs.tasks.Example``; ``None`` outside an episode),
    ``protocol`` the env's name, ``phase`` and ``phase_index`` the phase's name and number,
    ``agent_id`` the seat that asks, ``sample`` the episode's sample number; ``extra`` keeps any
    other key given in the old ``metadata`` spelling. A model never sees the context: a
    deterministic agent's answer depends on the messages and the sampling alone.
    """

    example: Any = None
    protocol: str | None = None
    phase: str | None = None
    phase_index: int | None = None
    agent_id: str | None = None
    sample: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> RequestContext:
        """The context of an old-style ``metadata`` dict: its known keys as fields, the rest in ``extra``."""
        if not isinstance(metadata, Mapping):
            raise ConfigTypeError(f"Request metadata must be a dict (e.g. {{'example': ...}}), got {type(metadata).__name__}")
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(**{k: v for k, v in metadata.items() if k in known},
                   extra={k: v for k, v in metadata.items() if k not in known})

    def as_metadata(self) -> dict[str, Any]:
        """The old ``metadata`` dict: the fields that are set (not ``None``), then ``extra``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**{k: v for k, v in out.items() if v is not None}, **self.extra}


@dataclass(init=False)
class Request:
    """One prompt to answer: chat ``messages``, ``sampling`` settings and a :class:`RequestContext`.

    ``Request(messages, sampling, context=RequestContext(example=ex))``. The old spelling,
    ``Request(messages, sampling, {"example": ex})`` or ``metadata={...}``, still works: the dict
    becomes the context, and ``request.metadata`` reads the context back as a read-only dict.
    """

    messages: list[Message]
    sampling: SamplingParams
    context: RequestContext

    def __init__(
        self,
        messages: list[Message],
        sampling: SamplingParams | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        context: RequestContext | None = None,
    ) -> None:
        if metadata is not None and context is not None:
            raise ConfigError("Request takes context=RequestContext(...) or metadata={...} (its old spelling), not both")
        if context is not None and not isinstance(context, RequestContext):
            raise ConfigTypeError(f"Request context must be an agents.RequestContext, got {type(context).__name__}")
        self.messages = messages
        self.sampling = SamplingParams() if sampling is None else sampling
        self.context = context if context is not None else RequestContext.from_metadata(metadata or {})
        if not isinstance(self.messages, list) or not self.messages:
            raise ConfigError("Request.messages must be a non-empty list of {'role', 'content'} dicts")
        for m in self.messages:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
                raise ConfigError(f"malformed chat message {m!r}: expected {{'role': str, 'content': str}}")

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The old spelling of :attr:`context`: its set fields as a read-only dict (``metadata["example"]``)."""
        return MappingProxyType(self.context.as_metadata())


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
    #: True when a generation is a function of :attr:`fingerprint`, the request's messages and its
    #: sampling settings (seed included) alone: the same whatever the batch, the process or the
    #: request's context. Only such agents are memoised (:class:`crl_envs.runner.RequestMemo`
    #: generates each distinct request once). A backend sets it when it guarantees it and a test
    #: proves it (HFAgent: per-request generators, batch-invariant decoding; LlamaCppAgent: fixed
    #: evaluation chunks); vLLM's batched kernels, remote servers and scripted agents (``respond``
    #: may read the context or keep state) leave it False.
    deterministic: bool = False
    #: The spec string this agent was built from (set by :func:`agents.from_spec`), so that other
    #: processes (e.g. Ray workers in valuation) can rebuild it instead of receiving its weights.
    spec: str | None = None

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        requests = list(requests)
        if not requests:
            return []
        for r in requests:
            if not isinstance(r, Request):
                raise ConfigTypeError(f"{self.name}: generate() takes Request objects, got {type(r).__name__}")
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


class SampledAgent(Agent):
    """``agent`` decoding every request at its own ``temperature`` and ``top_p``, whatever the caller asked,
    with the request's seed (the runner derives one per seat, example, sample and phase): a pool seat that
    samples while the rest of the pool is greedy, e.g. sixteen copies of one model that only chance
    separates (``agents.pool("zoo16-copies")``).

    Never memoised (``deterministic`` False): the runner's greedy memo keys a greedy request without its
    seed, but this agent's answer reads it.

    Example:
        >>> from agents import Request, SamplingParams, ScriptedAgent
        >>> seen = ScriptedAgent("t", lambda ex, msgs: "ok")
        >>> hot = SampledAgent(seen, temperature=0.7)
        >>> hot.name, hot.generate([Request([{"role": "user", "content": "?"}], SamplingParams(seed=3))])[0].text
        ('t@t0.7', 'ok')

    Raises:
        ConfigError: ``temperature`` not above 0 (a greedy seat is the agent itself), or ``top_p`` outside (0, 1].
    """

    deterministic = False

    def __init__(self, agent: Agent, temperature: float, top_p: float = 1.0, *, name: str | None = None):
        if not isinstance(agent, Agent):
            raise ConfigTypeError(f"SampledAgent wraps an agents.Agent, got {type(agent).__name__}")
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature > 0:
            raise ConfigError(f"SampledAgent temperature must be a number > 0 (a greedy seat is the agent itself), "
                              f"got {temperature!r}")
        SamplingParams(temperature=float(temperature), top_p=top_p)  # the same checks as any request's
        self.agent, self.temperature, self.top_p = agent, float(temperature), float(top_p)
        self.name = name or f"{agent.name}@t{self.temperature:g}"

    def _generate(self, requests: list[Request]) -> list[Generation]:
        return self.agent.generate([replace(r, sampling=replace(r.sampling, temperature=self.temperature,
                                                                  top_p=self.top_p)) for r in requests])

    @property
    def fingerprint(self) -> str:
        return f"sampled(t={self.temperature!r},top_p={self.top_p!r}):{self.agent.fingerprint}"


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
    """Fallback chat format for tokenizers without a chat template (``"User: ..."`` turns, one a
    line, ending with ``"Assistant:"``). Answers in it end at :data:`PLAIN_CHAT_STOP`."""
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(parts) + "\nAssistant:"


PLAIN_CHAT_STOP: tuple[str, ...] = ("\nUser:", "\nSystem:", "\nAssistant:")
"""The stop strings of :func:`plain_chat_format`: the start of the next turn. A base model (no chat
template, e.g. Gemma-3-270m) otherwise writes the next "User:" turn itself until max_new_tokens."""


def default_stop(tokenizer: Any) -> tuple[str, ...]:
    """Stop strings a backend adds to every request for ``tokenizer``: :data:`PLAIN_CHAT_STOP` when
    prompts are rendered with :func:`plain_chat_format` (no chat template), else none (a chat
    template's end-of-turn token is an eos token)."""
    return () if getattr(tokenizer, "chat_template", None) else PLAIN_CHAT_STOP


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """The index in ``text`` where the earliest stop string begins (searching from ``start``), or -1."""
    found = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(found) if found else -1


def cut_at_stop(decode: Any, token_ids: Sequence[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """Where a stop string cuts a generated answer: ``(kept, text)`` or None when no stop occurs.

    ``decode(ids) -> str`` decodes token ids (as the answer's text is decoded). With ``p`` the index
    where the earliest stop string begins in ``decode(token_ids)``, the answer keeps the longest
    prefix ``token_ids[:kept]`` whose text ends at or before ``p``, and ``text = decode(token_ids[:kept])``.
    So the text, the token ids and the log-probs end at the same place: the token in which the stop
    string begins is dropped with everything after it. When a stop string begins inside a token
    (``"4.\nUser:"`` with ``".\n"`` one token), that token's characters before the stop (``"."``)
    are dropped too: the text is always exactly the decoded kept tokens, which is what trainers score.
    """
    full = decode(list(token_ids))
    p = find_stop(full, stops)
    if p < 0:
        return None
    for kept in range(len(token_ids), -1, -1):
        text = decode(list(token_ids[:kept]))
        if len(text) <= p and full.startswith(text):
            return kept, text
    return 0, ""


def truncate_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before its earliest stop string, and whether one occurred (for backends that
    return text only: scripted agents, servers that ignore ``stop``)."""
    p = find_stop(text, stops)
    return (text, False) if p < 0 else (text[:p], True)


def render_chat(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The prompt text of a chat: ``tokenizer``'s chat template, or :func:`plain_chat_format`.
    Every local backend renders through this, so the same chat is the same prompt everywhere."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return plain_chat_format(messages)


def adds_bos(tokenizer: Any) -> bool:
    """True when ``tokenizer`` puts a BOS token in front of text by default (Gemma, Llama-2, Mistral)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    return tokenizer("a")["input_ids"][:1] == [bos] and tokenizer("a", add_special_tokens=False)["input_ids"][:1] != [bos]


def encode_prompt_text(tokenizer: Any, text: str) -> list[int]:
    """A rendered prompt's token ids with the BOS token exactly once where the tokenizer adds one.

    The text is encoded without special tokens (a chat template writes its own); then a tokenizer
    that adds BOS by default gets it in front, unless the text already starts with it (templates
    that write ``{{ bos_token }}``). Every local backend encodes prompts through this.
    """
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if adds_bos(tokenizer) and ids[:1] != [tokenizer.bos_token_id]:
        ids.insert(0, tokenizer.bos_token_id)
    return ids


#: the conversation whose rendering fingerprints a chat template: every role, two user turns
FINGERPRINT_CHAT: tuple[Message, ...] = (
    {"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
    {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
)


class TokenizerPrompts:
    """Prompts and answer text through a Hugging Face tokenizer (``self.tokenizer``), the same way in
    every local backend (HFAgent, VLLMAgent, LlamaCppAgent): the same chat is the same token ids."""

    tokenizer: Any

    def prompt_identity(self) -> str:
        """Everything besides the weights that sets a local backend's answer to a chat, for its
        fingerprint: the chat template's source, a conversation with every role rendered (a template
        that now renders the system message changes it), the eos ids decoding stops at and the default
        stop strings. The one place for it (HFAgent, VLLMAgent and LlamaCppAgent hash it)."""
        try:
            rendered = self.render(FINGERPRINT_CHAT)
        except Exception as e:  # a template that refuses a role: its source and the one-turn render still count
            rendered = f"<refused: {type(e).__name__}: {e}>"
        return json.dumps({"template": getattr(self.tokenizer, "chat_template", None), "chat": rendered,
                           "one": self.render([{"role": "user", "content": "x"}]),
                           "eos": sorted(getattr(self, "eos_ids", None) or ()),
                           "stop": list(default_stop(self.tokenizer))}, sort_keys=True, default=str)

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text of a chat: the tokenizer's chat template, or :func:`plain_chat_format`."""
        return render_chat(self.tokenizer, messages)

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        """The prompt's token ids, with the BOS token exactly once when the tokenizer adds one by
        default (:func:`encode_prompt_text`); trainers re-score these same ids."""
        return encode_prompt_text(self.tokenizer, self.render(messages))

    def decode_text(self, token_ids: Sequence[int]) -> str:
        """The text of generated tokens (special tokens skipped), as answers and stop checks read it."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def check_prompts_fit(
        self, requests: Sequence[Request], prompt_ids: Sequence[Sequence[int]], *, context: str, fix: str
    ) -> None:
        """Raise before any decoding when a prompt fills the context (``self.context_length``, ``None``:
        unbounded), naming the example, the lengths and ``fix``.

        Raises:
            ValueError: a prompt has ``context_length`` tokens or more.
        """
        limit = getattr(self, "context_length", None)
        if limit is None:
            return
        for r, ids in zip(requests, prompt_ids):
            if len(ids) >= limit:
                example = getattr(r.context.example, "id", None)
                raise ConfigError(
                    f"{type(self).__name__} {getattr(self, 'name', '')!r}: the prompt of example {example!r} has "
                    f"{len(ids)} tokens, but {context} holds {limit}; {fix}"
                )

    def generation(
        self, prompt_ids: list[int], tokens: list[int], logprobs: list[float], reason: str, seconds: float
    ) -> Generation:
        """A decoded answer as a :class:`Generation`: its text is :meth:`decode_text` of ``tokens``."""
        return Generation(
            text=self.decode_text(tokens),
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(tokens),
            prompt_token_ids=prompt_ids,
            seconds=seconds,
        )


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
