"""Where work executes: in this process, one after another; in local worker processes; or as Ray tasks.

An executor runs two kinds of work with the same machinery:

- **coalitions** (:meth:`Executor.run`): a game's coalitions are played in lockstep groups
  (:func:`lockstep_groups`: all of them locally unless ``coalitions_per_task`` says fewer, up to
  :data:`MAX_LOCKSTEP_EPISODES` episodes at a time; ``coalitions_per_task`` per task on worker
  processes and Ray) with
  :func:`crl_envs.valuation.coalition.coalitions_outcomes`, one batched call per agent per phase across
  the group, each distinct request generated once (the process's request memo), and each coalition's
  scores handed back to the driver, which stores them in the game's on-disk cache (one atomic write per
  coalition). A coalition's scores do not depend on its group, so every executor gives the local
  path's numbers bit for bit, and a killed driver, rerun, plays only the coalitions that never finished;
- **any picklable call** (:meth:`Executor.map`): ``fn(payload)`` for each payload, each result handed
  to ``done(index, result)`` as it arrives (the study runs its cells this way).

:class:`RayExecutor`:

- **Pool transport.** An agent built from a spec string (``agents.from_spec``, ``agents.pool("zoo")``)
  travels as its spec and fingerprint; each worker process builds it once and keeps it for later
  tasks (per-worker loading; ``vllm:``/``openai:`` agents then share their server), and checks that
  the fingerprint matches the driver's. Other agents (``ScriptedAgent``, models changed in memory)
  travel as objects through Ray's object store (cloudpickle), fetched once per worker.
- **Backpressure.** At most as many tasks in flight as the cluster has slots (CPUs divided by
  ``num_cpus`` per task; GPUs likewise when ``num_gpus`` is set), through ``ray.wait``.
- **Faults.** A worker that dies mid-run is retried (Ray's ``max_retries``); a task that raises is
  surfaced, never turned into a score; a malformed or unreachable address fails in seconds with one line.

:class:`ProcessExecutor` does the same on ``workers`` local processes (``spawn``ed, so no forked torch
state), with agents shipped the same way.

Example:
    >>> from crl_envs.valuation.executors import RayExecutor, resolve_executor
    >>> resolve_executor("local")
    LocalExecutor()
    >>> RayExecutor("head-node:6379", num_cpus=2)
    RayExecutor(address='head-node:6379', num_cpus=2)
"""

from __future__ import annotations

import abc
import os
import re
import socket
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import cloudpickle  # a gymnasium dependency
import numpy as np

from agents import Agent, Pool
from crl_envs.valuation.coalition import CoalitionRun, SoloAnswers, coalitions_outcomes
from crl_envs.valuation.spend import Spend
from crl_kit.errors import ConfigError, ConfigTypeError, MissingDependencyError, RunError
from crl_kit.validation import check_int, did_you_mean

INSTALL_HINT = "pip install 'crl-envs[ray]'"


class CoalitionJob(Protocol):
    """What an executor needs of a game: what a coalition run needs besides the mask."""

    def run_spec(self) -> CoalitionRun: ...


Done = Callable[[Any, int, tuple[np.ndarray, Spend, SoloAnswers | None]], Any]
#: The most episodes one lockstep group of coalitions plays at once (bounds memory and the work a
#: killed local run loses).
MAX_LOCKSTEP_EPISODES = 4096


