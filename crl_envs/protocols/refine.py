"""Draft, review, finalise: one member drafts, the others review in turn, the drafter finalises.

| | |
|---|---|
| Import | ``crl_envs.refine_v0(pool, task, drafter=None)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``drafter_0`` when the drafter is an outside agent |
| Phases | ``draft`` the drafter answers alone; ``review_k`` the k-th reviewer (every other present member, pool order) sees the draft and the earlier reviews and writes a review; ``finalise`` the drafter sees its draft and all reviews and gives the final answer (no reviews, no ``finalise``) |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the draft, review or final text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the final answer (of the draft when there were no reviewers) |
| Final infos | ``answer``, ``score``, ``answers`` (the drafter's final), ``standalone`` (the drafter's draft correctness) |
| Arguments | ``drafter`` (see below), ``prompts``, ``max_action_chars``, ``render_mode`` |

``drafter``: ``None`` (default) — the first present member (pool order); a pool agent id or index —
that member (if it is masked out, the first present member instead); an :class:`agents.Agent` or
spec string — a fixed outside agent ``drafter_0``, never masked (then every member reviews).
Earlier reviews are shown as "Agent 1", "Agent 2", ... by position, never by pool id.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the member drafts and its draft is the system's answer (with an outside drafter: one review, then the drafter finalises) |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers
from crl_envs.protocols.roles import RoleOption, resolve_role, role_player


class RefineEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("refine"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "draft": "{question}",
        "review_first": "{question}\nDraft: {draft}\nReview this draft: point out any errors.",
        "review": "{question}\nDraft: {draft}\nEarlier reviews:\n{reviews}\nReview this draft: point out any errors.",
        "finalise": "{question}\nYour draft: {draft}\nReviews:\n{reviews}\nGive your final answer.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, drafter: RoleOption = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        self.drafter = resolve_role(self, "drafter", drafter)

    def _play(self):
        drafter = role_player(self, self.drafter)
        draft = (yield Phase("draft", {drafter: self.messages("draft")}))[drafter].strip()
        first = self.extract(draft)
        reviews: list[str] = []
        for k, reviewer in enumerate([a for a in self.members if a != drafter], start=1):
            prompt = (self.messages("review", draft=draft, reviews=format_answers(reviews)) if reviews
                      else self.messages("review_first", draft=draft))
            reviews.append((yield Phase(f"review_{k}", {reviewer: prompt}))[reviewer])
        final = draft
        if reviews:
            final = (yield Phase("finalise", {drafter: self.messages("finalise", draft=draft,
                                                                     reviews=format_answers(reviews))}))[drafter]
        answer = self.extract(final)
        return Outcome(answer=answer, answers={drafter: answer},
                       standalone={drafter: self.task.score_answer(first, self.example)},
                       details={"drafter": drafter, "reviews": len(reviews)})


def env(pool, task, **options) -> RefineEnv:
    """Make a ``refine_v0`` env (see the module docstring for options)."""
    return RefineEnv(pool, task, **options)
