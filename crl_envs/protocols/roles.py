"""Helpers the protocols share: fixed roles chosen by option, member orders, choices parsed from text.

A *role* (aggregator, judge, summariser, ranker, fuser, answerer, drafter) is set by an option that is
either

- ``None`` (default): the first present coalition member (pool order) plays it;
- a pool member (agent id ``"model_2"`` or index ``2``): that member plays it and takes part in the
  coalition game; if it is masked out, the first present member plays it instead;
- an outside agent (an :class:`agents.Agent` or a spec string such as ``"hf:path"``): registered as
  the fixed role agent ``"<role>_0"``, never masked, outside the coalition game.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agents import Agent
from crl_envs.protocols.base import ProtocolEnv
from crl_kit.errors import ConfigError, ConfigTypeError

RoleOption = str | int | Agent | None
_INTEGER = re.compile(r"-?\d+")


def resolve_role(env: ProtocolEnv, role: str, option: RoleOption) -> str | None:
    """Turn a role option into an agent id (a pool member or a registered role agent), or ``None``
    for "first present member". Call from the env's ``__init__``."""
    if option is None:
        return None
    if isinstance(option, Agent):
        return env.add_role(f"{role}_0", option)
    if isinstance(option, int) and not isinstance(option, bool):
        if not 0 <= option < len(env.pool):
            raise ConfigError(f"{role}={option} is out of range for a pool of {len(env.pool)}; pass 0..{len(env.pool) - 1}")
        return env.pool.ids[option]
    if isinstance(option, str):
        if option in env.pool:
            return option
        if ":" in option:
            return env.add_role(f"{role}_0", option)
        raise ConfigError(
            f"{role}={option!r} is neither a pool member ({', '.join(env.pool.ids)}) nor an agent spec "
            f"('<backend>:<target>'); pass one of those, an agents.Agent, or None (first present member)"
        )
    raise ConfigTypeError(f"{role} must be None, a pool agent id or index, an agents.Agent or a spec string, got {type(option).__name__}")


def role_player(env: ProtocolEnv, chosen: str | None) -> str:
    """Who plays a role in the current episode: a role agent as given, a present pool member as
    given, and otherwise (``None`` or a masked member) the first present member."""
    if chosen is None or (chosen in env.pool and chosen not in env.members):
        return env.members[0]
    return chosen


def resolve_order(env: ProtocolEnv, order: Sequence[str | int] | None, name: str = "order") -> list[str]:
    """A permutation of the pool's agent ids (given as ids or indices); pool order by default."""
    if order is None:
        return list(env.pool.ids)
    if isinstance(order, (str, int)):
        raise ConfigTypeError(f"{name} must be a sequence of agent ids or indices, got {order!r}")
    ids = []
    for m in order:
        if isinstance(m, int) and not isinstance(m, bool) and 0 <= m < len(env.pool):
            ids.append(env.pool.ids[m])
        elif isinstance(m, str) and m in env.pool:
            ids.append(m)
        else:
            raise ConfigError(f"{name} names unknown agent {m!r}; pool agents are {env.pool.ids}")
    if sorted(ids) != sorted(env.pool.ids):
        raise ConfigError(f"{name} must list every pool agent exactly once ({env.pool.ids}), got {list(order)}")
    return ids


def parse_choice(text: str, n: int) -> int | None:
    """The first integer in ``text`` read as a 1-based choice among ``n``; its 0-based index, or
    ``None`` when there is no integer or the first one is out of range.

    Example:
        >>> parse_choice("Agent 2 is best.", 3), parse_choice("none", 3), parse_choice("7", 3)
        (1, None, None)
    """
    found = _INTEGER.search(text or "")
    if found is None:
        return None
    k = int(found.group())
    return k - 1 if 1 <= k <= n else None


__all__ = ["RoleOption", "resolve_role", "role_player", "resolve_order", "parse_choice"]
