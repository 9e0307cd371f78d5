"""``bbh``: BIG-Bench Hard (Suzgun et al. 2022), 27 subtasks with short exact-match targets."""

from __future__ import annotations

import os
import re

from crl_envs.tasks.base import Example, Task, own_turn
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_envs.tasks.numeric import boxed_contents
from crl_kit.errors import ConfigError

SUBTASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa", "dyck_languages",
    "formal_fallacies", "geometric_shapes", "hyperbaton", "logical_deduction_five_objects",
    "logical_deduction_seven_objects", "logical_deduction_three_objects", "movie_recommendation",
    "multistep_arithmetic_two", "navigate", "object_counting", "penguins_in_a_table",
    "reasoning_about_colored_objects", "ruin_names", "salient_translation_error_detection", "snarks",
    "sports_understanding", "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects", "web_of_lies",
    "word_sorting",
)
_ANSWER_IS_RE = re.compile(r"answer is\s*:?\s*(.+)", re.IGNORECASE)
_LETTER_TARGET_RE = re.compile(r"^\(([A-R])\)$")
_BINARY = ({"true", "false"}, {"yes", "no"}, {"valid", "invalid"})


def extract_bbh_answer(text: str, finish_reason: str | None = None) -> str | None:
    """In the response's own turn (:func:`crl_envs.tasks.base.own_turn`): the last "So the answer
    is X." (BBH's chain-of-thought format; the last one wins), else the last ``\\boxed{}``, else the
    last non-empty line. A cut-off response (``finish_reason == "length"``) counts only through an
    "answer is X" line that ends before the cut, or a closed ``\\boxed{}``."""
    if not isinstance(text, str):
        return None
    text, ended_by_turn = own_turn(text)
    cut = finish_reason == "length" and not ended_by_turn
    found = [m.group(1) for m in _ANSWER_IS_RE.finditer(text)
             if not cut or re.match(r"[^\n]*?(?:\n|\.\s)", text[m.start(1):])]
    if found:
        answer = found[-1]
    elif cut:
        boxes = boxed_contents(text)
        if not boxes:
            return None
        answer = boxes[-1]
    else:
        boxes = boxed_contents(text)
        lines = [line for line in text.splitlines() if line.strip()]
        if boxes:
            answer = boxes[-1]
        elif lines:
            answer = lines[-1]
        else:
            return None
    answer = re.sub(r"\s*\.\s*$", "", answer.strip()).strip().strip("*").strip()
    return answer or None


def _normalize(s: str) -> str:
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s.strip())
    s = s.strip().strip("*`\"'$").strip().rstrip(".").strip()
    return re.sub(r"\s+", " ", s).lower()


def bbh_equal(prediction: str | None, target: str) -> bool:
    """BBH exact match, tolerant of the forms models write: ``(A)``/``A``/``(A) text`` for option
    targets, case and trailing periods for words, spacing for Dyck sequences, numbers numerically."""
    if prediction is None:
        return False
    p, t = _normalize(prediction), _normalize(target)
    letter = _LETTER_TARGET_RE.match(target.strip())
    if letter:
        m = re.match(r"^\(?([a-r])\)?(?:$|[\s.:)])", p)
        return bool(m) and m.group(1).upper() == letter.group(1)
    if p == t:
        return True
    if re.fullmatch(r"[\[\]{}()<>\s]+", t):  # dyck_languages
        return p.replace(" ", "") == t.replace(" ", "")
    try:
        return float(p.replace(",", "")) == float(t)
    except ValueError:
        pass
    for words in _BINARY:  # "Yes, ..." / "valid argument"
        if t in words:
            first = re.match(r"[a-z]+", p)
            return bool(first) and first.group(0) == t
    return False


def _chance(example: Example) -> float:
    target = example.answer.strip()
    if _LETTER_TARGET_RE.match(target):
        k = len(re.findall(r"^\s*\([A-R]\)", example.question, re.MULTILINE))
        return 1 / k if k else 0.0
    return 0.5 if any(target.lower() in words for words in _BINARY) else 0.0


class BBHTask(Task):
    """BIG-Bench Hard (``lukaemon/bbh``: one config per subtask, split ``test``, fields ``input``, ``target``).

    Args:
        subtasks: a subtask name or a list of them (default: all 27).
        split: ``"test"`` (the only split).
        n, seed: seeded subsample over the chosen subtasks.
        path: local file(s) with ``input``/``target`` (and optionally ``subtask``) fields.

    ``chance`` is the mean over examples of 1/(number of options) for option targets, 1/2 for
    True/False, Yes/No and valid/invalid targets, and 0 for free-form targets.
    """

    name = "bbh"
    instruction = "Answer the question. Think step by step, then end your response with 'So the answer is X.'"
    HUB_ID = "lukaemon/bbh"

    def __init__(self, *, subtasks: str | list[str] | tuple[str, ...] | None = None, split: str | None = None,
                 n: int | None = None, seed: int = 0, path: str | os.PathLike | None = None):
        chosen = (subtasks,) if isinstance(subtasks, str) else tuple(subtasks or SUBTASKS)
        unknown = [s for s in chosen if s not in SUBTASKS]
        if unknown:
            raise ConfigError(f"bbh: unknown subtasks {unknown}; known: {', '.join(SUBTASKS)}")
        self.subtasks = chosen
        self.split = check_split(self.name, split or "test", ("test",))
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        examples = []
        if path is not None:
            rows = load_rows(self.name, hub_id="", config=None, split=self.split, path=path,
                             required=("input", "target"))
            for i, row in enumerate(rows):
                subtask = row.get("subtask") or "unknown"
                if subtasks is None or subtask in chosen:
                    examples.append(self._example(f"{subtask}-{i}", row, subtask))
        else:
            for subtask in chosen:
                rows = load_rows(self.name, hub_id=self.HUB_ID, config=subtask, split=self.split, path=None,
                                 required=("input", "target"))
                examples += [self._example(f"{subtask}-{i}", row, subtask) for i, row in enumerate(rows)]
        super().__init__(subsample(examples, n, seed))
        self.chance = sum(_chance(e) for e in self.examples) / len(self.examples)

    @staticmethod
    def _example(example_id: str, row: dict, subtask: str) -> Example:
        return Example(id=example_id, question=str(row["input"]).strip(), answer=str(row["target"]).strip(),
                       metadata={"subtask": subtask})

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_bbh_answer(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return bbh_equal(answer, example.answer)

    @property
    def fingerprint(self) -> str:
        return f"bbh:{self.source}:{self.split}:{','.join(self.subtasks)}"
