"""``theoremqa``: theorem-driven STEM questions (Chen et al. 2023), typed answers.

Answer types: ``integer``, ``float`` (both compared within 4% of the reference, as TheoremQA's own
grader does), ``bool``, ``option`` (``(a)``..``(d)``), ``list of integer`` / ``list of float``
(element-wise).
"""

from __future__ import annotations

import ast
import math
import os
import re

from crl_envs.tasks.base import Example, Task
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_envs.tasks.math import (
    _parse,
    _plain_number,
    _split_tuple,
    _warm_up,
    call_with_timeout,
    extract_math_answer,
    normalize_math_answer,
)
from crl_kit.errors import ConfigError

TOLERANCE = 0.04
ANSWER_TYPES = ("integer", "float", "bool", "option", "list of integer", "list of float")
_SCI_RE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:\\times|\*|x|×)\s*10\s*\^\s*\{?\s*(-?\d+)\s*\}?")
_NUM_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _math_verify_value(text: str) -> float | None:
    """The real value math-verify reads in ``text`` (``None`` if it has free symbols or none)."""
    try:
        parsed = _parse(text)
        value = parsed[0] if parsed else None
        if getattr(value, "is_number", False):
            return float(value.evalf())
    except Exception:  # unparsable or not real: no value
        return None
    return None


def parse_number(text: str) -> float | None:
    """A number written as models write it: ``3.2``, ``1/3``, ``\\frac{1}{3}``, ``2.5 \\times 10^{-3}``,
    ``\\sqrt{2}``, ``45%`` (as 45); the last plain number in the text as a fallback."""
    s = normalize_math_answer(text)
    value = _plain_number(s)
    if value is not None:
        return value
    sci = _SCI_RE.fullmatch(s.replace(" ", "")) or _SCI_RE.fullmatch(s)
    if sci:
        return float(sci.group(1)) * 10 ** int(sci.group(2))
    _warm_up()
    value = call_with_timeout(_math_verify_value, (s,), 2.0)
    if value is not None and math.isfinite(value):
        return value
    found = _NUM_RE.findall(s.replace(",", ""))
    return float(found[-1]) if found else None


def _close(prediction: float | None, reference: float) -> bool:
    return prediction is not None and abs(prediction - reference) <= TOLERANCE * abs(reference) + 1e-12


def _parse_list(text: str) -> list[str] | None:
    s = normalize_math_answer(text)
    parts = _split_tuple(s)
    if parts is not None:
        return parts[1]
    if "," in s:
        return [p.strip() for p in s.split(",")]
    return None


def theoremqa_equal(prediction: str | None, reference: str, answer_type: str) -> bool:
    """Whether an extracted answer matches a TheoremQA reference of the given type."""
    if prediction is None:
        return False
    if answer_type == "bool":
        words = re.findall(r"\b(true|false|yes|no|correct|incorrect)\b", prediction.lower())
        if not words:
            return False
        truth = words[-1] in ("true", "yes", "correct")
        return truth == (str(reference).strip().lower() in ("true", "yes", "1"))
    if answer_type == "option":
        m = re.search(r"\(?\b([a-eA-E])\b\)?", re.sub(r"\\text\{([^{}]*)\}", r"\1", prediction))
        want = re.search(r"([a-eA-E])", str(reference))
        return bool(m and want) and m.group(1).lower() == want.group(1).lower()
    if answer_type.startswith("list"):
        try:
            reference_values = [float(v) for v in ast.literal_eval(str(reference))]
        except (ValueError, SyntaxError, TypeError):
            raise ConfigError(f"theoremqa: list reference {reference!r} is not a list of numbers") from None
        items = _parse_list(prediction)
        if items is None or len(items) != len(reference_values):
            return False
        return all(_close(parse_number(p), r) for p, r in zip(items, reference_values))
    try:
        reference_value = float(reference)
    except ValueError:
        return normalize_math_answer(prediction) == normalize_math_answer(str(reference))
    return _close(parse_number(prediction), reference_value)


class TheoremQATask(Task):
    """TheoremQA (``TIGER-Lab/TheoremQA``, split ``test``: ``Question``, ``Answer``, ``Answer_type``).

    ``example.answer`` is the reference as a string; ``metadata["answer_type"]`` its type. Some
    questions refer to a picture (``Picture``); text-only models see just the question.

    Args:
        split: ``"test"``.
        n, seed: seeded subsample.
        path: local file(s) with the hub's fields.
    """

    name = "theoremqa"
    instruction = ("Solve the problem step by step. End your response with 'The answer is X.' where X is a "
                   "number, a list of numbers like [1, 2], True/False, or an option like (a).")
    HUB_ID = "TIGER-Lab/TheoremQA"

    def __init__(self, *, split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None):
        self.split = check_split(self.name, split or "test", ("test",))
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        rows = load_rows(self.name, hub_id=self.HUB_ID, config=None, split=self.split, path=path,
                         required=("Question", "Answer", "Answer_type"))
        examples = []
        for i, row in enumerate(rows):
            answer_type = str(row["Answer_type"]).strip()
            if answer_type not in ANSWER_TYPES:
                raise ConfigError(f"theoremqa row {i}: unknown Answer_type {answer_type!r}; known: {ANSWER_TYPES}")
            examples.append(Example(
                id=str(row.get("id") or f"{self.split}-{i}"),
                question=str(row["Question"]).strip(),
                answer=str(row["Answer"]).strip(),
                metadata={"answer_type": answer_type, "has_picture": bool(row.get("Picture"))},
            ))
        super().__init__(subsample(examples, n, seed))

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_math_answer(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return theoremqa_equal(answer, example.answer, example.metadata["answer_type"])

    @property
    def fingerprint(self) -> str:
        return f"theoremqa:{self.source}:{self.split}"
