"""Multiple-choice tasks: ``arc_challenge``, ``mmlu``, ``gpqa``. Answers are option letters A, B, ..."""

from __future__ import annotations

import os
import random
import re
import string
from collections.abc import Sequence

from crl_envs.tasks.base import Example, Task, own_turn
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_envs.tasks.numeric import boxed_contents
from crl_kit.errors import ConfigError

LETTERS = string.ascii_uppercase[:10]  # A..J
_L = f"[{LETTERS}]"
# "the answer is (B)", "Answer: B", "final answer: **C**", "the correct option is D", "answer is option A"
_ANSWER_RE = re.compile(
    r"(?i:answer|correct\s+(?:option|choice))\s*(?i:is)?\s*[:=\-]?\s*[\*_]*\s*(?i:option\s*|choice\s*)?"
    r"[\(\[]?(" + _L + r")[\)\]]?(?![A-Za-z0-9])"
)
_LONE_RE = re.compile(r"^[\s\*_]*[\(\[]?(" + _L + r")[\)\]]?[\.\):]?[\s\*_]*$")
_LINE_START_RE = re.compile(r"^[\s\*_]*[\(\[]?(" + _L + r")[\)\]\.:](?:\s|$)")
_PAREN_RE = re.compile(r"\((" + _L + r")\)")


def extract_letter(text: str, finish_reason: str | None = None) -> str | None:
    """The chosen option letter in a response's own turn (:func:`crl_envs.tasks.base.own_turn`).

    In order: the last ``\\boxed{B}``; the last "the answer is (B)" / "Answer: B" (the last marker
    wins, as for numbers); a response that is only a letter; a final line starting with "B)" /
    "(B)" / "B."; the last "(B)" anywhere. A cut-off response (``finish_reason == "length"``)
    counts only through the first two (a final line or a lone "(B)" may be an option being quoted).

    Example:
        >>> extract_letter("A is tempting, but the answer is (C).")
        'C'
        >>> extract_letter("B"), extract_letter("no idea") is None
        ('B', True)
    """
    if not isinstance(text, str):
        return None
    text, ended_by_turn = own_turn(text)
    cut = finish_reason == "length" and not ended_by_turn
    for content in reversed(boxed_contents(text)):
        content = re.sub(r"\\text(?:bf)?\{([^{}]*)\}", r"\1", content)
        m = re.match(r"^\s*[\(\[]?(" + _L + r")[\)\]]?(?![A-Za-z0-9])", content)
        if m:
            return m.group(1)
    found = [m for m in _ANSWER_RE.finditer(text) if not cut or m.end() < len(text.rstrip())]
    if found:
        return found[-1].group(1)
    if cut:
        return None
    m = _LONE_RE.match(text)
    if m:
        return m.group(1)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines:
        m = _LINE_START_RE.match(lines[-1]) or _LONE_RE.match(lines[-1])
        if m:
            return m.group(1)
    found = _PAREN_RE.findall(text)
    return found[-1] if found else None


