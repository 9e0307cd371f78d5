"""Wrappers around protocol envs."""

from __future__ import annotations

from collections.abc import Sequence

from pettingzoo.utils.wrappers import BaseParallelWrapper

from crl_envs.protocols.base import ProtocolEnv


class Coalition(BaseParallelWrapper):
    """Play only ``members`` of the pool: every ``reset`` passes them as ``options["coalition"]``.

    Example:
        >>> env = Coalition(crl_envs.vote_v0(pool, task), ["model_0", "model_2"])  # doctest: +SKIP
        >>> env.reset(seed=0)                                                     # doctest: +SKIP
    """

    def __init__(self, env: ProtocolEnv, members: Sequence[str | int]):
        super().__init__(env)
        self.members = list(members)
        env.unwrapped._resolve_coalition(self.members)  # fail now on unknown/empty members

    def reset(self, seed: int | None = None, options: dict | None = None):
        options = dict(options or {})
        if "coalition" in options and options["coalition"] is not None:
            raise ValueError("Coalition wrapper already fixes the coalition; do not pass options['coalition']")
        options["coalition"] = self.members
        return self.env.reset(seed=seed, options=options)
