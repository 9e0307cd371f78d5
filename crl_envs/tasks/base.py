"""What a task is: examples, how a question is put to a model, answer extraction and scoring."""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crl_kit.errors import ConfigError

TURN_MARKERS: tuple[str, ...] = (
    r"Agent \d+", "Your previous answer", "Other agents' answers", "Considering the other answers",
    "User", "Assistant", "System", "Human", "Student", "Teacher", "Question", "Q",
)
"""Line starts (each followed by ``:``, except "Considering the other answers") that open a turn a
model did not write: a base model without a chat template (gemma-3-270m) goes on to write the
protocol's next turns itself, with their answers (``"Agent 2: ... So, the answer is 120."``)."""
_TURN_RE = re.compile(r"\n[ \t*]*(?:(?:" + "|".join(TURN_MARKERS) + r")[ \t]*:|Considering the other answers)",
                      re.IGNORECASE)


def own_turn(text: str) -> tuple[str, bool]:
    """The part of a response the model wrote as its own turn, and whether a hallucinated next turn
    (a line starting with one of :data:`TURN_MARKERS`) ended it there.

    Example:
        >>> own_turn(" 26 + 34 = 52\\nAgent 2: So, 26 - 34 = 12.")
        (' 26 + 34 = 52', True)
    """
    m = _TURN_RE.search(text)
    if m is None or not text[: m.start()].strip():
        return text, False
    return text[: m.start()], True


@dataclass(frozen=True)
class Example:
    """One question. ``answer`` is the reference answer in canonical form (a string)."""

    id: str
    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Task(abc.ABC):
    """A list of examples plus the three things every protocol needs from a task.

    - :meth:`prompt` — the user message that puts a question to a model;
    - :meth:`extract` — the answer in a free-text response (``None`` if there is none); it is given
      the generation's ``finish_reason`` when the caller knows it (``"length"``: cut off at
      ``max_new_tokens``), since a cut-off answer may end in a fragment;
    - :meth:`score` — the response's score in [0, 1] against the example's reference.

    Subclasses override :meth:`extract` and :meth:`is_correct` (and usually :meth:`prompt`).
    ``instruction`` is the system message protocols send with the question; ``chance`` is the
    expected score of a uniformly random answer (0 for open-ended answers).
    """

    name: str = "task"
    instruction: str = "Answer the question. End your response with 'The answer is X.'"
    chance: float = 0.0

    def __init__(self, examples: Sequence[Example], *, name: str | None = None):
        if name is not None:
            self.name = name
        self.examples: list[Example] = list(examples)
        if not self.examples:
            raise ConfigError(f"task {self.name!r} has no examples; check n= and the data source")
        ids = [e.id for e in self.examples]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"task {self.name!r} has duplicate example ids")
        self._by_id = {e.id: e for e in self.examples}

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self):
        return iter(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    def by_id(self, example_id: str) -> Example:
        try:
            return self._by_id[example_id]
        except KeyError:
            raise KeyError(f"task {self.name!r} has no example with id {example_id!r}") from None

    def subset(self, ids: Sequence[str]) -> Task:
        """A task of the same kind over the given example ids (in that order)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.examples = [self.by_id(i) for i in ids]
        clone._by_id = {e.id: e for e in clone.examples}
        return clone

    def prompt(self, example: Example) -> str:
        return example.question

    @abc.abstractmethod
    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        """The answer in a free-text response, or ``None``.

        ``finish_reason``: ``"stop"`` (the model ended its answer), ``"length"`` (cut off at
        ``max_new_tokens`` or at the env's ``max_action_chars``) or ``None`` (unknown: read as complete).
        """

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and answer == example.answer

    def score_answer(self, answer: str | None, example: Example) -> float:
        """Score of an already extracted answer (protocols that aggregate answers use this)."""
        return float(self.is_correct(answer, example))

    def score(self, text: str, example: Example, finish_reason: str | None = None) -> float:
        """Score in [0, 1] of a free-text response."""
        return self.score_answer(self.extract(text, finish_reason), example)

    @property
    def fingerprint(self) -> str:
        """Identifies the task's scoring and prompt; caches key on it with the example ids."""
        return f"{type(self).__module__}.{type(self).__name__}:{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, n={len(self)})"
