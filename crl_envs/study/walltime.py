"""The dry run's wall-time estimate: each planned cell's model calls (its cost estimate) times seconds per call
measured in a committed run, then stage by stage over the executor's workers.

The rates (:data:`SECONDS_PER_CALL`) are paper-small's committed cells (docs/study.json, commit 55b83b4), and
for pilot cells paper-cpu-pilot's (docs/paper-cpu-pilot/study.json): each
kind's recorded seconds over its planned calls, pooled, and for training cells per trainer (the placebo updates
on every group, so its cells cost more per call). That run shared 2 cores at load 5-8 with other jobs, so on an
idle machine the estimate errs long; a protocol whose calls are longer or shorter than judge's and cascade's
(the two paper-small trained in) moves it. ``tests/test_paper_cpu.py`` recomputes the rates from the record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

#: Seconds per planned model call: ``kind`` -> rate, or ``kind`` -> {trainer -> rate} (training cells).
#: Crossplay cells were never timed: they play greedy episodes like a baseline cell.
SECONDS_PER_CALL: dict[str, Any] = {
    "valuation": 0.00871,   # 4,048 s over 464,662 calls
    "lr_sweep": 0.00185,    # 8.2 s over 4,440 calls
    "baseline": 0.00387,    # 10.1 s over 2,600 calls
    "crossplay": 0.00387,
    "training": {"crl": 0.00424, "grpo": 0.00334, "loo_reward": 0.00363, "shapley_credit": 0.00323,
                 "placebo": 0.00646},   # e.g. crl: 131.8 s over 31,080 calls
    # GRPO pilot cells, from paper-cpu-pilot's committed run (docs/paper-cpu-pilot/study.json, 2026-12-07: 30
    # cells, 4,450 s over 1,504,000 planned calls, 2 workers at load ~2-3): the old stand-in, GRPO training's
    # rate, had priced them 2.2x long
    "pilot": {"grpo": 0.00296},
}
#: A training cell of a trainer paper-small never timed: its slowest trainer's rate.
_UNTIMED_TRAINER = max(SECONDS_PER_CALL["training"].values())


def cell_seconds(cell: Any) -> float:
    """A planned cell's estimated seconds: its planned model calls times its kind's (and trainer's) rate."""
    rate = SECONDS_PER_CALL.get(cell.kind, _UNTIMED_TRAINER)
    if isinstance(rate, Mapping):  # training and pilot cells: per trainer; a pilot of another trainer: its training rate
        trainer = cell.spec.trainer
        rate = rate.get(trainer, SECONDS_PER_CALL["training"].get(trainer, _UNTIMED_TRAINER))
    return float(cell.cost.get("calls", 0.0)) * rate


def wall_estimate(config: Any, planned: Sequence[Any]) -> dict[str, Any]:
    """The estimated wall seconds of ``planned`` (the dry run's cells with their costs): stage by stage (every
    cell of a stage finishes before the next starts), a stage's cell-seconds spread over the workers but never
    shorter than its longest cell. ``{"seconds", "cell_seconds", "workers", "executor"}``; ``seconds`` is
    ``None`` on Ray (its slots are not known before it runs)."""
    executor = config.executor
    workers = 1 if executor.kind == "local" else (executor.workers or os.cpu_count() or 1) \
        if executor.kind == "processes" else None
    stages: dict[int, list[float]] = {}
    for cell in planned:
        stages.setdefault(cell.stage, []).append(cell_seconds(cell))
    total = sum(sum(s) for s in stages.values())
    wall = None if workers is None else sum(max(sum(s) / workers, max(s)) for s in stages.values() if s)
    return {"seconds": wall, "cell_seconds": total, "workers": workers, "executor": executor.kind}


def format_wall(estimate: Mapping[str, Any]) -> str:
    """The dry run's line for :func:`wall_estimate`."""
    cells = f"{estimate['cell_seconds'] / 60:,.0f} cell-minutes"
    if estimate["seconds"] is None:
        return f"estimated time: {cells} (on Ray: wall time depends on its slots)"
    over = "in one process (executor local)" if estimate["executor"] == "local" else \
        f"over {estimate['workers']} worker processes"
    return (f"estimated wall time: {estimate['seconds'] / 60:,.0f} minutes ({cells} {over}; rates per model call "
            f"from committed runs on 2 shared cores (paper-small's cells; pilot cells paper-cpu-pilot's): paper-cpu "
            f"took 0.67x its estimate)")
