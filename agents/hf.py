"""Hugging Face transformers backend: batched, left-padded, KV-cached decoding with per-request seeds.

Why a decoding loop of our own rather than ``model.generate``: ``generate`` draws every row of a
batch from one random stream, so a sampled answer would depend on which other requests share its
batch. Here each request samples from its own ``torch.Generator`` seeded by ``request.sampling.seed``:
the same request gives the same text whatever it is batched with, which is what makes runs
reproducible and coalition results cacheable. The loop is the standard one (one forward over the
left-padded prompts, then one token per step through the model's KV cache); rows that finish
are dropped from the cache as they accumulate, and sampling is vectorised over the batch.

What keeps it at the hardware's pace (#17), each proven output-identical to the slow way in
``tests/test_fast_decoding.py``: the KV cache is written in place (:mod:`agents.kv_cache`)
instead of re-concatenated every step; a sampled row ranks only its most likely tokens
(:func:`agents.sampling.nucleus_draw`) instead of sorting the vocabulary every step; small models decode on one
thread but run a large batch of prompts on torch's threads.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import json
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from agents.base import (
    Agent,
    Generation,
    Request,
    SamplingParams,
    TokenizerPrompts,
    cut_at_stop,
    default_stop,
    find_stop,
    token_id_set,
)
from agents.gguf import gguf_model_dir
from agents.sampling import cpu_threads, sample_next
from agents.spec_options import split_options
from crl_kit.errors import ConfigError, ModelError

SMALL_MODEL_PARAMETERS = 20_000_000
#: prompt forwards over at least this many (padded) tokens use ``HFAgent.prefill_threads``
PARALLEL_PREFILL_TOKENS = 2048


def _cache_of(output: Any) -> Any:
    """The KV cache of a forward's output (``cache`` in transformers >= 5.x, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _select_rows(cache: Any, index: torch.Tensor) -> Any | None:
    """Keep only the rows ``index`` of a KV cache; None when the cache type does not allow it."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return cache
    if isinstance(cache, tuple):  # legacy per-layer (key, value) tuples
        return tuple(tuple(t[index] for t in layer) for layer in cache)
    return None


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids padded on the left to one width: ``(input_ids, attention_mask, position_ids)``, with
    positions counting from 0 at each row's first real token (pads sit at position 0)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, s in enumerate(sequences):
        if s:
            input_ids[row, width - len(s) :] = torch.tensor(list(s))
            attention[row, width - len(s) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    return input_ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def answer_limits(params: Sequence[SamplingParams], prompt_lengths: Sequence[int], context_length: int | None
                  ) -> list[int]:
    """Each row's most answer tokens: its ``max_new_tokens``, or fewer where the context ends first (the answer
    then stops with ``"length"``)."""
    room = context_length or 2**62
    return [min(p.max_new_tokens, room - length) for p, length in zip(params, prompt_lengths)]


class CachedRows:
    """One model's side of a batched decode: its left-padded prompts, then one token a row a step through its KV
    cache, with the attention mask and positions that go with it. :func:`decode_batch` steps one
    (:class:`HFAgent`) or several in lockstep (the members of :class:`agents.logit.LogitEnsemble`).

    Args:
        agent: the model.
        prompts: one row's prompt ids each.
    """

    def __init__(self, agent: HFAgent, prompts: Sequence[Sequence[int]]):
        self.agent, self.device = agent, agent.device
        self.input_ids, self.attention, self.positions = left_pad(prompts, agent.tokenizer.pad_token_id, agent.device)
        self.width = self.input_ids.shape[1]
        self.past: Any = None
        self._extra: dict[str, Any] = {"logits_to_keep": 1} if agent._keeps_logits else {}

    def grow_to(self, capacity: int) -> None:
        """Decode into :func:`agents.kv_cache.growing_cache` (written in place) of ``capacity`` positions, where
        the model's architecture has one (else transformers' dynamic cache, as without this call)."""
        from agents.kv_cache import growing_cache

        cache = growing_cache(self.agent.model, capacity=capacity)
        if cache is not None:
            self._extra[self.agent._cache_arg] = cache

    def prefill(self, threads: int | None = None) -> torch.Tensor:
        """The forward over the prompts (on ``threads`` torch threads; None: as set): each row's next-token logits."""
        with cpu_threads(threads):
            out = self.agent.model(input_ids=self.input_ids, attention_mask=self.attention,
                                   position_ids=self.positions, use_cache=True, **self._extra)
        self.input_ids = None
        self.past = _cache_of(out)
        return out.logits[:, -1, :].float()

    def step(self, chosen: torch.Tensor, room: int) -> torch.Tensor:
        """Feed each row its ``chosen`` token: the next-token logits. Positions stay inside the context (``room``):
        finished rows that could not be dropped are fed a position there (their outputs are ignored)."""
        self.attention = torch.cat([self.attention, self.attention.new_ones((len(chosen), 1))], dim=1)
        self.positions = (self.positions[:, -1:] + 1).clamp(max=room - 1)
        out = self.agent.model(input_ids=chosen[:, None].to(self.device), attention_mask=self.attention,
                               position_ids=self.positions, use_cache=True, **{self.agent._cache_arg: self.past})
        self.past = _cache_of(out)
        return out.logits[:, -1, :].float()

    def select_rows(self, index: torch.Tensor) -> bool:
        """Keep only the rows ``index``; False (nothing changed) when the cache type does not allow it."""
        pruned = _select_rows(self.past, index)
        if pruned is None:
            return False
        self.past, self.attention, self.positions = pruned, self.attention[index], self.positions[index]
        return True


