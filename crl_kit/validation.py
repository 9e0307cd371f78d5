"""The checks every layer shares: an integer option, the "did you mean" hint for a mistyped name, and the
check of numbers read back from a file (:func:`finite_number`, :func:`numbers_problem`).

One place for each rule, so an option is refused in the same words by a protocol, a task, the runner,
the valuation, a trainer's config and a study config. Imports nothing of the project but
:mod:`crl_kit.errors`, so every layer (``agents`` included) may import it.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
from collections.abc import Iterable
from typing import Any

from crl_kit.errors import ConfigError, ConfigTypeError


def close_match(word: Any, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` (``difflib``'s cutoff 0.6), or ``None``.

    Example:
        >>> close_match("zooo", ["zoo", "pretrained"]), close_match("x", ["zoo"])
        ('zoo', None)
    """
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return close[0] if close else None


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """``" (did you mean 'zoo'?)"`` for a near miss, else ``""``: appended to an "unknown ..." message.

    Example:
        >>> "unknown pool 'zooo'" + did_you_mean("zooo", ["zoo", "pretrained"])
        "unknown pool 'zooo' (did you mean 'zoo'?)"
    """
    close = close_match(word, choices)
    return f" (did you mean {close!r}?)" if close is not None else ""


def is_int(value: Any) -> bool:
    """An integral number (``numpy`` integers too), not a bool and not a string."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def int_problem(value: Any, *, minimum: int | None = None, why: str = "", name: str = "") -> str | None:
    """What is wrong with ``value`` as an int ``>= minimum``, worded after the option's name, or ``None``:
    ``"must be an int >= 1 (why), got '5' (str) (write n=5 without quotes)"``. For callers that wrap the
    words in their own error (a study config names its key); :func:`check_int` raises them."""
    bound = f" >= {minimum}" if minimum is not None else ""
    note = f" ({why})" if why else ""
    if not is_int(value):
        hint = ""
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            short = re.split(r"[ .]", name)[-1] if name else ""
            hint = f" (write {short}={value.strip()} without quotes)" if short else f" (write {value.strip()} without quotes)"
        return f"must be an int{bound}{note}, got {value!r} ({type(value).__name__}){hint}"
    if minimum is not None and value < minimum:
        return f"must be an int{bound}{note}, got {value!r}"
    return None


def check_int(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False,
              why: str = "") -> int | None:
    """``value`` as an ``int``, else one line naming ``name``, what was passed and what to pass.

    Raises:
        ConfigTypeError: ``value`` is not an integral number (a bool, a str, a float); a ``TypeError``.
        ConfigError: ``value`` is below ``minimum``; a ``ValueError``.

    Example:
        >>> check_int("rounds", 3, minimum=1)
        3
        >>> check_int("rounds", "3", minimum=1)
        Traceback (most recent call last):
        ...
        crl_kit.errors.ConfigTypeError: rounds must be an int >= 1, got '3' (str) (write rounds=3 without quotes)
    """
    if value is None and allow_none:
        return None
    problem = int_problem(value, minimum=minimum, why=why, name=name)
    if problem is not None:
        raise (ConfigError if is_int(value) else ConfigTypeError)(f"{name} {problem}")
    return int(value)


def finite_number(value: Any) -> float | None:
    """``value`` as a finite ``float`` when it is a real number a float holds (an int or a float, not a bool),
    else ``None``: a string, a bool, NaN, an infinity, or an int too large for a float (a 400-digit JSON
    integer, which ``float()`` and ``math.isfinite`` answer with ``OverflowError``).

    Example:
        >>> finite_number(3), finite_number(0.5), finite_number(10 ** 400), finite_number(float("nan")), finite_number("1")
        (3.0, 0.5, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        x = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return x if math.isfinite(x) else None


def numbers_problem(name: str, values: Any, shape: tuple[int, ...], *, low: float | None = None,
                    high: float | None = None) -> str | None:
    """What is wrong with ``values`` (read back from a file) as nested lists of ``shape`` finite numbers in
    ``[low, high]`` (``None``: nothing), worded after ``name``: the one check of every table a cache entry or a
    result file holds, so that a value planted there is refused in one line instead of raising on use.

    Example:
        >>> numbers_problem("scores", [[0.5, 1]], (1, 2), low=0, high=1) is None
        True
        >>> numbers_problem("scores", [[0.5, "x"]], (1, 2))
        "scores holds 'x', not a finite number"
        >>> numbers_problem("scores", [0.5, 7.0], (2,), low=0, high=1)
        'scores holds 7.0, outside [0, 1]'
    """
    def walk(v: Any, depth: int) -> str | None:
        if depth == len(shape):
            x = finite_number(v)
            if x is None:
                text = repr(v)
                return f"{name} holds {text if len(text) <= 24 else text[:20] + '...'}, not a finite number"
            if (low is not None and x < low) or (high is not None and x > high):
                return f"{name} holds {x!r}, outside [{low:g}, {high:g}]" if low is not None and high is not None \
                    else f"{name} holds {x!r}, {'below ' + format(low, 'g') if low is not None else 'above ' + format(high, 'g')}"
            return None
        if not isinstance(v, list) or len(v) != shape[depth]:
            return f"{name} is not {' x '.join(map(str, shape))} numbers"
        return next((p for p in (walk(x, depth + 1) for x in v) if p), None)

    return walk(values, 0)


__all__ = ["close_match", "did_you_mean", "is_int", "int_problem", "check_int", "finite_number", "numbers_problem"]
