"""Any OpenAI-compatible chat-completions server as an :class:`Agent` (vLLM serve, SGLang, llama.cpp,
hosted APIs).

One ``generate`` call sends its requests concurrently (asyncio + httpx, at most ``concurrency`` in
flight) and returns the answers in request order. Transient failures (timeouts, dropped connections,
HTTP 429 and 5xx, malformed JSON) are retried with exponential backoff and jitter, honouring the
server's ``Retry-After``. When the retries are spent the failure is raised, naming the agent and the
task example: a failed call never becomes an empty answer that silently scores 0.

The API key is read from an environment variable (``OPENAI_API_KEY`` by default) when a batch is
sent; it is never stored in the agent's repr, logs or exception messages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import os
import random
import re
import time
from typing import Any

import httpx

from agents.base import Agent, Generation, Request, truncate_at_stop
from agents.spec_options import split_options
from crl_kit.errors import ConfigError, ConfigTypeError, ModelError

RETRYABLE_STATUS = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
#: Retries of a refused connection to a server this agent has never reached (a wrong URL, a server that was
#: never started), each after at most CONNECT_RETRY_DELAY seconds: such a mistake fails in about a second.
#: Once the server has answered, a refusal means it is restarting: it gets the full retry budget.
CONNECT_RETRIES = 2
CONNECT_RETRY_DELAY = 0.5
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class OpenAIRequestError(ModelError):
    """A chat-completions request failed for good (retries spent, or a non-retryable HTTP error)."""


class _Failure(Exception):
    """One failed attempt: what went wrong, whether retrying may help, and the server's Retry-After."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None, refused: bool = False):
        super().__init__(message)
        self.message, self.retryable, self.retry_after = message, retryable, retry_after
        self.refused = refused  # no connection at all: retried CONNECT_RETRIES times at most

    def __str__(self) -> str:
        return self.message


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date); None if absent/invalid."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with "equal jitter": a delay in [d/2, d] with d = min(cap, base * 2**attempt)."""
    ceiling = min(cap, base * (2**attempt))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def parse_openai_spec(target: str) -> tuple[str, str, dict[str, Any]]:
    """``"http://host:8000/v1#model?concurrency=8"`` -> ``(base_url, model, options)``."""
    if "#" not in target:
        raise ConfigError(
            f"malformed openai spec 'openai:{target}': expected 'openai:<base url>#<model>', "
            "e.g. 'openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-0.5B-Instruct'"
        )
    base_url, model = target.rsplit("#", 1)
    model, options = split_options(model, _SPEC_OPTIONS, "openai")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"openai spec base url {base_url!r} must start with http:// or https://")
    if not model:
        raise ConfigError(f"openai spec 'openai:{target}' names no model after '#'")
    return base_url, model, options


