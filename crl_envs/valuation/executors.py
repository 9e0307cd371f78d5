"""Where coalition runs execute: in this process, one after another, or as Ray tasks on a cluster.

Both executors play a coalition with :func:`crl_envs.valuation.game.coalition_scores` and hand the
scores back to the driver, which stores them in the game's on-disk cache (one atomic write per
coalition). So the Ray path gives the local path's numbers bit for bit, and a killed driver, rerun,
plays only the coalitions that never finished.

:class:`RayExecutor`:

- **Pool transport.** An agent built from a spec string (``agents.from_spec``, ``agents.pool("zoo")``)
  travels as its spec and fingerprint; each worker process builds it once and keeps it for later
  tasks (per-worker loading; ``vllm:``/``openai:`` agents then share their server), and checks that
  the fingerprint matches the driver's. Other agents (``ScriptedAgent``, models changed in memory)
  travel as objects through Ray's object store (cloudpickle), fetched once per worker.
- **Backpressure.** At most as many coalitions in flight as the cluster has slots (CPUs divided by
  ``num_cpus`` per task; GPUs likewise when ``num_gpus`` is set), through ``ray.wait``.
- **Faults.** A worker that dies mid-run is retried (Ray's ``max_retries``); a task that raises is
  surfaced, never turned into a score; an unreachable address fails in seconds with one line.

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
import socket
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from agents import Agent, Pool

if TYPE_CHECKING:
    from crl_envs.valuation.game import CoalitionGame

EXECUTORS = ("local", "ray")
INSTALL_HINT = "pip install 'crl-envs[ray]'"
Done = Callable[["CoalitionGame", int, np.ndarray], Any]


class Executor(abc.ABC):
    """Plays coalition runs and reports each result to ``done(game, mask, scores)`` as it arrives."""

    @abc.abstractmethod
    def start(self) -> None:
        """Connect to whatever runs the work (called before the first run, so a bad address fails early)."""

    @abc.abstractmethod
    def run(self, jobs: Sequence[tuple[CoalitionGame, int]], done: Done, bar: Any = None) -> None:
        """Play every ``(game, mask)`` of ``jobs``; ``bar`` is the driver's tqdm bar (for a status line)."""


class LocalExecutor(Executor):
    """One coalition after another in this process (the default)."""

    def start(self) -> None:
        """Nothing to connect to."""

    def run(self, jobs: Sequence[tuple[CoalitionGame, int]], done: Done, bar: Any = None) -> None:
        for game, mask in jobs:
            done(game, mask, game._play(mask))

    def __repr__(self) -> str:
        return "LocalExecutor()"


def resolve_executor(executor: Executor | str | None) -> Executor:
    """``"local"`` / ``None`` -> :class:`LocalExecutor`, ``"ray"`` -> :class:`RayExecutor` (the
    running or a new local cluster), or an :class:`Executor` as is."""
    if executor is None or executor == "local":
        return LocalExecutor()
    if executor == "ray":
        return RayExecutor()
    if isinstance(executor, Executor):
        return executor
    raise ValueError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)} or pass an Executor "
                     "(e.g. crl_envs.valuation.RayExecutor('head-node:6379'))")


# ---------------------------------------------------------------------- Ray
def import_ray():
    """Ray, or one line naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"executor='ray' needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast, with one line, when nothing listens at a Ray address (``host:port`` of the head's GCS,
    default port 6379, or ``ray://host:port`` of Ray Client, default 10001). Ray itself retries for
    minutes before giving up."""
    if address in ("auto", "local"):
        return
    target, default_port = (address[len("ray://"):], 10001) if address.startswith("ray://") else (address, 6379)
    host, _, port = target.rpartition(":") if ":" in target else (target, "", str(default_port))
    try:
        port_number = int(port)
    except ValueError:
        raise ValueError(f"malformed Ray address {address!r}: expected 'host:port' or 'ray://host:port'") from None
    try:
        socket.create_connection((host.strip("[]"), port_number), timeout=timeout).close()
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConnectionError(
            f"cannot reach the Ray cluster at {address!r} ({reason}): check the address (the head's "
            f"'host:6379', or 'ray://host:10001' for Ray Client) or start a cluster with `ray start --head`"
        ) from None


@dataclass(frozen=True)
class _SpecAgent:
    """An agent shipped as the spec it was built from; the worker rebuilds it and checks the fingerprint."""

    spec: str
    fingerprint: str
    name: str


@dataclass(frozen=True)
class _ObjectAgent:
    """An agent shipped as an object in Ray's object store (fetched once per worker process)."""

    ref: Any
    fingerprint: str


