"""Protocol envs. Each module defines one ``ParallelEnv`` and a thin ``env(pool, task, **options)``.

``PROTOCOLS`` maps a protocol's short name to its factory; adding a protocol means adding its module
and one entry here (the test suite parametrises over this dict).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any

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


def env_class(factory: Callable[..., ProtocolEnv] | type[ProtocolEnv]) -> type[ProtocolEnv] | None:
    """The env class a factory makes (from its return annotation), or ``None`` when it does not say."""
    if isinstance(factory, type):
        return factory if issubclass(factory, ProtocolEnv) else None
    try:
        made = typing.get_type_hints(factory).get("return")
    except Exception:  # an unresolvable annotation: nothing to check against
        return None
    return made if isinstance(made, type) and issubclass(made, ProtocolEnv) else None


def valid_options(protocol: str | Callable[..., ProtocolEnv]) -> list[str]:
    """The keyword options a protocol accepts (its own, then the shared ``prompts``, ``max_action_chars``,
    ``render_mode``); empty when the factory's env class is unknown."""
    cls = env_class(get(protocol))
    return cls.option_names() if cls is not None else []


def check_options(protocol: str | Callable[..., ProtocolEnv], options: Mapping[str, Any] | None) -> None:
    """Raise one ``ValueError`` naming every unknown option of ``protocol`` and listing the valid ones,
    before any env (or model) is built. Factories of unknown env classes are not checked here (the
    env's ``__init__`` still checks)."""
    cls = env_class(get(protocol))
    if cls is not None and options:
        cls.check_options(options)


__all__ = ["PROTOCOLS", "get", "env_class", "valid_options", "check_options", "ProtocolEnv", "Phase", "Outcome", "Turn", "plurality"]
