"""What the procedural tasks share: examples drawn from a seed, a train/test split by content hash,
question kinds, and the replies a model (or a scripted peer) gives: right and plausibly wrong.

Every procedural task (``arith``, ``wordprob``, ``compare``, ``logic``, ``pyfunc``, ``pytrace``,
``law``, ``sequence``) generates unlimited verifiable examples offline. One question in five, by a
hash of its text, belongs to ``test``; the rest to ``train``, so the two never share a question.
Each example's ``metadata["kind"]`` names its question kind (what makes it hard), which the zoo's
model cards report accuracy by.
"""

from __future__ import annotations

import abc
import hashlib
import random
from collections import Counter
from collections.abc import Callable

from crl_envs.tasks.base import Example, Task
from crl_kit.errors import ConfigError

TEST_FRACTION = 5  # one question in 5 (by content hash) belongs to the test split
#: The paper's three kinds of task, and the procedural tasks of each.
TASK_KINDS: dict[str, tuple[str, ...]] = {
    "reasoning": ("arith", "wordprob", "compare", "logic"),
    "coding": ("pyfunc", "pytrace"),
    "discovery": ("law", "sequence"),
}

Draw = tuple[str, str, dict]  # question, answer, extra metadata


def in_test_split(question: str) -> bool:
    """Whether a question belongs to the test split (a hash of its text, one in five)."""
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % TEST_FRACTION == 0


def check_split(name: str, split: str | None) -> str:
    split = split or "test"
    if split not in ("train", "test"):
        raise ConfigError(f"{name} has splits 'train' and 'test', got {split!r}")
    return split


class ProceduralTask(Task, abc.ABC):
    """A task whose examples a subclass draws with :meth:`draw`; see the module docstring.

    Subclasses set ``kinds`` (the question kinds :meth:`draw` returns), implement :meth:`draw` and
    :meth:`wrong_answer`, and call ``super().__init__(self.generate(split, n, seed, settings))``.
    """

    kinds: tuple[str, ...] = ()
    split: str
    seed: int
    settings: str

    def generate(self, split: str | None, n: int | None, seed: int, settings: str) -> list[Example]:
        """``n`` (default 200) distinct examples of ``split``, drawn from a RNG seeded by the task's
        name, its settings and ``seed``."""
        self.split = check_split(self.name, split)
        n = 200 if n is None else n
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"{self.name}: n must be an int >= 1, got {n!r}")
        self.seed, self.settings = seed, settings
        rng = random.Random(f"{self.name}/{settings}/{seed}")
        want_test = self.split == "test"
        examples: list[Example] = []
        seen: set[str] = set()
        active = list(self.kinds)  # kinds in turn, so each is equally common while it has new questions
        while len(examples) < n:
            if not active:
                raise ConfigError(f"{self.name} cannot make {n} distinct {self.split} questions with settings "
                                 f"{settings}; ask for fewer (n=) or widen the settings")
            kind = active[len(examples) % len(active)]
            for _ in range(3000):
                question, answer, extra = self.draw(rng, kind)
                if in_test_split(question) == want_test and question not in seen:
                    break
            else:  # this kind has no new question left
                active.remove(kind)
                continue
            seen.add(question)
            examples.append(Example(id=f"{self.split}-{len(examples)}", question=question, answer=answer,
                                    metadata={"kind": kind, **extra}))
        return examples

    @abc.abstractmethod
    def draw(self, rng: random.Random, kind: str) -> Draw:
        """One random question of ``kind``: ``(question, answer, metadata)``."""

    @abc.abstractmethod
    def wrong_answer(self, example: Example, h: int) -> str:
        """A plausible wrong answer to ``example`` (the slip a model makes), chosen by the integer ``h``."""

    def reply(self, example: Example) -> str:
        """The response a model trained on this task gives when it is right."""
        return f"The answer is {example.answer}."

    def wrong_reply(self, example: Example, h: int) -> str:
        """A response with a plausible wrong answer (never scored right)."""
        return f"The answer is {self.wrong_answer(example, h)}."

    @property
    def fingerprint(self) -> str:
        return f"{self.name}:{self.settings}:{self.split}:s{self.seed}"


def differs(value: int, wrong: int) -> int:
    """``wrong``, or ``value + 1`` when the slip happened to give the right value."""
    return wrong if wrong != value else value + 1


def majority_baseline(load: Callable[..., Task], name: str, *, n_train: int = 1000, n_test: int = 500,
                      **options) -> dict[str, float | str]:
    """The blind baseline of a task: always give the most common *train* answer, scored on ``n_test``
    test questions; with the task's chance level. A task a format-only guess solves is no test."""
    train = load(name, split="train", n=n_train, **options)
    test = load(name, split="test", n=n_test, **options)
    answer, _ = Counter(e.answer for e in train).most_common(1)[0]
    score = sum(test.score_answer(answer, e) for e in test) / len(test)
    return {"task": name, "majority_answer": answer, "majority": round(score, 3), "chance": round(test.chance, 3)}


__all__ = ["ProceduralTask", "TASK_KINDS", "in_test_split", "majority_baseline", "differs"]
