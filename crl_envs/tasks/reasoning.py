"""Procedural reasoning tasks: ``wordprob`` (GSM-shaped word problems), ``compare`` (multiple choice
with letter answers) and ``logic`` (BBH-shaped boolean and modular expressions). ``arith`` is the
fourth (:mod:`crl_envs.tasks.arith`)."""

from __future__ import annotations

import random

from crl_envs.tasks.base import Example
from crl_envs.tasks.bbh import bbh_equal, extract_bbh_answer
from crl_envs.tasks.multiple_choice import LETTERS, MultipleChoiceTask
from crl_envs.tasks.numeric import NumericTask
from crl_envs.tasks.procedural import Draw, ProceduralTask, differs
from crl_kit.errors import ConfigError

NAMES = ("Ann", "Ben", "Cal", "Dee", "Eve", "Finn", "Gus", "Hana", "Ivy", "Jo", "Kai", "Lea", "Max", "Noa")
ITEMS = ("apple", "book", "coin", "shell", "card", "stamp", "marble", "pencil", "sticker", "cookie")
_ADD = ("{who} buys {n} more.", "{who} finds {n} more.", "A friend gives {obj} {n} more.", "{who} wins {n} more.")
_SUB = ("{who} gives away {n}.", "{who} loses {n}.", "{who} sells {n}.", "{who} uses {n}.")
_TIMES = {2: "Then the number of {item}s doubles.", 3: "Then the number of {item}s triples."}


class WordProblemTask(ProceduralTask, NumericTask):
    """``wordprob``: multi-step word problems from templates, GSM8K-shaped, with a numeric answer.

    | | |
    |---|---|
    | question | ``"Ann has 23 shells. She finds 15 more. She gives away 8. How many shells does Ann have now?"`` |
    | answer | the final count, an integer in 0..199: ``"The answer is 30."`` |
    | kinds | ``add`` (every step adds), ``sub`` (every step takes away), ``mixed`` (both), ``times`` (a doubling or tripling) |
    | difficulty | ``steps`` (changes after the start, 1..4), ``max_value`` (largest starting count / change) |
    | scorer | :class:`~crl_envs.tasks.numeric.NumericTask`: the last "The answer is N." (or boxed, ####, last result), compared numerically |
    | blind baseline | the most common train answer (``1``) scores 0.070 on 300 test questions (``benchmarks/procedural_baselines.py``) |
    """

    name = "wordprob"
    kinds = ("add", "sub", "mixed", "times")

    def __init__(self, *, steps: int = 2, max_value: int = 40, split: str | None = None, n: int | None = None,
                 seed: int = 0):
        if not isinstance(steps, int) or not 1 <= steps <= 4:
            raise ConfigError(f"wordprob steps must be an int in 1..4, got {steps!r}")
        if not isinstance(max_value, int) or not 5 <= max_value <= 99:
            raise ConfigError(f"wordprob max_value must be an int in 5..99, got {max_value!r}")
        self.steps, self.max_value = steps, max_value
        super().__init__(self.generate(split, n, seed, f"{steps}/{max_value}"))

    def draw(self, rng: random.Random, kind: str) -> Draw:
        while True:  # until the problem is of the asked kind and its answer at most 199
            name, item = rng.choice(NAMES), rng.choice(ITEMS)
            who, obj = ("She", "her") if NAMES.index(name) % 2 == 0 else ("He", "him")
            value = rng.randint(2, self.max_value)
            sentences = [f"{name} has {value} {item}s."]
            ops: list[tuple[str, int]] = []
            for _ in range(self.steps):
                op = rng.choice(("+", "-", "+", "-", "*")) if value <= 60 else rng.choice(("+", "-", "-"))
                if op == "*" and not any(o == "*" for o, _ in ops):
                    k = rng.choice((2, 3)) if value <= 30 else 2
                    sentences.append(_TIMES[k].format(item=item))
                    value *= k
                    ops.append(("*", k))
                elif op == "-" and value > 1:
                    k = rng.randint(1, min(value - 1, self.max_value))
                    sentences.append(rng.choice(_SUB).format(who=who, n=k))
                    value -= k
                    ops.append(("-", k))
                else:
                    k = rng.randint(1, self.max_value)
                    sentences.append(rng.choice(_ADD).format(who=who, obj=obj, n=k))
                    value += k
                    ops.append(("+", k))
            done = {o for o, _ in ops}
            drawn = "times" if "*" in done else "add" if done == {"+"} else "sub" if done == {"-"} else "mixed"
            if value <= 199 and drawn == kind:
                break
        sentences.append(f"How many {item}s does {name} have now?")
        return " ".join(sentences), str(value), {"ops": ops}

    def wrong_answer(self, example: Example, h: int) -> str:
        """A step applied the wrong way round, a step dropped, or an arithmetic slip of 1 or 10."""
        ops = example.metadata["ops"]
        truth = int(example.answer)
        start = int(example.question.split(" has ")[1].split(" ")[0])
        choice, step = h % 4, (h >> 2) % len(ops)
        value = start
        for i, (op, k) in enumerate(ops):
            if choice == 0 and i == step:  # the wrong operation
                op = {"+": "-", "-": "+", "*": "+"}[op]
            if choice == 1 and i == step:  # a step forgotten
                continue
            value = value + k if op == "+" else value - k if op == "-" else value * k
        if choice == 2:
            value = truth + (1 if (h >> 4) % 2 else -1)
        if choice == 3:
            value = truth + (10 if (h >> 4) % 2 else -10)
        return str(differs(truth, value))


