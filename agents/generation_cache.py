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
must equal the request's, else it is ignored (and overwritten by the fresh answer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents.base import Agent, Generation, Request

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


def _read(root: Path, key: str, body: dict[str, Any]) -> Generation | None:
    path = _path(root, key)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or record.get("body") != body \
            or record.get("version") != VERSION or not isinstance(record.get("generation"), dict):
        return None
    try:
        return Generation(**record["generation"])
    except TypeError:
        return None


def _write(root: Path, key: str, body: dict[str, Any], fingerprint: str, gen: Generation) -> None:
    path = _path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"version": VERSION, "key": key, "fingerprint": fingerprint, "body": body, "generation": asdict(gen)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def size(root: str | os.PathLike | None = None) -> tuple[int, int]:
    """``(entries, bytes)`` held by the cache at ``root`` (default: the current :func:`directory`)."""
    root = Path(root) if root is not None else directory()
    if root is None or not root.exists():
        return 0, 0
    files = [p for p in root.glob("*/*.json")]
    return len(files), sum(p.stat().st_size for p in files)


def clear(root: str | os.PathLike | None = None) -> int:
    """Delete every cached generation at ``root`` (default: the current :func:`directory`); returns how many."""
    root = Path(root) if root is not None else directory()
    if root is None or not root.exists():
        return 0
    entries, _ = size(root)
    for sub in root.iterdir():
        if sub.is_dir() and len(sub.name) == 2:
            shutil.rmtree(sub)
    return entries


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
