"""Protocol envs. Each module defines one ``ParallelEnv`` and a thin ``env(pool, task, **options)``.

``PROTOCOLS`` maps a protocol's short name to its factory; adding a protocol means adding its module
and one row to the roster's table, :data:`crl_envs.roster.VERSIONS` (the test suite parametrises over
``PROTOCOLS``).
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable, Mapping
from typing import Any

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, Turn, plurality
from crl_kit.errors import ConfigError

#: Short name -> factory, for every protocol of the roster (:data:`crl_envs.roster.VERSIONS`), in its order.
PROTOCOLS: dict[str, Callable[..., ProtocolEnv]] = {
    name: importlib.import_module(roster.module(name)).env for name in roster.VERSIONS
}


#: Method families: how the models of a protocol collaborate (MoCo's API / text / logit / weight
#: levels, refined at the API and text levels). Every protocol's env class declares one as ``FAMILY``.
FAMILIES: dict[str, str] = {
    "routing": "one model is chosen per question, and it alone answers (API level)",
    "cascade": "models answer in turn until one is confident enough (API level)",
    "aggregation": "members answer independently; their answers are combined (vote, a synthesising aggregator)",
    "judging": "members propose; a judge or ranker picks or fuses the best (text level)",
    "text exchange": "members read and revise each other's text over rounds (debate, feedback, relay, ...)",
    "logit": "members' next-token logits are fused at every decoding step into one answer (logit level)",
    "weight": "members' weights are merged into one model, which answers (weight level)",
}

#: The logit- and weight-level protocols (:data:`crl_envs.roster.MODEL_LEVEL`; :mod:`crl_envs.protocols.levels`),
#: imported on first use: they play transformers models only, so they are not in :data:`PROTOCOLS`.
MODEL_LEVEL_PROTOCOLS: tuple[str, ...] = tuple(roster.MODEL_LEVEL)


def family(protocol: str | Callable[..., ProtocolEnv]) -> str:
    """The method family of a protocol (name or factory), one of :data:`FAMILIES`.

    Example:
        >>> family("debate"), family("vote"), family("cascade")
        ('text exchange', 'aggregation', 'cascade')
    """
    cls = env_class(get(protocol))
    found = getattr(cls, "FAMILY", "") if cls is not None else ""
    if found not in FAMILIES:
        raise ConfigError(f"protocol {protocol!r} declares no method family (FAMILY = {found!r}); set FAMILY on its env "
                         f"class to one of {', '.join(FAMILIES)}")
    return found


def get(name: str | Callable[..., ProtocolEnv]) -> Callable[..., ProtocolEnv]:
    """A protocol factory by short name (``"debate"``), versioned name (``"debate_v0"``) or as given.

    Raises:
        ValueError: an unknown protocol or version.
        pettingzoo.utils.deprecated_module.DeprecatedEnv: a version older than the roster's (it names the
            current one).
    """
    if callable(name):
        return name
    level = roster.model_level(name) if isinstance(name, str) else None
    if level is not None:
        return importlib.import_module(roster.module(level)).env
    found = roster.parse(name)
    if found is not None and found[1] < roster.VERSIONS[found[0]]:
        roster.deprecated(*found)()  # raises DeprecatedEnv, naming the current version
    key = found[0] if found is not None and found[1] == roster.VERSIONS[found[0]] else name
    if key not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; known protocols: {', '.join(sorted(PROTOCOLS))}; logit and "
                          f"weight levels: {', '.join(MODEL_LEVEL_PROTOCOLS)}")
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


__all__ = ["PROTOCOLS", "MODEL_LEVEL_PROTOCOLS", "get", "env_class", "valid_options", "check_options", "ProtocolEnv", "Phase", "Outcome", "Turn", "plurality"]
