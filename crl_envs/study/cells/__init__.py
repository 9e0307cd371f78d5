"""The study's cell kinds: one module per kind, each a frozen :class:`Cell` subclass that owns how it is
planned from the config, its spec and fingerprint, its cost, its run and the check of its result.

- :mod:`~crl_envs.study.cells.valuation` — ``valuation``: one ``valuation.evaluate`` per pool x protocol x task x seed;
- :mod:`~crl_envs.study.cells.lr_sweep` — ``lr_sweep``: one candidate learning rate of ``[training.lr_rule]``;
- :mod:`~crl_envs.study.cells.pilot` — ``pilot``: one rate x adapter x seed of ``[training.pilot]``, one fit
  scored at each checkpoint;
- :mod:`~crl_envs.study.cells.baseline` — ``baseline``: the untrained learner in one setup x task;
- :mod:`~crl_envs.study.cells.training` — ``training``: one trainer's fit with one seed, then its evaluation;
- :mod:`~crl_envs.study.cells.crossplay` — ``crossplay``: a training cell's learners with unseen partners.

Adding a kind is one new module here: it is imported below (every module of this package is) and its class
registers itself by its ``kind``; the plan, the cost estimate, the scheduler and the dry run read the
registry (:func:`cell_kinds`).
"""

from __future__ import annotations

import importlib
import pkgutil

from crl_envs.study.cells.base import (
    CELL_VERSION,
    Cell,
    CellContext,
    CellJob,
    StudyTracking,
    TableInputs,
    cell_kind,
    cell_kinds,
    read_result,
    result_problem,
    run_cell,
    run_job,
)


def _import_kinds() -> None:
    """Import every module of this package, so each kind defined in one registers itself."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_kinds()

__all__ = ["CELL_VERSION", "Cell", "CellContext", "CellJob", "StudyTracking", "TableInputs", "cell_kind", "cell_kinds",
           "read_result", "result_problem", "run_cell", "run_job"]
