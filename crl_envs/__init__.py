"""crl-envs: multi-LLM collaboration protocols as PettingZoo environments.

Factories (``crl_envs.<protocol>_v0(pool, task, **options)``, one per row of the roster's table,
:data:`crl_envs.roster.VERSIONS`) return ``pettingzoo.ParallelEnv`` instances; :func:`run_episodes`
plays many of them in lockstep with batched generation.

Names are imported on first use (PEP 562), so ``import crl_envs`` and ``crl-envs --help`` do not
pay for torch, transformers and scipy; ``crl_envs.debate_v0`` or ``crl_envs.valuation`` load them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from crl_envs import roster

__version__ = "0.1.0"

#: Protocol short name -> module under ``crl_envs.protocols`` (each has an ``env`` factory), from the
#: roster's one table (:data:`crl_envs.roster.VERSIONS`).
PROTOCOL_MODULES: dict[str, str] = {name: roster.module(name) for name in roster.VERSIONS}

_SUBMODULES = ("tasks", "valuation", "wrappers", "protocols", "runner", "sandbox", "spaces", "commands")
_FROM_RUNNER = ("Episode", "EpisodeStepper", "TurnRecord", "Usage", "run_episodes", "total_usage")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"crl_envs.{name}")
    if name == "PROTOCOLS":
        return importlib.import_module("crl_envs.protocols").PROTOCOLS
    level = roster.model_level(name) if roster.parse(name) is None and "_v" in name else None
    if level is not None:  # a logit- or weight-level protocol (roster.MODEL_LEVEL)
        return importlib.import_module(roster.module(level)).env
    found = roster.parse(name)
    if found is not None:
        protocol, version = found
        if version == roster.VERSIONS[protocol]:
            return importlib.import_module(roster.module(protocol)).env
        if version < roster.VERSIONS[protocol]:
            return roster.deprecated(protocol, version)
    if name in _FROM_RUNNER:
        return getattr(importlib.import_module("crl_envs.runner"), name)
    raise AttributeError(f"module 'crl_envs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _register_with_pettingzoo() -> None:
    """Expose every protocol as ``pettingzoo.make("parallel", "crl_envs/<name>-v0", pool=..., task=...)``.

    Entry points are ``"module:attr"`` strings, which PettingZoo imports only when the env is made.
    """
    try:
        import pettingzoo
    except ImportError:  # pragma: no cover
        return
    register = getattr(pettingzoo, "register", None)
    if register is None:  # pettingzoo < 1.27
        return
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-registration on module reload
        for name, version in {**roster.VERSIONS, **roster.MODEL_LEVEL}.items():
            register("parallel", f"crl_envs/{name}-v{version}", f"{roster.module(name)}:env")


_register_with_pettingzoo()

if TYPE_CHECKING:  # pragma: no cover
    from crl_envs import protocols, tasks, valuation, wrappers
    from crl_envs.protocols import PROTOCOLS
    from crl_envs.runner import Episode, EpisodeStepper, TurnRecord, Usage, run_episodes, total_usage

__all__ = ["tasks", "wrappers", "valuation", "protocols", "roster", "PROTOCOLS", "PROTOCOL_MODULES",
           *(roster.versioned(name) for name in roster.VERSIONS),
           "run_episodes", "Episode", "EpisodeStepper", "TurnRecord", "Usage", "total_usage"]