def lockstep_groups(jobs: Sequence[tuple[CoalitionJob, int]], specs: Mapping[int, CoalitionRun],
                    per_group: int | None) -> list[tuple[int, list[int]]]:
    """``jobs`` as ``(id(game), [job indices])`` groups played in lockstep: one game per group, at most
    ``per_group`` coalitions (None: no limit) and :data:`MAX_LOCKSTEP_EPISODES` episodes, in job order."""
    groups: list[tuple[int, list[int]]] = []
    open_group: dict[int, list[int]] = {}
    for j, (game, _) in enumerate(jobs):
        spec = specs[id(game)]
        episodes = max(1, len(spec.example_ids) * spec.samples)
        limit = max(1, min(per_group or len(jobs), MAX_LOCKSTEP_EPISODES // episodes))
        group = open_group.get(id(game))
        if group is None or len(group) >= limit:
            group = open_group[id(game)] = []
            groups.append((id(game), group))
        group.append(j)
    return groups


class Executor(abc.ABC):
    """Plays coalition runs and reports each result to ``done(game, mask, (scores, spend))`` as it arrives;
    runs any picklable ``fn(payload)`` with :meth:`map`."""

    #: the name configs and the CLI give it (:data:`EXECUTORS`)
    name: str = ""
    #: the settings a config (a study's ``[executor]``) may give it, by :func:`build_executor`
    OPTIONS: tuple[str, ...] = ()

    #: coalitions played in lockstep by one task (None: as many as :data:`MAX_LOCKSTEP_EPISODES` allows)
    coalitions_per_task: int | None = None

    @abc.abstractmethod
    def start(self) -> None:
        """Connect to whatever runs the work (called before the first run, so a bad address fails early)."""

    @abc.abstractmethod
    def map(self, fn: Callable[[Any], Any], payloads: Sequence[Any], done: Callable[[int, Any], Any],
            bar: Any = None) -> None:
        """Call ``fn(payload)`` for every payload; ``done(index, result)`` as each finishes (any order)."""

    def run(self, jobs: Sequence[tuple[CoalitionJob, int]], done: Done, bar: Any = None) -> None:
        """Play every ``(game, mask)`` of ``jobs``; ``bar`` is the driver's progress bar (for a status line)."""
        specs: dict[int, CoalitionRun] = {}
        for game, _ in jobs:
            specs.setdefault(id(game), game.run_spec())
        self._run_groups(jobs, specs, specs, _play_coalitions, done, bar)

    def _run_groups(self, jobs: Sequence[tuple[CoalitionJob, int]], specs: Mapping[int, CoalitionRun],
                    payloads: Mapping[int, Any], fn: Callable[[Any], Any], done: Done, bar: Any) -> None:
        """Map ``fn`` over the lockstep groups of ``jobs`` (payload: the game's shipped run and the
        group's masks); ``done`` per coalition as each group's scores arrive."""
        groups = lockstep_groups(jobs, specs, self.coalitions_per_task)

        def finished(g: int, outcomes: list[tuple[np.ndarray, Spend, SoloAnswers | None]]) -> None:
            for j, s in zip(groups[g][1], outcomes):
                done(jobs[j][0], jobs[j][1], s)

        self.map(fn, [(payloads[key], [jobs[j][1] for j in members]) for key, members in groups], finished, bar=bar)


def _play_coalitions(payload: tuple[CoalitionRun, list[int]]) -> list[tuple[np.ndarray, Spend, SoloAnswers | None]]:
    run, masks = payload
    return coalitions_outcomes(run, masks)


class LocalExecutor(Executor):
    """One run after another in this process (the default).

    Args:
        coalitions_per_task: coalitions one group plays in lockstep (None: as many as
            :data:`MAX_LOCKSTEP_EPISODES` allows). Fewer: smaller batches, but each group's results
            reach the cache sooner, so a killed run loses at most one group's work.
    """

    name = "local"
    OPTIONS = ("coalitions_per_task",)

    def __init__(self, *, coalitions_per_task: int | None = None, **unexpected: Any):
        _unexpected("LocalExecutor", unexpected, ["coalitions_per_task"])
        self.coalitions_per_task = _check_per_task("LocalExecutor", coalitions_per_task, allow_none=True)

    def start(self) -> None:
        """Nothing to connect to."""

    def map(self, fn, payloads, done, bar=None) -> None:
        for i, payload in enumerate(payloads):
            done(i, fn(payload))

    def __repr__(self) -> str:
        per_task = self.coalitions_per_task
        return "LocalExecutor()" if per_task is None else f"LocalExecutor(coalitions_per_task={per_task})"


def resolve_executor(executor: Executor | str | None) -> Executor:
    """``"local"`` / ``None`` -> :class:`LocalExecutor`, ``"processes"`` -> :class:`ProcessExecutor`,
    ``"ray"`` -> :class:`RayExecutor` (the running or a new local cluster), each with its defaults (:func:`build_executor`);
    or an :class:`Executor` as is."""
    if executor is None:
        return LocalExecutor()
    if isinstance(executor, str) and executor in EXECUTOR_CLASSES:
        return build_executor(executor)
    if isinstance(executor, Executor):
        return executor
    raise ConfigError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)} or pass an Executor "
                     "(e.g. crl_envs.valuation.RayExecutor('head-node:6379'))")


