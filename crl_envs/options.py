"""Checks for keyword options (protocol, task and runner options): one-line errors naming the fix."""

from __future__ import annotations

import difflib
import inspect
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from crl_envs.errors import ConfigError, ConfigTypeError


def keyword_options(*callables: Callable[..., Any], skip: Iterable[str] = ("self", "pool", "task")) -> list[str]:
    """Named keyword parameters of ``callables`` (in order, without duplicates or ``*args``/``**kwargs``)."""
    out: list[str] = []
    skipped = set(skip)
    for fn in callables:
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in skipped or p.name in out:
                continue
            out.append(p.name)
    return out


def accepts_any_keyword(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes ``**kwargs`` (then its options cannot be checked by name)."""
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())


def unknown_option_message(what: str, unknown: Iterable[str], valid: Iterable[str],
                           hints: Mapping[str, str] | None = None) -> str:
    """``"<what>: unknown option 'round' (did you mean 'rounds'?); valid options: ..."``."""
    unknown, valid = sorted(unknown), list(valid)
    parts = []
    for name in unknown:
        if hints and name in hints:
            parts.append(f"{name!r} ({hints[name]})")
            continue
        close = difflib.get_close_matches(name, valid, n=1)
        parts.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    noun = "option" if len(unknown) == 1 else "options"
    return f"{what}: unknown {noun} {', '.join(parts)}; valid options: {', '.join(valid) or '(none)'}"


def check_int(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` (an integral number, not a bool or a string), else a ``TypeError``/``ValueError``
    naming ``name``, what was passed and what to pass."""
    if value is None and allow_none:
        return None
    bound = f" >= {minimum}" if minimum is not None else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = f" (write {name}={value.strip()} without quotes)" if isinstance(value, str) and value.strip().lstrip(
            "-").isdigit() else ""
        raise ConfigTypeError(f"{name} must be an int{bound}, got {value!r} ({type(value).__name__}){hint}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be an int{bound}, got {value!r}")
    return int(value)


__all__ = ["keyword_options", "accepts_any_keyword", "unknown_option_message", "check_int"]
