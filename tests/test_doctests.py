"""Every docstring example of the project's packages runs (as Gymnasium runs ``pytest --doctest-modules``):
one test per module that has examples, found by reading every module of ``crl_envs``, ``agents`` and
``trainers``. An example that cannot run here says why on its line (``# doctest: +SKIP`` and a reason:
it needs the hub or a GPU)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("crl_envs", "agents", "trainers", "crl_kit")
#: Files that are not modules of the library: the programs sent into the sandbox as text.
NOT_MODULES = ("crl_envs/sandbox/inside/",)
#: Modules whose examples need an optional extra: ``module -> the import it needs``.
NEEDS = {"trainers.sb3": "sb3_contrib"}


def modules_with_examples() -> list[str]:
    """Dotted names of the packages' modules whose source holds a ``>>>`` example."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(NOT_MODULES) or ">>> " not in path.read_text():
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


MODULES = modules_with_examples()


def test_examples_are_found():
    assert len(MODULES) >= 20 and "crl_envs.protocols.roles" in MODULES and "agents.sampling" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name in NEEDS:  # CI installs every extra (README's test command), so there they run
        pytest.importorskip(NEEDS[name], reason=f"{name}'s examples need {NEEDS[name]}")
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(verbose=False)
    report: list[str] = []
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    for test in tests:
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    skipped = [e for t in tests for e in t.examples if e.options.get(doctest.SKIP)]
    assert results.attempted + len(skipped) == sum(len(t.examples) for t in tests) > 0, f"{name}: examples not found"
    assert results.failed == 0, "".join(report)


def test_a_failing_example_fails():
    """What the test above rests on: a wrong output is reported, a skipped example is not run."""

    def f():
        """
        >>> 1 + 1
        3
        >>> raise SystemExit  # doctest: +SKIP
        """

    runner, report = doctest.DocTestRunner(verbose=False), []
    for test in doctest.DocTestFinder().find(f, "f"):
        runner.run(test, out=report.append)
    assert tuple(runner.summarize(verbose=False)) == (1, 1) and "Expected:\n    3" in "".join(report)