class OpenAIAgent(Agent):
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``.
        model: the served model's name.
        name: display name (default: ``model``).
        api_key_env: environment variable holding the API key (sent as ``Authorization: Bearer``);
            unset means no key (local servers).
        concurrency: the most requests in flight at once.
        timeout: seconds per attempt (connect, read and write).
        max_retries: retries after the first attempt of a request. A refused connection to a server this
            agent has never reached is retried only ``CONNECT_RETRIES`` times, within about a second (a wrong
            URL fails fast); once the server has answered, a refusal (a restart) gets every retry.
        backoff_base, backoff_max: exponential backoff of retry ``k``: ``min(max, base * 2**k)``,
            jittered down by up to half; a server's ``Retry-After`` (capped at ``retry_after_max``)
            takes precedence.
        logprobs: ask for the sampled tokens' log-probabilities (``logprobs: true`` with
            ``top_logprobs``, without which llama.cpp's server sends none). A server that answers
            without them (``transformers serve``) fails the request at once with an error saying so:
            missing log-probs never reach a trainer as ``None``. Servers report the log-probs of the
            model's own distribution, before temperature and top-p (vLLM's default
            ``raw_logprobs``, llama.cpp): the same as HFAgent's at temperature 0 or 1 with top_p 1.
        top_logprobs: alternatives per token the server is asked to list (the agent reads only the
            sampled token's log-prob; llama.cpp needs the field, 0 suffices).
        token_ids: ask vLLM servers for token ids (``return_tokens_as_token_ids``, ``return_token_ids``;
            vLLM-specific fields that other servers may reject).
        seed_bits: seeds are reduced modulo ``2**seed_bits`` (servers such as llama.cpp take 32-bit seeds).
        extra_body: fields added to every request body (e.g. ``{"top_k": 20}``; for llama.cpp's
            server ``{"repeat_penalty": 1.0}``: it applies 1.1 by default, so its greedy answer is
            otherwise not the model's argmax).

    Example:
        >>> agent = OpenAIAgent("http://127.0.0.1:8000/v1", "qwen")  # connects on the first request
        >>> agent.generate([Request([{"role": "user", "content": "2+2?"}])])[0].text  # a server  # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        name: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 6,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 120.0,
        logprobs: bool = False,
        top_logprobs: int = 0,
        token_ids: bool = False,
        seed_bits: int = 31,
        extra_body: dict[str, Any] | None = None,
    ):
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries}")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {timeout}")
        if not 0 <= top_logprobs <= 20:
            raise ConfigError(f"top_logprobs must be in 0..20 (the OpenAI API's range), got {top_logprobs}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.token_ids = token_ids
        self.seed_bits = seed_bits
        self.extra_body = dict(extra_body or {})
        self._rng = random.Random()
        self._reached = False  # has the server answered this agent at least once?

    @classmethod
    def from_spec(cls, target: str) -> OpenAIAgent:
        """Build from the part of ``openai:<base url>#<model>[?options]`` after ``openai:``."""
        base_url, model, options = parse_openai_spec(target)
        return cls(base_url, model, **options)

    @property
    def fingerprint(self) -> str:
        return f"openai:{self.base_url}#{self.model}"

    def __repr__(self) -> str:
        return f"OpenAIAgent({self.name!r}, base_url={self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ requests
    def payload(self, request: Request) -> dict[str, Any]:
        """The JSON body of one chat-completions request."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_new_tokens,
            "n": 1,
        }
        if s.seed is not None:
            body["seed"] = int(s.seed) % (2**self.seed_bits)
        if s.stop:
            body["stop"] = list(s.stop)
        if self.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = self.top_logprobs
        if self.token_ids:  # vLLM: ids in the logprob tokens ("token_id:N"), and (>= 0.10.2) as lists
            body["return_tokens_as_token_ids"] = True
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    def _generate(self, requests: list[Request]) -> list[Generation]:
        # the optional on-disk cache (off by default): agents/generation_cache.py
        from agents.generation_cache import cached_generate

        return cached_generate(self, requests, self._generate_now, self.payload)

    def _generate_now(self, requests: list[Request]) -> list[Generation]:
        coroutine = self._generate_all(requests)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        # Called from inside a running event loop (Jupyter, an async app): use a private loop in a thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coroutine).result()

    async def _generate_all(self, requests: list[Request]) -> list[Generation]:
        headers = {"Content-Type": "application/json"}
        api_key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        semaphore = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(headers=headers, timeout=self.timeout, limits=limits) as client:
            tasks = [asyncio.ensure_future(self._one(client, semaphore, r, api_key, _which(r, i, len(requests))))
                     for i, r in enumerate(requests)]
            await _first_failure_in_order(tasks)
            return [t.result() for t in tasks]

    async def _one(
        self, client: httpx.AsyncClient, semaphore: asyncio.Semaphore, request: Request, api_key: str | None,
        which: str = "request",
    ) -> Generation:
        body = self.payload(request)
        url = f"{self.base_url}/chat/completions"
        last: _Failure | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait = backoff_delay(attempt - 1, self.backoff_base, self.backoff_max, self._rng)
                if last is not None and last.retry_after is not None:
                    wait = min(self.retry_after_max, last.retry_after)
                if last is not None and last.refused and not self._reached:
                    wait = min(wait, CONNECT_RETRY_DELAY)
                await asyncio.sleep(wait)
            t0 = time.perf_counter()
            try:
                async with semaphore:
                    data = await self._post(client, url, body)
                generation = self._parse(data, request.sampling.stop)
                generation.seconds = time.perf_counter() - t0
                return generation
            except _Failure as failure:
                last = failure
                if not failure.retryable or (failure.refused and not self._reached and attempt >= CONNECT_RETRIES):
                    break
        attempts = attempt + 1
        message = (
            f"OpenAIAgent {self.name!r} (model {self.model!r} at {self.base_url}): {which} "
            f"failed after {attempts} attempt{'s' * (attempts > 1)}; last failure: {last}"
        )
        raise OpenAIRequestError(_redact(message, api_key))

    async def _post(self, client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Any:
        try:
            response = await client.post(url, json=body)
            self._reached = True
        except httpx.TimeoutException as e:
            raise _Failure(f"timed out after {self.timeout} s ({type(e).__name__})", retryable=True) from None
        except httpx.ConnectError as e:  # nothing listens there (refused), or the host name does not resolve
            raise _Failure(f"connection error ({type(e).__name__}: {e}); is a server running at {self.base_url}? "
                           "Start it, or fix the base URL of the spec", retryable=True, refused=True) from None
        except httpx.TransportError as e:  # connection reset, dropped mid-response, protocol errors
            raise _Failure(f"connection error ({type(e).__name__}: {e})", retryable=True) from None
        if response.status_code != 200:
            snippet = response.text[:300].replace("\n", " ")
            raise _Failure(
                f"HTTP {response.status_code}: {snippet}",
                retryable=response.status_code in RETRYABLE_STATUS,
                retry_after=parse_retry_after(response.headers.get("retry-after")),
            )
        try:
            return response.json()
        except ValueError:
            snippet = response.text[:200].replace("\n", " ")
            raise _Failure(f"malformed JSON in the response: {snippet!r}", retryable=True) from None

    def _parse(self, data: Any, stops: tuple[str, ...] = ()) -> Generation:
        """Map a chat-completions response to a :class:`Generation`; malformed responses raise a retryable
        failure, an answer without the log-probs this agent asks for a non-retryable one.

        The answer ends before its first stop string even when the server returns the stop string
        (``transformers serve`` does) or ignores ``stop``; log-probs (and ids) are cut at the same
        place, as HFAgent cuts them (:func:`agents.base.cut_at_stop`)."""
        try:
            choice = data["choices"][0]
            message = choice["message"]
            finish = choice.get("finish_reason") or "stop"
            text = message.get("content")
            if text is None:
                if finish != "length":
                    raise KeyError("message.content is null")
                text = ""
            if not isinstance(text, str):
                raise ConfigTypeError(f"message.content is {type(text).__name__}, not a string")
            usage = data.get("usage") or {}
            logprobs, token_ids, pieces = _logprobs_of(choice)
            prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
            prompt_ids = [int(t) for t in prompt_ids] if isinstance(prompt_ids, list) else None
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise _Failure(f"malformed chat-completions response ({type(e).__name__}: {e})", retryable=True) from None
        text, stopped = truncate_at_stop(text, stops)
        if stopped:
            finish = "stop"
        if self.logprobs and logprobs is None:
            if text:
                raise _Failure(
                    "the server answered without the log-probs this agent asks for (logprobs=true, "
                    f"top_logprobs={self.top_logprobs}); it does not serve them (transformers serve does not). "
                    "Use a server that does (vLLM, llama.cpp's) or an agent with logprobs=false",
                    retryable=False,
                )
            logprobs, token_ids = [], token_ids if token_ids is not None else []  # an empty answer: no tokens
        if logprobs is not None and pieces is not None:
            kept, kept_text = _tokens_within(pieces, text)
            if kept is not None and kept < len(logprobs):  # tokens past the answer: the stop string's, eos
                logprobs, text = logprobs[:kept], kept_text
                token_ids = token_ids[:kept] if token_ids is not None else None
        completion_tokens = int(usage.get("completion_tokens") or (len(logprobs) if logprobs else 0))
        return Generation(
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason="length" if finish == "length" else "stop",
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=completion_tokens,
            prompt_token_ids=prompt_ids,
        )


def _logprobs_of(choice: dict[str, Any]) -> tuple[list[float] | None, list[int] | None, list[bytes] | None]:
    """The sampled tokens' log-probs, their ids when the server gives them, and their bytes (from
    ``bytes``, else the ``token`` string; None when tokens are only named by id)."""
    token_ids = choice.get("token_ids")
    token_ids = [int(t) for t in token_ids] if isinstance(token_ids, list) else None
    block = choice.get("logprobs")
    if not block or block.get("content") is None:
        return None, token_ids, None
    entries = block["content"]
    logprobs = [float(e["logprob"]) for e in entries]
    matches = [_TOKEN_ID.match(str(e.get("token", ""))) for e in entries]
    named_by_id = bool(entries) and all(matches)
    if token_ids is None and named_by_id:
        token_ids = [int(m.group(1)) for m in matches]  # type: ignore[union-attr]
    pieces: list[bytes] | None = []
    for e in entries:
        if isinstance(e.get("bytes"), list):
            pieces.append(bytes(e["bytes"]))
        elif named_by_id or not isinstance(e.get("token"), str):
            pieces = None
            break
        else:
            pieces.append(e["token"].encode("utf-8"))
    return logprobs, token_ids, pieces


def _tokens_within(pieces: list[bytes], text: str) -> tuple[int | None, str]:
    """How many leading tokens lie within ``text``, and their text, when the tokens spell ``text``
    and then run past it (a stop string's tokens, an end-of-turn token); ``(None, text)`` when
    they do not spell it (the server's text and tokens disagree: nothing is cut)."""
    target = text.encode("utf-8")
    spelled = b"".join(pieces)
    if not spelled.startswith(target) or len(spelled) == len(target):
        return None, text
    kept, length = 0, 0
    for piece in pieces:
        if length + len(piece) > len(target):
            break
        kept, length = kept + 1, length + len(piece)
    return kept, target[:length].decode("utf-8", errors="replace")


async def _first_failure_in_order(tasks: list[asyncio.Future]) -> None:
    """Wait for ``tasks``; raise the failure of the first failing one in list order, whichever failed first.

    When task ``k`` fails, the tasks after it are cancelled (they cannot change the verdict) and those
    before it run on (one of them may fail too, and then it is the one raised): the error a batch
    raises depends on the requests and the server, never on the order in which requests finished."""
    index = {t: i for i, t in enumerate(tasks)}
    first = len(tasks)  # the first failing task's index (len: none failed)
    live = set(tasks)
    while live:
        done, live = await asyncio.wait(live, return_when=asyncio.FIRST_EXCEPTION)
        failed = [index[t] for t in done if not t.cancelled() and t.exception() is not None]
        if failed and min(failed) < first:
            first = min(failed)
            for t in tasks[first + 1:]:
                t.cancel()
            live = {t for t in live if index[t] < first}
    await asyncio.gather(*tasks[first + 1:], return_exceptions=True)  # cancelled; their failures retrieved
    if first < len(tasks):
        raise tasks[first].exception()  # type: ignore[misc]


def _which(request: Request, index: int, total: int) -> str:
    """How an error names a request: its task example when it has one, else its place in the batch."""
    example = getattr(request.context.example, "id", request.context.example)
    if example is not None:
        return f"request for example {example!r}"
    return f"request {index + 1} of {total} (no task example)"


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


_SPEC_OPTIONS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "api_key_env": str,
    "concurrency": int,
    "timeout": float,
    "max_retries": int,
    "backoff_base": float,
    "backoff_max": float,
    "retry_after_max": float,
    "logprobs": bool,
    "top_logprobs": int,
    "token_ids": bool,
    "seed_bits": int,
}
