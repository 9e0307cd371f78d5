"""Protocol envs. Each module defines one ``ParallelEnv`` and a thin ``env(pool, task, **options)``.

``PROTOCOLS`` maps a protocol's short name to its factory; adding a protocol means adding its module
and one entry here (the test suite parametrises over this dict).
"""

from __future__ import annotations

from collections.abc import Callable

from crl_envs.protocols import (
    blender,
    cascade,
    debate,
    feedback,
    judge,
    knowledge,
    moa,
    refine,
    relay,
    routing,
    topology,
    vote,
)
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, Turn, plurality

PROTOCOLS: dict[str, Callable[..., ProtocolEnv]] = {
    "debate": debate.env,
    "vote": vote.env,
    "moa": moa.env,
    "routing": routing.env,
    "cascade": cascade.env,
    "feedback": feedback.env,
    "topology": topology.env,
    "blender": blender.env,
    "knowledge": knowledge.env,
    "judge": judge.env,
    "relay": relay.env,
    "refine": refine.env,
}


def get(name: str | Callable[..., ProtocolEnv]) -> Callable[..., ProtocolEnv]:
    """A protocol factory by short name (``"debate"``), versioned name (``"debate_v0"``) or as given."""
    if callable(name):
        return name
    key = name.removesuffix("_v0")
    if key not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(PROTOCOLS))}")
    return PROTOCOLS[key]


__all__ = ["PROTOCOLS", "get", "ProtocolEnv", "Phase", "Outcome", "Turn", "plurality"]
