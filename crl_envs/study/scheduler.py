"""Running a study's cells: each unfinished cell claimed under a lock, run (:func:`crl_envs.study.cells.
run_cell`) on the configured executor, its result cached under its fingerprint as soon as it arrives.

Layout of a study's ``out`` directory::

    cells/<fingerprint>.json     one finished cell's result (atomic write; a rerun skips it)
    coalitions/                  the coalition cache every valuation cell shares (resume mid-cell)
    train/<fingerprint>/         a training cell's checkpoints, metrics.jsonl and TensorBoard logs
    cells/<fingerprint>.lock     held (``flock``) by the driver running the cell: pid, host and start inside
    logs/<cell id>.log           one log per cell: its settings, then its result and time
    study.json, study.md, *.png  the tables (see :mod:`crl_envs.study.tables`)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from crl_envs.study.cells import Cell, CellContext, CellJob, StudyTracking, read_result, run_cell, run_job
from crl_envs.study.config import StudyConfig
from crl_kit.safe_io import atomic_write_json

OnResult = Callable[[Cell, dict[str, Any]], Any]


# ---------------------------------------------------------------------- the cell cache
def cell_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.fingerprint}.json"


def load_result(out: Path, cell: Cell) -> dict[str, Any] | None:
    """A finished cell's result, or ``None`` when it has not finished. A file that is not a valid result
    of this cell (not JSON, not its fingerprint, scores missing, outside [0, 1], not finite or of the
    wrong length) is not used: a warning names it and the cell runs again (its file is then replaced)."""
    path = cell_path(out, cell)
    if not path.exists():
        return None
    result, problem = read_result(path, cell)  # a regular file only: a FIFO planted there must not hang the study
    if problem is None:
        return result
    warnings.warn(f"study cell file {path} is not a valid result of {cell.id}: {problem}; the cell runs again",
                  stacklevel=2)
    return None


# ---------------------------------------------------------------------- the locks
def _lock_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.fingerprint}.lock"


#: The lock files this process holds: path -> open descriptor (closing it releases the lock).
_HELD: dict[str, int] = {}


def _claim(out: Path, cell: Cell) -> bool:
    """Take the cell's lock: an exclusive ``flock`` on ``cells/<fingerprint>.lock``, which the kernel
    releases when its holder exits however it exits, so a lock never outlives its driver and no lock is
    ever taken over by guessing. The file then names the holder (pid, host, since). ``False`` while
    another driver (or another open of the file) holds it."""
    path = _lock_path(out, cell)
    if str(path) in _HELD:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(8):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder released and removed it between our open and flock: open the new one
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}).encode())
        _HELD[str(path)] = fd
        return True
    return False


def _release(out: Path, cell: Cell) -> None:
    """Release a lock this process holds (removed while still held, then closed)."""
    path = _lock_path(out, cell)
    fd = _HELD.pop(str(path), None)
    if fd is not None:
        path.unlink(missing_ok=True)
        os.close(fd)


def lock_holder(out: Path, cell: Cell) -> str:
    """Who holds the cell's lock, as its file says: ``"pid 12 on host h since 2026-12-03 09:00:00 UTC"``."""
    try:
        who = json.loads(_lock_path(out, cell).read_text() or "{}")
        return f"pid {who['pid']} on host {who['host']} since {who['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another driver (it has not written its pid yet)"


# ---------------------------------------------------------------------- the loop
def make_executor(config: StudyConfig):
    """The valuation executor the config's ``[executor]`` names (cells and coalitions run on it)."""
    from dataclasses import asdict

    from crl_envs.valuation.executors import build_executor

    settings = asdict(config.executor)
    return build_executor(settings.pop("kind"), **settings)


def run_cells(config: StudyConfig, plan: Sequence[Cell], *, progress: bool = True,
              on_result: OnResult | None = None) -> dict[str, dict[str, Any]]:
    """Run every unfinished cell of ``plan``; return ``cell id -> result`` for all of them.

    Stage by stage (:attr:`~crl_envs.study.cells.Cell.stage`: sweeps, then the rest, then crossplay; each
    reads the one before). Cells that run in the driver (valuation) run one after another in this process,
    their coalitions on the executor (a Ray cluster's slots, or worker processes); the others are handed to
    the executor as whole cells. Each result is written as soon as it arrives."""
    results: dict[str, dict[str, Any]] = {}
    for stage in sorted({c.stage for c in plan}):
        batch = CellScheduler(config, [c for c in plan if c.stage == stage], progress=progress, on_result=on_result)
        results.update(batch.run())
    return results


