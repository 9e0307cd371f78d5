"""Logit contrast: the coalition's top-ranked member, steered by the logit difference between its better and worse half.

| | |
|---|---|
| Import | ``crl_envs.logit_contrast_v0(pool, task, ranking=None, strength=0.5)`` |
| Family | logit (MoCo's logit level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the seat ``ensemble``, which answers for them |
| Phases | 1: ``answer`` — the ``ensemble`` seat, played by :class:`agents.logit.LogitEnsemble` of the members with the contrast rule, answers the question |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the ensemble's answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's answer extracted from the contrastive decode |
| Final infos | ``answer``, ``score``, ``answers`` (``{"ensemble": answer}``) |
| Arguments | ``ranking`` (every pool agent id, best first: the declared roles; default pool order), ``strength`` (λ >= 0, default 0.5), ``prompts``, ``max_action_chars``, ``render_mode`` |

Players enter as **declared roles**, not symmetrically (DExperts / proxy-tuning style, MoCo's logit
contrast): the coalition's members ordered by ``ranking`` (e.g. a dev ranking), ``z_0 .. z_{k-1}``, decode
from ``z_0 + λ Σ_{i < k // 2} (z_i − z_{k-1-i})`` (:class:`agents.logit.Fusion`): the top member's logits
plus λ times the gap between each better member and its mirror among the worse ones. A member's role
moves with the coalition (the best present member is the top), as a ranking restricted to the coalition
says. Members must share a vocabulary (one line otherwise, at construction). Cost per question as deployed:
token forwards summed over the members.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | that model alone |
| 2 members | ``z_top + λ (z_top − z_other)``: contrastive decoding, the better against the worse |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agents import Agent
from agents.logit import Fusion, LogitEnsemble, check_shared_vocabulary
from crl_envs import roster
from crl_envs.protocols.levels import SeatEnv
from crl_kit.errors import ConfigError


class LogitContrastEnv(SeatEnv):
    metadata = {"name": roster.versioned("logit_contrast"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "logit"
    SEAT = "ensemble"

    def __init__(self, pool, task, *, ranking: Sequence[str] | None = None, strength: float = 0.5, **kwargs):
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not (math.isfinite(strength)
                                                                                        and strength >= 0):
            raise ConfigError(f"logit_contrast_v0: strength must be a finite number >= 0 (e.g. 0.5), got {strength!r}")
        self.strength = float(strength)
        self._ranking_given = None if ranking is None else list(ranking)
        super().__init__(pool, task, **kwargs)
        self.ranking = self._ranking_given or list(self.pool.ids)
        if sorted(self.ranking) != sorted(self.pool.ids):
            raise ConfigError(f"logit_contrast_v0: ranking must list every pool agent id once, best first; got "
                              f"{self.ranking}, pool agents are {self.pool.ids}")

    def rule(self) -> str:
        return f"contrast(strength={self.strength}, ranking={self._ranking_given})"

    def check_pool(self, members: Sequence[Agent]) -> None:
        check_shared_vocabulary(members, "logit_contrast_v0")

    def roles(self, members: Sequence[str]) -> list[str]:
        """The members in their declared order (best first): the order the contrast rule reads them in."""
        return sorted(members, key=self.ranking.index)

    def build(self, members: Sequence[str]) -> Agent:
        ordered = [self.pool[a] for a in self.roles(members)]
        return LogitEnsemble(ordered, Fusion("contrast", strength=self.strength),
                             name=f"contrast({'>'.join(m.name for m in ordered)})")


def env(pool, task, **options) -> LogitContrastEnv:
    """Make a ``logit_contrast_v0`` env (see the module docstring for options)."""
    return LogitContrastEnv(pool, task, **options)
