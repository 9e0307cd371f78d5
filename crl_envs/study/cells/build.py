"""What a cell's spec names, built: its pool, task and sampling (to run), and its pool's size, member
names and model calls per episode (to price it before anything runs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
    """The task a cell's task description names (``split`` and ``n`` override the description's)."""
    from crl_envs import tasks

    return tasks.load(desc["name"], split=split if split is not None else desc["split"],
                      n=n if n is not None else desc["n"], seed=desc["seed"], **desc["options"])


def sampling_params(desc: dict[str, Any]):
    """The :class:`agents.SamplingParams` of a cell's sampling description."""
    from agents import SamplingParams

    return SamplingParams(temperature=desc["temperature"], top_p=desc["top_p"], max_new_tokens=desc["max_new_tokens"])


def pool_size(pool: Any) -> int:
    """How many models a cell's pool description names (without loading them)."""
    if isinstance(pool, str):
        import agents  # registers the zoo's pools with their sizes

        return agents.pool_size(pool)
    return len(pool)


def member_names(pool: Any) -> list[str]:
    """The pool's member names as the cost estimate plays them (a named pool's: ``<pool>-<i>``)."""
    n = pool_size(pool)
    if isinstance(pool, list):
        return [m if isinstance(m, str) else m.get("name", f"expert-{m['expert']}") for m in pool]
    return [f"{pool}-{i}" for i in range(n)]


def calls_per_episode(protocol: str, options: Mapping[str, Any], names: list[str], members: list[int]) -> float:
    """Model calls per episode of a coalition, played by scripted stand-ins on one arith question
    (a protocol's call count does not depend on the task)."""
    from crl_envs import protocols, tasks
    from crl_envs.valuation.cost import calls_per_episode as played_calls

    return played_calls(protocols.get(protocol), names, tasks.load("arith", n=1), [f"model_{i}" for i in members],
                        options)
