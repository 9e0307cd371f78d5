"""Peer feedback: every member answers, critiques its peers' answers, then revises with the feedback it got.

| | |
|---|---|
| Import | ``crl_envs.feedback_v0(pool, task, summariser=None)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``summariser_0`` when the summariser is an outside agent |
| Phases | 3 or 4: ``answer`` every member answers alone; ``critique`` every member critiques the other members' answers; ``revise`` every member sees its own answer and the critiques written by the others, and answers again; ``summarise`` (only with a summariser) the summariser sees the revised answers and gives the final answer |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer, critique or summary text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | without a summariser: plurality of the revised answers (ties go to the tied answer first given in pool order); with one: the extraction of the summary |
| Final infos | ``answer``, ``score``, ``answers`` (revised, per member), ``standalone`` (first-answer correctness per member) |
| Arguments | ``summariser`` (see below), ``prompts``, ``max_action_chars``, ``render_mode`` |

``summariser``: ``None`` (default) — no summariser, plurality; a pool agent id or index — that member
summarises (if it is masked out, the first present member summarises instead); an
:class:`agents.Agent` or spec string — a fixed outside agent ``summariser_0``, never masked.
Answers and critiques are shown as "Agent 1", "Agent 2", ... in pool order among the *present*
members, the reader excluded.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | self-feedback: the member critiques its own answer and revises with its own critique |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers, plurality
from crl_envs.protocols.roles import RoleOption, resolve_role, role_player


class FeedbackEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("feedback"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "answer": "{question}",
        "critique": "{question}\n{answers}\nPoint out any errors in these answers.",
        "revise": "{question}\nYour answer: {own}\nFeedback:\n{feedback}\nGive your revised answer.",
        "summarise": "{question}\n{answers}\nSummarise these answers into one final answer.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, summariser: RoleOption = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        self.has_summariser = summariser is not None
        self.summariser = resolve_role(self, "summariser", summariser)

    def _others(self, agent: str) -> list[str]:
        others = [b for b in self.members if b != agent]
        return others or [agent]  # alone: self-feedback

    def _play(self):
        first = yield Phase("answer", {a: self.messages("answer") for a in self.members})
        critiques = yield Phase("critique", {
            a: self.messages("critique", answers=format_answers([first[b] for b in self._others(a)]))
            for a in self.members
        })
        revised = yield Phase("revise", {
            a: self.messages("revise", own=first[a].strip(),
                             feedback=format_answers([critiques[b] for b in self._others(a)]))
            for a in self.members
        })
        answers = {a: self.extract(revised[a]) for a in self.members}
        standalone = {a: self.task.score(first[a], self.example) for a in self.members}
        if not self.has_summariser:
            return Outcome(answer=plurality([answers[a] for a in self.members]), answers=answers, standalone=standalone)
        summariser = role_player(self, self.summariser)
        shown = format_answers([revised[a] for a in self.members])
        summary = yield Phase("summarise", {summariser: self.messages("summarise", answers=shown)})
        return Outcome(answer=self.extract(summary[summariser]), answers=answers, standalone=standalone,
                       details={"summariser": summariser})


def env(pool, task, **options) -> FeedbackEnv:
    """Make a ``feedback_v0`` env (see the module docstring for options)."""
    return FeedbackEnv(pool, task, **options)
