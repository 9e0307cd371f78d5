"""Procedural coding tasks: ``pyfunc`` (write a short Python function; held-out asserts run in the
sandbox) and ``pytrace`` (say what a short program prints)."""

from __future__ import annotations

import random

from crl_envs.tasks.base import Example
from crl_envs.tasks.code import CodeTask
from crl_envs.tasks.numeric import NumericTask
from crl_envs.tasks.procedural import Draw, ProceduralTask, differs
from crl_kit.errors import ConfigError

_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def _function(kind: str, rng: random.Random) -> tuple[str, str, callable]:
    """(description, body expression, the function in Python) of one function of ``kind``."""
    if kind == "linear":
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        return f"returns x times {a} plus {b}", f"x * {a} + {b}", lambda x: x * a + b
    if kind == "mod":
        m = rng.randint(2, 9)
        return f"returns the remainder of x divided by {m}", f"x % {m}", lambda x: x % m
    if kind == "clip":
        c = rng.randint(1, 20)
        if rng.random() < 0.5:
            return f"returns the larger of x and {c}", f"max(x, {c})", lambda x: max(x, c)
        return f"returns the smaller of x and {c}", f"min(x, {c})", lambda x: min(x, c)
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    while b == a:
        b = rng.randint(0, 9)
    return (f"returns {a} if x is even, otherwise {b}", f"{a} if x % 2 == 0 else {b}",
            lambda x: a if x % 2 == 0 else b)


class PyFuncTask(ProceduralTask, CodeTask):
    """``pyfunc``: write a short Python function from a description and two examples; scored by four
    held-out asserts run in :mod:`crl_envs.sandbox` (the code never runs outside it).

    | | |
    |---|---|
    | question | ``"Write a Python function f(x) that returns x times 3 plus 2. Examples: f(1) == 5, f(4) == 14."`` |
    | answer | a program defining ``f``, best in a fenced block: ````` ```python\\ndef f(x):\\n    return x * 3 + 2\\n``` ````` |
    | kinds | ``linear`` (a*x + b), ``mod`` (x % m), ``clip`` (max/min with a constant), ``parity`` (a value for even x, another for odd) |
    | difficulty | ``held_out`` (asserts that decide the score, 1..8, on inputs the examples do not show) |
    | scorer | :func:`~crl_envs.tasks.code.extract_code` (the last fenced block, else the text), then every held-out assert must pass in the sandbox |
    | blind baseline | the most common train program (``return x % 3``) passes 0.053 of 300 test questions |
    """

    name = "pyfunc"
    kinds = ("linear", "mod", "clip", "parity")
    instruction = "Write the Python function. Put the code in a single ```python code block."

    def __init__(self, *, held_out: int = 4, split: str | None = None, n: int | None = None, seed: int = 0,
                 timeout: float = 10.0, unsafe_guard_only: bool = False):
        if not isinstance(held_out, int) or not 1 <= held_out <= 8:
            raise ConfigError(f"pyfunc held_out must be an int in 1..8, got {held_out!r}")
        self.held_out = held_out
        super().__init__(self.generate(split, n, seed, f"{held_out}"), timeout=timeout,
                         unsafe_guard_only=unsafe_guard_only)

    def draw(self, rng: random.Random, kind: str) -> Draw:
        description, body, fn = _function(kind, rng)
        xs = rng.sample(range(-5, 30), 2 + self.held_out)
        shown, hidden = xs[:2], xs[2:]
        examples = ", ".join(f"f({x}) == {fn(x)}" for x in shown)
        question = f"Write a Python function f(x) that {description}. Examples: {examples}."
        tests = [f"assert f({x}) == {fn(x)}" for x in hidden]
        return question, f"def f(x):\n    return {body}", {"tests": tests, "body": body}

    def prompt(self, example: Example) -> str:
        return example.question

    def harness(self, code: str, example: Example) -> tuple[str, str]:
        return f"{code}\n", "\n".join(example.metadata["tests"]) + "\n"

    def reply(self, example: Example) -> str:
        return f"```python\n{example.answer}\n```"

    def wrong_answer(self, example: Example, h: int) -> str:
        """A constant off by one, the wrong operator or function, a missing ``return``, or a syntax slip."""
        body = example.metadata["body"]
        choice = h % 4
        if choice == 0:  # a constant off by one
            digits = [i for i, ch in enumerate(body) if ch.isdigit()]
            i = digits[(h >> 2) % len(digits)]
            wrong = body[:i] + str((int(body[i]) + 1) % 10) + body[i + 1 :]
        elif choice == 1:  # the wrong operator or function
            swaps = (("*", "+"), ("%", "//"), ("max", "min"), ("min", "max"), ("==", "!="))
            old, new = next(((o, n) for o, n in swaps if o in body), ("x", "x + 1"))
            wrong = body.replace(old, new, 1)
        elif choice == 2:
            return f"def f(x):\n    {body}"  # no return: f gives None
        else:
            return f"def f(x):\n    return {body} +"  # a syntax error
        if wrong == body:
            wrong = body + " + 1"
        return f"def f(x):\n    return {wrong}"

    def wrong_reply(self, example: Example, h: int) -> str:
        return f"```python\n{self.wrong_answer(example, h)}\n```"

    @property
    def fingerprint(self) -> str:
        return f"{self.name}:{self.settings}:{self.split}:s{self.seed}:t{self.timeout}"


