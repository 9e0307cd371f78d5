"""Tasks: ``crl_envs.tasks.load(name, split=None, n=None, seed=0, **options) -> Task``.

Register a new task with :func:`register` (a callable ``(split, n, seed, **options) -> Task``).
"""

from __future__ import annotations

from collections.abc import Callable

from crl_envs.tasks.arith import ArithTask
from crl_envs.tasks.base import Example, Task
from crl_envs.tasks.bbh import BBHTask
from crl_envs.tasks.code import CodeTask, HumanEvalTask, MBPPTask
from crl_envs.tasks.gsm8k import GSM8KTask
from crl_envs.tasks.math import MathTask, math_equal
from crl_envs.tasks.multiple_choice import ARCChallengeTask, GPQATask, MMLUTask, MultipleChoiceTask
from crl_envs.tasks.numeric import NumericTask, extract_number, normalize_number
from crl_envs.tasks.theoremqa import TheoremQATask

_REGISTRY: dict[str, Callable[..., Task]] = {}


def register(name: str, factory: Callable[..., Task]) -> None:
    """Make ``load(name, ...)`` call ``factory(split=, n=, seed=, **options)``."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    return sorted(_REGISTRY)


def load(name: str, split: str | None = None, n: int | None = None, seed: int = 0, **options) -> Task:
    """Load a task by name.

    Example:
        >>> from crl_envs import tasks
        >>> t = tasks.load("arith", n=3)
        >>> len(t), t.score("The answer is " + t[0].answer, t[0])
        (3, 1.0)
    """
    if isinstance(name, Task):
        return name
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(names())}")
    return _REGISTRY[name](split=split, n=n, seed=seed, **options)


register("arith", ArithTask)
register("gsm8k", GSM8KTask)
register("math", MathTask)
register("arc_challenge", ARCChallengeTask)
register("mmlu", MMLUTask)
register("gpqa", GPQATask)
register("bbh", BBHTask)
register("theoremqa", TheoremQATask)
register("humaneval", HumanEvalTask)
register("mbpp", MBPPTask)

__all__ = ["Example", "Task", "NumericTask", "ArithTask", "GSM8KTask", "load", "register", "names",
           "extract_number", "normalize_number", "MathTask", "math_equal", "MultipleChoiceTask", "ARCChallengeTask",
           "MMLUTask", "GPQATask", "BBHTask", "TheoremQATask", "CodeTask", "HumanEvalTask", "MBPPTask"]
