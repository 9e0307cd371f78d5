"""crl-envs: multi-LLM collaboration protocols as PettingZoo environments.

Factories (``crl_envs.<protocol>_v0(pool, task, **options)``) return ``pettingzoo.ParallelEnv``
instances; :func:`run_episodes` plays many of them in lockstep with batched generation.

Names are imported on first use (PEP 562), so ``import crl_envs`` and ``crl-envs --help`` do not
pay for torch, transformers and scipy; ``crl_envs.debate_v0`` or ``crl_envs.valuation`` load them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Protocol short name -> module under ``crl_envs.protocols`` (each has an ``env`` factory).
#: ``crl_envs.protocols.PROTOCOLS`` is the same roster with the factories themselves (a test keeps
#: them equal).
PROTOCOL_MODULES: dict[str, str] = {
    name: f"crl_envs.protocols.{name}"
    for name in ("debate", "vote", "moa", "routing", "cascade", "feedback", "topology", "blender", "knowledge",
                 "judge", "relay", "refine")
}

_SUBMODULES = ("tasks", "valuation", "wrappers", "protocols", "runner", "sandbox", "spaces", "cli")
_FROM_RUNNER = ("Episode", "TurnRecord", "Usage", "run_episodes", "total_usage")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"crl_envs.{name}")
    if name == "PROTOCOLS":
        return importlib.import_module("crl_envs.protocols").PROTOCOLS
    if name.endswith("_v0") and name.removesuffix("_v0") in PROTOCOL_MODULES:
        return importlib.import_module(PROTOCOL_MODULES[name.removesuffix("_v0")]).env
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
        for name, module in PROTOCOL_MODULES.items():
            register("parallel", f"crl_envs/{name}-v0", f"{module}:env")


_register_with_pettingzoo()

if TYPE_CHECKING:  # pragma: no cover
    from crl_envs import protocols, tasks, valuation, wrappers
    from crl_envs.protocols import PROTOCOLS
    from crl_envs.protocols.blender import env as blender_v0
    from crl_envs.protocols.cascade import env as cascade_v0
    from crl_envs.protocols.debate import env as debate_v0
    from crl_envs.protocols.feedback import env as feedback_v0
    from crl_envs.protocols.judge import env as judge_v0
    from crl_envs.protocols.knowledge import env as knowledge_v0
    from crl_envs.protocols.moa import env as moa_v0
    from crl_envs.protocols.refine import env as refine_v0
    from crl_envs.protocols.relay import env as relay_v0
    from crl_envs.protocols.routing import env as routing_v0
    from crl_envs.protocols.topology import env as topology_v0
    from crl_envs.protocols.vote import env as vote_v0
    from crl_envs.runner import Episode, TurnRecord, Usage, run_episodes, total_usage

__all__ = ["tasks", "wrappers", "valuation", "protocols", "PROTOCOLS", "PROTOCOL_MODULES", "debate_v0", "vote_v0",
           "blender_v0", "cascade_v0", "feedback_v0", "judge_v0", "knowledge_v0", "moa_v0", "refine_v0", "relay_v0",
           "routing_v0", "topology_v0", "run_episodes", "Episode", "TurnRecord", "Usage", "total_usage"]