class PyTraceTask(ProceduralTask, NumericTask):
    """``pytrace``: say what a short Python program prints (code reasoning, CRUXEval-shaped).

    | | |
    |---|---|
    | question | ``"What does this program print?\\nx = 4\\nfor i in range(3):\\n    x = x + 2\\nprint(x)"`` |
    | answer | the printed integer: ``"The answer is 10."`` |
    | kinds | ``assign`` (straight-line assignments), ``loop`` (a loop adding a constant), ``sum`` (a loop adding its counter), ``branch`` (an if/else on the value) |
    | difficulty | ``max_value`` (largest constant), loops run 2..``max_loops`` times |
    | scorer | :class:`~crl_envs.tasks.numeric.NumericTask` (the last "The answer is N.", compared numerically) |
    | blind baseline | the most common train answer (``6``) scores 0.067 |

    The reference answer is computed from the program's structure, not by running it; the tests check
    it against Python's own ``exec``.
    """

    name = "pytrace"
    kinds = ("assign", "loop", "sum", "branch")

    def __init__(self, *, max_value: int = 9, max_loops: int = 4, split: str | None = None, n: int | None = None,
                 seed: int = 0):
        if not isinstance(max_value, int) or not 2 <= max_value <= 50:
            raise ConfigError(f"pytrace max_value must be an int in 2..50, got {max_value!r}")
        if not isinstance(max_loops, int) or not 2 <= max_loops <= 9:
            raise ConfigError(f"pytrace max_loops must be an int in 2..9, got {max_loops!r}")
        self.max_value, self.max_loops = max_value, max_loops
        super().__init__(self.generate(split, n, seed, f"{max_value}/{max_loops}"))

    def draw(self, rng: random.Random, kind: str) -> Draw:
        v = self.max_value
        x = rng.randint(0, v)
        if kind == "assign":
            a, b = rng.randint(1, v), rng.randint(2, 3)
            op = rng.choice(("+", "-"))
            y = x + a if op == "+" else x - a
            lines = [f"x = {x}", f"y = x {op} {a}", f"x = y * {b}", "print(x)"]
            value, meta = y * b, {"slip": y}
        elif kind == "loop":
            k, a = rng.randint(2, self.max_loops), rng.randint(1, v)
            lines = [f"x = {x}", f"for i in range({k}):", f"    x = x + {a}", "print(x)"]
            value, meta = x + k * a, {"slip": x + (k - 1) * a}
        elif kind == "sum":
            k = rng.randint(2, self.max_loops + 1)
            lines = [f"s = {x}", f"for i in range({k}):", "    s = s + i", "print(s)"]
            value, meta = x + k * (k - 1) // 2, {"slip": x + k * (k + 1) // 2}
        else:
            c, a, b = rng.randint(0, v), rng.randint(1, v), rng.randint(1, v)
            lines = [f"x = {x}", f"if x > {c}:", f"    x = x - {a}", "else:", f"    x = x + {b}", "print(x)"]
            value, meta = (x - a if x > c else x + b), {"slip": x + b if x > c else x - a}
        program = "\n".join(lines)
        return f"What does this program print?\n{program}", str(value), {"program": program, **meta}

    def wrong_answer(self, example: Example, h: int) -> str:
        """The typical misreading (one loop pass too few or many, the other branch, a skipped line), or off by one."""
        truth = int(example.answer)
        if h % 3:
            return str(differs(truth, int(example.metadata["slip"])))
        return str(differs(truth, truth + (1 if (h >> 2) % 2 else -1)))


__all__ = ["PyFuncTask", "PyTraceTask"]
