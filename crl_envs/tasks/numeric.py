"""Numeric answers: extraction from free text as real models write it, and comparison.

The rules, measured on 334 real answers of SmolLM2-135M-Instruct and gemma-3-270m
(``tests/data/extraction_labels.jsonl``):

1. **The model's own turn.** A base model without a chat template goes on to write the next turns
   itself (``"Agent 2: ..."``, ``"Your previous answer: ..."``); only the text before the first
   such line is its answer (:func:`crl_envs.tasks.base.own_turn`).
2. **Final markers.** ``\\boxed{N}``, ``#### N``, "the answer is N" (also "answer: N", "the final
   answer is N", "the answer to this problem is N", "the answer is indeed N"), and "N is the answer"
   / "N, which is the answer". A marker counts only if a number follows it at once (filler such as
   a placeholder ``N =`` or ``$`` allowed): "The answer is N = 130." is 130, while "The answer is N.",
   "The answer is that ..." and "The answer is 2 - 84." (an unevaluated expression) carry no
   number and are skipped. An equation after the marker counts by its result:
   "the answer is 249 / 12 = 18.25" is 18.25; a lone fraction "the answer is 3/4" is 0.75.
3. **Which marker wins: the last one that carries a number**, whatever its kind. The instruction
   asks the model to *end* with it, math-verify and the Minerva/MATH graders take the last
   ``\\boxed{}``, and lm-evaluation-harness' flexible match takes the last number; so
   "The answer is 65. The answer is 1." is 1. (lm-evaluation-harness' *strict* GSM8K match takes
   the first "#### N" / "The answer is N."; it differs from us only when finals contradict.)
4. **Cut-off answers** (``finish_reason == "length"``, when the caller knows it): a number that
   runs into the end of the text is a fragment and is dropped, and only a complete final marker
   counts, with no last-number fallback; "The answer is N = 1" cut there scores ``None``.
   A turn that ended because the model started the next turn (rule 1) is complete.
5. **Fallback** (a complete answer without a final marker): the last number stated as a result, i.e.
   the last one that is not an operand of an arithmetic expression (``+ - * x / ^``, "times",
   "plus", "minus", "divided by"). " 66 - 9 = 66 - 9" (a restated question) has none, "26 + 34 = 52"
   has 52. Numbers in a plan that states no result ("we need to find the difference between 82
   and 44.") are not answers, nor are numbers in a question ("...how many cents will she have left?") are not answers, and a
   turn that ends with a question mark has no answer. lm-evaluation-harness' flexible match takes the
   last number of any kind; here operands and questions are skipped (they restate the problem, and
   gave two models that restate it a spurious agreement).
6. **Number syntax.** A minus sign is negative only when it is attached to the number and does not
   follow a number or a closing bracket ("is -12", "= -3", "(-4)"; "66 - 9" and "66-9" are
   subtractions). ``−`` (U+2212) and ``–`` count as minus signs. Thousands separators are commas in
   groups of three ("1,234,567"; "1,2,3" is three numbers); a period is always the decimal point.
   Currency symbols (``$ € £ ¥``), a trailing ``%`` and units after the number are ignored
   ("$1,200.50" is 1200.5, "45%" is 45, "6 inches" is 6).
"""

from __future__ import annotations

import functools
import math
import re

from crl_envs.tasks.base import Example, Task, own_turn