def decode_batch(agent: Any, rows: Any, logits: torch.Tensor, params: Sequence[SamplingParams], limits: Sequence[int]
                 ) -> list[tuple[list[int], list[float], str]]:
    """The token loop of one batch, shared by :class:`HFAgent` and :class:`agents.logit.LogitEnsemble`: from the
    first next-token ``logits`` (after the prompts), draw one token a row (:func:`~agents.sampling.sample_next`,
    the row's own seeded generator), stop a row at an eos id, a stop string or its limit, and feed the tokens
    back through ``rows`` (a :class:`CachedRows`, or anything with its ``step``, ``select_rows``, ``positions``
    and ``device``). Finished rows are dropped from ``rows`` once they are a quarter of them, and always before
    one would step past the context, where ``rows`` allows it.

    ``agent`` gives the ``tokenizer`` (its default stops), ``eos_ids``, ``decode_text`` and ``context_length``.
    Returns ``(tokens, log-probs, finish reason)`` per row, cut where a stop string begins
    (:func:`~agents.base.cut_at_stop`).
    """
    batch, device = len(params), rows.device
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    generators = [
        torch.Generator().manual_seed(int(p.seed or 0) % (2**63)) if p.temperature > 0 else None for p in params
    ]
    room = agent.context_length or 2**62  # answers stop ("length") where the context ends
    fallback_stop = default_stop(agent.tokenizer)
    stops = [tuple(dict.fromkeys(p.stop + fallback_stop)) for p in params]
    longest_stop = [max((len(s) for s in st), default=0) for st in stops]
    searched = [0] * batch  # how much of each row's text is known to hold no stop string
    tokens: list[list[int]] = [[] for _ in range(batch)]
    logprobs: list[list[float]] = [[] for _ in range(batch)]
    reasons = ["length"] * batch
    live = list(range(batch))  # the request row of each cache row
    finished = [False] * batch
    while True:
        chosen, chosen_lp = sample_next(logits, temperature, top_p, [generators[r] for r in live])
        for j, (tok, lp) in enumerate(zip(chosen.tolist(), chosen_lp.tolist())):
            r = live[j]
            if finished[r]:
                continue
            if tok in agent.eos_ids:
                finished[r], reasons[r] = True, "stop"
                continue
            tokens[r].append(tok)
            logprobs[r].append(lp)
            if stops[r]:
                text = agent.decode_text(tokens[r])
                if find_stop(text, stops[r], max(0, searched[r] - longest_stop[r] - 8)) >= 0:
                    finished[r], reasons[r] = True, "stop"
                    continue
                searched[r] = len(text)
            if len(tokens[r]) >= limits[r]:
                finished[r] = True
        keep = [j for j, r in enumerate(live) if not finished[r]]
        if not keep:
            break
        # Drop finished rows once they are a quarter of the cache, and always before a finished
        # row would step past the model's context (its positions keep growing while it stays).
        done = torch.tensor([finished[r] for r in live], device=device)
        at_context_end = bool((done & (rows.positions[:, -1] + 1 >= room)).any())
        if at_context_end or 4 * (len(live) - len(keep)) >= len(live):
            index = torch.tensor(keep, device=device)
            if rows.select_rows(index):
                temperature, top_p, chosen = temperature[index], top_p[index], chosen[index]
                live = [live[j] for j in keep]
        logits = rows.step(chosen, room)
    for r in range(batch):
        if reasons[r] == "stop" and stops[r]:
            cut = cut_at_stop(agent.decode_text, tokens[r], stops[r])
            if cut is not None:
                tokens[r], logprobs[r] = tokens[r][: cut[0]], logprobs[r][: cut[0]]
    return [(tokens[r], logprobs[r], reasons[r]) for r in range(batch)]


