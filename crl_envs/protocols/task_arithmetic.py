"""Task arithmetic: the coalition answers as its common base plus the sum of its members' task vectors.

| | |
|---|---|
| Import | ``crl_envs.task_arithmetic_v0(pool, task, base=..., scale=0.5)`` |
| Family | weight (MoCo's weight level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the seat ``merged``, which answers for them |
| Phases | 1: ``answer`` — the ``merged`` seat, played by ``base + scale * Σ (θ_i − base)`` over the members (:func:`agents.merge.task_arithmetic`), answers the question |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the merged model's answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's answer extracted from the merged model's answer |
| Final infos | ``answer``, ``score``, ``answers`` (``{"merged": answer}``) |
| Arguments | ``base`` (required: the members' common base, an agent or a spec string), ``scale`` (λ, default 0.5), ``prompts``, ``max_action_chars``, ``render_mode`` |

``v(S)`` is the accuracy of ``base + λ Σ_{i ∈ S} τ_i`` with ``τ_i = θ_i − base`` (Ilharco et al. 2023), built
once per coalition and cached by content. The sum, not the mean: a member whose weights are the base
(``τ = 0``) adds nothing to any coalition. ``v(∅)`` is the base answering alone (greedy): the merge of
no task vectors. One line at construction when the base or a member has another architecture, or when
the members declare different bases (the zoo's models name theirs in ``training.json``). The zoo's
bases are not shipped (``python -m tools.zoo.build`` / ``tools.zoo.v4`` write them to ``OUT/_base``).

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | ``base + λ τ_i`` (the member itself when λ = 1) |
| 0 members | v(∅) = the base's accuracy |

Version history: v0 — initial release.
"""

from __future__ import annotations

from agents import Agent
from crl_envs import roster
from crl_envs.protocols.merging import MergeEnv


class TaskArithmeticEnv(MergeEnv):
    metadata = {"name": roster.versioned("task_arithmetic"), "render_modes": ["human"], "is_parallelizable": True}
    METHOD = "task_arithmetic"
    NEEDS_BASE = True
    PARAMS = {"scale": 0.5}

    def __init__(self, pool, task, *, base: Agent | str | None = None, scale: float = 0.5, **kwargs):
        super().__init__(pool, task, base=base, scale=scale, **kwargs)


def env(pool, task, **options) -> TaskArithmeticEnv:
    """Make a ``task_arithmetic_v0`` env (see the module docstring for options)."""
    return TaskArithmeticEnv(pool, task, **options)
