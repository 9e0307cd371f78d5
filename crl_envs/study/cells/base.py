"""What every cell kind shares: the :class:`Cell` base (its id, payload ``spec``, fingerprint and cost), the
registry of kinds, the typed :class:`CellContext` a cell runs in, and :func:`run_cell`, the one function
every executor calls.

A kind is a frozen subclass that sets :attr:`Cell.kind` (registered by ``__init_subclass__``) and its
:attr:`Cell.spec_class` (:mod:`crl_envs.study.cells.specs`), and defines how
it is planned (:meth:`Cell.plan_study`, :meth:`Cell.plan_setting` or :meth:`Cell.plan_after`), what it costs
(:meth:`Cell.cost_estimate`), how it runs (:meth:`Cell.run`) and what a valid result of it is
(:meth:`Cell.problem`). A cell's fingerprint hashes its kind and spec's payload with :data:`CELL_VERSION`:
two configs that share a cell share its result.
"""

from __future__ import annotations

import abc
import errno
import json
import os
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from crl_envs.study.cells.specs import CellSpec, SettingSpec
from crl_kit.errors import ConfigTypeError
from crl_kit.safe_io import read_json
from crl_kit.serial import digest
from crl_kit.validation import finite_number

if TYPE_CHECKING:  # pragma: no cover
    from crl_envs.study.config import SetupConfig, StudyConfig

CELL_VERSION = 1

#: ``kind -> cell class``, filled as the kinds' modules are imported (:mod:`crl_envs.study.cells` imports them all).
_KINDS: dict[str, type[Cell]] = {}


@dataclass(frozen=True)
class StudyTracking:
    """The study's trackers (:mod:`crl_envs.tracking`): training cells log under the study's name and out."""

    trackers: tuple[str, ...]
    project: str
    dir: str


@dataclass(frozen=True)
class CellContext:
    """Where a cell runs: the study's ``out`` directory, the executor its coalitions run on (valuation cells
    played in the driver; ``None``: this process) and the study's trackers (``None``: none)."""

    out: Path
    coalition_executor: Any = None
    tracking: StudyTracking | None = None


@dataclass
class TableInputs:
    """What the study's tables read from the finished cells, each kind adding its own results
    (:meth:`Cell.add_to_tables`): valuation reports with their labels; per ``(setup, task)`` the baseline, and per
    trainer and seed the training and crossplay results."""

    valuation: list[dict[str, Any]] = field(default_factory=list)
    baselines: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    runs: dict[tuple[str, str], dict[str, dict[int, Any]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(dict)))
    crossplay: dict[tuple[str, str], dict[str, dict[int, Any]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))


@dataclass
class Setting:
    """One setup x task of ``[training]`` as the kinds plan it: ``label`` (the setup's), ``setup``, ``task`` (a
    task label), ``common`` (the spec its cells share: its baseline cell's) and ``planned`` (kind -> the cells that kind planned for
    it so far: a training cell reads its setting's learning-rate sweep there)."""

    label: str
    setup: SetupConfig
    task: str
    common: SettingSpec
    planned: dict[str, list[Cell]] = field(default_factory=dict)