_CORE = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,]\d)|\d+(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(r"(?<![\w.])(?:" + _CORE + r")(?![\d])")
_MINUS = "-−–"
_CURRENCY = "$€£¥"
# a binary operator between two numbers ("x" only as a word: "29 x 1")
_OP = r"(?:[-+*/×÷^−–]|\bx\b|\btimes\b|\bplus\b|\bminus\b|\bdivided\s+by\b|\bmultiplied\s+by\b)"
_OPERAND_AFTER_RE = re.compile(r"\s*%?\s*" + _OP + r"\s*[(\[]?\s*[" + _CURRENCY + _MINUS + r"]?\s*\d")
_OPERAND_BEFORE_RE = re.compile(r"(?:\d|[)\]%]|\b[a-zA-Z])\s*" + _OP + r"\s*[(\[]?\s*$")
# "we need to find the difference between 82 and 44.": a plan, its numbers are not results
_PLAN_RE = re.compile(r"\b(?:need to|needs to|let's|let us|we will|we'll|we must|we have to|we can|you can)\b", re.I)
_RESULT_WORD_RE = re.compile(r"=|\b(?:is|are|was|equals?|gives?|get|gets|got|results?|makes?)\b", re.I)
_FILLER = (r"\s*(?:\*\*|__)?\s*(?:\$\s*)?(?:\\\(|\\\[)?\s*"
           r"(?:(?:indeed|actually|simply|just|exactly|approximately|about|equal\s+to|equals|now)\s+)?"
           r"(?:[A-Z]\s*(?:=|:|,?\s*which\s+is)\s*)?")
_ANSWER_IS_RE = re.compile(
    r"(?<!previous )(?<!previous\s)\b(?:final\s+)?answer(?:\s+to\s+(?:the|this|that)\s+(?:\w+\s+)?(?:problem|question))?"
    r"\s*(?:is|was|:|=)(?:\s*:)?" + _FILLER,
    re.IGNORECASE,
)
_HASHES_RE = re.compile(r"####\s*")
_IS_THE_ANSWER_RE = re.compile(r"\s*(?:\*\*)?\s*,?\s*(?:which|that|this)?\s*(?:is|'s)\s+(?:the\s+)?(?:final\s+)?answer\b",
                               re.IGNORECASE)
_CHAIN_SEP_RE = re.compile(r"\s*(=|" + _OP + r")\s*")


class _Number:
    """A number as it stands in a text: its span (sign and currency included) and value."""

    __slots__ = ("start", "end", "value")

    def __init__(self, start: int, end: int, value: str):
        self.start, self.end, self.value = start, end, value


def _numbers(text: str) -> list[_Number]:
    """Every number in ``text`` with its sign read by rule 6 of the module docstring."""
    out = []
    for m in _NUMBER_RE.finditer(text):
        start, end = m.start(), m.end()
        if text[end:end + 1] == "%":
            end += 1
        j = start
        if j > 0 and text[j - 1] in _CURRENCY:
            j -= 1
        negative = False
        if j > 0 and text[j - 1] in _MINUS:
            before = text[: j - 1]
            stripped = before.rstrip()
            attached_to_word = bool(before) and not before[-1].isspace() and before[-1].isalnum()
            after_value = bool(stripped) and (stripped[-1].isdigit() or stripped[-1] in ")]}%")
            if not attached_to_word and not after_value:
                negative, j = True, j - 1
        value = normalize_number(("-" if negative else "") + m.group(0))
        if value is not None:
            out.append(_Number(j, end, value))
    return out


def normalize_number(raw: str) -> str | None:
    """``"$1,234.50"`` -> ``"1234.5"``; ``"72.0"`` -> ``"72"``; ``"−3"`` -> ``"-3"``; not a number -> ``None``."""
    s = raw.strip().replace(",", "").replace(" ", "").rstrip(".").rstrip("%")
    for c in _CURRENCY:
        s = s.replace(c, "")
    s = re.sub(f"^[{_MINUS}]", "-", s)
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


def _is_operand(text: str, number: _Number) -> bool:
    return bool(_OPERAND_AFTER_RE.match(text, number.end) or _OPERAND_BEFORE_RE.search(text[: number.start]))


def _chain_value(text: str, numbers: list[_Number], k: int) -> str | None:
    """The value of the expression that starts with ``numbers[k]``: the number itself, the result
    after the last ``=`` of an equation chain, a fraction ``a/b``; ``None`` if unevaluated."""
    chain, seps, i = [numbers[k]], [], k
    while i + 1 < len(numbers):
        gap = _CHAIN_SEP_RE.fullmatch(text, chain[-1].end, numbers[i + 1].start)
        if not gap:
            break
        seps.append(gap.group(1))
        chain.append(numbers[i + 1])
        i += 1
    if not seps:
        return chain[0].value
    if seps[-1] == "=":
        return chain[-1].value
    if seps == ["/"] and float(chain[1].value) != 0:  # a lone fraction: 3/4
        return normalize_number(repr(float(chain[0].value) / float(chain[1].value)))
    return None


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


def _latex_numbers(s: str) -> str:
    s = re.sub(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"\1/\2", s)
    return re.sub(r"\\(?:text|mathrm|textbf)\s*\{([^{}]*)\}|\\[,;!]|\\?\$", r" \1 ", s)


def _final_markers(text: str) -> list[tuple[int, str]]:
    """``(position, value)`` of every final marker in ``text`` that carries a number."""
    numbers = _numbers(text)
    starts = {n.start: k for k, n in enumerate(numbers)}
    found = []
    for pattern in (_ANSWER_IS_RE, _HASHES_RE):
        for m in pattern.finditer(text):
            k = starts.get(m.end())
            if k is None:  # the number may start after a space the filler did not eat
                k = next((j for j, n in enumerate(numbers) if n.start >= m.end() and not text[m.end():n.start].strip()), None)
            if k is not None:
                value = _chain_value(text, numbers, k)
                if value is not None:
                    found.append((m.start(), value))
    for n in numbers:
        if _IS_THE_ANSWER_RE.match(text, n.end) and not _is_operand(text, n):
            found.append((n.start, n.value))
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        content = next(iter(boxed_contents(text[m.start():])), None)
        if content is None:
            continue
        inner = _latex_numbers(content).strip()
        inner_numbers = _numbers(inner)
        if inner_numbers and not inner[: inner_numbers[0].start].strip():
            value = _chain_value(inner, inner_numbers, 0)
            if value is not None:
                found.append((m.start(), value))
    return sorted(found)


def _drop_cut_number(text: str) -> str:
    """A text cut at max_new_tokens without the number it was writing at the end."""
    return re.sub(r"[" + _MINUS + _CURRENCY + r"]?\d[\d,.]*\s*$", "", text)


def final_marker_answer(text: str, finish_reason: str | None = None) -> str | None:
    """The number of the last final marker in the model's own turn (rules 1-4), or ``None``.

    Example:
        >>> final_marker_answer("26 + 34 = 60. The answer is N = 60.")
        '60'
        >>> final_marker_answer("The answer is N = 1", finish_reason="length") is None
        True
    """
    if not isinstance(text, str):
        return None
    own, ended_by_turn = own_turn(text)
    if finish_reason == "length" and not ended_by_turn:
        own = _drop_cut_number(own)
    markers = _final_markers(own)
    return markers[-1][1] if markers else None


def extract_number(text: str, finish_reason: str | None = None) -> str | None:
    """The final numeric answer in a response, by the rules of the module docstring.

    Example:
        >>> extract_number("so 3 + 4 = 7. The answer is $1,200.")
        '1200'
        >>> extract_number(" 66 - 9 = 66 - 9") is None, extract_number("26 + 34 = 52")
        (True, '52')
    """
    if not isinstance(text, str):
        return None
    return _extract_number(str(text), finish_reason if isinstance(finish_reason, str) else None)


@functools.lru_cache(maxsize=1 << 16)
def _extract_number(text: str, finish_reason: str | None) -> str | None:
    """:func:`extract_number` of a plain string, kept for the most recent answers: they repeat (every seat
    and coalition that shows a model's answer reads it), and the rules are a function of the text alone."""
    own, ended_by_turn = own_turn(text)
    cut = finish_reason == "length" and not ended_by_turn
    if cut:
        own = _drop_cut_number(own)
    markers = _final_markers(own)
    if markers:
        return markers[-1][1]
    if cut or own.rstrip().rstrip("*").endswith("?"):
        return None
    return last_number(own)


def last_number(text: str) -> str | None:
    """The last number stated as a result (rule 5): not an operand, not in a question or a plan."""
    statements = re.sub(r"[^.!?\n]*\?", " ", text)
    statements = re.sub(r"[^.!?\n]+", lambda m: _blank_plan(m.group(0)), statements)
    for n in reversed(_numbers(statements)):
        if not _is_operand(statements, n):
            return n.value
    return None


def _blank_plan(sentence: str) -> str:
    if _PLAN_RE.search(sentence) and not _RESULT_WORD_RE.search(sentence):
        return " " * len(sentence)
    return sentence


def numbers_equal(a: str | None, b: str | None, rel_tol: float = 1e-6) -> bool:
    if a is None or b is None:
        return False
    try:
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-9)
    except ValueError:
        return a.strip() == b.strip()


class NumericTask(Task):
    """A task whose answers are numbers, extracted by the rules of :mod:`crl_envs.tasks.numeric`:
    the model's own turn; the last final marker that carries a number ("The answer is N.",
    ``\\boxed{N}``, ``#### N``) wins; a cut-off answer (``finish_reason == "length"``) counts only
    through a complete final marker; otherwise the last number stated as a result.

    The instruction names no placeholder: "End your response with 'The answer is N.' where N is a
    number" made SmolLM2 write "The answer is N." and "The answer is N = 130." (extraction still
    reads "N = 130" as 130 and skips a bare "N"). On the pretrained pool, arith, 30 questions
    (``benchmarks/answer_format.py --wordings --n 30 --max-new-tokens 128``), SmolLM2's answers
    carried a final marker 0.77 of the time with this wording, 0.73 with the N wording and 0.53
    with "like 'The answer is 7.'" (which it copied twice); gemma-3-270m (a base model) wrote none
    with any of them. The zoo never sees it (its chat template drops system messages).
    """

    instruction = "Solve the problem. Finish with the sentence 'The answer is', then your final number, then a period."

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_number(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return numbers_equal(answer, example.answer)
