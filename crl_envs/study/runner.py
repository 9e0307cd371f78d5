"""Running a study's cells: each through today's calls (``valuation.evaluate``, a trainer's ``fit`` and
``evaluate``), each result cached under its fingerprint, on the configured executor.

Layout of a study's ``out`` directory::

    cells/<fingerprint>.json     one finished cell's result (atomic write; a rerun skips it)
    coalitions/                  the coalition cache every valuation cell shares (resume mid-cell)
    train/<fingerprint>/         a training cell's checkpoints, metrics.jsonl and TensorBoard logs
    logs/<cell id>.log           one log per cell: its settings, then its result and time
    study.json, study.md, *.png  the tables (see :mod:`crl_envs.study.tables`)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crl_envs.study.config import StudyConfig
from crl_envs.study.plan import Cell
from crl_envs.valuation.coalition import atomic_write_json


# ---------------------------------------------------------------------- building what a cell names
def build_pool(desc: Any):
    """The :class:`agents.Pool` a cell's pool description names."""
    import agents

    if isinstance(desc, str):
        if desc == "zoo":
            import agents.zoo  # noqa: F401  registers the pool
        return agents.pool(desc)
    members = []
    for m in desc:
        if isinstance(m, str):
            if m.startswith("zoo:"):
                import agents.zoo  # noqa: F401  registers the backend
            members.append(m)
        else:
            members.append(agents.ScriptedAgent.expert(m.get("name", f"expert-{m['expert']}"), float(m["expert"]),
                                                       seed=int(m.get("seed", 0))))
    return agents.pool(members)


def build_task(desc: dict[str, Any], *, split: str | None = None, n: int | None = None):
    from crl_envs import tasks

    return tasks.load(desc["name"], split=split if split is not None else desc["split"],
                      n=n if n is not None else desc["n"], seed=desc["seed"], **desc["options"])


def _sampling(desc: dict[str, Any]):
    from agents import SamplingParams

    return SamplingParams(temperature=desc["temperature"], top_p=desc["top_p"], max_new_tokens=desc["max_new_tokens"])


