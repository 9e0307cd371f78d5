"""``arith``: procedural integer arithmetic, unlimited verifiable examples from a seed."""

from __future__ import annotations

import hashlib
import random

from crl_envs.tasks.base import Example
from crl_envs.tasks.numeric import NumericTask
from crl_kit.errors import ConfigError
from crl_kit.validation import check_int

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
TEST_FRACTION = 5  # one question in 5 (by content hash) belongs to the test split


class ArithTask(NumericTask):
    """Questions ``"What is 47 + 85?"``, answer ``"132"``.

    Args:
        digits: operands are uniform in ``[0, 10**digits - 1]``.
        operations: any of ``"+"``, ``"-"``, ``"*"``.
        split: ``"train"`` or ``"test"``: the two are disjoint by question content.
        n: number of examples (default 200).
        seed: the example stream's seed.
    """

    name = "arith"

    def __init__(
        self,
        *,
        digits: int = 2,
        operations: str | tuple[str, ...] = ("+", "-"),
        split: str | None = None,
        n: int | None = None,
        seed: int = 0,
    ):
        split = split or "test"
        if split not in ("train", "test"):
            raise ConfigError(f"arith has splits 'train' and 'test', got {split!r}")
        check_int("arith digits", digits, minimum=1)
        if not 1 <= digits <= 9:
            raise ConfigError(f"arith digits must be in 1..9, got {digits}")
        ops = tuple(operations)
        bad = [o for o in ops if o not in OPERATIONS]
        if not ops or bad:
            raise ConfigError(f"arith operations must be a non-empty subset of {list(OPERATIONS)}, got {ops}")
        n = 200 if n is None else n
        if n < 1:
            raise ConfigError(f"n must be >= 1, got {n}")
        self.digits, self.operations, self.split, self.seed = digits, ops, split, seed
        rng = random.Random(f"arith/{digits}/{''.join(ops)}/{seed}")
        hi = 10**digits - 1
        examples, seen, drawn = [], set(), set()
        want_test = split == "test"
        space = (hi + 1) ** 2 * len(ops)
        while len(examples) < n:
            a, b, op = rng.randint(0, hi), rng.randint(0, hi), rng.choice(ops)
            key = (a, op, b)
            drawn.add(key)
            if (_content_bucket(key) == 0) != want_test or key in seen:
                if len(drawn) >= space:  # every question drawn: the split has fewer than n
                    raise ConfigError(f"arith cannot make {n} distinct {split} questions with {digits} digits")
                continue
            seen.add(key)
            examples.append(
                Example(
                    id=f"{split}-{len(examples)}",
                    question=f"What is {a} {op} {b}?",
                    answer=str(OPERATIONS[op](a, b)),
                    metadata={"a": a, "b": b, "op": op},
                )
            )
        super().__init__(examples)

    @property
    def fingerprint(self) -> str:
        return f"arith:d{self.digits}:{''.join(self.operations)}:{self.split}:s{self.seed}"


def _content_bucket(key: tuple) -> int:
    # a real hash: a linear one mod 5 put every question with some units-digit pairs (7 + 5, ...) in test
    a, op, b = key
    digest = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % TEST_FRACTION
