"""``gsm8k``: grade-school math word problems (Cobbe et al. 2021), loaded with ``datasets``."""

from __future__ import annotations

import random

from crl_envs.tasks.base import Example
from crl_envs.tasks.hub import load_rows
from crl_envs.tasks.numeric import NumericTask, extract_number
from crl_kit.errors import ConfigError

HUB_ID = "openai/gsm8k"


class GSM8KTask(NumericTask):
    """GSM8K. The reference is the number after ``####`` in the gold solution.

    Args:
        split: ``"test"`` (default) or ``"train"``.
        n: subsample ``n`` examples (seeded); all when ``None``.
        seed: subsampling seed.
        path: a local JSONL (or JSON/Parquet/CSV) file with ``question``/``answer`` fields; the hub is used otherwise.
    """

    name = "gsm8k"

    def __init__(self, *, split: str | None = None, n: int | None = None, seed: int = 0, path: str | None = None):
        split = split or "test"
        rows = load_rows(self.name, hub_id=HUB_ID, config="main", split=split, path=path, required=("question", "answer"))
        examples = []
        for i, row in enumerate(rows):
            reference = extract_number(row["answer"].split("####")[-1])
            if reference is None:
                raise ConfigError(f"gsm8k row {i}: no final '#### N' in its answer")
            examples.append(
                Example(id=f"{split}-{i}", question=row["question"], answer=reference, metadata={"solution": row["answer"]})
            )
        if n is not None:
            if n < 1:
                raise ConfigError(f"n must be >= 1, got {n}")
            examples = random.Random(seed).sample(examples, min(n, len(examples)))
        self.split, self.source = split, path or HUB_ID
        super().__init__(examples)

    @property
    def fingerprint(self) -> str:
        return f"gsm8k:{self.source}:{self.split}"
