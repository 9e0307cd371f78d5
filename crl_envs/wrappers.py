"""Wrappers around protocol envs."""

from __future__ import annotations

from collections.abc import Sequence

from pettingzoo.utils.wrappers import BaseParallelWrapper

from crl_envs.protocols.base import ProtocolEnv
from crl_kit.errors import ConfigError


class Coalition(BaseParallelWrapper):
    """Play only ``members`` of the pool: every ``reset`` passes them as ``options["coalition"]``.

    Example:
        >>> import agents, crl_envs
        >>> pool = agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.9, 0.6, 0.3)])
        >>> env = Coalition(crl_envs.vote_v0(pool, "arith"), ["model_0", "model_2"])
        >>> observations, infos = env.reset(seed=0)
        >>> sorted(observations)
        ['model_0', 'model_2']
    """

    def __init__(self, env: ProtocolEnv, members: Sequence[str | int]):
        super().__init__(env)
        self.members = list(members)
        env.unwrapped._resolve_coalition(self.members)  # fail now on unknown/empty members

    def reset(self, seed: int | None = None, options: dict | None = None):
        options = dict(options or {})
        if "coalition" in options and options["coalition"] is not None:
            raise ConfigError("Coalition wrapper already fixes the coalition; do not pass options['coalition']")
        options["coalition"] = self.members
        return self.env.reset(seed=seed, options=options)