@dataclass(frozen=True)
class Cell(abc.ABC):
    """One unit of work: a readable ``id``, its ``spec`` (a frozen dataclass of plain data, the kind's
    :attr:`spec_class`: it runs the same in this process, a worker process or on Ray), its ``fingerprint`` and
    estimated ``cost``; the kind is the class."""

    #: the kind's name (cell ids start with it; result files carry it)
    kind: ClassVar[str] = ""
    #: where the kind is listed (the dry run's rows, the registry's order)
    order: ClassVar[int] = 100
    #: the stage it runs in: every cell of a stage finishes before the next stage starts
    stage: ClassVar[int] = 1
    #: the order kinds are planned in within one training setting (:meth:`plan_setting`)
    setting_order: ClassVar[int] = 100
    #: the kind whose every cell this kind follows in the plan (:meth:`plan_after`), if any
    follows: ClassVar[str | None] = None
    #: cells of this kind that several settings plan with one id are planned (and run) once
    shared: ClassVar[bool] = False
    #: runs in the driver, one after another, its coalitions on the executor (else: whole, on the executor)
    in_driver: ClassVar[bool] = False
    #: what the dry run calls its ``runs``
    runs_unit: ClassVar[str] = "trainer fits"
    #: the class of this kind's specs
    spec_class: ClassVar[type[CellSpec]] = CellSpec

    id: str
    spec: CellSpec
    fingerprint: str
    cost: dict[str, float] = field(default_factory=dict, compare=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            known = _KINDS.get(cls.kind)
            if known is not None and _where(known) != _where(cls):  # the same class imported again: itself
                raise ConfigTypeError(f"two cell kinds named {cls.kind!r}: {_where(known)} and {_where(cls)}; "
                                      f"remove the second (or give it a kind of its own): a kind is defined once")
            _KINDS[cls.kind] = cls

    @classmethod
    def make(cls, cell_id: str, spec: CellSpec) -> Cell:
        """A cell of this kind, its fingerprint the digest of its version, kind and spec's payload (the dict the
        study hashed when specs were dicts: every committed cell file keeps its fingerprint).

        Raises:
            ConfigTypeError: ``spec`` is not this kind's :attr:`spec_class`."""
        if type(spec) is not cls.spec_class:
            raise ConfigTypeError(f"a {cls.kind} cell's spec is a {cls.spec_class.__name__}, got a "
                                  f"{type(spec).__name__}; build it with {cls.spec_class.__name__}(...)")
        return cls(cell_id, spec, digest({"version": CELL_VERSION, "kind": cls.kind, **spec.payload()}))

    def with_cost(self, cost: dict[str, float]) -> Cell:
        return type(self)(self.id, self.spec, self.fingerprint, cost)

    # ------------------------------------------------------------------ planning (one of the three)
    @classmethod
    def plan_study(cls, config: StudyConfig) -> list[Cell]:
        """The kind's cells planned once for the whole study (valuation: its grid), in order."""
        return []

    @classmethod
    def plan_setting(cls, config: StudyConfig, setting: Setting) -> list[Cell]:
        """The kind's cells of one training setting (setup x task), in order."""
        return []

    @classmethod
    def plan_after(cls, config: StudyConfig, cell: Cell) -> list[Cell]:
        """The kind's cells planned right after ``cell``, a cell of the kind named by :attr:`follows`."""
        return []

    # ------------------------------------------------------------------ cost, run, result
    @classmethod
    @abc.abstractmethod
    def estimate_costs(cls, config: StudyConfig, cells: list[Cell], *, distinct: bool = True) -> list[dict[str, float]]:
        """The cost of each of ``cells`` (this kind's, in plan order): ``runs``, ``episodes``, ``calls``, ``tokens``,
        before anything runs (a kind whose cells share work, as valuation cells share coalitions, counts it once)."""

    @abc.abstractmethod
    def run(self, context: CellContext) -> dict[str, Any]:
        """Do the work; return the result (plain data, with a one-line ``summary``)."""

    def problem(self, result: dict[str, Any]) -> str | None:
        """What is wrong with ``result`` (a dict of this cell's fingerprint and kind) as this kind's result."""
        return None

    def add_to_tables(self, tables: TableInputs, results: Mapping[str, dict[str, Any]]) -> None:
        """Add this finished cell's result (``results[self.id]``) to what the tables read; a kind whose results
        no table reads (the default) adds nothing."""
        del tables, results


def _where(cls: type) -> str:
    """A class's full name, ``module.qualname``: two kinds are the same only when this is."""
    return f"{cls.__module__}.{cls.__qualname__}"


def cell_kinds() -> list[type[Cell]]:
    """The registered kinds, in listing order (:attr:`Cell.order`)."""
    return sorted(_KINDS.values(), key=lambda k: (k.order, k.kind))


def cell_kind(kind: str) -> type[Cell]:
    """The class of cell kind ``kind``."""
    return _KINDS[kind]


# ---------------------------------------------------------------------- results
def scores_problem(name: str, values: Any, length: int) -> str | None:
    """What is wrong with ``values`` as ``length`` scores (or rows of scores) in [0, 1] (``None``: nothing)."""
    if not isinstance(values, list) or len(values) != length:
        return f"{name} is not a list of {length} scores"
    flat = [x for row in values for x in (row if isinstance(row, list) else [row])]
    if not all((x := finite_number(v)) is not None and 0 <= x <= 1 for v in flat):
        return f"{name} holds a score that is not a finite number in [0, 1]"
    return None


def result_problem(cell: Cell, result: Any) -> str | None:
    """What is wrong with ``result`` as the finished result of ``cell`` (``None``: nothing)."""
    if not isinstance(result, dict):
        return f"a {type(result).__name__}, not a result"
    if result.get("fingerprint") != cell.fingerprint or result.get("kind") != cell.kind:
        return "another cell's fingerprint or kind"
    return cell.problem(result)


def read_result(path: Path, cell: Cell) -> tuple[dict[str, Any] | None, str | None]:
    """The result file at ``path`` read as ``cell``'s: ``(result, None)``, or ``(None, what is wrong)`` when it is
    not a regular file (a FIFO or a link planted there: refused, never waited on), not JSON (a number too long
    for Python's parser included) or not a valid result of ``cell`` (:func:`result_problem`). The one reader of
    cell files: the scheduler's (a cell whose file is not valid runs again) and a training cell's read of its
    learning-rate sweep."""
    try:
        result = read_json(path)
        problem = result_problem(cell, result)
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError and int-digit limits are ValueErrors
        return None, f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    return (result, None) if problem is None else (None, problem)


# ---------------------------------------------------------------------- running one cell
def run_cell(cell: Cell, context: CellContext) -> dict[str, Any]:
    """Run one cell in ``context`` and return its result (plain data: the cell's id, kind and fingerprint, what
    :meth:`Cell.run` returned and the seconds it took), logged to ``out/logs/<cell id>.log``."""
    out = Path(context.out)
    log = out / "logs" / (cell.id.replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    append_log(log, f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] start {cell.id} (fingerprint {cell.fingerprint})\n"
                    f"settings: {json.dumps(cell.spec.payload(), sort_keys=True)}\n")
    try:
        result = cell.run(context)
    except BaseException as e:
        append_log(log, f"[{time.strftime('%H:%M:%S')}] failed after {time.perf_counter() - t0:.1f}s: "
                        f"{type(e).__name__}: {e}\n")
        raise
    result = {"id": cell.id, "kind": cell.kind, "fingerprint": cell.fingerprint, **result,
              "seconds": time.perf_counter() - t0}
    append_log(log, f"[{time.strftime('%H:%M:%S')}] done in {result['seconds']:.1f}s: {result.get('summary', '')}\n")
    return result


@dataclass(frozen=True)
class CellJob:
    """What an executor ships for one whole cell: the cell and its context (both picklable)."""

    cell: Cell
    context: CellContext


def run_job(job: CellJob) -> dict[str, Any]:
    """:func:`run_cell` of a shipped :class:`CellJob` (the function :meth:`Executor.map` calls)."""
    return run_cell(job.cell, job.context)


def append_log(path: Path, text: str) -> None:
    """Append ``text`` to the log at ``path``, never through a symbolic link: a link planted there is
    replaced by a regular file (``O_NOFOLLOW``), so a log cannot write into the link's target."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            path.unlink()
            continue
        with os.fdopen(fd, "a") as f:
            f.write(text)
        return
