"""The study's runner, as it was named before the cells became types (issue #44): what runs a cell is
:mod:`crl_envs.study.cells` (each kind's ``run``, and :func:`~crl_envs.study.cells.run_cell`), the loop
that claims, runs and caches them is :mod:`crl_envs.study.scheduler`. The old names stay importable here."""

from __future__ import annotations

from crl_envs.study.cells import CellContext, result_problem, run_cell
from crl_envs.study.cells.base import append_log
from crl_envs.study.cells.build import build_pool, build_task
from crl_envs.study.cells.trained import resolve_learning_rate
from crl_envs.study.scheduler import (
    _claim,
    _release,
    cell_path,
    environment,
    load_result,
    lock_holder,
    make_executor,
    run_cells,
)

__all__ = ["CellContext", "append_log", "build_pool", "build_task", "cell_path", "environment", "load_result",
           "lock_holder", "make_executor", "resolve_learning_rate", "result_problem", "run_cell", "run_cells",
           "_claim", "_release"]
