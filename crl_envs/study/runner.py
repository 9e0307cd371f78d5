"""Running a study's cells: each through today's calls (``valuation.evaluate``, a trainer's ``fit`` and
``evaluate``), each result cached under its fingerprint, on the configured executor.

Layout of a study's ``out`` directory::

    cells/<fingerprint>.json     one finished cell's result (atomic write; a rerun skips it)
    coalitions/                  the coalition cache every valuation cell shares (resume mid-cell)
    train/<fingerprint>/         a training cell's checkpoints, metrics.jsonl and TensorBoard logs
    cells/<fingerprint>.lock     held (``flock``) by the driver running the cell: pid, host and start inside
    logs/<cell id>.log           one log per cell: its settings, then its result and time
    study.json, study.md, *.png  the tables (see :mod:`crl_envs.study.tables`)
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from crl_envs.study.config import StudyConfig
from crl_envs.study.plan import Cell
from crl_kit.errors import RunError
from crl_kit.safe_io import atomic_write_json, read_json


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
    append_log(log, f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] start {cell['id']} (fingerprint {cell['fingerprint']})\n"
                    f"settings: {json.dumps(cell['spec'], sort_keys=True)}\n")
    try:
        if cell["kind"] == "valuation":
            result = _valuation_cell(cell["spec"], out, payload.get("coalition_executor"))
        else:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(cell["spec"]["threads"])  # the same reductions on every executor
            try:
                spec = resolve_learning_rate(cell["spec"], out)
                if cell["kind"] == "crossplay":
                    result = _crossplay_cell(spec, out / "train" / cell["spec"]["training_fingerprint"])
                elif cell["kind"] == "baseline":
                    result = _baseline_cell(spec)
                elif cell["kind"] == "lr_sweep":
                    result = _sweep_cell(spec)
                else:
                    result = _training_cell(spec, out / "train" / cell["fingerprint"], payload.get("tracking"))
            finally:
                torch.set_num_threads(threads)
    except BaseException as e:
        append_log(log, f"[{time.strftime('%H:%M:%S')}] failed after {time.perf_counter() - t0:.1f}s: "
                        f"{type(e).__name__}: {e}\n")
        raise
    result = {"id": cell["id"], "kind": cell["kind"], "fingerprint": cell["fingerprint"], **result,
              "seconds": time.perf_counter() - t0}
    append_log(log, f"[{time.strftime('%H:%M:%S')}] done in {result['seconds']:.1f}s: {result.get('summary', '')}\n")
    return result


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
    # a baseline cell has no budget: it only evaluates, with the config's defaults otherwise
    budget = {k: spec[k] for k in ("steps", "questions_per_step", "num_generations", "learning_rate") if k in spec}
    common = dict(**budget, max_new_tokens=spec["max_new_tokens"], seed=seed, progress=False,
                  protocol_options=spec["options"], output_dir=None if output_dir is None else str(output_dir))
    if tracking:  # the study's trackers (crl_envs.tracking), under the study's name
        common.update(trackers=tuple(tracking["trackers"]), tracking_project=tracking["project"],
                      tracking_dir=tracking["dir"])
    if spec.get("lora"):
        common["lora"] = trainers.LoraSettings(**spec["lora"])
    if trainer_name == "shapley_credit":
        common["coalitions_per_question"] = spec.get("shapley_coalitions")
    if "schedule" in spec:
        common["schedule"] = spec["schedule"]
    config = trainers.TRAINERS[trainer_name].config_class(**common)
    who = {"learners": spec["learners"]} if "learners" in spec else {"learner": spec["learner"]}
    return trainers.TRAINERS[trainer_name](spec["protocol"], pool, train, config=config, eval_task=held_out, **who)


def _scores(result: Any) -> dict[str, Any]:
    """An evaluation as a cell's result: per question ``system``, ``standalone`` (several learners: their
    mean) and, with several learners, each one's own under ``learners``."""
    out = {"example_ids": list(result.example_ids), "system": result.system.tolist(),
           "standalone": result.standalone.tolist()}
    if len(result.learners) > 1:
        out["learners"] = {j: np.asarray(v).tolist() for j, v in result.learners.items()}
    return out


