"""Checks for keyword options (protocol, task and runner options): one-line errors naming the fix.

An option's value is checked with :mod:`crl_kit.validation` (``check_int``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from crl_kit.validation import did_you_mean


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
        parts.append(f"{name!r}{did_you_mean(name, valid)}")
    noun = "option" if len(unknown) == 1 else "options"
    return f"{what}: unknown {noun} {', '.join(parts)}; valid options: {', '.join(valid) or '(none)'}"


__all__ = ["keyword_options", "accepts_any_keyword", "unknown_option_message"]