def fuse_gelu_activations(model: torch.nn.Module) -> int:
    """Replace every ``transformers.activations.NewGELUActivation`` in ``model`` by ``GELUTanh`` and return how
    many were replaced.

    Both compute GPT-2's tanh approximation of GELU; ``NewGELUActivation`` as eight elementwise torch ops (a
    tensor pass each, and a graph node each under autograd), ``GELUTanh`` as ``torch.nn.functional.gelu(x,
    approximate="tanh")``, one fused kernel: ~5x faster at decoding sizes on CPU. Not bit-identical: ~0.5% of
    elements differ by 1-2 ulp. Measured on the zoo (``benchmarks/fused_gelu.py``): no greedy answer of 7,200
    moved, debate on ``zoo4-ladder`` ~1.3x faster.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
        >>> fuse_gelu_activations(model), type(model.transformer.h[0].mlp.act).__name__
        (2, 'GELUTanh')
    """
    from transformers.activations import GELUTanh, NewGELUActivation

    swapped = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is NewGELUActivation:
                setattr(parent, child_name, GELUTanh())
                swapped += 1
    return swapped


def is_out_of_memory(error: BaseException) -> bool:
    """True for CUDA/accelerator OOMs and for CPU allocation failures (``DefaultCPUAllocator``)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text.lower() or "DefaultCPUAllocator" in text)


_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU; anything else goes to ``torch.device``."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype | None:
    """A torch dtype from a name (``"bfloat16"``, ``"fp16"``, ...); ``"auto"`` is bfloat16 on a GPU
    that supports it, float16 on other GPUs, float32 on CPU."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