def _check_per_task(owner: str, value: Any, *, allow_none: bool = False) -> int | None:
    return check_int(f"{owner} coalitions_per_task", value, minimum=1, allow_none=allow_none,
                     why="coalitions one task plays in lockstep")


def _unexpected(owner: str, unexpected: Mapping[str, Any], known: Sequence[str]) -> None:
    """One-line TypeError for keyword arguments ``owner`` does not take, with the closest known one."""
    if not unexpected:
        return
    name = next(iter(unexpected))
    hint = did_you_mean(name, known)
    raise ConfigTypeError(f"{owner} got an unexpected argument {name!r}{hint}; its arguments are {', '.join(known)}")


# ---------------------------------------------------------------------- agents shipped to workers
def _ship(value: Any, put: Callable[[Any], Any], refs: dict[int, _ObjectAgent]) -> Any:
    """``value`` with every Agent replaced by a :class:`_SpecAgent` or :class:`_ObjectAgent`."""
    if isinstance(value, Agent):
        spec = getattr(value, "spec", None)
        if isinstance(spec, str):
            return _SpecAgent(spec, value.fingerprint, value.name)
        if id(value) not in refs:
            refs[id(value)] = _ObjectAgent(put(value), value.fingerprint)
        return refs[id(value)]
    if isinstance(value, Mapping):
        return {k: _ship(v, put, refs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_ship(v, put, refs) for v in value)
    return value


def _portable_run(run: CoalitionRun, put: Callable[[Any], Any], refs: dict[int, _ObjectAgent]) -> CoalitionRun:
    return replace(run, pool=_ship(list(run.pool.values()), put, refs), options=_ship(run.options, put, refs))


def _play_shipped(payload: tuple[CoalitionRun, list[int]]) -> list[tuple[np.ndarray, Spend, SoloAnswers | None]]:
    """On a worker: rebuild the run's pool and options (reusing agents this process holds), play the masks."""
    portable, masks = payload
    if not isinstance(portable, CoalitionRun):  # a Ray object-store ref nested in the payload
        import ray

        portable = ray.get(portable)
    run = replace(portable, pool=Pool(_resolve(portable.pool)), options=_resolve(portable.options))
    return coalitions_outcomes(run, masks)


def _unpickled_call(blob: bytes) -> Any:
    """In a worker process: ``fn(payload)`` from their cloudpickle (scripted agents hold lambdas)."""
    fn, payload = cloudpickle.loads(blob)
    return fn(payload)


class ProcessExecutor(Executor):
    """Runs on ``workers`` local processes (started with ``spawn``; default: the CPU count). Payloads
    travel by cloudpickle, as on Ray.

    Args:
        workers: how many processes run at once.
        coalitions_per_task: coalitions one task plays in lockstep (more: bigger batches, fewer
            repeated requests; fewer: finer-grained results and load balance).
    """

    name = "processes"
    OPTIONS = ("workers", "coalitions_per_task")

    def __init__(self, workers: int | None = None, *, coalitions_per_task: int = 1, **unexpected: Any):
        _unexpected("ProcessExecutor", unexpected, ["workers", "coalitions_per_task"])
        check_int("ProcessExecutor workers", workers, minimum=1, allow_none=True, why="processes at once")
        self.workers = workers or os.cpu_count() or 1
        self.coalitions_per_task = _check_per_task("ProcessExecutor", coalitions_per_task)

    def start(self) -> None:
        """Processes start with the first :meth:`map`."""

    def map(self, fn, payloads, done, bar=None) -> None:
        import concurrent.futures
        import multiprocessing

        if not payloads:
            return
        with concurrent.futures.ProcessPoolExecutor(max_workers=min(self.workers, len(payloads)),
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_unpickled_call, cloudpickle.dumps((fn, p))): i for i, p in enumerate(payloads)}
            if bar is not None:
                bar.set_postfix_str(f"{min(self.workers, len(payloads))} processes", refresh=True)
            try:
                for future in concurrent.futures.as_completed(futures):
                    done(futures[future], future.result())
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def run(self, jobs, done, bar=None) -> None:
        refs: dict[int, _ObjectAgent] = {}
        specs: dict[int, CoalitionRun] = {}
        shipped: dict[int, CoalitionRun] = {}
        for game, _ in jobs:
            if id(game) not in specs:
                specs[id(game)] = game.run_spec()
                shipped[id(game)] = _portable_run(specs[id(game)], lambda agent: agent, refs)
        self._run_groups(jobs, specs, shipped, _play_shipped, done, bar)

    def __repr__(self) -> str:
        return f"ProcessExecutor(workers={self.workers})"


