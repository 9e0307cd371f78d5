"""``math``: competition mathematics (Hendrycks et al. 2021, MATH / MATH-500), ``\\boxed{}`` answers.

Answers are compared by :func:`math_equal`: the same string after a light normalisation (LaTeX
spacing, ``\\dfrac``, units, ``\\%``, degrees, ``x = ``, thousands separators), else HF's
``math-verify`` (the field's grader: open-r1, lighteval) for numbers, fractions, radicals, intervals,
sets, tuples and symbolic equivalence. What it lacks is kept here: a relative tolerance of 1e-4
between plain numbers (``0.70711`` = ``\\frac{\\sqrt{2}}{2}``; math-verify rounds to 6 decimals), and
a hard timeout that works in worker threads and keeps an outer timer (math-verify's own uses
``signal.alarm`` in the calling thread, so it is switched off and :func:`call_with_timeout` used).

Extraction (:func:`extract_math_answer`) reads the model's own turn; the last ``\\boxed{}`` wins, as
in math-verify and the Minerva/MATH graders, then the last "final answer is" / "the answer is" /
"Answer:"; a cut-off response (``finish_reason == "length"``) has no last-number fallback.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import threading
from collections.abc import Callable
from typing import Any

from crl_envs.tasks.base import Example, Task, own_turn
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_envs.tasks.numeric import boxed_contents, last_number
from crl_kit.errors import ConfigError

REL_TOL = 1e-4
SYMPY_TIMEOUT = 5.0  # math-verify's own default


class _OwnTimeoutNotice(logging.Filter):
    """Drops math-verify's "Timeout is disabled as ... is None" warning, and only that: its signal
    timeout is off on purpose here and :func:`call_with_timeout` keeps one, so the warning misleads."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled as ")


_OWN_TIMEOUT_NOTICE = _OwnTimeoutNotice()
for _logger in ("math_verify.parser", "math_verify.grader"):  # set before math-verify loads; workers too
    logging.getLogger(_logger).addFilter(_OWN_TIMEOUT_NOTICE)
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


def extract_math_answer(text: str, finish_reason: str | None = None) -> str | None:
    """The final answer in a response's own turn (:func:`crl_envs.tasks.base.own_turn`): the last
    ``\\boxed{}``, else the last "the final answer is ...", "the answer is ...", "Answer: ...",
    else the last number stated as a result. A cut-off response (``finish_reason == "length"``)
    counts only through a closed ``\\boxed{}`` or an answer sentence that ends before the cut.

    Example:
        >>> extract_math_answer(r"so $x = \\boxed{\\frac{1}{2}}$.")
        '\\\\frac{1}{2}'
    """
    if not isinstance(text, str):
        return None
    text, ended_by_turn = own_turn(text)
    cut = finish_reason == "length" and not ended_by_turn
    boxes = boxed_contents(text)
    if boxes:
        return boxes[-1].strip()
    for pattern in _ANSWER_PATTERNS:
        found = [m for m in pattern.finditer(text)
                 if not cut or re.match(r"[^\n]*?(?:\n|[.。]\s)", text[m.start(1):])]  # ends before the cut
        if found:
            answer = found[-1].group(1).strip().strip("*").strip()
            math_span = re.match(r"\$+([^$]+)\$", answer)
            if math_span:  # "The final answer is $\frac{3}{4}$. I hope it is correct."
                answer = math_span.group(1)
            else:
                answer = re.split(r"\.\s", answer)[0]
            answer = re.sub(r"\s*[.。]\s*$", "", answer).strip().strip("$").strip()
            if answer:
                return answer
    return None if cut else last_number(text)


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


def _parse(answer: str) -> list:
    """math-verify's parse of a bare answer (LaTeX or plain), without its own signal timeout."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    s = answer.strip()
    if not (s.startswith("$") or s.startswith("\\(") or s.startswith("\\[")):
        s = f"${s}$"
    return parse(s, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None)


def _small_powers(expr: Any) -> bool:
    """No power with a numeric base and a huge or nested exponent (``9^{9^{9^{9}}}``): sympy computes
    those with big integers in C, out of reach of every timeout, so they are never compared."""
    import sympy

    if not isinstance(expr, sympy.Basic):
        return True
    for power in expr.atoms(sympy.Pow):
        if power.base.is_number and power.exp.is_number and not (power.exp.is_Number and abs(power.exp) <= 10_000):
            return False
    return True


def _cheap_number(expr: Any) -> bool:
    """A sympy number whose value is cheap to compute: no power with a huge or symbolic exponent
    (``9^{9^{9^{9}}}`` would run in C for ever, out of reach of every timeout)."""
    import sympy

    if not isinstance(expr, sympy.Basic) or not expr.is_number:
        return False
    return all(e.exp.is_Number and abs(e.exp) <= 64 for e in expr.atoms(sympy.Pow))


def _math_verify_equal(prediction: str, reference: str) -> bool:
    """math-verify's equivalence (numbers, fractions, radicals, intervals, sets, tuples, equations
    ``x = 3``, units, percentages, symbolic simplification), plus a relative tolerance of
    ``REL_TOL`` between two plain numbers (math-verify rounds to 6 decimals: it rejects ``0.70711``
    for ``\\frac{\\sqrt{2}}{2}``)."""
    from math_verify import verify

    try:
        gold, pred = _parse(reference), _parse(prediction)
        if not gold or not pred or not all(_small_powers(x) for x in (*gold, *pred)):
            return False
        if verify(gold, pred, timeout_seconds=None):
            return True
        g, p = gold[0], pred[0]
        if _cheap_number(g) and _cheap_number(p) and (g.is_Float or p.is_Float):
            vg, vp = complex(g.evalf()), complex(p.evalf())
            return _numbers_close(vg.real, vp.real) and _numbers_close(vg.imag, vp.imag)
    except Exception:  # math-verify/sympy raise many kinds on odd input; unparsable means not shown equal
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
            _POOL.apply(_warm_up)  # imports and grammar load, outside every timed call
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
    """Whether two MATH answers are equivalent: the same after :func:`normalize_math_answer`, else
    by HF ``math-verify`` (:func:`_math_verify_equal`), stopped after ``timeout`` seconds.

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
    _warm_up()  # math-verify's first parse loads its LaTeX grammar: not part of the timed call
    return bool(call_with_timeout(_math_verify_equal, (prediction, reference), timeout))


_WARM = False


def _warm_up() -> bool:
    global _WARM
    if not _WARM:
        _parse("1")
        _WARM = True
    return True


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
            raise ConfigError(f"math subset must be 'math500' or 'full', got {subset!r}")
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
                    raise ConfigError(f"math row {i}: no 'answer' field and no \\boxed{{}} in its solution")
                answer = boxes[-1]
            examples.append(Example(
                id=str(row.get("unique_id") or f"{self.split}-{i}"),
                question=row["problem"],
                answer=str(answer).strip(),
                metadata={k: row.get(k) for k in ("solution", "level", "type", "subject") if row.get(k) is not None},
            ))
        super().__init__(subsample(examples, n, seed))

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_math_answer(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return math_equal(answer, example.answer)

    @property
    def fingerprint(self) -> str:
        return f"math:{self.source}:{self.subset}:{self.split}"
