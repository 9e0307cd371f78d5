"""Uniform soup: the coalition answers as one model, the element-wise mean of its members' weights.

| | |
|---|---|
| Import | ``crl_envs.soup_v0(pool, task)`` |
| Family | weight (MoCo's weight level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the seat ``merged``, which answers for them |
| Phases | 1: ``answer`` — the ``merged`` seat, played by the soup of the members (:func:`agents.merge.soup`), answers the question |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the merged model's answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's answer extracted from the merged model's answer |
| Final infos | ``answer``, ``score``, ``answers`` (``{"merged": answer}``) |
| Arguments | ``prompts``, ``max_action_chars``, ``render_mode`` |

``v(S)`` is the accuracy of ``merge(S)``, the state-dict average of the coalition's members (Wortsman et al.
2022's uniform soup), built once per coalition and cached by content (the members' fingerprints, which hash
every weight). Members must be transformers models of one architecture and vocabulary (one line otherwise, at
construction); a soup needs no declared base, but averaging helps only fine-tunes of one base (the zoo's
v1 specialists and every zoo v4 pool are). Cost per question as deployed: the one merged model's tokens.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | that model alone |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.merging import MergeEnv


class SoupEnv(MergeEnv):
    metadata = {"name": roster.versioned("soup"), "render_modes": ["human"], "is_parallelizable": True}
    METHOD = "soup"


def env(pool, task, **options) -> SoupEnv:
    """Make a ``soup_v0`` env (see the module docstring for options)."""
    return SoupEnv(pool, task, **options)
