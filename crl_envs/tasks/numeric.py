"""Numeric answers: extraction from free text as real models write it, and comparison."""

from __future__ import annotations

import math
import re

from crl_envs.tasks.base import Example, Task

_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_HASHES_RE = re.compile(r"####\s*(" + _NUMBER + ")")


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, with nested braces."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def normalize_number(raw: str) -> str | None:
    """``"$1,234.50"`` -> ``"1234.5"``; ``"72.0"`` -> ``"72"``; not a number -> ``None``."""
    s = raw.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if s.startswith("+"):
        s = s[1:]
    try:
        value = float(s)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


def extract_number(text: str) -> str | None:
    """The final numeric answer in ``text``.

    Looks, in order, at the last ``\\boxed{}``, the last "the answer is N", GSM8K's ``#### N``, and
    finally the last number in the text.

    Example:
        >>> extract_number("so 3 + 4 = 7. The answer is $1,200.")
        '1200'
        >>> extract_number(r"\\boxed{42}") , extract_number("no digits") is None
        ('42', True)
    """
    if not isinstance(text, str):
        return None
    for content in reversed(boxed_contents(text)):
        nums = _NUMBER_RE.findall(content)
        if nums:
            return normalize_number(nums[-1])
    for pattern in (_ANSWER_IS_RE, _HASHES_RE):
        found = pattern.findall(text)
        if found:
            value = normalize_number(found[-1])
            if value is not None:
                return value
    return last_number(text)


def last_number(text: str) -> str | None:
    """The last number in ``text``, normalised (the fallback of every numeric extractor)."""
    for raw in reversed(_NUMBER_RE.findall(text)):
        value = normalize_number(raw)
        if value is not None:
            return value
    return None


def numbers_equal(a: str | None, b: str | None, rel_tol: float = 1e-6) -> bool:
    if a is None or b is None:
        return False
    try:
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-9)
    except ValueError:
        return a.strip() == b.strip()


class NumericTask(Task):
    """A task whose answers are numbers."""

    instruction = "Solve the problem. End your response with 'The answer is N.' where N is a number."

    def extract(self, text: str) -> str | None:
        return extract_number(text)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return numbers_equal(answer, example.answer)