def unreadable_safetensors(path: Path, error: Exception) -> str:
    """What to say when ``safetensors`` refused a weights file under ``path`` (its own message names no
    file): the file(s) it cannot read, its reason, the fix."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    bad = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception:
            bad.append(str(f))
    return (f"{', '.join(bad) or path} is not a valid safetensors file ({error}); re-save the model with "
            "save_pretrained or copy the file again")


class HFAgent(TokenizerPrompts, Agent):
    """A transformers causal LM as an :class:`Agent`.

    Args:
        model: a path or hub id, or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer (loaded from ``model`` when it is a path/id).
        name: display name (default: the path's last component or the config's name).
        device: ``"cpu"``, ``"cuda"``, ``"auto"`` (CUDA when available), ...
        dtype: ``torch.bfloat16`` or a name (``"bfloat16"``, ``"fp16"``, ``"auto"``); default float32.
        batch_size: the most requests decoded together; requests are sorted by prompt length
            first (length buckets) so padding stays small. A batch that runs out of memory is
            halved and retried (and later batches of the call stay at the smaller size).
        num_threads: torch CPU threads while generating; default 1 for models under 20M
            parameters on CPU (faster: thread synchronisation outweighs the work), else torch's setting.
        gguf_file: the name of a GGUF checkpoint inside the directory ``model`` (a ``model`` path
            ending in ``.gguf`` is read as one too): converted once to a plain model directory
            cached by the file's sha256 (:func:`agents.gguf.gguf_model_dir`).
        fuse_gelu: swap transformers' ``NewGELUActivation`` (GPT-2's ``gelu_new``, the zoo's: eight
            elementwise ops) for its ``GELUTanh`` (torch's one fused tanh-GELU, the same function):
            :func:`fuse_gelu_activations`. ``False`` keeps transformers' exact arithmetic.

    Example:
        >>> import agents.zoo
        >>> agent = HFAgent(agents.zoo.model_dir("zoo-nocarry"))  # a directory, or a hub id
        >>> agent.generate([Request([{"role": "user", "content": "What is 23 + 45?"}])])[0].text
        'The answer is 68.'
    """

    deterministic = True  # per-request generators; batch-invariant (tests/test_hf_agent.py)

    #: options of ``hf:<model>?key=value`` specs (keyword arguments of the constructor)
    SPEC_OPTIONS: dict[str, type | tuple[type, ...]] = {
        "dtype": str, "device": str, "batch_size": int, "name": str, "trust_remote_code": bool,
        "num_threads": int, "gguf_file": str, "fuse_gelu": bool,
    }

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any | None = None,
        *,
        name: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        batch_size: int = 64,
        trust_remote_code: bool = False,
        num_threads: int | None = None,
        gguf_file: str | None = None,
        fuse_gelu: bool = True,
    ):
        from safetensors import SafetensorError
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        if gguf_file is not None and not isinstance(model, (str, Path)):
            raise ConfigError("HFAgent(gguf_file=...) needs model= the directory that holds the GGUF file")
        if isinstance(model, (str, Path)):
            source = str(model)
            gguf_path = Path(source) / gguf_file if gguf_file else Path(source) if source.endswith(".gguf") else None
            if gguf_path is not None:  # converted once to a plain directory (agents.gguf)
                source = str(gguf_model_dir(gguf_path))
                name = name or gguf_path.stem
            if not Path(source).exists():  # a hub id: fail in a second when the hub is unreachable
                from agents.hub import require_hub

                require_hub(f"HFAgent({source!r})", "pass a local model directory written by save_pretrained "
                            "or a GGUF file (e.g. 'hf:/path/to/model' or 'hf:/path/to/model.gguf')")
            try:
                loaded = AutoModelForCausalLM.from_pretrained(
                    source, dtype=dtype or torch.float32, trust_remote_code=trust_remote_code
                )
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
            except OSError as e:
                raise OSError(
                    f"HFAgent could not load {source!r}: not a local model directory and not reachable on the hub "
                    f"({e.__class__.__name__}). Pass a directory written by save_pretrained, or a hub id with network access."
                ) from e
            except SafetensorError as e:  # its message names no file
                raise OSError(f"HFAgent could not load {source!r}: {unreadable_safetensors(Path(source), e)}") from e
            except ValueError as e:  # transformers' word for a directory that holds no model it knows
                raise ConfigError(f"HFAgent could not load {source!r}: {e}") from e
            model = loaded
            default_name = Path(source).name or source
        else:
            if tokenizer is None:
                raise ConfigError("HFAgent(model=<loaded model>) also needs tokenizer=")
            default_name = getattr(model.config, "name_or_path", None) or type(model).__name__
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.to(device=device, dtype=dtype) if dtype is not None else model.to(device)
        self.model.eval()
        #: activation modules swapped for fused ones (:func:`fuse_gelu_activations`); the fingerprint names them
        self.fused_activations = fuse_gelu_activations(self.model) if fuse_gelu else 0
        self.tokenizer = tokenizer
        self.name = name or default_name
        self.device = torch.device(device)
        self.batch_size = batch_size
        chosen_for_you = num_threads is None and self.device.type == "cpu"
        if chosen_for_you:
            n_params = sum(p.numel() for p in self.model.parameters())
            num_threads = 1 if n_params < SMALL_MODEL_PARAMETERS else None
        #: torch CPU threads while decoding (None: torch's setting). Small models decode faster on
        #: one thread: a step's few rows are too little work for intra-op parallelism, which costs
        #: more than it saves (14x slower on 2 busy cores).
        self.num_threads = num_threads
        #: threads for the forward over a batch of prompts: torch's setting when the thread count was
        #: chosen automatically (one large matrix product per layer, where threads pay: the runner
        #: benchmark's prefill ran 1.9x faster on 2 threads), else ``num_threads``
        self.prefill_threads = None if chosen_for_you else num_threads
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = self._eos_ids()
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params
        #: decode through :func:`agents.kv_cache.growing_cache` (False: transformers' dynamic cache,
        #: kept for side-by-side benchmarks and equivalence tests)
        self.growing_cache = True
        config = self.model.config
        #: the most positions the model can attend over (prompt + answer); None when unknown
        self.context_length: int | None = getattr(config, "n_positions", None) or getattr(
            config, "max_position_embeddings", None
        )

    @classmethod
    def from_spec(cls, target: str) -> HFAgent:
        """Build from ``hf:<path or hub id>[?dtype=bfloat16&device=cuda&batch_size=128&name=x]``,
        ``hf:<path/to/file.gguf>`` or ``hf:<dir>?gguf_file=<name.gguf>``."""
        source, options = split_options(target, cls.SPEC_OPTIONS, "hf")
        return cls(source, **options)

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[Request]) -> list[Generation]:
        prefill_threads = self.prefill_threads or torch.get_num_threads()
        with cpu_threads(self.num_threads):
            return self._generate_batches(requests, prefill_threads)

    def _generate_batches(self, requests: list[Request], prefill_threads: int) -> list[Generation]:
        prompt_ids = [self.encode_prompt(r.messages) for r in requests]
        self.check_prompts_fit(requests, prompt_ids, context="the model's context",
                               fix="shorten the prompt (fewer rounds or peers)")
        # Length buckets: sorted by prompt length, so each batch pads little.
        order = sorted(range(len(requests)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(requests)
        rows = self.batch_size
        start = 0
        while start < len(order):
            chunk = order[start : start + rows]
            t0 = time.perf_counter()
            try:
                outs = self._decode(
                    [prompt_ids[i] for i in chunk], [requests[i].sampling for i in chunk], prefill_threads
                )
            except Exception as error:
                if not is_out_of_memory(error):
                    raise
                if len(chunk) == 1:
                    i = chunk[0]
                    raise ModelError(
                        f"HFAgent {self.name!r} ran out of memory on a single request ({len(prompt_ids[i])} prompt "
                        f"tokens, max_new_tokens={requests[i].sampling.max_new_tokens}); lower max_new_tokens, "
                        "use a smaller dtype (dtype='bfloat16') or a device with more memory"
                    ) from error
                oom = True
            else:
                oom = False
            if oom:  # outside the except block, so the failed batch's tensors can be freed
                self._release_memory()
                rows = max(1, len(chunk) // 2)
                warnings.warn(
                    f"HFAgent {self.name!r}: a batch of {len(chunk)} ran out of memory; retrying in batches of {rows}",
                    RuntimeWarning,
                    stacklevel=3,
                )
                continue
            per_request = (time.perf_counter() - t0) / len(chunk)
            for i, (tokens, logprobs, reason) in zip(chunk, outs):
                results[i] = self.generation(prompt_ids[i], tokens, logprobs, reason, per_request)
            start += len(chunk)
        return results  # type: ignore[return-value]

    def _release_memory(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()
    def _decode(
        self, prompts: list[list[int]], params: list[SamplingParams], prefill_threads: int | None = None
    ) -> list[tuple[list[int], list[float], str]]:
        """Decode one batch (:func:`decode_batch`): a forward over the left-padded prompts (on
        ``prefill_threads`` when the batch is large), then one token per step through the KV cache, written in
        place when :attr:`growing_cache` is set."""
        limits = answer_limits(params, [len(p) for p in prompts], self.context_length)
        rows = CachedRows(self, prompts)
        if self.growing_cache:  # written in place, not re-concatenated every step (agents.kv_cache)
            rows.grow_to(rows.width + max(limits))
        threads = prefill_threads if len(prompts) * rows.width >= PARALLEL_PREFILL_TOKENS else None
        return decode_batch(self, rows, rows.prefill(threads), params, limits)

    # ------------------------------------------------------------------ identity
    def _eos_ids(self) -> set[int]:
        return token_id_set(self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None))

    @property
    def fingerprint(self) -> str:
        """Changes when the answers may change: a checksum of every byte of every parameter and buffer
        (not a sample: any weight may change the outputs; with peft, the active adapter's name too),
        and :meth:`~agents.base.TokenizerPrompts.prompt_identity` (chat template, eos ids, default
        stops). Recomputed on every call (a memo keyed by torch's version counters would miss writes
        through ``.data``): about 0.3 s for the 135M-parameter SmolLM2 and 1 s for gemma-3-270m (fp32)
        on one idle core, under 1 ms for a zoo model."""
        h = hashlib.blake2b(digest_size=12)
        h.update(self.name.encode())
        h.update(self.prompt_identity().encode())
        h.update(repr(self._adapter_identity()).encode())
        if self.fused_activations:  # the same weights compute (very slightly) different numbers
            h.update(f"fused_gelu:{self.fused_activations}".encode())
        with torch.no_grad():
            for name, t in self._identity_tensors():
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                data = t.detach().to("cpu").contiguous().reshape(-1)
                if data.numel():
                    h.update(data.view(torch.uint8).numpy().data)
        return f"hf:{self.name}:{h.hexdigest()}"

    def _adapter_identity(self) -> Any:
        """The peft adapter(s) that answer (name and settings), or None for a plain model."""
        config = getattr(self.model, "peft_config", None)
        if not config:
            return None
        active = getattr(self.model, "active_adapter", None)
        return [active, {k: peft_settings(v) for k, v in sorted(config.items())}]

    def _identity_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors the fingerprint hashes: every parameter and buffer."""
        return iter(self.model.state_dict().items())


def peft_settings(config: Any) -> str:
    """A peft adapter config as canonical JSON: the same in every process (its sets sorted; a set's repr
    follows the process's string hashing)."""
    data = config.to_dict() if hasattr(config, "to_dict") else vars(config)
    return json.dumps(data, sort_keys=True,
                      default=lambda o: sorted(map(str, o)) if isinstance(o, (set, frozenset)) else str(o))


@contextlib.contextmanager
def active_adapter(model: Any, adapter: str) -> Iterator[None]:
    """Run with the peft adapter ``adapter`` of ``model`` active (and trainable), then restore the one before.

    peft's ``set_adapter`` also marks the active adapter's weights trainable and every other adapter's
    frozen, so a forward inside computes gradients for ``adapter`` only."""
    before = model.active_adapter
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(before)


class LoraAdapterAgent(HFAgent):
    """One named LoRA adapter of a peft model that holds several on one base, as an agent: it shares the
    base model (and every setting) of ``base`` and generates with its own adapter active.

    Several learners trained as adapters of one base (``CRLConfig(lora_shared_base=True)``) play through
    one of these each. The runner calls each agent's ``generate`` on its own requests, so a batch never
    mixes adapters; the adapter is switched per call.

    Args:
        base: an :class:`HFAgent` whose ``model`` is a ``peft.PeftModel`` holding ``adapter``.
        adapter: the adapter's name.
        name: display name (default ``<base name>+<adapter>``).

    Raises:
        ValueError: ``base.model`` holds no adapter named ``adapter``.
    """

    def __init__(self, base: HFAgent, adapter: str, *, name: str | None = None):
        if adapter not in getattr(base.model, "peft_config", {}):
            raise ConfigError(f"{base.name!r} holds no LoRA adapter {adapter!r}; its adapters are "
                             f"{sorted(getattr(base.model, 'peft_config', {}))}")
        self.__dict__.update(base.__dict__)  # the same model, tokenizer and decoding settings
        self.adapter = adapter
        self.name = name or f"{base.name}+{adapter}"

    def _generate(self, requests: list[Request]) -> list[Generation]:
        with active_adapter(self.model, self.adapter):
            return super()._generate(requests)

    def _adapter_identity(self) -> Any:
        """This learner's adapter alone: its name and settings (the other adapters on the base never answer)."""
        return [self.adapter, peft_settings(self.model.peft_config[self.adapter])]

    def _identity_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The base model's tensors and this adapter's, not the other learners' adapters: two learners
        copied from one base differ by their adapters' weights (and names), as their answers do."""
        others = [re.compile(rf"\.lora_\w+\.{re.escape(a)}(\.|$)") for a in self.model.peft_config if a != self.adapter]
        return ((n, t) for n, t in self.model.state_dict().items() if not any(o.search(n) for o in others))

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """This adapter's own parameters (by their names in the shared model)."""
        marker = re.compile(rf"\.lora_\w+\.{re.escape(self.adapter)}\.")
        return {n: p for n, p in self.model.named_parameters() if marker.search(n)}

    def save_adapter(self, directory: str | Path) -> Path:
        """Write this adapter alone with ``save_pretrained`` (``adapter_config.json`` and its weights) into
        ``directory``, the layout vLLM's ``LoRARequest`` and ``PeftModel.from_pretrained`` read."""
        directory = Path(directory)
        with tempfile.TemporaryDirectory(dir=directory.parent if directory.parent.exists() else None) as tmp:
            self.model.save_pretrained(tmp, selected_adapters=[self.adapter])  # peft writes tmp/<adapter>/
            written = Path(tmp) / self.adapter
            directory.mkdir(parents=True, exist_ok=True)
            for f in written.iterdir():
                shutil.move(str(f), directory / f.name)
        return directory