# ---------------------------------------------------------------------- Ray
def import_ray():
    """Ray, or one line naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(f"executor='ray' needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9\-_.]*[A-Za-z0-9])?)$")
ADDRESS_FORMS = "'host:port' of the head (default port 6379), 'ray://host:port' for Ray Client (10001), or 'auto'"


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Ray address, or one line saying what is malformed and which forms are valid."""
    def malformed(why: str) -> ValueError:
        return ConfigError(f"malformed Ray address {address!r} ({why}): expected {ADDRESS_FORMS}")

    target, default_port = (address[len("ray://"):], 10001) if address.startswith("ray://") else (address, 6379)
    if "://" in target:
        raise malformed(f"unknown scheme {target.split('://')[0]!r}; only ray:// is understood")
    if target.startswith("[") and "]" in target:  # [ipv6]:port
        host, _, rest = target.partition("]")
        host, port = host + "]", rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise malformed("text after the bracketed host")
    else:
        host, sep, port = target.rpartition(":") if ":" in target else (target, "", "")
    if not host:
        raise malformed("no host")
    if not _HOST.match(host):
        raise malformed(f"{host!r} is not a host name or IP address")
    if port == "":
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise malformed(f"port {port!r} is not a number in 1..65535")
    return host, int(port)


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast, with one line, when a Ray address is malformed, its host does not resolve, or nothing
    listens there (``host:port`` of the head's GCS, default port 6379, or ``ray://host:port`` of Ray
    Client, default 10001). Ray itself retries for minutes before giving up."""
    if address in ("auto", "local"):
        return
    host, port = parse_address(address)
    fix = ("check the address (the head's 'host:6379', or 'ray://host:10001' for Ray Client) or start a cluster "
           "with `ray start --head`")
    try:
        socket.getaddrinfo(host.strip("[]"), port)
    except OSError:
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: the host name {host!r} does not "
                              f"resolve; {fix}") from None
    try:
        socket.create_connection((host.strip("[]"), port), timeout=timeout).close()
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else "connection refused" \
            if isinstance(e, ConnectionRefusedError) else "unreachable"
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: nothing answers on port {port} "
                              f"({reason}); {fix}") from None


@dataclass(frozen=True)
class _SpecAgent:
    """An agent shipped as the spec it was built from; the worker rebuilds it and checks the fingerprint."""

    spec: str
    fingerprint: str
    name: str


@dataclass(frozen=True)
class _ObjectAgent:
    """An agent shipped as an object (a Ray object-store ref, or the agent itself for local processes),
    fetched once per worker process."""

    ref: Any
    fingerprint: str


#: Agents a worker process has built or fetched, by spec/fingerprint (a few at a time).
_WORKER_AGENTS: OrderedDict[tuple[str, str], Agent] = OrderedDict()
WORKER_AGENT_CACHE = 16


def _resolve(value: Any) -> Any:
    """On a worker: the inverse of :func:`_ship`, reusing agents this process already holds."""
    if isinstance(value, (_SpecAgent, _ObjectAgent)):
        key = (value.spec if isinstance(value, _SpecAgent) else "object", value.fingerprint)
        agent = _WORKER_AGENTS.get(key)
        if agent is None:
            if isinstance(value, _SpecAgent):
                from agents import from_spec

                agent = from_spec(value.spec)
                if agent.name != value.name:  # a spec builds its default name; keep the driver's
                    agent.name = value.name
                if agent.fingerprint != value.fingerprint:
                    raise RunError(
                        f"agent {value.name!r} rebuilt on a worker from {value.spec!r} differs from the driver's "
                        f"(fingerprint {agent.fingerprint} != {value.fingerprint}): the driver's agent changed after "
                        f"it was built, or the worker sees other files; save it and pass its spec, or drop .spec to "
                        f"ship the object"
                    )
            elif isinstance(value.ref, Agent):
                agent = value.ref
            else:
                import ray

                agent = ray.get(value.ref)
            _WORKER_AGENTS[key] = agent
            while len(_WORKER_AGENTS) > WORKER_AGENT_CACHE:
                _WORKER_AGENTS.popitem(last=False)
        _WORKER_AGENTS.move_to_end(key)
        return agent
    if isinstance(value, Mapping):
        return {k: _resolve(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v) for v in value)
    return value


def _call(fn: Callable[[Any], Any], payload: Any) -> Any:
    """The Ray task: ``fn(payload)`` on a worker."""
    return fn(payload)


class RayExecutor(Executor):
    """Each run is a Ray task; results come back to the driver, which caches them.

    Args:
        address: the cluster (``"head:6379"``, ``"ray://head:10001"``, ``"auto"``); ``None`` uses the
            Ray session this process already has, else ``$RAY_ADDRESS``, else starts a local cluster.
        num_cpus, num_gpus: resources per task (GPUs for workers that load local models on a GPU).
        max_retries: how often a task whose worker died is retried before the run fails.
        connect_timeout: seconds to wait for the address to answer before failing.
        init_options: extra keyword arguments of ``ray.init`` (e.g. ``runtime_env``) when this executor connects.
        coalitions_per_task: coalitions one task plays in lockstep (more: bigger batches, fewer
            repeated requests; fewer: finer-grained results, retries and load balance).

    Requires the ``ray`` extra: ``pip install 'crl-envs[ray]'``. Workers must be able to import
    ``crl_envs`` and ``agents`` (installed on every node, or shipped with ``runtime_env``).
    """

    name = "ray"
    OPTIONS = ("address", "num_cpus", "coalitions_per_task")
    ARGUMENTS = ("address", "num_cpus", "num_gpus", "max_retries", "connect_timeout", "init_options",
                 "coalitions_per_task")

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 max_retries: int = 3, connect_timeout: float = 3.0, init_options: Mapping[str, Any] | None = None,
                 coalitions_per_task: int = 1, **unexpected: Any):
        _unexpected("RayExecutor", unexpected, self.ARGUMENTS)
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ConfigError(f"RayExecutor address must be a string such as 'head:6379' or 'ray://head:10001', "
                             f"got {address!r}")
        if address is not None and address not in ("auto", "local"):
            parse_address(address)  # a malformed address fails here, before any connection attempt
        for label, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("connect_timeout", connect_timeout)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"RayExecutor {label} must be a number >= 0, got {v!r}")
        if num_cpus == 0 and num_gpus == 0:
            raise ConfigError("RayExecutor needs num_cpus > 0 or num_gpus > 0 per task (slots are counted from them)")
        check_int("RayExecutor max_retries", max_retries, minimum=0)
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.max_retries, self.connect_timeout = max_retries, float(connect_timeout)
        self.init_options = dict(init_options or {})
        self.coalitions_per_task = _check_per_task("RayExecutor", coalitions_per_task)
        self._remote: Any = None
        #: tasks submitted by the last :meth:`run` / :meth:`map` (retries not counted)
        self.submitted = 0

    def start(self) -> None:
        ray = import_ray()
        address = self.address or (None if ray.is_initialized() else os.environ.get("RAY_ADDRESS") or None)
        if address is not None:
            check_reachable(address, self.connect_timeout)
        if ray.is_initialized():
            if self.address is not None and address not in ("auto",) and not _same_cluster(ray, address):
                raise ConfigError(
                    f"this process is already connected to another Ray cluster "
                    f"({ray.get_runtime_context().gcs_address}); call ray.shutdown() first or use address=None"
                )
        else:
            options = dict(self.init_options)
            if address is None:  # a new local cluster: no dashboard (it needs ray[default] and a port)
                options.setdefault("include_dashboard", False)
            ray.init(address=address, **options)
        if self._remote is None:
            self._remote = ray.remote(_call)

    def slots(self) -> int:
        """How many tasks the cluster can run at once."""
        ray = import_ray()
        resources = ray.cluster_resources()
        counts = []
        if self.num_cpus:
            counts.append(int(resources.get("CPU", 0) // self.num_cpus))
        if self.num_gpus:
            counts.append(int(resources.get("GPU", 0) // self.num_gpus))
        slots = min(counts)
        if slots < 1:
            raise RunError(f"the Ray cluster has {resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} "
                               f"GPUs: no room for a task of num_cpus={self.num_cpus}, num_gpus={self.num_gpus}")
        return slots

    def map(self, fn, payloads, done, bar=None) -> None:
        self.start()
        ray = import_ray()
        fn_ref = ray.put(fn)
        task = self._remote.options(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=self.max_retries,
                                    retry_exceptions=False)
        slots = self.slots()
        queue = list(enumerate(payloads))
        queue.reverse()  # pop() from the end submits in the given order
        pending: dict[Any, int] = {}
        self.submitted = 0
        try:
            while queue or pending:
                while queue and len(pending) < slots:
                    i, payload = queue.pop()
                    pending[task.remote(fn_ref, payload)] = i
                    self.submitted += 1
                if bar is not None:
                    bar.set_postfix_str(f"{len(pending)} in flight on {slots} slots", refresh=True)
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    done(pending.pop(ref), ray.get(ref))
        finally:
            for ref in pending:  # an error or an interrupt: stop what is still running
                ray.cancel(ref, force=True)

    def run(self, jobs, done, bar=None) -> None:
        self.start()
        ray = import_ray()
        refs: dict[int, _ObjectAgent] = {}
        specs: dict[int, CoalitionRun] = {}
        payloads: dict[int, Any] = {}
        for game, _ in jobs:
            if id(game) not in payloads:
                specs[id(game)] = game.run_spec()
                payloads[id(game)] = ray.put(_portable_run(specs[id(game)], ray.put, refs))
        self._run_groups(jobs, specs, payloads, _play_shipped, done, bar)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus))
                        if v != (1 if k == "num_cpus" else 0))
        return f"RayExecutor(address={self.address!r}{extra})"


def _same_cluster(ray: Any, address: str) -> bool:
    current = ray.get_runtime_context().gcs_address or ""
    if address.startswith("ray://"):
        return True  # a Ray Client session cannot be compared by GCS address; trust the caller
    host, _, port = address.rpartition(":")
    cur_host, _, cur_port = current.rpartition(":")
    if port != cur_port:
        return False
    try:
        return {socket.gethostbyname(host)} == {socket.gethostbyname(cur_host)} or host == cur_host
    except OSError:
        return host == cur_host


#: The executors by name: the one place their names are declared (a study's ``[executor] kind`` reads it).
EXECUTOR_CLASSES: dict[str, type[Executor]] = {cls.name: cls for cls in (LocalExecutor, ProcessExecutor, RayExecutor)}
EXECUTORS = tuple(EXECUTOR_CLASSES)


def build_executor(kind: str, **settings: Any) -> Executor:
    """The executor named ``kind`` with the ``settings`` it takes (:attr:`Executor.OPTIONS`; a ``None`` setting
    keeps the executor's default), e.g. from a study's ``[executor]`` table."""
    cls = EXECUTOR_CLASSES[kind]
    return cls(**{k: v for k, v in settings.items() if k in cls.OPTIONS and v is not None})
