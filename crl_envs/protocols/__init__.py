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


#: Method families: how the models of a protocol collaborate (MoCo's API / text / logit / weight
#: levels, refined at the API and text levels). Every protocol's env class declares one as ``FAMILY``.
FAMILIES: dict[str, str] = {
    "routing": "one model is chosen per question, and it alone answers (API level)",
    "cascade": "models answer in turn until one is confident enough (API level)",
    "aggregation": "members answer independently; their answers are combined (vote, a synthesising aggregator)",
    "judging": "members propose; a judge or ranker picks or fuses the best (text level)",
    "text exchange": "members read and revise each other's text over rounds (debate, feedback, relay, ...)",
}


def family(protocol: str | Callable[..., ProtocolEnv]) -> str:
    """The method family of a protocol (name or factory), one of :data:`FAMILIES`.

    Example:
        >>> family("debate"), family("vote"), family("cascade")
        ('text exchange', 'aggregation', 'cascade')
    """
    cls = env_class(get(protocol))
    found = getattr(cls, "FAMILY", "") if cls is not None else ""
    if found not in FAMILIES:
        raise ValueError(f"protocol {protocol!r} declares no method family (FAMILY = {found!r}); set FAMILY on its env "
                         f"class to one of {', '.join(FAMILIES)}")
    return found


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