_COMPARATIVES = (("taller", "shorter", "tallest", "shortest"), ("older", "younger", "oldest", "youngest"),
                 ("faster", "slower", "fastest", "slowest"), ("heavier", "lighter", "heaviest", "lightest"))


class CompareTask(ProceduralTask, MultipleChoiceTask):
    """``compare``: multiple choice with letter answers: comparisons of numbers and orderings of people.

    | | |
    |---|---|
    | question | ``"Which number is the largest?"`` + options ``A) 47`` ... or ``"Ann is taller than Ben. Cal is shorter than Ben. Who is the tallest?"`` + options |
    | answer | an option letter: ``"The answer is (B)."`` |
    | kinds | ``largest``, ``smallest`` (of ``options`` two-digit numbers), ``order`` (three people, two relations, asks for an extreme) |
    | difficulty | ``options`` (2..6 numbers to compare); ``order`` questions always have 3 options |
    | scorer | :func:`~crl_envs.tasks.multiple_choice.extract_letter` ("The answer is (B)", "Answer: B", a lone "B", ...) |
    | blind baseline | chance is 1/options (1/3 for order): 0.278; the most common train letter (``B``) scores 0.277 |
    """

    name = "compare"
    kinds = ("largest", "smallest", "order")

    def __init__(self, *, options: int = 4, split: str | None = None, n: int | None = None, seed: int = 0):
        if not isinstance(options, int) or not 2 <= options <= 6:
            raise ConfigError(f"compare options must be an int in 2..6, got {options!r}")
        self.options = options
        super().__init__(self.generate(split, n, seed, f"{options}"))

    def draw(self, rng: random.Random, kind: str) -> Draw:
        if kind == "order":
            people = rng.sample(NAMES, 3)  # in order, first is the most (tallest, ...)
            more, less, most, least = rng.choice(_COMPARATIVES)
            facts = []
            for a, b in ((people[0], people[1]), (people[1], people[2])):
                facts.append(f"{a} is {more} than {b}." if rng.random() < 0.5 else f"{b} is {less} than {a}.")
            rng.shuffle(facts)
            ask_most = rng.random() < 0.5
            target = people[0] if ask_most else people[2]
            options = list(people)
            rng.shuffle(options)
            question = " ".join(facts) + f" Who is the {most if ask_most else least}?"
        else:
            options = [str(v) for v in rng.sample(range(10, 100), self.options)]
            target = max(options, key=int) if kind == "largest" else min(options, key=int)
            question = f"Which number is the {kind}?"
        correct = options.index(target)
        prompt = question + "\n" + " ".join(f"{LETTERS[i]}) {o}" for i, o in enumerate(options))
        return prompt, LETTERS[correct], {"options": options, "question_only": question}

    def prompt(self, example: Example) -> str:
        return example.question

    def wrong_answer(self, example: Example, h: int) -> str:
        """Another option: for numbers the runner-up; for order, the one in the middle or the other end."""
        options = example.metadata["options"]
        right = LETTERS.index(example.answer)
        others = [i for i in range(len(options)) if i != right]
        if example.metadata["kind"] != "order" and h % 2 == 0:
            ranked = sorted(range(len(options)), key=lambda i: int(options[i]),
                            reverse=example.metadata["kind"] == "largest")
            return LETTERS[ranked[1]]
        return LETTERS[others[(h >> 1) % len(others)]]

    def reply(self, example: Example) -> str:
        return f"The answer is ({example.answer})."

    def wrong_reply(self, example: Example, h: int) -> str:
        return f"The answer is ({self.wrong_answer(example, h)})."