def resolve_learning_rate(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """``spec`` with a rule's ``learning_rate`` (``{"rule", "tolerance", "sweep": lr -> sweep cell fingerprint}``)
    replaced by the rate the rule picks from the finished sweep cells (:func:`crl_envs.study.gates.
    choose_learning_rate`); a number stays as it is.

    Raises:
        RunError: a sweep cell has not finished (the study runs them first: rerun it)."""
    rule = spec.get("learning_rate")
    if not isinstance(rule, dict):
        return spec
    from crl_envs.study.gates import choose_learning_rate

    sweep = {}
    for lr, fingerprint in rule["sweep"].items():
        path = out / "cells" / f"{fingerprint}.json"
        if not path.exists():
            raise RunError(f"the learning-rate sweep cell for lr {lr} ({path}) has not finished; rerun the study "
                           f"(sweep cells run before training cells)")
        sweep[float(lr)] = json.loads(path.read_text())
    chosen = choose_learning_rate(sweep, rule["rule"], rule["tolerance"])
    return {**spec, "learning_rate": chosen["learning_rate"], "learning_rate_choice": chosen}


def _alone(trainer: Any, task: Any) -> np.ndarray:
    """The learner's (first learner's) greedy scores alone on ``task``."""
    from trainers.rollout import rollout_episodes

    j = trainer.learners[0]
    episodes = rollout_episodes("vote", trainer.pool, task, j, trainer.policies[j], coalition=[j],
                                examples=[ex.id for ex in task], samples=1, seed=trainer.config.seed,
                                learner_sampling=trainer.eval_sampling, partner_sampling=trainer.eval_sampling)
    return np.array([ep.score for ep in episodes], dtype=float)


def _sweep_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """One learning rate of the sweep: the learner alone on the selection questions before and after
    ``spec["trainer"]`` trains at it (on the sweep's seed); never the eval split."""
    sel = spec["selection"]
    desc = {**spec["task"], "seed": sel["seed"]}
    questions = build_task(desc, split=sel["split"], n=sel["n"])
    trainer = _trainer(spec, spec["trainer"], spec["seed"], None)
    before = _alone(trainer, questions)
    trainer.fit()
    after = _alone(trainer, questions)
    from trainers.controls import zero_variance_share

    return {"learning_rate": spec["learning_rate"], "before": float(before.mean()), "after": float(after.mean()),
            "example_ids": [ex.id for ex in questions], "zero_variance": zero_variance_share(trainer.history),
            "summary": f"lr {spec['learning_rate']:g}: learner alone on the selection questions {before.mean():.3f} -> "
                       f"{after.mean():.3f}"}


def _rates(trainer: Any, task: Any) -> dict[str, float | None]:
    """The learner's parse rate and, as a judge, verdict rate on ``task`` (greedy, the whole system)."""
    from trainers.controls import answer_rates
    from trainers.rollout import rollout_episodes

    greedy = trainer.eval_sampling
    episodes = rollout_episodes(trainer.protocol, trainer.pool, task, trainer.policies, options=trainer.config.protocol_options,
                                examples=[ex.id for ex in task], samples=1, seed=trainer.config.seed,
                                learner_sampling=greedy, partner_sampling=greedy)
    return answer_rates(episodes, trainer.learners[0])


def _baseline_cell(spec: dict[str, Any]) -> dict[str, Any]:
    trainer = _trainer(spec, "crl", 0, None)
    result = trainer.evaluate()
    return {**_scores(result), "without_learner": np.asarray(result.without_learner).tolist(),
            "rates": _rates(trainer, trainer.eval_task),
            "summary": f"system {result.system_accuracy:.3f}, learner alone {result.standalone_accuracy:.3f}, "
                       f"without the learner {np.mean(result.without_learner):.3f}"}


def _training_cell(spec: dict[str, Any], output_dir: Path, tracking: dict[str, Any] | None = None) -> dict[str, Any]:
    from trainers.controls import zero_variance_share

    trainer = _trainer(spec, spec["trainer"], spec["seed"], output_dir, tracking)
    trainer.fit()
    result = trainer.evaluate(controls=False)  # the system without the learner: once, in the baseline cell
    zero = zero_variance_share(trainer.history)
    chosen = {"learning_rate": spec["learning_rate"], **({"learning_rate_choice": spec["learning_rate_choice"]}
                                                          if "learning_rate_choice" in spec else {})}
    return {**_scores(result), "rollouts": trainer.rollouts, "zero_variance": zero,
            "rates": _rates(trainer, trainer.eval_task), **chosen,
            "summary": f"after training: system {result.system_accuracy:.3f}, learner alone "
                       f"{result.standalone_accuracy:.3f}, {trainer.rollouts} rollouts, zero-variance groups "
                       f"{zero if zero is None else round(zero, 2)}, lr {spec['learning_rate']:g}"}


def _crossplay_cell(spec: dict[str, Any], train_dir: Path) -> dict[str, Any]:
    """The training cell's learners, restored from its final checkpoint in ``train_dir``, played with the
    partners they trained with and with partners they never trained with (:func:`trainers.trainer_crossplay`).

    Raises:
        RuntimeError: no final checkpoint in ``train_dir`` (rerun the training cell with ``--fresh``)."""
    import trainers

    trainer = _trainer(spec, spec["trainer"], spec["seed"], train_dir)
    final = train_dir / f"checkpoint-{spec['steps']:06d}"
    if not (final / "state.json").exists():
        raise RunError(f"crossplay needs the training cell's final checkpoint {final}, which is missing; rerun "
                           f"the study with --fresh for {spec['setup_label']}/{spec['trainer']}/seed{spec['seed']}")
    trainer.load_checkpoint(final)
    cross = trainers.trainer_crossplay(trainer)
    learners = {j: {**r.to_dict(), **{k: np.asarray(v).tolist() for k, v in r.per_question.items()}}
                for j, r in cross.learners.items()}
    gap = np.mean([r.gap.delta for r in cross.learners.values()])
    return {"example_ids": list(cross.example_ids), "learners": learners,
            "settings": {k: float(np.mean(v)) for k, v in cross.settings.items()},
            "summary": f"cross-play gap (trained-with minus unseen partners' gain) {100 * gap:+.1f} points, "
                       f"{len(cross.settings)} settings"}


# ---------------------------------------------------------------------- the cell cache and the loop
def cell_path(out: Path, cell: Cell) -> Path:
    return out / "cells" / f"{cell.fingerprint}.json"


def load_result(out: Path, cell: Cell) -> dict[str, Any] | None:
    """A finished cell's result, or ``None`` when it has not finished. A file that is not a valid result
    of this cell (not JSON, not its fingerprint, scores missing, outside [0, 1], not finite or of the
    wrong length) is not used: a warning names it and the cell runs again (its file is then replaced)."""
    path = cell_path(out, cell)
    if not path.exists():
        return None
    try:
        result = read_json(path)  # a regular file only: a FIFO planted there must not hang the study
        problem = result_problem(cell, result)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = f"unreadable ({type(e).__name__}: {e})"
    if problem is None:
        return result
    warnings.warn(f"study cell file {path} is not a valid result of {cell.id}: {problem}; the cell runs again",
                  stacklevel=2)
    return None


def result_problem(cell: Cell, result: Any) -> str | None:
    """What is wrong with ``result`` as the finished result of ``cell`` (``None``: nothing)."""

    def scores(name: str, values: Any, length: int) -> str | None:
        if not isinstance(values, list) or len(values) != length:
            return f"{name} is not a list of {length} scores"
        flat = [x for row in values for x in (row if isinstance(row, list) else [row])]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1
                   for x in flat):
            return f"{name} holds a score that is not a finite number in [0, 1]"
        return None

    if not isinstance(result, dict):
        return f"a {type(result).__name__}, not a result"
    if result.get("fingerprint") != cell.fingerprint or result.get("kind") != cell.kind:
        return "another cell's fingerprint or kind"
    if cell.kind == "valuation":
        report = result.get("report")
        if not isinstance(report, dict) or not isinstance(report.get("ids"), list) \
                or not isinstance(report.get("example_ids"), list) or not isinstance(report.get("measures"), dict):
            return "no valuation report (ids, example_ids, measures)"
        n = len(report["example_ids"])
        checks = [scores("report.system", report.get("system"), n)]
        if report.get("estimator") in ("exact", "loo", "permutation", "antithetic"):
            individual = report["measures"].get("individual")
            if not isinstance(individual, dict):
                return "no individual scores"
            table = individual.get("per_question")  # (models, questions)
            checks.append(scores("report.measures.individual", table, len(report["ids"])))
            if not checks[-1] and not all(isinstance(r, list) and len(r) == n for r in table):
                checks.append(f"report.measures.individual is not {n} scores per model")
        return next((c for c in checks if c), None)
    ids = result.get("example_ids")
    if not isinstance(ids, list):
        return "no example_ids"
    if cell.kind == "lr_sweep":
        ok = all(isinstance(result.get(k), (int, float)) and math.isfinite(result[k]) and 0 <= result[k] <= 1
                 for k in ("before", "after"))
        return None if ok else "before/after are not accuracies in [0, 1]"
    if cell.kind == "crossplay":
        learners = result.get("learners")
        if not isinstance(learners, dict) or not learners:
            return "no learners"
        for j, r in learners.items():
            for k in ("trained_with_gain", "unseen_gain"):
                v = r.get(k) if isinstance(r, dict) else None
                if not isinstance(v, list) or len(v) != len(ids) or not all(
                        isinstance(x, (int, float)) and math.isfinite(x) and -1 <= x <= 1 for x in v):
                    return f"learners.{j}.{k} is not {len(ids)} gains in [-1, 1]"
        return None
    problem = scores("system", result.get("system"), len(ids)) or scores("standalone", result.get("standalone"), len(ids))
    if problem is None and cell.kind == "baseline":  # written before baselines carried the controls (#46): rerun
        problem = scores("without_learner", result.get("without_learner"), len(ids))
    return problem