def _portable(value: Any, ray: Any, refs: dict[int, _ObjectAgent]) -> Any:
    """``value`` with every Agent replaced by a :class:`_SpecAgent` or :class:`_ObjectAgent`."""
    if isinstance(value, Agent):
        spec = getattr(value, "spec", None)
        if isinstance(spec, str):
            return _SpecAgent(spec, value.fingerprint, value.name)
        if id(value) not in refs:
            refs[id(value)] = _ObjectAgent(ray.put(value), value.fingerprint)
        return refs[id(value)]
    if isinstance(value, Mapping):
        return {k: _portable(v, ray, refs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_portable(v, ray, refs) for v in value)
    return value


#: Agents a worker process has built or fetched, by spec/fingerprint (a few at a time).
_WORKER_AGENTS: OrderedDict[tuple[str, str], Agent] = OrderedDict()
WORKER_AGENT_CACHE = 16


def _resolve(value: Any) -> Any:
    """On a worker: the inverse of :func:`_portable`, reusing agents this process already holds."""
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
                    raise RuntimeError(
                        f"agent {value.name!r} rebuilt on a Ray worker from {value.spec!r} differs from the driver's "
                        f"(fingerprint {agent.fingerprint} != {value.fingerprint}): the driver's agent changed after "
                        f"it was built, or the worker sees other files; save it and pass its spec, or drop .spec to "
                        f"ship the object"
                    )
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


def _play_on_worker(portable_run: Any, mask: int) -> np.ndarray:
    """The Ray task: rebuild the run's pool and options on this worker, play coalition ``mask``."""
    from crl_envs.valuation.game import coalition_scores

    members = _resolve(portable_run.pool)
    run = replace(portable_run, pool=Pool(members), options=_resolve(portable_run.options))
    return coalition_scores(run, mask)


class RayExecutor(Executor):
    """Each coalition's run is a Ray task; results come back to the driver, which caches them.

    Args:
        address: the cluster (``"head:6379"``, ``"ray://head:10001"``, ``"auto"``); ``None`` uses the
            Ray session this process already has, else ``$RAY_ADDRESS``, else starts a local cluster.
        num_cpus, num_gpus: resources per coalition task (GPUs for workers that load local models on a GPU).
        max_retries: how often a task whose worker died is retried before the run fails.
        connect_timeout: seconds to wait for the address to answer before failing.
        init_options: extra keyword arguments of ``ray.init`` (e.g. ``runtime_env``) when this executor connects.

    Requires the ``ray`` extra: ``pip install 'crl-envs[ray]'``. Workers must be able to import
    ``crl_envs`` and ``agents`` (installed on every node, or shipped with ``runtime_env``).
    """

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float = 0,
                 max_retries: int = 3, connect_timeout: float = 3.0, init_options: Mapping[str, Any] | None = None):
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"RayExecutor address must be a string such as 'head:6379' or 'ray://head:10001', "
                             f"got {address!r}")
        for label, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("connect_timeout", connect_timeout)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"RayExecutor {label} must be a number >= 0, got {v!r}")
        if num_cpus == 0 and num_gpus == 0:
            raise ValueError("RayExecutor needs num_cpus > 0 or num_gpus > 0 per task (slots are counted from them)")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"RayExecutor max_retries must be an int >= 0, got {max_retries!r}")
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.max_retries, self.connect_timeout = max_retries, float(connect_timeout)
        self.init_options = dict(init_options or {})
        self._remote: Any = None
        #: coalition tasks submitted by the last :meth:`run` (retries not counted)
        self.submitted = 0

    def start(self) -> None:
        ray = import_ray()
        address = self.address or (None if ray.is_initialized() else os.environ.get("RAY_ADDRESS") or None)
        if address is not None:
            check_reachable(address, self.connect_timeout)
        if ray.is_initialized():
            if self.address is not None and address not in ("auto",) and not _same_cluster(ray, address):
                raise ValueError(
                    f"this process is already connected to another Ray cluster "
                    f"({ray.get_runtime_context().gcs_address}); call ray.shutdown() first or use address=None"
                )
        else:
            options = dict(self.init_options)
            if address is None:  # a new local cluster: no dashboard (it needs ray[default] and a port)
                options.setdefault("include_dashboard", False)
            ray.init(address=address, **options)
        if self._remote is None:
            self._remote = ray.remote(_play_on_worker)

    def slots(self) -> int:
        """How many coalition tasks the cluster can run at once."""
        ray = import_ray()
        resources = ray.cluster_resources()
        counts = []
        if self.num_cpus:
            counts.append(int(resources.get("CPU", 0) // self.num_cpus))
        if self.num_gpus:
            counts.append(int(resources.get("GPU", 0) // self.num_gpus))
        slots = min(counts)
        if slots < 1:
            raise RuntimeError(f"the Ray cluster has {resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} "
                               f"GPUs: no room for a task of num_cpus={self.num_cpus}, num_gpus={self.num_gpus}")
        return slots

    def run(self, jobs: Sequence[tuple[CoalitionGame, int]], done: Done, bar: Any = None) -> None:
        self.start()
        ray = import_ray()
        refs: dict[int, _ObjectAgent] = {}
        payloads: dict[int, Any] = {}
        for game, _ in jobs:
            if id(game) not in payloads:
                run = game.run_spec()
                portable = replace(run, pool=_portable(list(run.pool.values()), ray, refs),
                                   options=_portable(run.options, ray, refs))
                payloads[id(game)] = ray.put(portable)
        task = self._remote.options(num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=self.max_retries,
                                    retry_exceptions=False)
        slots = self.slots()
        queue = list(jobs)
        queue.reverse()  # pop() from the end submits in the given order
        pending: dict[Any, tuple[CoalitionGame, int]] = {}
        self.submitted = 0
        try:
            while queue or pending:
                while queue and len(pending) < slots:
                    game, mask = queue.pop()
                    pending[task.remote(payloads[id(game)], mask)] = (game, mask)
                    self.submitted += 1
                if bar is not None:
                    bar.set_postfix_str(f"{len(pending)} in flight on {slots} slots", refresh=True)
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    game, mask = pending.pop(ref)
                    done(game, mask, ray.get(ref))
        finally:
            for ref in pending:  # an error or an interrupt: stop what is still running
                ray.cancel(ref, force=True)

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
