"""A :class:`Pool` is the ordered roster of models a protocol plays: ``model_0 .. model_{n-1}``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from agents.base import Agent
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import did_you_mean

SpecFactory = Callable[[str], Agent]
_BACKENDS: dict[str, SpecFactory] = {}
_NAMED_POOLS: dict[str, Callable[[], list[Agent]]] = {}


def register_backend(prefix: str, factory: SpecFactory) -> None:
    """Make spec strings ``"<prefix>:<rest>"`` build ``factory(rest)``."""
    _BACKENDS[prefix] = factory


def register_pool(name: str, factory: Callable[[], list[Agent]]) -> None:
    """Make ``agents.pool(name)`` build the agents ``factory()`` returns (e.g. ``"zoo"``)."""
    _NAMED_POOLS[name] = factory


def pool_names() -> list[str]:
    """The named pools ``agents.pool(name)`` builds (``"zoo"``, ``"pretrained"``, ...), sorted."""
    return sorted(_NAMED_POOLS)


def backend_names() -> list[str]:
    """The backends of agent specs ``"<backend>:<target>"`` (``"hf"``, ``"openai"``, ...), sorted."""
    return sorted(_BACKENDS)


def _unknown_pool_error(name: str) -> ValueError:
    """The error for a pool member that is neither a named pool nor a ``<backend>:<target>`` spec."""
    return ConfigError(
        f"unknown pool or malformed agent spec {name!r}{did_you_mean(name, _NAMED_POOLS)}: named pools are "
        f"{', '.join(sorted(_NAMED_POOLS))}; an agent spec is '<backend>:<target>' with backend one of "
        f"{', '.join(sorted(_BACKENDS))} (e.g. 'hf:path/to/model')"
    )


def from_spec(spec: str) -> Agent:
    """Build one agent from a spec string such as ``"hf:gpt2"`` or ``"openai:http://host/v1#model"``."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(
            f"malformed agent spec {spec!r}: expected '<backend>:<target>' with backend one of "
            f"{sorted(_BACKENDS)} (e.g. 'hf:path/to/model')"
        )
    prefix, rest = spec.split(":", 1)
    if prefix not in _BACKENDS:
        raise ConfigError(f"unknown agent backend {prefix!r} in spec {spec!r}{did_you_mean(prefix, _BACKENDS)}; "
                         f"known backends: {sorted(_BACKENDS)}")
    if not rest.strip():
        raise ConfigError(f"malformed agent spec {spec!r}: nothing after '{prefix}:'")
    agent = _BACKENDS[prefix](rest)
    if agent.spec is None:
        agent.spec = spec  # remembered, so another process can rebuild the same agent
    return agent


class Pool(Mapping[str, Agent]):
    """Ordered mapping ``agent id -> Agent`` with ids ``model_0 .. model_{n-1}``.

    Example:
        >>> from agents import Pool, ScriptedAgent
        >>> p = Pool([ScriptedAgent.expert("a", 0.9), ScriptedAgent.expert("b", 0.5)])
        >>> p.ids, p.names
        (['model_0', 'model_1'], ['a', 'b'])
    """

    def __init__(self, members: Iterable[Agent]):
        members = list(members)
        if not members:
            raise ConfigError("empty pool: a pool needs at least one agent")
        for m in members:
            if not isinstance(m, Agent):
                raise ConfigTypeError(f"pool members must be agents.Agent instances or spec strings, got {type(m).__name__}")
        self._agents = {f"model_{i}": a for i, a in enumerate(members)}

    def __getitem__(self, agent_id: str) -> Agent:
        try:
            return self._agents[agent_id]
        except KeyError:
            raise KeyError(f"no agent {agent_id!r} in pool; agents are {self.ids}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    @property
    def ids(self) -> list[str]:
        return list(self._agents)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self._agents.values()]

    def name_of(self, agent_id: str) -> str:
        return self[agent_id].name

    @property
    def fingerprint(self) -> str:
        return "|".join(f"{i}={a.fingerprint}" for i, a in self._agents.items())

    def __repr__(self) -> str:
        return "Pool(" + ", ".join(f"{i}={a.name}" for i, a in self._agents.items()) + ")"


def pool(*members: Agent | str | Iterable[Agent | str] | Pool) -> Pool:
    """Build a :class:`Pool` from agents, spec strings, or a registered pool name.

    ``agents.pool("zoo")`` is the embedded default pool; ``agents.pool("hf:a", "hf:b")`` or
    ``agents.pool([agent_a, "hf:b"])`` build one from parts.
    """
    if len(members) == 1 and isinstance(members[0], Pool):
        return members[0]
    if len(members) == 1 and isinstance(members[0], str) and members[0] in _NAMED_POOLS:
        return Pool(_NAMED_POOLS[members[0]]())
    flat: list[Agent | str] = []
    for m in members:
        if isinstance(m, (str, Agent)):
            flat.append(m)
        elif isinstance(m, Iterable):
            flat.extend(m)
        else:
            raise ConfigTypeError(f"cannot build a pool member from {type(m).__name__}")
    built = []
    for m in flat:
        if isinstance(m, str) and m in _NAMED_POOLS:
            built.extend(_NAMED_POOLS[m]())
        elif isinstance(m, str) and ":" not in m:
            raise _unknown_pool_error(m)
        elif isinstance(m, str):
            built.append(from_spec(m))
        else:
            built.append(m)
    return Pool(built)
