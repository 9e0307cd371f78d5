"""TIES-merging: the coalition answers as its base plus the sign-elected, trimmed merge of its task vectors.

| | |
|---|---|
| Import | ``crl_envs.ties_v0(pool, task, base=..., density=0.2, scale=1.0)`` |
| Family | weight (MoCo's weight level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the seat ``merged``, which answers for them |
| Phases | 1: ``answer`` — the ``merged`` seat, played by the TIES merge of the members (:func:`agents.merge.ties`), answers the question |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the merged model's answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's answer extracted from the merged model's answer |
| Final infos | ``answer``, ``score``, ``answers`` (``{"merged": answer}``) |
| Arguments | ``base`` (required: the members' common base), ``density`` (share of each task vector's entries kept, by magnitude, per tensor; default 0.2), ``scale`` (λ, default 1.0), ``prompts``, ``max_action_chars``, ``render_mode`` |

``v(S)`` is the accuracy of TIES-merging (Yadav et al. 2023) of the coalition's task vectors ``τ_i = θ_i −
base``: each trimmed to its ``density`` largest-magnitude entries, a sign elected per entry (the sign of the
trimmed vectors' sum), the mean of the entries that agree with it, ``base + λ`` that. A member whose weights
are the base votes for no sign and joins no mean: it adds nothing. ``v(∅)`` is the base answering alone.
Errors as for ``task_arithmetic_v0`` (another architecture, members of different bases: one line).

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | ``base + λ trim(τ_i)`` |
| 0 members | v(∅) = the base's accuracy |

Version history: v0 — initial release.
"""

from __future__ import annotations

from agents import Agent
from crl_envs import roster
from crl_envs.protocols.merging import MergeEnv
from crl_kit.errors import ConfigError


class TiesEnv(MergeEnv):
    metadata = {"name": roster.versioned("ties"), "render_modes": ["human"], "is_parallelizable": True}
    METHOD = "ties"
    NEEDS_BASE = True
    PARAMS = {"density": 0.2, "scale": 1.0}

    def __init__(self, pool, task, *, base: Agent | str | None = None, density: float = 0.2, scale: float = 1.0,
                 **kwargs):
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0 < density <= 1:
            raise ConfigError(f"ties_v0: density must be in (0, 1] (the share of each task vector kept), got {density!r}")
        super().__init__(pool, task, base=base, density=density, scale=scale, **kwargs)


def env(pool, task, **options) -> TiesEnv:
    """Make a ``ties_v0`` env (see the module docstring for options)."""
    return TiesEnv(pool, task, **options)
