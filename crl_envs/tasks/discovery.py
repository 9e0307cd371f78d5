"""Procedural scientific-discovery tasks: ``law`` (induce a hidden law y = f(x) from measurements, then
predict an unseen measurement or name its rate) and ``sequence`` (induce the rule of a sequence)."""

from __future__ import annotations

import math
import random

from crl_envs.tasks.base import Example
from crl_envs.tasks.numeric import NumericTask
from crl_envs.tasks.procedural import Draw, ProceduralTask, differs
from crl_kit.errors import ConfigError


class LawTask(ProceduralTask, NumericTask):
    """``law``: measurements of a hidden law y = f(x); predict y at an unseen x, or name the law's rate.

    | | |
    |---|---|
    | question | ``"A hidden law gives y from x. Measured: x=1 y=5; x=2 y=8; x=4 y=14. Predict y at x=6."`` |
    | answer | a number: ``"The answer is 20."`` (``rate`` questions: ``"What does y gain per unit of x?"``, the slope) |
    | kinds | ``linear`` (y = a*x + b), ``square`` (y = a*x*x + b), ``doubling`` (y = a * 2**x), ``rate`` (name a of a linear law) |
    | difficulty | ``noise`` (each shown measurement is off by up to this much, default 0), ``tolerance`` (relative) |
    | scorer | the last "The answer is N." (or boxed, ####, last result); right when within ``max(1, tolerance * abs(truth))`` of the noiseless truth |
    | blind baseline | the most common train answer (``8``) scores 0.133 (within tolerance; mostly ``rate`` questions) |
    """

    name = "law"
    kinds = ("linear", "square", "doubling", "rate")

    def __init__(self, *, noise: int = 0, tolerance: float = 0.05, split: str | None = None, n: int | None = None,
                 seed: int = 0):
        if not isinstance(noise, int) or not 0 <= noise <= 5:
            raise ConfigError(f"law noise must be an int in 0..5, got {noise!r}")
        if not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise ConfigError(f"law tolerance must be a number in [0, 1), got {tolerance!r}")
        self.noise, self.tolerance = noise, float(tolerance)
        super().__init__(self.generate(split, n, seed, f"{noise}/{tolerance}"))

    def draw(self, rng: random.Random, kind: str) -> Draw:
        a, b = rng.randint(1, 9 if kind != "doubling" else 5), rng.randint(0, 9)
        law = {"linear": lambda x: a * x + b, "rate": lambda x: a * x + b, "square": lambda x: a * x * x + b,
               "doubling": lambda x: a * 2**x}[kind]
        xs = sorted(rng.sample(range(0, 6), 3))
        shown = "; ".join(f"x={x} y={law(x) + rng.randint(-self.noise, self.noise)}" for x in xs)
        question = f"A hidden law gives y from x. Measured: {shown}."
        if kind == "rate":
            return f"{question} What does y gain per unit of x?", str(a), {"xs": xs, "at": None}
        at = rng.choice([x for x in range(0, 9 if kind != "doubling" else 7) if x not in xs])
        return f"{question} Predict y at x={at}.", str(law(at)), {"xs": xs, "at": at}

    def is_correct(self, answer: str | None, example: Example) -> bool:
        if answer is None:
            return False
        try:
            value = float(answer)
        except ValueError:
            return False
        truth = float(example.answer)
        return math.isfinite(value) and abs(value - truth) <= max(1.0, self.tolerance * abs(truth))

    def wrong_answer(self, example: Example, h: int) -> str:
        """A straight line through the last two measurements (wrong for curved laws), or a slope-sized slip."""
        truth = int(example.answer)
        pairs = [tuple(int(v.split("=")[1]) for v in m.split()) for m in
                 example.question.split("Measured: ")[1].split(".")[0].split("; ")]
        (x1, y1), (x2, y2) = pairs[-2], pairs[-1]
        slope = (y2 - y1) / (x2 - x1)
        at = example.metadata["at"]
        if at is None:  # rate: the slope between the first and last point, off, or y/x
            wrong = [truth + 1, truth - 1, round(pairs[-1][1] / max(1, pairs[-1][0]))][h % 3]
        elif h % 2 == 0:
            wrong = round(y2 + slope * (at - x2))
        else:
            wrong = truth + (int(slope) or 1) * (1 if (h >> 1) % 2 else -1)
        return str(_far(truth, int(wrong), self.tolerance))


def _far(truth: int, wrong: int, tolerance: float) -> int:
    """``wrong`` moved out of the tolerance band when it fell inside it."""
    band = max(1.0, tolerance * abs(truth))
    if abs(wrong - truth) <= band:
        return truth + math.floor(band) + 1
    return wrong


class SequenceTask(ProceduralTask, NumericTask):
    """``sequence``: the next term of an integer sequence made by a hidden rule.

    | | |
    |---|---|
    | question | ``"A hidden rule makes the sequence 3, 7, 11, 15, 19. What comes next?"`` |
    | answer | the next term: ``"The answer is 23."`` |
    | kinds | ``arithmetic`` (+d), ``geometric`` (*2 or *3), ``fibonacci`` (each term the sum of the two before), ``alternate`` (+d1, +d2, +d1, ...) |
    | difficulty | ``shown`` (terms shown, 4..7) |
    | scorer | :class:`~crl_envs.tasks.numeric.NumericTask` (the last "The answer is N.", compared exactly) |
    | blind baseline | the most common train answer (``31``) scores 0.013 |
    """

    name = "sequence"
    kinds = ("arithmetic", "geometric", "fibonacci", "alternate")

    def __init__(self, *, shown: int = 5, split: str | None = None, n: int | None = None, seed: int = 0):
        if not isinstance(shown, int) or not 4 <= shown <= 7:
            raise ConfigError(f"sequence shown must be an int in 4..7, got {shown!r}")
        self.shown = shown
        super().__init__(self.generate(split, n, seed, f"{shown}"))

    def draw(self, rng: random.Random, kind: str) -> Draw:
        k = self.shown + 1
        if kind == "arithmetic":
            start, d = rng.randint(0, 40), rng.randint(1, 12)
            terms = [start + d * i for i in range(k)]
        elif kind == "geometric":
            r = rng.choice((2, 3)) if self.shown <= 5 else 2
            start = rng.randint(1, 30 if r == 2 else 10)
            terms = [start * r**i for i in range(k)]
        elif kind == "fibonacci":
            terms = [rng.randint(1, 9), rng.randint(1, 9)]
            while len(terms) < k:
                terms.append(terms[-1] + terms[-2])
        else:
            start, d1, d2 = rng.randint(0, 20), rng.randint(1, 9), rng.randint(1, 9)
            while d2 == d1:
                d2 = rng.randint(1, 9)
            terms = [start]
            for i in range(k - 1):
                terms.append(terms[-1] + (d1 if i % 2 == 0 else d2))
        shown = ", ".join(str(t) for t in terms[:-1])
        return f"A hidden rule makes the sequence {shown}. What comes next?", str(terms[-1]), {"terms": terms}

    def wrong_answer(self, example: Example, h: int) -> str:
        """The last difference added again (right only for arithmetic rules), or a slip of one step."""
        terms = example.metadata["terms"]
        truth = terms[-1]
        last_step = terms[-2] - terms[-3]
        if h % 2 == 0:
            return str(differs(truth, terms[-2] + last_step))
        return str(differs(truth, truth + (1 if (h >> 1) % 2 else -1) * max(1, abs(last_step))))


__all__ = ["LawTask", "SequenceTask"]
