"""Tasks: ``crl_envs.tasks.load(name, split=None, n=None, seed=0, **options) -> Task``.

The procedural tasks (offline, seeded, disjoint train/test splits) by kind: :data:`TASK_KINDS`.
Register a new task with :func:`register` (a callable ``(split, n, seed, **options) -> Task``).
"""

from __future__ import annotations

from collections.abc import Callable

from crl_envs.tasks.arith import ArithTask
from crl_envs.tasks.base import Example, Task
from crl_envs.tasks.bbh import BBHTask
from crl_envs.tasks.code import CodeTask, HumanEvalTask, MBPPTask
from crl_envs.tasks.coding import PyFuncTask, PyTraceTask
from crl_envs.tasks.discovery import LawTask, SequenceTask
from crl_envs.tasks.gsm8k import GSM8KTask
from crl_envs.tasks.math import MathTask, math_equal
from crl_envs.tasks.multiple_choice import ARCChallengeTask, GPQATask, MMLUTask, MultipleChoiceTask
from crl_envs.tasks.numeric import NumericTask, extract_number, normalize_number
from crl_envs.tasks.procedural import TASK_KINDS, ProceduralTask, majority_baseline
from crl_envs.tasks.reasoning import CompareTask, LogicTask, WordProblemTask
from crl_envs.tasks.theoremqa import TheoremQATask
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import did_you_mean

_REGISTRY: dict[str, Callable[..., Task]] = {}


def register(name: str, factory: Callable[..., Task]) -> None:
    """Make ``load(name, ...)`` call ``factory(split=, n=, seed=, **options)``."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    """The registered task names, sorted (what :func:`load` takes)."""
    return sorted(_REGISTRY)


def option_names(name: str) -> list[str] | None:
    """The keyword options task ``name`` takes besides ``split``, ``n`` and ``seed`` (e.g. arith's
    ``digits``), or ``None`` when its factory takes any keyword (then they cannot be checked by name).

    Raises:
        ConfigError: ``name`` is not a registered task (the message suggests the closest).
    """
    from crl_envs.options import accepts_any_keyword, keyword_options

    factory = _factory(name)
    if accepts_any_keyword(factory):
        return None
    return [o for o in keyword_options(factory) if o not in ("split", "n", "seed")]


def _factory(name: str) -> Callable[..., Task]:
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ConfigError(f"unknown task {name!r}{did_you_mean(name, names())}; known tasks: {', '.join(names())}")
    return _REGISTRY[name]


def load(name: str, split: str | None = None, n: int | None = None, seed: int = 0, **options) -> Task:
    """Load a task by name.

    Example:
        >>> from crl_envs import tasks
        >>> t = tasks.load("arith", n=3)
        >>> len(t), t.score("The answer is " + t[0].answer, t[0])
        (3, 1.0)
    """
    from crl_envs.options import unknown_option_message
    from crl_kit.validation import check_int

    if isinstance(name, Task):
        return name
    factory = _factory(name)
    n = check_int("n", n, minimum=1, allow_none=True)
    seed = check_int("seed", seed)
    if split is not None and not isinstance(split, str):
        raise ConfigTypeError(f"split must be a str such as 'test' or 'train' (or None for the task's default), got {split!r}")
    valid = option_names(name)
    if options and valid is not None:
        unknown = [k for k in options if k not in valid]
        if unknown:
            raise ConfigError(unknown_option_message(f"task {name!r}", unknown, ["split", "n", "seed", *valid]))
    return factory(split=split, n=n, seed=seed, **options)


register("arith", ArithTask)
register("wordprob", WordProblemTask)
register("compare", CompareTask)
register("logic", LogicTask)
register("pyfunc", PyFuncTask)
register("pytrace", PyTraceTask)
register("law", LawTask)
register("sequence", SequenceTask)
register("gsm8k", GSM8KTask)
register("math", MathTask)
register("arc_challenge", ARCChallengeTask)
register("mmlu", MMLUTask)
register("gpqa", GPQATask)
register("bbh", BBHTask)
register("theoremqa", TheoremQATask)
register("humaneval", HumanEvalTask)
register("mbpp", MBPPTask)

__all__ = ["Example", "Task", "NumericTask", "ArithTask", "GSM8KTask", "load", "register", "names", "option_names",
           "extract_number", "normalize_number", "MathTask", "math_equal", "MultipleChoiceTask", "ARCChallengeTask",
           "MMLUTask", "GPQATask", "BBHTask", "TheoremQATask", "CodeTask", "HumanEvalTask", "MBPPTask",
           "ProceduralTask", "TASK_KINDS", "majority_baseline", "WordProblemTask", "CompareTask", "LogicTask",
           "PyFuncTask", "PyTraceTask", "LawTask", "SequenceTask"]