# ---------------------------------------------------------------------- one cell
def run_cell(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one cell (``payload = {"cell": Cell fields, "out": str, "coalition_executor": ...}``) and
    return its result (plain data). The one function every executor calls."""
    cell = payload["cell"]
    out = Path(payload["out"])
    log = out / "logs" / (cell["id"].replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] start {cell['id']} (fingerprint {cell['fingerprint']})\n"
                f"settings: {json.dumps(cell['spec'], sort_keys=True)}\n")
    try:
        if cell["kind"] == "valuation":
            result = _valuation_cell(cell["spec"], out, payload.get("coalition_executor"))
        else:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(cell["spec"]["threads"])  # the same reductions on every executor
            try:
                result = _baseline_cell(cell["spec"]) if cell["kind"] == "baseline" else \
                    _training_cell(cell["spec"], out / "train" / cell["fingerprint"], payload.get("tracking"))
            finally:
                torch.set_num_threads(threads)
    except BaseException as e:
        with open(log, "a") as f:
            f.write(f"[{time.strftime('%H:%M:%S')}] failed after {time.perf_counter() - t0:.1f}s: "
                    f"{type(e).__name__}: {e}\n")
        raise
    result = {"id": cell["id"], "kind": cell["kind"], "fingerprint": cell["fingerprint"], **result,
              "seconds": time.perf_counter() - t0}
    with open(log, "a") as f:
        f.write(f"[{time.strftime('%H:%M:%S')}] done in {result['seconds']:.1f}s: {result.get('summary', '')}\n")
    return result


def _valuation_cell(spec: dict[str, Any], out: Path, coalition_executor: Any) -> dict[str, Any]:
    from crl_envs import protocols, valuation

    pool = build_pool(spec["pool"])
    task = build_task(spec["task"])
    estimator = spec["estimator"] if isinstance(spec["estimator"], str) else \
        ("exact" if len(pool) <= spec["estimator"]["exact_up_to"] else spec["estimator"]["larger"])
    report = valuation.evaluate(
        spec["protocol"]["protocol"], pool, task, estimator=estimator, samples=spec["samples"], seed=spec["seed"],
        budget=spec["budget"] if estimator in ("permutation", "antithetic") else None,
        cache_dir=out / "coalitions", progress=False, sampling=_sampling(spec["sampling"]),
        options=spec["protocol"]["options"], ci_level=spec["ci_level"],
        bootstrap_resamples=spec["bootstrap_resamples"], executor=coalition_executor or "local")
    d = report.to_dict()
    d["family"] = protocols.family(spec["protocol"]["protocol"])
    d["fingerprints"] = {a: pool[a].fingerprint for a in pool.ids}
    comp = "shapley" if report.shapley is not None else "loo"
    kt = report.correlation[comp]["kendall"]
    summary = (f"v(N) {report.system.mean():.3f}, {comp} vs individual Kendall tau-b {kt.value:+.3f} "
                    f"(p {kt.p_value:.3f}); {report.system_evaluations + report.individual_evaluations} runs, "
                    f"{report.cached_evaluations} from cache")
    return {"report": d, "summary": summary}


def _trainer(spec: dict[str, Any], trainer_name: str, seed: int, output_dir: Path | None,
             tracking: dict[str, Any] | None = None):
    import trainers

    pool = build_pool(spec["pool"])
    train = build_task(spec["task"], split=spec["train_split"], n=spec["n_train"])
    held_out = build_task(spec["task"], split=spec["eval_split"], n=spec["n_eval"])
    common = dict(steps=spec.get("steps", 1), questions_per_step=spec.get("questions_per_step", 8),
                  num_generations=spec.get("num_generations", 8), learning_rate=spec.get("learning_rate", 5e-5),
                  max_new_tokens=spec["max_new_tokens"], seed=seed, progress=False,
                  protocol_options=spec["options"], output_dir=None if output_dir is None else str(output_dir))
    if tracking:  # the study's trackers (crl_envs.tracking), under the study's name
        common.update(trackers=tuple(tracking["trackers"]), tracking_project=tracking["project"],
                      tracking_dir=tracking["dir"])
    if spec.get("lora"):
        common["lora"] = trainers.LoraSettings(**spec["lora"])
    if trainer_name == "shapley_credit":
        config = trainers.ShapleyCreditConfig(coalitions_per_question=spec.get("shapley_coalitions"), **common)
    else:
        config = trainers.TRAINERS[trainer_name].config_class(**common)
    return trainers.TRAINERS[trainer_name](spec["protocol"], pool, train, learner=spec["learner"], config=config,
                                           eval_task=held_out)


def _baseline_cell(spec: dict[str, Any]) -> dict[str, Any]:
    result = _trainer(spec, "crl", 0, None).evaluate()
    return {"example_ids": list(result.example_ids), "system": result.system.tolist(),
            "standalone": result.standalone.tolist(),
            "summary": f"system {result.system_accuracy:.3f}, learner alone {result.standalone_accuracy:.3f}"}


def _training_cell(spec: dict[str, Any], output_dir: Path, tracking: dict[str, Any] | None = None) -> dict[str, Any]:
    trainer = _trainer(spec, spec["trainer"], spec["seed"], output_dir, tracking)
    trainer.fit()
    result = trainer.evaluate()
    return {"example_ids": list(result.example_ids), "system": result.system.tolist(),
            "standalone": result.standalone.tolist(), "rollouts": trainer.rollouts,
            "summary": f"after training: system {result.system_accuracy:.3f}, learner alone "
                       f"{result.standalone_accuracy:.3f}, {trainer.rollouts} rollouts"}


# ---------------------------------------------------------------------- the cell cache and the loop
def cell_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.fingerprint}.json"


def load_result(out: Path, cell: Cell) -> dict[str, Any] | None:
    """A finished cell's result, or ``None`` when it has not finished (or the file is not its own)."""
    path = cell_path(out, cell)
    if not path.exists():
        return None
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return result if result.get("fingerprint") == cell.fingerprint else None


def _payload(cell: Cell, out: Path, coalition_executor: Any = None, tracking: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    return {"cell": {"kind": cell.kind, "id": cell.id, "spec": cell.spec, "fingerprint": cell.fingerprint},
            "out": str(out), "coalition_executor": coalition_executor, "tracking": tracking}


def make_executor(config: StudyConfig):
    """The valuation executor the config names (cells and coalitions run on it)."""
    from crl_envs.valuation.executors import LocalExecutor, ProcessExecutor, RayExecutor

    e = config.executor
    if e.kind == "ray":
        return RayExecutor(e.address, num_cpus=e.num_cpus)
    if e.kind == "processes":
        return ProcessExecutor(e.workers)
    return LocalExecutor()


def run_cells(config: StudyConfig, plan: Sequence[Cell], *, progress: bool = True,
              on_result: Callable[[Cell, dict[str, Any]], Any] | None = None) -> dict[str, dict[str, Any]]:
    """Run every unfinished cell of ``plan``; return ``cell id -> result`` for all of them.

    Valuation cells run one after another in this process, their coalitions on the executor (a Ray
    cluster's slots, or worker processes); baseline and training cells are handed to the executor
    as whole cells. Each result is written as soon as it arrives."""
    out = config.out
    (out / "cells").mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for cell in plan:
        found = load_result(out, cell)
        if found is not None:
            results[cell.id] = found
        else:
            todo.append(cell)
    if not todo:
        return results
    executor = make_executor(config)
    executor.start()  # a bad address fails here, before any work
    tracking = {"trackers": list(config.trackers), "project": config.name, "dir": str(out)} if config.trackers else None
    weight = {c.id: max(c.cost.get("calls", 1.0), 1.0) for c in todo}
    bar = tqdm(total=round(sum(weight.values())), desc=f"{config.name}: {len(todo)} cells", disable=not progress,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| est. model calls{postfix} [{elapsed}<{remaining}]")
    done = [0]

    def pending(cells: list[Cell]) -> list[Cell]:
        """The cells still unfinished now (another driver on the same ``out`` may have finished some)."""
        still = []
        for c in cells:
            found = load_result(out, c)
            if found is None:
                still.append(c)
            else:
                results[c.id] = found
                done[0] += 1
                bar.update(round(weight[c.id]))
        return still

    def finished(cell: Cell, result: dict[str, Any]) -> None:
        atomic_write_json(cell_path(out, cell), result)
        results[cell.id] = result
        done[0] += 1
        bar.update(round(weight[cell.id]))
        bar.set_postfix_str(f"{done[0]}/{len(todo)} cells, last {cell.id}", refresh=True)
        if on_result is not None:
            on_result(cell, result)

    try:
        bar.set_postfix_str(f"0/{len(todo)} cells", refresh=True)
        coalition_executor = executor if config.executor.kind != "local" else None
        local = [c for c in todo if c.kind == "valuation"]
        rest = [c for c in todo if c.kind != "valuation"]
        if config.executor.kind == "local":  # one cell at a time: claim each just before it runs
            local, rest = local + rest, []
        waiting: list[Cell] = []
        for cell in local:
            if pending([cell]):
                if _claim(out, cell):
                    _run_claimed(cell, out, coalition_executor, finished, tracking)
                else:
                    waiting.append(cell)  # another driver is running it: come back at the end
        while waiting:
            cell = waiting.pop(0)
            if not pending([cell]):
                continue
            if _claim(out, cell):
                _run_claimed(cell, out, coalition_executor, finished, tracking)
            else:
                waiting.append(cell)
                time.sleep(5)
        rest = pending(rest)
        executor.map(run_cell, [_payload(c, out, tracking=tracking) for c in rest], lambda i, r: finished(rest[i], r))
    finally:
        bar.close()
    return results


def _lock_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.fingerprint}.lock"


def _claim(out: Path, cell: Cell) -> bool:
    """Take the cell's lock file (created exclusively, holding this process id); a lock whose process is
    gone is stale and taken over. Several drivers on one ``out`` then never run one cell at once."""
    path = _lock_path(out, cell)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(path.read_text() or 0)
                os.kill(pid, 0)
                return pid == os.getpid()
            except (ValueError, ProcessLookupError, FileNotFoundError):
                path.unlink(missing_ok=True)  # stale: its driver died
                continue
            except PermissionError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _run_claimed(cell: Cell, out: Path, coalition_executor: Any, finished: Callable[[Cell, dict[str, Any]], Any],
                 tracking: dict[str, Any] | None = None) -> None:
    try:
        finished(cell, run_cell(_payload(cell, out, coalition_executor, tracking)))
    finally:
        _lock_path(out, cell).unlink(missing_ok=True)


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into plain Python (for ``json.dumps``)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and (value != value):
        return None
    return value


def environment() -> dict[str, Any]:
    """Where a study ran: CPUs and the load average (for honest wall times)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in load]}
