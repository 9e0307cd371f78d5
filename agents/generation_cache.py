"""An optional on-disk cache of ``openai:`` agents' generations, for paid APIs: a rerun (or another
valuation, study cell or process) that sends a request already answered reads the answer instead of
paying for it again.

Off by default. Turn it on with the environment variable ``CRL_ENVS_GENERATION_CACHE=<directory>`` or
:func:`enable`; see what it holds with ``python -m agents.generation_cache size`` and empty it with
``python -m agents.generation_cache clear`` (or :func:`size`, :func:`clear`).

A request's key is a digest of the agent's fingerprint (server and model) and the exact request body
the agent would send (:meth:`agents.openai.OpenAIAgent.payload`: messages, every sampling field, seed
and stops included, and the agent's extra fields): everything that can change the answer. Only
requests with a seed or greedy ones are cached; an unseeded sampled request asks for a fresh sample
every time. Each entry is one JSON file written atomically; on read its stored key and request body
must equal the request's and every field of the generation must have its type, else it is ignored
(and overwritten by the fresh answer). Keys are public, so only a directory that nobody else can write
is used (owned by you, not group- or world-writable: else one line refuses it), and only regular files
you own are read (:mod:`crl_kit.safe_io`: a FIFO or a symlink at an entry's path is refused, never
waited on). Entries are ``0644 & ~umask`` like the coalition cache's (see :mod:`crl_kit.safe_io`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents.base import Agent, Generation, Request
from crl_kit.errors import ConfigError
from crl_kit.safe_io import atomic_write_json, read_json, trusted_directory

ENV = "CRL_ENVS_GENERATION_CACHE"
VERSION = 1
_enabled: Path | None = None


def enable(directory: str | os.PathLike | None) -> None:
    """Cache ``openai:`` generations in ``directory`` from now on in this process (None: back to
    ``$CRL_ENVS_GENERATION_CACHE``, unset meaning off)."""
    global _enabled
    _enabled = None if directory is None else Path(directory)


def directory() -> Path | None:
    """Where generations are cached now, or None when the cache is off (the default)."""
    if _enabled is not None:
        return _enabled
    value = os.environ.get(ENV, "").strip()
    return Path(value).expanduser() if value else None


def cacheable(request: Request) -> bool:
    """Whether a request has one answer to keep: greedy, or sampled with a seed."""
    return request.sampling.temperature == 0 or request.sampling.seed is not None


def request_key(fingerprint: str, body: dict[str, Any]) -> str:
    """The cache key of a request body sent by the agent with ``fingerprint``."""
    text = json.dumps([VERSION, fingerprint, body], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def cached_generate(agent: Agent, requests: list[Request], generate: Callable[[list[Request]], list[Generation]],
                    body: Callable[[Request], dict[str, Any]]) -> list[Generation]:
    """``generate(requests)`` through the cache when it is on: cached answers are read, the others
    generated in one call and stored. ``body(request)`` is the request as the agent sends it."""
    root = directory()
    if root is None:
        return generate(requests)
    fingerprint = agent.fingerprint
    out: list[Generation | None] = [None] * len(requests)
    todo: list[int] = []
    keys: list[tuple[str, dict[str, Any]] | None] = [None] * len(requests)
    for k, request in enumerate(requests):
        if not cacheable(request):
            todo.append(k)
            continue
        sent = json.loads(json.dumps(body(request), default=repr))
        keys[k] = (request_key(fingerprint, sent), sent)
        out[k] = _read(root, keys[k][0], sent)
        if out[k] is None:
            todo.append(k)
    if todo:
        fresh = generate([requests[k] for k in todo])
        for k, gen in zip(todo, fresh):
            out[k] = gen
            if keys[k] is not None:
                _write(root, keys[k][0], keys[k][1], fingerprint, gen)  # type: ignore[index]
    return out  # type: ignore[return-value]


def _path(root: Path, key: str) -> Path:
    return root / key[:2] / f"{key}.json"


_KEY = re.compile(r"[0-9a-f]{40}\.json")
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,), "token_ids": (list, type(None)), "logprobs": (list, type(None)), "finish_reason": (str,),
    "prompt_tokens": (int,), "completion_tokens": (int,), "prompt_token_ids": (list, type(None)),
    "seconds": (int, float),
}


def _check_directory(root: Path, sub: Path) -> None:
    """Refuse (one line) a cache directory someone else could write: its entries would be served."""
    for d in (root, sub):
        why = trusted_directory(d)
        if why:
            raise ConfigError(f"generation cache {d} {why}: its entries could be planted; use a directory "
                              f"of your own (mode 700 or 755) for ${ENV}")


def _generation(record: Any, key: str, body: dict[str, Any]) -> Generation | None:
    """The generation a cache record holds, when it is this request's and every field has its type."""
    if not isinstance(record, dict) or record.get("key") != key or record.get("body") != body \
            or record.get("version") != VERSION or not isinstance(record.get("generation"), dict):
        return None
    fields = record["generation"]
    if set(fields) != set(_FIELD_TYPES) or any(
            not isinstance(fields[f], types) or isinstance(fields[f], bool) for f, types in _FIELD_TYPES.items()):
        return None
    for f, item in (("token_ids", int), ("prompt_token_ids", int), ("logprobs", (int, float))):
        if fields[f] is not None and not all(isinstance(x, item) and not isinstance(x, bool) for x in fields[f]):
            return None
    return Generation(**fields)