def _payload(cell: Cell, out: Path, coalition_executor: Any = None, tracking: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    return {"cell": {"kind": cell.kind, "id": cell.id, "spec": cell.spec, "fingerprint": cell.fingerprint},
            "out": str(out), "coalition_executor": coalition_executor, "tracking": tracking}


def make_executor(config: StudyConfig):
    """The valuation executor the config names (cells and coalitions run on it)."""
    from crl_envs.valuation.executors import LocalExecutor, ProcessExecutor, RayExecutor

    e = config.executor
    per_task = {} if e.coalitions_per_task is None else {"coalitions_per_task": e.coalitions_per_task}
    if e.kind == "ray":
        return RayExecutor(e.address, num_cpus=e.num_cpus, **per_task)
    if e.kind == "processes":
        return ProcessExecutor(e.workers, **per_task)
    return LocalExecutor(**per_task)


def run_cells(config: StudyConfig, plan: Sequence[Cell], *, progress: bool = True,
              on_result: Callable[[Cell, dict[str, Any]], Any] | None = None) -> dict[str, dict[str, Any]]:
    """Run every unfinished cell of ``plan``; return ``cell id -> result`` for all of them.

    Valuation cells run one after another in this process, their coalitions on the executor (a Ray
    cluster's slots, or worker processes); baseline and training cells are handed to the executor
    as whole cells. Each result is written as soon as it arrives."""
    from crl_envs.study.plan import STAGE  # sweeps, then the rest, then crossplay (each reads the one before)

    stages = sorted({STAGE.get(c.kind, 1) for c in plan})
    if len(stages) > 1:
        results: dict[str, dict[str, Any]] = {}
        for stage in stages:
            results.update(run_cells(config, [c for c in plan if STAGE.get(c.kind, 1) == stage], progress=progress,
                                     on_result=on_result))
        return results
    out = config.out
    (out / "cells").mkdir(parents=True, exist_ok=True)
    results = {}
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

    def claimed(cell: Cell) -> bool:
        """Claim ``cell`` if it is still unfinished; ``False`` while another driver holds it."""
        if not _claim(out, cell):
            return False
        if not pending([cell]):  # finished by the driver that held it until now
            _release(out, cell)
        return True

    try:
        bar.set_postfix_str(f"0/{len(todo)} cells", refresh=True)
        local = [c for c in todo if c.kind == "valuation"]
        rest = [c for c in todo if c.kind != "valuation"]
        if config.executor.kind == "local":  # one cell at a time: claim each just before it runs
            local, rest = local + rest, []
        waiting: list[Cell] = []
        for cell in local:
            if pending([cell]):
                if claimed(cell):
                    if cell.id not in results:
                        _run_claimed(cell, out, executor, finished, tracking)
                else:
                    waiting.append(cell)  # another driver is running it: come back at the end
        mine = []  # whole cells on the executor: every one claimed first, held until its result is written
        for cell in pending(rest):
            if not claimed(cell):
                waiting.append(cell)
            elif cell.id not in results:
                mine.append(cell)
        try:
            executor.map(run_cell, [_payload(c, out, tracking=tracking) for c in mine], lambda i, r: finished(mine[i], r))
        finally:
            for cell in mine:
                _release(out, cell)
        told: set[str] = set()
        while waiting:
            progressed = False
            for cell in list(waiting):
                if not pending([cell]):
                    waiting.remove(cell)
                    progressed = True
                elif claimed(cell):
                    waiting.remove(cell)
                    progressed = True
                    if cell.id not in results:
                        _run_claimed(cell, out, executor, finished, tracking)
                elif cell.id not in told:
                    told.add(cell.id)
                    tqdm.write(f"[crl-envs study] {cell.id} is being run by {lock_holder(out, cell)}; waiting for "
                               f"it (taken over at once if that driver stops)")
            if waiting and not progressed:
                time.sleep(2)
    finally:
        bar.close()
    return results


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


def _run_claimed(cell: Cell, out: Path, coalition_executor: Any, finished: Callable[[Cell, dict[str, Any]], Any],
                 tracking: dict[str, Any] | None = None) -> None:
    try:
        finished(cell, run_cell(_payload(cell, out, coalition_executor, tracking)))
    finally:
        _release(out, cell)


def environment() -> dict[str, Any]:
    """Where a study ran: CPUs and the load average (for honest wall times)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "load_average": [round(x, 2) for x in load]}