class MultipleChoiceTask(Task):
    """Questions with lettered options; ``example.answer`` is the correct letter.

    ``example.metadata["options"]`` holds the option texts in letter order. ``chance`` is the mean of
    ``1 / number of options`` over the examples.
    """

    instruction = (
        "Answer the multiple-choice question. Think step by step, then end your response with "
        "'The answer is (X)' where X is the letter of the correct option."
    )
    header: str = ""

    def __init__(self, examples: Sequence[Example]):
        super().__init__(examples)
        for e in self.examples:
            k = len(e.metadata.get("options", ()))
            if not 2 <= k <= len(LETTERS) or e.answer not in LETTERS[:k]:
                raise ConfigError(f"{self.name} example {e.id!r}: answer {e.answer!r} is not one of {k} options")
        self.chance = sum(1 / len(e.metadata["options"]) for e in self.examples) / len(self.examples)

    def prompt(self, example: Example) -> str:
        options = "\n".join(f"{LETTERS[i]}) {text}" for i, text in enumerate(example.metadata["options"]))
        header = example.metadata.get("header", self.header)
        return (f"{header}\n\n" if header else "") + f"{example.question}\n\n{options}"

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_letter(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and answer.strip().strip("()").upper() == example.answer


def _mc_example(example_id: str, question: str, options: Sequence[str], correct: int, **metadata) -> Example:
    return Example(
        id=example_id,
        question=question.strip(),
        answer=LETTERS[correct],
        metadata={"options": [str(o).strip() for o in options], **metadata},
    )


class ARCChallengeTask(MultipleChoiceTask):
    """AI2 ARC, Challenge set (``allenai/ai2_arc``, config ``ARC-Challenge``).

    Rows: ``id``, ``question``, ``choices: {text: [...], label: [...]}``, ``answerKey``. Labels are
    letters or digits ("1".."4") in the data; options are re-lettered A, B, ... in their order.

    Args:
        split: ``"test"`` (default), ``"validation"`` or ``"train"``.
        n, seed: seeded subsample of ``n`` examples.
        path: local JSON/JSONL/Parquet/CSV file(s) with the hub's fields.
    """

    name = "arc_challenge"
    HUB_ID, CONFIG = "allenai/ai2_arc", "ARC-Challenge"

    def __init__(self, *, split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None):
        self.split = check_split(self.name, split or "test", ("train", "validation", "test"))
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        rows = load_rows(self.name, hub_id=self.HUB_ID, config=self.CONFIG, split=self.split, path=path,
                         required=("question", "choices", "answerKey"))
        examples = []
        for i, row in enumerate(rows):
            labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
            if row["answerKey"] not in labels:
                raise ConfigError(f"arc_challenge row {i}: answerKey {row['answerKey']!r} not among labels {labels}")
            examples.append(_mc_example(str(row.get("id") or f"{self.split}-{i}"), row["question"], texts,
                                        labels.index(row["answerKey"]), labels=labels))
        super().__init__(subsample(examples, n, seed))

    @property
    def fingerprint(self) -> str:
        return f"arc_challenge:{self.source}:{self.split}"


class MMLUTask(MultipleChoiceTask):
    """MMLU (``cais/mmlu``): rows ``question``, ``subject``, ``choices`` (4 texts), ``answer`` (0-3).

    Args:
        subject: a config of ``cais/mmlu`` (``"all"`` by default, or e.g. ``"college_physics"``).
        split: ``"test"`` (default), ``"validation"``, ``"dev"``.
        n, seed: seeded subsample.
        path: local file(s) with the hub's fields.
    """

    name = "mmlu"
    HUB_ID = "cais/mmlu"

    def __init__(self, *, subject: str = "all", split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None):
        self.split = check_split(self.name, split or "test", ("test", "validation", "dev", "auxiliary_train"))
        self.subject = subject
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        rows = load_rows(self.name, hub_id=self.HUB_ID, config=subject, split=self.split, path=path,
                         required=("question", "choices", "answer"))
        examples = []
        for i, row in enumerate(rows):
            answer = row["answer"]
            if isinstance(answer, str):  # some exports store the letter
                answer = LETTERS.index(answer.strip()) if answer.strip() in LETTERS else int(answer)
            subject_name = (row.get("subject") or "").replace("_", " ")
            header = f"The following is a multiple choice question about {subject_name}." if subject_name else ""
            examples.append(_mc_example(f"{self.split}-{i}", row["question"], row["choices"], int(answer),
                                        subject=row.get("subject"), header=header))
        if subject != "all" and path is not None:
            examples = [e for e in examples if e.metadata["subject"] in (None, subject)]
        super().__init__(subsample(examples, n, seed))

    @property
    def fingerprint(self) -> str:
        return f"mmlu:{self.source}:{self.subject}:{self.split}"


class GPQATask(MultipleChoiceTask):
    """GPQA (``Idavidrein/gpqa``; gated on the hub): graduate-level science, four options.

    Rows: ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3`` (and ``Record ID``). The options
    are shuffled per example with ``random.Random(f"{shuffle_seed}/{record id}")``, so the letter
    of the correct answer is uniform and reproducible.

    Args:
        subset: ``"gpqa_diamond"`` (default), ``"gpqa_main"``, ``"gpqa_extended"``, ``"gpqa_experts"``.
        split: ``"train"`` (the only split GPQA has).
        shuffle_seed: seed of the option order.
        n, seed: seeded subsample.
        path: local file(s) with the hub's fields (the hub ships CSV).
    """

    name = "gpqa"
    HUB_ID = "Idavidrein/gpqa"

    def __init__(self, *, subset: str = "gpqa_diamond", split: str | None = None, n: int | None = None,
                 seed: int = 0, shuffle_seed: int = 0, path: str | os.PathLike | None = None):
        self.split = check_split(self.name, split or "train", ("train",))
        self.subset, self.shuffle_seed = subset, shuffle_seed
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        fields = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
        rows = load_rows(self.name, hub_id=self.HUB_ID, config=subset, split=self.split, path=path, required=fields)
        examples = []
        for i, row in enumerate(rows):
            record = str(row.get("Record ID") or f"{self.split}-{i}")
            options = [row["Correct Answer"]] + [row[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
            order = list(range(4))
            random.Random(f"{shuffle_seed}/{record}").shuffle(order)
            examples.append(_mc_example(record, row["Question"], [options[j] for j in order], order.index(0)))
        super().__init__(subsample(examples, n, seed))

    @property
    def fingerprint(self) -> str:
        return f"gpqa:{self.source}:{self.subset}:{self.split}:shuffle{self.shuffle_seed}"