class LogicTask(ProceduralTask):
    """``logic``: evaluate a boolean expression (BBH ``boolean_expressions``-shaped) or a modular sum.

    | | |
    |---|---|
    | question | ``"Evaluate: not ( True and False ) or False"`` / ``"Evaluate: ( 7 + 12 ) mod 5"`` |
    | answer | ``True`` / ``False``, or the residue (an integer): ``"The answer is True."`` |
    | kinds | ``flat`` (and/or, no parentheses), ``not`` (a negation, no parentheses), ``nested`` (parentheses), ``mod`` (a sum mod 3..9) |
    | difficulty | ``terms`` (most literals in a boolean expression, 2..5; each has 2..terms) |
    | scorer | BBH's: the last "answer is X", else the last line; case, a trailing period and "(True)" forgiven; numbers compared numerically |
    | blind baseline | the most common train answer (``True``) scores 0.393; chance 0.350 (1/2 on the boolean kinds) |
    """

    name = "logic"
    kinds = ("flat", "not", "nested", "mod")
    instruction = "Evaluate the expression. End your response with 'The answer is X.'"

    def __init__(self, *, terms: int = 4, split: str | None = None, n: int | None = None, seed: int = 0):
        if not isinstance(terms, int) or not 2 <= terms <= 5:
            raise ConfigError(f"logic terms must be an int in 2..5, got {terms!r}")
        self.terms = terms
        super().__init__(self.generate(split, n, seed, f"{terms}"))
        self.chance = sum(0.5 for e in self.examples if e.metadata["kind"] != "mod") / len(self.examples)

    def draw(self, rng: random.Random, kind: str) -> Draw:
        if kind == "mod":
            a, b, m = rng.randint(0, 19), rng.randint(0, 19), rng.randint(3, 9)
            return f"Evaluate: ( {a} + {b} ) mod {m}", str((a + b) % m), {}
        size = rng.randint(2, self.terms)
        literals = [rng.random() < 0.5 for _ in range(size)]
        ops = [rng.choice(("and", "or")) for _ in range(size - 1)]
        negated = [False] * size
        if kind == "not":
            negated[rng.randrange(size)] = True
        tokens = [("not " if neg else "") + str(v) for v, neg in zip(literals, negated)]
        values = [v != neg for v, neg in zip(literals, negated)]
        if kind == "nested":
            # parentheses around a pair, possibly negated: "not ( A or B ) and C"
            i = rng.randrange(size - 1)
            inner = values[i] and values[i + 1] if ops[i] == "and" else values[i] or values[i + 1]
            neg = rng.random() < 0.5
            tokens[i : i + 2] = [("not " if neg else "") + f"( {tokens[i]} {ops[i]} {tokens[i + 1]} )"]
            values[i : i + 2] = [inner != neg]
            del ops[i]
        value = _and_before_or(values, ops)
        expression = tokens[0] + "".join(f" {op} {t}" for op, t in zip(ops, tokens[1:]))
        return f"Evaluate: {expression}", str(value), {}

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        return extract_bbh_answer(text, finish_reason)

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return bbh_equal(answer, example.answer)

    def wrong_answer(self, example: Example, h: int) -> str:
        if example.metadata["kind"] == "mod":
            m = int(example.question.rsplit(" ", 1)[1])
            return str((int(example.answer) + 1 + h % (m - 1)) % m)
        return "False" if example.answer == "True" else "True"


def _and_before_or(values: list[bool], ops: list[str]) -> bool:
    """Python's precedence: ``and`` binds tighter than ``or``."""
    groups, current = [], values[0]
    for op, v in zip(ops, values[1:]):
        if op == "and":
            current = current and v
        else:
            groups.append(current)
            current = v
    groups.append(current)
    return any(groups)


__all__ = ["WordProblemTask", "CompareTask", "LogicTask"]
