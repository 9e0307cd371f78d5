"""A :class:`Pool` is the ordered roster of models a protocol plays: ``model_0 .. model_{n-1}``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from agents.base import Agent
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import did_you_mean

SpecFactory = Callable[[str], Agent]
#: What a backend's spec target builds, without building it: ``target -> agent class``.
ClassOfTarget = Callable[[str], "type[Agent]"]
_BACKENDS: dict[str, SpecFactory] = {}
_BACKEND_CLASSES: dict[str, ClassOfTarget] = {}
_NAMED_POOLS: dict[str, Callable[[], list[Agent]]] = {}
_POOL_CLASSES: dict[str, Callable[[], type[Agent]]] = {}
_POOL_SIZES: dict[str, int] = {}


def register_backend(prefix: str, factory: SpecFactory, agent_class: ClassOfTarget | None = None) -> None:
    """Make spec strings ``"<prefix>:<rest>"`` build ``factory(rest)``; ``agent_class(rest)`` names the
    class that will be built (cheaply: it may import the backend's module, never load a model), so a plan
    can read the class's properties (``Agent.deterministic``) before anything is built."""
    _BACKENDS[prefix] = factory
    if agent_class is not None:
        _BACKEND_CLASSES[prefix] = agent_class


def register_pool(name: str, factory: Callable[[], list[Agent]],
                  agent_class: Callable[[], type[Agent]] | None = None, size: int | None = None) -> None:
    """Make ``agents.pool(name)`` build the agents ``factory()`` returns (e.g. ``"zoo"``);
    ``agent_class()`` names the class of every member, as for :func:`register_backend`; ``size`` how many
    agents ``factory()`` returns, when known without building them (a plan reads it: :func:`pool_size`)."""
    _NAMED_POOLS[name] = factory
    if agent_class is not None:
        _POOL_CLASSES[name] = agent_class
    if size is not None:
        _POOL_SIZES[name] = size
    else:
        _POOL_SIZES.pop(name, None)


def pool_size(name: str) -> int:
    """How many agents the named pool ``agents.pool(name)`` holds: the size it was registered with, else built
    and counted.

    Example:
        >>> import agents, agents.zoo
        >>> agents.pool_size("zoo4-ladder")   # read from the registry: no model is loaded
        8

    Raises:
        ConfigError: ``name`` is not a named pool.
    """
    if name not in _NAMED_POOLS:
        raise _unknown_pool_error(name)
    if name in _POOL_SIZES:
        return _POOL_SIZES[name]
    return len(pool(name))


def agent_class(entry: str) -> type[Agent]:
    """The class of agent a named pool's members or a spec string will be, without building one:
    :class:`Agent` itself when the backend did not say (so a plan assumes only what every agent does).

    Example:
        >>> import agents
        >>> agents.agent_class("zoo").__name__, agents.agent_class("openai:http://h/v1#m").__name__
        ('HFAgent', 'OpenAIAgent')
        >>> agents.agent_class("pretrained:gemma-3-270m?backend=vllm").deterministic
        False

    Raises:
        ConfigError: ``entry`` is neither a named pool nor a ``<backend>:<target>`` spec.
    """
    if entry in _NAMED_POOLS:
        return _POOL_CLASSES[entry]() if entry in _POOL_CLASSES else Agent
    if not isinstance(entry, str) or ":" not in entry:
        raise _unknown_pool_error(entry)
    prefix, rest = entry.split(":", 1)
    if prefix not in _BACKENDS:
        raise ConfigError(f"unknown agent backend {prefix!r} in spec {entry!r}{did_you_mean(prefix, _BACKENDS)}; "
                          f"known backends: {sorted(_BACKENDS)}")
    return _BACKEND_CLASSES[prefix](rest) if prefix in _BACKEND_CLASSES else Agent


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
