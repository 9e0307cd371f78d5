"""The Python version pyproject.toml declares (``requires-python``) runs the code: every standard-library
module the project imports exists at that floor, and ruff's target and the README say the same version."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Standard-library modules newer than 3.9, with the version that added them ("What's New in Python").
ADDED: dict[str, tuple[int, int]] = {
    "tomllib": (3, 11),
    "wsgiref.types": (3, 11),
    "annotationlib": (3, 14),
    "compression": (3, 14),
    "string.templatelib": (3, 14),
    "concurrent.interpreters": (3, 14),
}


def declared_floor() -> tuple[int, int]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec.strip())
    assert match, f"requires-python {spec!r} is not of the form '>=X.Y'"
    return int(match.group(1)), int(match.group(2))


def imported_modules() -> dict[str, str]:
    """``module -> where`` for every module imported by the project's packages (wherever the import stands)."""
    found: dict[str, str] = {}
    for package in sorted(p.parent for p in ROOT.glob("*/__init__.py")):
        for path in sorted(package.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                for name in names:
                    found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_stdlib_imports_exist_at_the_declared_floor():
    floor = declared_floor()
    imported = imported_modules()
    newer = {m: (ADDED[m], where) for m, where in imported.items() if m in ADDED}
    assert "tomllib" in newer  # the study reads its TOML configs with it: what sets today's floor
    too_new = {m: f"{where} needs {v[0]}.{v[1]}" for m, (v, where) in newer.items() if v > floor}
    assert not too_new, (f"requires-python >={floor[0]}.{floor[1]}, but the code imports newer standard-library "
                         f"modules: {too_new}; raise the floor or use a fallback")


def test_ruff_target_and_readme_name_the_floor():
    major, minor = declared_floor()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert f"Python {major}.{minor}" in (ROOT / "README.md").read_text()
