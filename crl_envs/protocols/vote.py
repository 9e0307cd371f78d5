"""Majority vote: every member answers once; the system answers the plurality.

| | |
|---|---|
| Import | ``crl_envs.vote_v0(pool, task)`` |
| Family | aggregation (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) |
| Phases | 1: ``answer`` — every member answers the question alone |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | plurality of the extracted answers; ties go to the tied answer first given in pool order; unparseable answers do not vote |
| Final infos | ``answer``, ``score``, ``answers`` (per agent), ``standalone`` (per agent correctness) |
| Arguments | ``prompts``, ``max_action_chars``, ``render_mode`` |

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the system is that model alone |
| 0 members | v(∅) = 0 |

Every member's answer is the same in every coalition (one phase, one prompt, seeds that never depend on the
coalition), so the valuation computes each coalition's score from the members' one-member runs with the rule
above (``VoteEnv.aggregate``), with no generation, for pools of up to 16 models.

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, pick_answer, plurality_winners


class VoteEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("vote"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "aggregation"
    PROMPTS = {"answer": "{question}"}
    empty_value = 0.0
    #: the plurality (the step's rule, and every coalition's value computed from the members' answers)
    aggregate = staticmethod(plurality_winners)

    def _play(self):
        texts = yield Phase("answer", {a: self.messages("answer") for a in self.members})
        answers = {a: self.extract(texts[a]) for a in self.members}
        final = pick_answer(self.aggregate, [answers[a] for a in self.members])
        standalone = {a: self.task.score_answer(answers[a], self.example) for a in self.members}
        return Outcome(answer=final, answers=answers, standalone=standalone)


def env(pool, task, **options) -> VoteEnv:
    """Make a ``vote_v0`` env (see the module docstring for options)."""
    return VoteEnv(pool, task, **options)
