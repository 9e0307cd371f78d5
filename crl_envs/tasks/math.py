"""``math``: competition mathematics (Hendrycks et al. 2021, MATH / MATH-500), ``\\boxed{}`` answers.

Answers are compared by :func:`math_equal`: string normalisation first (LaTeX spacing, ``\\dfrac``,
units, ``\\%``, degrees, ``x = ``, thousands separators), then numbers (``0.5`` = ``1/2`` =
``\\frac{1}{2}``, relative tolerance 1e-4), then element-wise for tuples and intervals, and last
symbolic equivalence through sympy under a hard timeout.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

from crl_envs.tasks.base import Example, Task
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_envs.tasks.numeric import boxed_contents, last_number

REL_TOL = 1e-4
SYMPY_TIMEOUT = 2.0
_UNITS = (
    "cm|centimeters?|m|meters?|km|kilometers?|mm|inches|inch|in|feet|foot|ft|yards?|miles?|units?|"
    "square units|sq units|degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|weeks?|years?|"
    "mph|pounds?|lbs?|ounces?|oz|grams?|g|kg|liters?|L|ml|points?|people|students|ways"
)
_ANSWER_PATTERNS = [
    re.compile(r"final answer is\s*:?\s*(.+)", re.IGNORECASE),
    re.compile(r"the answer is\s*:?\s*(.+)", re.IGNORECASE),
    re.compile(r"^\s*\**(?:final )?answer\**\s*:\s*\**(.+)", re.IGNORECASE | re.MULTILINE),
]
_SYMPY_FUNCTIONS = {"sqrt", "pi", "oo", "log", "sin", "cos", "tan", "exp", "I", "E"}


def extract_math_answer(text: str) -> str | None:
    """The final answer in a response: the last ``\\boxed{}``, else "the answer is ...", else
    "Answer: ...", else the last number.

    Example:
        >>> extract_math_answer(r"so $x = \\boxed{\\frac{1}{2}}$.")
        '\\\\frac{1}{2}'
    """
    if not isinstance(text, str):
        return None
    boxes = boxed_contents(text)
    if boxes:
        return boxes[-1].strip()
    for pattern in _ANSWER_PATTERNS:
        found = pattern.findall(text)
        if found:
            answer = found[-1].strip().strip("*").strip()
            math_span = re.match(r"\$+([^$]+)\$", answer)
            if math_span:  # "The final answer is $\frac{3}{4}$. I hope it is correct."
                answer = math_span.group(1)
            else:
                answer = re.split(r"\.\s", answer)[0]
            answer = re.sub(r"\s*[.。]\s*$", "", answer).strip().strip("$").strip()
            if answer:
                return answer
    return last_number(text)


def normalize_math_answer(answer: str) -> str:
    """Canonical string form of a MATH answer (spacing-insensitive comparison is done on top of it).

    Example:
        >>> normalize_math_answer(r"$x = \\dfrac{1}{2}\\text{ cm}$")
        '\\\\frac{1}{2}'
    """
    s = str(answer).strip()
    s = re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", s).strip()
    s = s.strip("$").strip()
    for token in ("\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\quad", "\\qquad"):
        s = s.replace(token, "" if token[1].isalpha() or token == "\\!" else " ")
    s = s.replace("~", " ").replace("dfrac", "frac").replace("tfrac", "frac").replace("{,}", ",")
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("°", "").replace("\\circ", "")
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = re.sub(r"([\d}])\s*\\(?:text|mbox|mathrm)\{\s*[a-zA-Z][^{}]*\}\s*(\^\s*\{?\d\}?)?\s*$", r"\1", s)  # units
    s = re.sub(r"\\(?:text|textbf|textit|mbox|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"([\d}])\s+(?:" + _UNITS + r")(?:\^?\s*\{?[23]\}?)?\.?\s*$", r"\1", s)
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if re.fullmatch(r"\s*(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+)\s*", lhs):
            s = rhs
    s = s.strip().rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s.replace(" ", "")):
        s = s.replace(",", "").replace(" ", "")
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z])(?![a-zA-Z])", r"\\sqrt{\1}", s)
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)
    s = s.replace("\\{", "{").replace("\\}", "}")
    return re.sub(r"\s+", " ", s).strip()


def _compact(s: str) -> str:
    return s.replace(" ", "")


def _split_tuple(s: str) -> tuple[str, list[str], str] | None:
    """``"(1, [2,3])"`` -> ``("(", ["1", "[2,3]"], ")")``; ``None`` if ``s`` is not a bracketed list."""
    s = s.strip()
    if len(s) < 2 or s[0] not in "([{" or s[-1] not in ")]}":
        return None
    parts, depth, current = [], 0, ""
    for ch in s[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None  # "(1)+(2)" is not one bracketed list
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        return None
    parts.append(current)
    return s[0], [p.strip() for p in parts], s[-1]


def _plain_number(s: str) -> float | None:
    """Floats for ``"3"``, ``"-0.25"``, ``"1/2"``, ``"\\frac{3}{4}"``, ``"-\\frac{3}{4}"``; else ``None``."""
    c = _compact(s)
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", c) or re.fullmatch(
        r"(-?)\(?(-?\d+(?:\.\d+)?)\)?/\(?(-?\d+(?:\.\d+)?)\)?", c
    )
    try:
        if m:
            value = float(m.group(2)) / float(m.group(3))
            return -value if m.group(1) else value
        if re.fullmatch(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?", c):
            return float(c)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def _numbers_close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9)


def _brace_group(s: str, start: int) -> tuple[str, int]:
    """Content of the ``{...}`` group opening at ``s[start]`` and the index after it."""
    depth = 0
    for i in range(start, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return s[start + 1 : i], i + 1
    raise ValueError("unbalanced braces")


def latex_to_sympy_text(s: str) -> str | None:
    """A sympy-parsable string for a LaTeX-ish expression, or ``None`` if it has unknown commands."""
    out, i = "", 0
    while i < len(s):
        if s.startswith("\\frac", i):
            j = i + 5
            while j < len(s) and s[j] == " ":
                j += 1
            if j >= len(s) or s[j] != "{":
                return None
            try:
                num, j = _brace_group(s, j)
                while j < len(s) and s[j] == " ":
                    j += 1
                den, j = _brace_group(s, j)
            except ValueError:
                return None
            inner = [latex_to_sympy_text(num), latex_to_sympy_text(den)]
            if None in inner:
                return None
            out += f"(({inner[0]})/({inner[1]}))"
            i = j
        elif s.startswith("\\sqrt", i):
            j, index = i + 5, None
            if j < len(s) and s[j] == "[":
                k = s.find("]", j)
                if k < 0:
                    return None
                index, j = latex_to_sympy_text(s[j + 1 : k]), k + 1
            if j >= len(s) or s[j] != "{":
                return None
            try:
                body, j = _brace_group(s, j)
            except ValueError:
                return None
            body = latex_to_sympy_text(body)
            if body is None:
                return None
            out += f"(({body})**(1/({index})))" if index else f"sqrt({body})"
            i = j
        elif s[i] == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m:
                return None
            word = m.group(1)
            mapped = {"pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "div": "/", "ln": " log",
                      "log": " log", "sin": " sin", "cos": " cos", "tan": " tan", "exp": " exp"}.get(word)
            if mapped is None:
                return None
            out += mapped
            i += len(m.group(0))
        elif s[i] in "{}":
            out += "(" if s[i] == "{" else ")"
            i += 1
        else:
            out += s[i]
            i += 1
    out = out.replace("^", "**")
    names = set(re.findall(r"[A-Za-z_]+", out))
    if any(len(n) > 1 and n not in _SYMPY_FUNCTIONS for n in names) or "_" in out:
        return None
    if not re.fullmatch(r"[0-9A-Za-z\s\.\+\-\*/\(\)]*", out) or len(out) > 300:
        return None
    if re.search(r"\*\*\s*\(*\s*\d{4,}", out) or re.search(r"\*\*\s*\([^()]*\*\*", out):
        return None  # 9**99999 or 9**(9**9): big-integer powers run in C, beyond the reach of the timeout
    return out


def _sympy_equal(a: str, b: str) -> bool:
    import sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    ta, tb = latex_to_sympy_text(a), latex_to_sympy_text(b)
    if not ta or not tb:
        return False
    try:
        ea = parse_expr(ta, transformations=transformations, evaluate=True)
        eb = parse_expr(tb, transformations=transformations, evaluate=True)
        if sympy.simplify(ea - eb) == 0:
            return True
        if not ea.free_symbols and not eb.free_symbols:
            va, vb = complex(sympy.N(ea)), complex(sympy.N(eb))
            return _numbers_close(va.real, vb.real) and _numbers_close(va.imag, vb.imag)
    except Exception:  # sympy raises many kinds on odd input; unparsable means not shown equal
        return False
    return False


class _Timeout(Exception):
    pass


_POOL_LOCK = threading.Lock()
_POOL: Any = None


def call_with_timeout(fn: Callable[..., bool], args: tuple, timeout: float) -> bool | None:
    """``fn(*args)`` stopped after ``timeout`` seconds (``None`` then).

    In the main thread a ``SIGALRM`` timer interrupts it (restoring any timer already set, e.g.
    pytest-timeout's); in other threads it runs in a one-process pool that is terminated on timeout.
    """
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def on_alarm(signum, frame):
            raise _Timeout

        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        previous_delay, _ = signal.setitimer(signal.ITIMER_REAL, timeout)
        if previous_delay and previous_delay < timeout:
            signal.setitimer(signal.ITIMER_REAL, previous_delay)  # the outer deadline comes first
        started = _monotonic()
        try:
            return fn(*args)
        except _Timeout:
            return None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)
            if previous_delay:
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, previous_delay - (_monotonic() - started)))
    import multiprocessing

    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = multiprocessing.get_context("spawn").Pool(1)
        pool = _POOL
        try:
            return pool.apply_async(fn, args).get(timeout)
        except multiprocessing.TimeoutError:
            pool.terminate()
            _POOL = None
            return None


def _monotonic() -> float:
    import time

    return time.monotonic()


def math_equal(prediction: str | None, reference: str | None, *, timeout: float = SYMPY_TIMEOUT) -> bool:
    """Whether two MATH answers are equivalent.

    Example:
        >>> math_equal(r"\\frac{1}{2}", "0.5"), math_equal("1/2", r"\\dfrac12"), math_equal("0.4", "1/2")
        (True, True, False)
    """
    if prediction is None or reference is None:
        return False
    a, b = normalize_math_answer(prediction), normalize_math_answer(reference)
    if not a or not b:
        return False
    if _compact(a) == _compact(b):
        return True
    ta, tb = _split_tuple(a), _split_tuple(b)
    if ta is not None and tb is not None and (len(ta[1]) > 1 or len(tb[1]) > 1):
        return (
            len(ta[1]) == len(tb[1])
            and (ta[0], ta[2]) == (tb[0], tb[2])
            and all(math_equal(x, y, timeout=timeout) for x, y in zip(ta[1], tb[1]))
        )
    fa, fb = _plain_number(a), _plain_number(b)
    if fa is not None and fb is not None:
        return _numbers_close(fa, fb)
    return bool(call_with_timeout(_sympy_equal, (a, b), timeout))


class MathTask(Task):
    """MATH. ``example.answer`` is the reference answer (the last ``\\boxed{}`` of the solution).

    Args:
        subset: ``"math500"`` (default; ``HuggingFaceH4/MATH-500``: ``problem``, ``answer``, ``solution``,
            ``subject``, ``level``, ``unique_id``) or ``"full"`` (``EleutherAI/hendrycks_math``, its seven
            subject configs: ``problem``, ``solution``, ``level``, ``type``).
        split: ``"test"`` (default) or ``"train"`` (``"full"`` only).
        n, seed: seeded subsample.
        path: local file(s) with ``problem`` and ``answer`` or ``solution`` fields.
    """

    name = "math"
    instruction = "Solve the problem step by step. Put your final answer within \\boxed{}."
    MATH500, FULL = "HuggingFaceH4/MATH-500", "EleutherAI/hendrycks_math"
    SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                "prealgebra", "precalculus")

    def __init__(self, *, subset: str = "math500", split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None):
        if subset not in ("math500", "full"):
            raise ValueError(f"math subset must be 'math500' or 'full', got {subset!r}")
        self.subset = subset
        self.split = check_split(self.name, split or "test", ("test",) if subset == "math500" else ("test", "train"))
        if path is not None:
            self.source = os.fspath(path)
            rows = load_rows(self.name, hub_id="", config=None, split=self.split, path=path, required=("problem",))
        elif subset == "math500":
            self.source = self.MATH500
            rows = load_rows(self.name, hub_id=self.MATH500, config=None, split=self.split, path=None,
                             required=("problem", "answer"))
        else:
            self.source = self.FULL
            rows = [row for subject in self.SUBJECTS
                    for row in load_rows(self.name, hub_id=self.FULL, config=subject, split=self.split, path=None,
                                         required=("problem", "solution"))]
        examples = []
        for i, row in enumerate(rows):
            answer = row.get("answer")
            if not answer:
                boxes = boxed_contents(row.get("solution") or "")
                if not boxes:
                    raise ValueError(f"math row {i}: no 'answer' field and no \\boxed{{}} in its solution")
                answer = boxes[-1]
            examples.append(Example(
                id=str(row.get("unique_id") or f"{self.split}-{i}"),
                question=row["problem"],
                answer=str(answer).strip(),
                metadata={k: row.get(k) for k in ("solution", "level", "type", "subject") if row.get(k) is not None},
            ))
        super().__init__(subsample(examples, n, seed))

    def extract(self, text: str) -> str | None:
        return extract_math_answer(text)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return math_equal(answer, example.answer)

    @property
    def fingerprint(self) -> str:
        return f"math:{self.source}:{self.subset}:{self.split}"
