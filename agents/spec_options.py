"""Options on agent spec strings: ``"<target>?key=value&key=value"``.

Spec strings name a model (``hf:gpt2``, ``vllm:Qwen/Qwen2.5-0.5B-Instruct``); options after a ``?``
set keyword arguments of the backend's constructor, e.g. ``hf:gpt2?dtype=bfloat16&device=cuda`` or
``vllm:/models/a?gpu_memory_utilization=0.3``. Values are parsed as bool, int, float or string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crl_kit.errors import ConfigError


def _parse_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def split_options(target: str, allowed: Mapping[str, type | tuple[type, ...]], backend: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name?k=v&k2=v2"`` into ``("name", {"k": v, "k2": v2})``, checking keys and types.

    Raises:
        ValueError: an option is not in ``allowed``, has no ``=``, or has a value of the wrong type.
    """
    if "?" not in target:
        return target, {}
    name, query = target.rsplit("?", 1)
    options: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        if "=" not in part:
            raise ConfigError(f"{backend} spec option {part!r} in {target!r} has no value: write key=value")
        key, raw = part.split("=", 1)
        if key not in allowed:
            raise ConfigError(
                f"unknown {backend} spec option {key!r} in {target!r}; known options: {sorted(allowed)}"
            )
        value = _parse_value(raw)
        expected = allowed[key]
        if isinstance(value, int) and not isinstance(value, bool) and float in _as_tuple(expected):
            value = float(value)
        if value is not None and not isinstance(value, expected) and str in _as_tuple(expected):
            value = raw
        if value is not None and not isinstance(value, expected):
            names = "/".join(t.__name__ for t in _as_tuple(expected))
            raise ConfigError(f"{backend} spec option {key}={raw!r} in {target!r}: expected {names}")
        options[key] = value
    return name, options


def _as_tuple(t: type | tuple[type, ...]) -> tuple[type, ...]:
    return t if isinstance(t, tuple) else (t,)
