"""The layers of docs/DESIGN.md ("Layers"), held to the code.

Every import of every module of the project's packages is read with ``ast``: at module level, inside
functions (lazy imports hide a circle from Python, not from the reader) and under ``if TYPE_CHECKING:``
(they are dependencies of the reader and of the type checker: a lower layer that names an upper layer's
type knows that layer). The test fails on (a) an import cycle among the project's modules and (b) an
import that points up the layer order, naming the edge, its file and line.

Not read: imports by a string (``importlib.import_module``, the CLI's ``PLUGINS``, PEP 562 tables, the
protocol factories the roster's table names); a facade names its other lazy exports under
``TYPE_CHECKING``, which is read. Implicit imports of a module's parent packages are not edges (Python
runs them for every import); an explicit ``from pkg import name`` is an edge to ``pkg`` unless ``pkg.name`` is a module, then to that module.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: ``layer -> (rank, module patterns)``: the one place to edit. A module may import its own layer and the
#: layers of lower rank; layers of equal rank are independent (neither imports the other). The longest
#: pattern that matches a module places it (``fnmatch``: ``agents.*`` is every module under ``agents``).
LAYERS: dict[str, tuple[int, tuple[str, ...]]] = {
    # the library's error types and shared checks (check_int, did_you_mean): every layer may import them
    "errors": (-1, ("crl_kit", "crl_kit.*")),
    "options": (0, ("crl_envs.options",)),
    "stats": (0, ("crl_envs.stats", "crl_envs.sequential")),  # numpy/scipy only: the verdicts' statistics
    # numpy only: the estimators and their weights, which valuation and the trainers' credit both use
    "estimators": (0, ("crl_envs.valuation.estimators",)),
    "tracking": (0, ("crl_envs.tracking",)),  # experiment trackers (TensorBoard, MLflow, trackio, W&B)
    "sandbox": (0, ("crl_envs.sandbox", "crl_envs.sandbox.*")),
    "backends": (0, ("agents", "agents.*")),
    "tasks": (1, ("crl_envs.tasks", "crl_envs.tasks.*")),
    # the learner's credit (coalitions, reward, episodes per question), on the estimators' weights: the trainers,
    # the TRL rollout and the seat all ask it
    "credit": (1, ("crl_envs.valuation.credit",)),
    "protocols": (2, ("crl_envs.protocols", "crl_envs.protocols.*", "crl_envs.roster", "crl_envs.spaces",
                      "crl_envs.wrappers")),
    "runner": (3, ("crl_envs.runner",)),
    "valuation": (4, ("crl_envs.valuation", "crl_envs.valuation.*")),
    "trainers": (4, ("trainers", "trainers.*")),
    "study": (5, ("crl_envs.study", "crl_envs.study.*")),
    "integrations": (5, ("crl_envs.integrations", "crl_envs.integrations.*", "crl_envs_seat")),  # TRL, OpenEnv, verifiers
    "interface": (6, ("crl_envs", "crl_envs.commands", "crl_envs.commands.*")),
    "tools": (7, ("tools", "tools.*")),  # the zoo's builders: a checkout's tools, not in the installed package
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    path: str
    line: int
    kind: str  # "module level", "lazy" (inside a function) or "TYPE_CHECKING"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line}, {self.kind})"


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """``dotted name -> file`` for every module of the top-level packages (directories with ``__init__.py``)."""
    modules = {}
    for package in sorted(p.parent for p in root.glob("*/__init__.py")):
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_with_kind(tree: ast.AST):
    """``(node, kind)`` for every import statement, wherever it stands."""

    def visit(node: ast.AST, kind: str):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                yield from visit(stmt, "TYPE_CHECKING")
            for stmt in node.orelse:
                yield from visit(stmt, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "module level":
            kind = "lazy"
        for child in ast.iter_child_nodes(node):
            yield from visit(child, kind)

    yield from visit(tree, "module level")


def read_imports(modules: dict[str, Path], root: Path = ROOT) -> list[Import]:
    """Every import among ``modules``, one :class:`Import` per (statement, target module)."""

    def deepest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node, kind in _imports_with_kind(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [deepest(alias.name) for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [deepest(f"{module}.{alias.name}") for alias in node.names]
            for target in dict.fromkeys(targets):
                if target is not None and target != source:
                    found.append(Import(source, target, str(path.relative_to(root)), node.lineno, kind))
    return found


def layer_of(module: str) -> str | None:
    """The layer whose longest pattern matches ``module``."""
    best = None
    for layer, (_rank, patterns) in LAYERS.items():
        for pattern in patterns:
            if fnmatch.fnmatchcase(module, pattern) and (best is None or len(pattern) > best[1]):
                best = (layer, len(pattern))
    return best[0] if best else None


def layer_breaks(imports: list[Import]) -> list[str]:
    """The imports that point up the layer order or across layers of equal rank."""
    out = []
    for imp in imports:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src == dst or src is None or dst is None:
            continue
        if LAYERS[dst][0] >= LAYERS[src][0]:
            out.append(f"{imp}: layer {src!r} (rank {LAYERS[src][0]}) may not import {dst!r} (rank {LAYERS[dst][0]})")
    return out


def import_cycles(imports: list[Import]) -> list[list[Import]]:
    """The shortest cycle through each module that is on one (Tarjan's components, then a BFS per
    module), each cycle once, shortest first."""
    graph: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in imports:
        graph[imp.source].setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # recursive Tarjan: the graph has ~100 nodes
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    cycles: dict[frozenset[tuple[str, str]], list[Import]] = {}
    for component in components:
        for node in sorted(component):  # the shortest cycle through each member, each cycle once
            cycle = _cycle_through(node, component, graph)
            cycles.setdefault(frozenset((i.source, i.target) for i in cycle), cycle)
    return sorted(cycles.values(), key=lambda c: (len(c), [i.source for i in c]))


def _cycle_through(start: str, component: set[str], graph: dict[str, dict[str, Import]]) -> list[Import]:
    """The shortest cycle from ``start`` back to it, within ``component``, as its imports."""
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                chain.reverse()  # start ... node
                return [graph[a][b] for a, b in zip(chain, [*chain[1:], start])]
            if nxt in component and nxt not in seen:
                seen.add(nxt)
                parent[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover  (a component of 2+ has one)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return read_imports(project_modules())


def test_every_module_has_a_layer():
    unplaced = [m for m in project_modules() if layer_of(m) is None]
    assert not unplaced, f"modules in no layer: {unplaced}; add a pattern to LAYERS in tests/test_layers.py"


def describe_cycles(cycles: list[list[Import]], shown: int = 8) -> str:
    """The edges that most cycles share (breaking one breaks them all), then the cycles themselves."""
    if not cycles:
        return "no import cycle"
    on = Counter(imp for cycle in cycles for imp in cycle)
    lines = [f"{len(cycles)} import cycle(s) among the project's modules; the imports on most of them:"]
    lines += [f"  {imp}: on {count} of {len(cycles)}" for imp, count in on.most_common(3)]
    for cycle in cycles[:shown]:
        hops = " -> ".join(f"{i.target} [{i.path}:{i.line}, {i.kind}]" for i in cycle)
        lines.append(f"cycle: {cycle[0].source} -> {hops}")
    if len(cycles) > shown:
        lines.append(f"... and {len(cycles) - shown} longer cycle(s)")
    return "\n".join(lines)


def test_no_import_cycle(imports):
    cycles = import_cycles(imports)
    assert not cycles, describe_cycles(cycles)


def test_imports_follow_the_layer_order(imports):
    breaks = layer_breaks(imports)
    assert not breaks, f"{len(breaks)} import(s) against the layer order (docs/DESIGN.md, Layers):\n" + "\n".join(breaks)


def test_integrations_import_nothing_from_trainers(imports):
    """The seat's credit comes from the estimators' module (#52): TRL, OpenEnv and verifiers serve the runner's
    episodes, and do not depend on the trainers (which depend on the same runner)."""
    edges = [str(i) for i in imports if layer_of(i.source) == "integrations" and layer_of(i.target) == "trainers"]
    assert not edges, "integrations import trainers:\n" + "\n".join(edges)


# ---- the reader and the checks, on a small package written here (each can fail) ----
def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return project_modules(root)


def test_reader_sees_lazy_type_checking_and_relative_imports(tmp_path):
    modules = write_package(tmp_path, {
        "pkg/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg/a.py": "import os\nfrom . import b\n\ndef f():\n    from pkg.c import g\n",
        "pkg/b.py": "from pkg import c as _c\nimport pkg.c.nothing_here\n",
        "pkg/c.py": "x = 1\n",
    })
    got = {(i.source, i.target, i.kind, i.line) for i in read_imports(modules, tmp_path)}
    assert got == {
        ("pkg", "pkg.b", "TYPE_CHECKING", 3),
        ("pkg.a", "pkg.b", "module level", 2),
        ("pkg.a", "pkg.c", "lazy", 5),
        ("pkg.b", "pkg.c", "module level", 1),
        ("pkg.b", "pkg.c", "module level", 2),
    }


def test_a_cycle_is_named_with_its_edges(tmp_path):
    modules = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    import pkg.c\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "import pkg.a\n",  # into the cycle, not on it
    })
    cycles = import_cycles(read_imports(modules, tmp_path))
    assert [[str(i) for i in cycle] for cycle in cycles] == [[
        "pkg.a -> pkg.b (pkg/a.py:1, module level)",
        "pkg.b -> pkg.c (pkg/b.py:2, lazy)",
        "pkg.c -> pkg.a (pkg/c.py:1, module level)",
    ]]


def test_an_upward_import_is_named_with_both_layers():
    up = Import("crl_envs.tasks.code", "crl_envs.runner", "crl_envs/tasks/code.py", 7, "lazy")
    across = Import("trainers.base", "crl_envs.valuation.game", "trainers/base.py", 3, "module level")
    down = Import("crl_envs.runner", "crl_envs.tasks", "crl_envs/runner.py", 1, "module level")
    assert layer_breaks([up, across, down]) == [
        "crl_envs.tasks.code -> crl_envs.runner (crl_envs/tasks/code.py:7, lazy): layer 'tasks' (rank 1) may not "
        "import 'runner' (rank 3)",
        "trainers.base -> crl_envs.valuation.game (trainers/base.py:3, module level): layer 'trainers' (rank 4) "
        "may not import 'valuation' (rank 4)",
    ]
    assert layer_of("crl_envs.commands.value") == "interface" and layer_of("crl_envs.valuation.game") == "valuation"
    assert layer_of("crl_envs.commands.study") == "interface" and layer_of("crl_envs.study.runner") == "study"
    assert layer_of("tools.zoo.build") == "tools" and layer_of("agents.zoo") == "backends"
