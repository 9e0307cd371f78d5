"""Is the Hugging Face hub reachable? One quick check, so a download fails in a second with the fix
named, instead of retrying for tens of seconds (``huggingface_hub``/``datasets`` retry a refused
connection before giving up).

Used before every hub download: model loading (``HFAgent``) and task data (``crl_envs.tasks``).
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

from crl_kit.errors import CrlEnvsError

#: Seconds the reachability check waits for a TCP connection to the hub (or the proxy).
CHECK_TIMEOUT = 3.0


class HubUnavailableError(CrlEnvsError, ConnectionError):
    """The hub is needed but unreachable or switched off (``HF_HUB_OFFLINE``); the message names the fix."""


def hub_offline() -> bool:
    """Whether downloads are switched off (``HF_HUB_OFFLINE``, read as ``huggingface_hub`` does)."""
    try:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    except ImportError:  # pragma: no cover
        pass
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def endpoint() -> str:
    """The hub endpoint (``HF_ENDPOINT``, default ``https://huggingface.co``)."""
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


@functools.lru_cache(maxsize=8)
def _unreachable(url: str, timeout: float) -> str | None:
    """Why ``url`` cannot be reached over TCP (``None`` if it can). Through ``HTTPS_PROXY`` when set."""
    target = urlparse(url)
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") if target.scheme == "https" else (
        os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy"))
    via = urlparse(proxy if "://" in (proxy or "") else f"http://{proxy}") if proxy else target
    host = via.hostname or ""
    port = via.port or (443 if via.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port} is unreachable ({type(e).__name__}: {e})"


def unavailable_reason(timeout: float = CHECK_TIMEOUT) -> str | None:
    """Why the hub cannot be used now, or ``None`` when it can (the network check is cached per process)."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    return _unreachable(endpoint(), timeout)


def require_hub(what: str, fix: str, *, timeout: float = CHECK_TIMEOUT) -> None:
    """Raise :class:`HubUnavailableError` (``"<what> needs the Hugging Face hub, but <reason>; <fix>"``)
    when the hub is unreachable. With ``HF_HUB_OFFLINE`` set it returns: the caller then reads the
    local cache and reports a miss with :func:`offline_miss`."""
    if hub_offline():
        return
    reason = _unreachable(endpoint(), timeout)
    if reason is not None:
        raise HubUnavailableError(f"{what} needs the Hugging Face hub, but {reason}; {fix}, "
                                  "or set HF_HUB_OFFLINE=1 to use a copy already in the local cache")


def offline_miss(what: str, fix: str, error: BaseException | None = None) -> HubUnavailableError:
    """The error for a cache miss with ``HF_HUB_OFFLINE`` set (``error``: what the library raised, if any)."""
    raised = f" ({type(error).__name__})" if error is not None else ""
    return HubUnavailableError(f"{what} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set{raised}; {fix}")


def require_model(what: str, repo_id: str, fix: str, *, timeout: float = CHECK_TIMEOUT) -> None:
    """Raise :class:`HubUnavailableError` at once when the hub model ``repo_id`` cannot be had: the hub is
    unreachable (:func:`require_hub`), or ``HF_HUB_OFFLINE`` is set and its ``config.json`` is not in the
    local cache. For engines (vLLM) that would otherwise retry for tens of seconds and then print the
    hub's own message."""
    require_hub(what, fix, timeout=timeout)
    if not hub_offline():
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: not in the cache either
        cached = None
    if not isinstance(cached, str):
        raise offline_miss(what, fix)


__all__ = ["HubUnavailableError", "hub_offline", "endpoint", "unavailable_reason", "require_hub", "offline_miss",
           "require_model", "CHECK_TIMEOUT"]