def _read(root: Path, key: str, body: dict[str, Any]) -> Generation | None:
    path = _path(root, key)
    _check_directory(root, path.parent)
    try:
        record = read_json(path, owner=os.getuid())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return _generation(record, key, body)


def _write(root: Path, key: str, body: dict[str, Any], fingerprint: str, gen: Generation) -> None:
    path = _path(root, key)
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.parent.mkdir(mode=0o755, exist_ok=True)  # never group-writable, whatever the umask
    _check_directory(root, path.parent)
    record = {"version": VERSION, "key": key, "fingerprint": fingerprint, "body": body, "generation": asdict(gen)}
    atomic_write_json(path, record)


def _entries(root: Path) -> list[Path]:
    """The cache's own entry files: ``<2 hex>/<40 hex>.json`` whose name starts with its directory's."""
    return [p for p in root.glob("*/*.json")
            if _KEY.fullmatch(p.name) and p.parent.name == p.name[:2] and p.is_file() and not p.is_symlink()]


def size(root: str | os.PathLike | None = None) -> tuple[int, int]:
    """``(entries, bytes)`` held by the cache at ``root`` (default: the current :func:`directory`)."""
    root = Path(root) if root is not None else directory()
    if root is None or not root.exists():
        return 0, 0
    files = _entries(root)
    return len(files), sum(p.stat().st_size for p in files)


def clear(root: str | os.PathLike | None = None) -> int:
    """Delete the cached generations at ``root`` (default: the current :func:`directory`); returns how
    many. Only the cache's own entries go (and their directories, once empty): anything else in
    ``root`` is left alone, so a mistyped ``--dir`` cannot delete someone's files."""
    root = Path(root) if root is not None else directory()
    if root is None or not root.exists():
        return 0
    entries = _entries(root)
    for p in entries:
        p.unlink()
    for sub in {p.parent for p in entries}:
        for tmp in sub.glob(".*.json.*.tmp"):  # a killed writer's leftovers
            tmp.unlink()
        try:
            sub.rmdir()
        except OSError:  # holds something that is not ours
            pass
    return len(entries)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agents.generation_cache [--dir DIR] size|clear``."""
    parser = argparse.ArgumentParser(prog="python -m agents.generation_cache",
                                     description="Size or clear the on-disk cache of openai: generations.")
    parser.add_argument("action", choices=["size", "clear"])
    parser.add_argument("--dir", help=f"the cache directory (default: ${ENV})")
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else directory()
    if root is None:
        parser.error(f"no cache directory: pass --dir DIR or set {ENV}")
    if args.action == "size":
        entries, nbytes = size(root)
        print(f"{root}: {entries} generations, {nbytes / 1e6:.2f} MB")
    else:
        print(f"{root}: cleared {clear(root)} generations")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