class CellScheduler:
    """Runs one stage's cells: the finished ones read from the cache, every other one claimed (its lock),
    run and written, cells another driver holds waited for and taken over when it lets go."""

    def __init__(self, config: StudyConfig, cells: Sequence[Cell], *, progress: bool = True,
                 on_result: OnResult | None = None):
        self.config, self.out, self.cells = config, config.out, list(cells)
        self.progress, self.on_result = progress, on_result
        self.results: dict[str, dict[str, Any]] = {}
        self.todo: list[Cell] = []
        self.done = 0
        self.bar: Any = None
        self.weight: dict[str, float] = {}

    def run(self) -> dict[str, dict[str, Any]]:
        (self.out / "cells").mkdir(parents=True, exist_ok=True)
        for cell in self.cells:
            found = load_result(self.out, cell)
            if found is not None:
                self.results[cell.id] = found
            else:
                self.todo.append(cell)
        if not self.todo:
            return self.results
        executor = make_executor(self.config)
        executor.start()  # a bad address fails here, before any work
        c = self.config
        tracking = StudyTracking(tuple(c.trackers), c.name, str(self.out)) if c.trackers else None
        in_driver = CellContext(self.out, executor, tracking)
        self.weight = {cell.id: max(cell.cost.get("calls", 1.0), 1.0) for cell in self.todo}
        self.bar = tqdm(total=round(sum(self.weight.values())), desc=f"{c.name}: {len(self.todo)} cells",
                        disable=not self.progress,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| est. model calls{postfix} [{elapsed}<{remaining}]")
        try:
            self.bar.set_postfix_str(f"0/{len(self.todo)} cells", refresh=True)
            local = [cell for cell in self.todo if cell.in_driver]
            rest = [cell for cell in self.todo if not cell.in_driver]
            if c.executor.kind == "local":  # one cell at a time: claim each just before it runs
                local, rest = local + rest, []
            waiting = [cell for cell in local if not self._run_here(cell, in_driver)]
            waiting += self._run_on_executor(executor, rest, CellContext(self.out, None, tracking))
            self._wait_for(waiting, in_driver)
        finally:
            self.bar.close()
        return self.results

    def _pending(self, cell: Cell) -> bool:
        """Whether ``cell`` is still unfinished now (another driver on the same ``out`` may have finished it)."""
        found = load_result(self.out, cell)
        if found is None:
            return True
        self.results[cell.id] = found
        self.done += 1
        self.bar.update(round(self.weight[cell.id]))
        return False

    def _finished(self, cell: Cell, result: dict[str, Any]) -> None:
        atomic_write_json(cell_path(self.out, cell), result)
        self.results[cell.id] = result
        self.done += 1
        self.bar.update(round(self.weight[cell.id]))
        self.bar.set_postfix_str(f"{self.done}/{len(self.todo)} cells, last {cell.id}", refresh=True)
        if self.on_result is not None:
            self.on_result(cell, result)

    def _claimed(self, cell: Cell) -> bool:
        """Claim ``cell`` if it is still unfinished; ``False`` while another driver holds it."""
        if not _claim(self.out, cell):
            return False
        if not self._pending(cell):  # finished by the driver that held it until now
            _release(self.out, cell)
        return True

    def _run_here(self, cell: Cell, context: CellContext) -> bool:
        """Run ``cell`` in this process if it is unfinished and free; ``False`` while another driver holds it."""
        if not self._pending(cell):
            return True
        if not self._claimed(cell):
            return False
        if cell.id not in self.results:
            try:
                self._finished(cell, run_cell(cell, context))
            finally:
                _release(self.out, cell)
        return True

    def _run_on_executor(self, executor: Any, cells: list[Cell], context: CellContext) -> list[Cell]:
        """Hand the unfinished ``cells`` to the executor whole, each claimed first and held until its result is
        written; return those another driver holds."""
        waiting, mine = [], []
        for cell in [cell for cell in cells if self._pending(cell)]:
            if not self._claimed(cell):
                waiting.append(cell)
            elif cell.id not in self.results:
                mine.append(cell)
        try:
            executor.map(run_job, [CellJob(cell, context) for cell in mine],
                         lambda i, result: self._finished(mine[i], result))
        finally:
            for cell in mine:
                _release(self.out, cell)
        return waiting

    def _wait_for(self, waiting: list[Cell], context: CellContext) -> None:
        """Until every cell another driver held is finished: take each over the moment its lock is free."""
        told: set[str] = set()
        while waiting:
            progressed = False
            for cell in list(waiting):
                if not self._pending(cell):
                    waiting.remove(cell)
                    progressed = True
                elif self._claimed(cell):
                    waiting.remove(cell)
                    progressed = True
                    if cell.id not in self.results:
                        try:
                            self._finished(cell, run_cell(cell, context))
                        finally:
                            _release(self.out, cell)
                elif cell.id not in told:
                    told.add(cell.id)
                    tqdm.write(f"[crl-envs study] {cell.id} is being run by {lock_holder(self.out, cell)}; waiting for "
                               f"it (taken over at once if that driver stops)")
            if waiting and not progressed:
                time.sleep(2)


def environment() -> dict[str, Any]:
    """Where a study ran: CPUs and the load average (for honest wall times)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in load]}
