"""LLM-as-judge selection: members propose; a judge picks the best candidate, whose answer is the system's.

| | |
|---|---|
| Import | ``crl_envs.judge_v0(pool, task, judge=None)`` |
| Family | judging (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``judge_0`` when the judge is an outside agent |
| Phases | ``propose`` every member answers alone; ``judge`` (only with 2 or more candidates) the judge sees the candidates and replies with the number of the best |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer or verdict text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the extracted answer of the candidate the judge picks (the first integer of its reply, 1-based); when the reply names no valid candidate, ``fallback="plurality"`` (default): plurality of the candidates' answers (ties go to pool order); ``fallback="none"``: no answer (scored 0) |
| Final infos | ``answer``, ``score``, ``answers`` (per member), ``standalone`` (per member correctness) |
| Arguments | ``judge`` (see below), ``fallback`` (``"plurality"`` or ``"none"``), ``prompts``, ``max_action_chars``, ``render_mode`` |

``judge``: ``None`` (default) — the first present member (pool order) judges (it also proposes); a pool
agent id or index — that member (if it is masked out, the first present member instead); an
:class:`agents.Agent` or spec string — a fixed outside agent ``judge_0``, never masked. Candidates
are shown as "Agent 1", "Agent 2", ... in pool order among the *present* members.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | nothing to judge: the single candidate's answer is the system's (no ``judge`` phase) |
| 0 members | v(∅) = 0 |

``fallback``: what an invalid verdict means. ``"plurality"`` keeps the system answering when a judge
rambles; ``"none"`` makes the verdict the only way to an answer, which is what to train a judge
with: under ``"plurality"`` a learner can raise the system's score by never naming a candidate
(the zoo's rookie does, under C-RL: it learns to defer to the vote).

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers, plurality
from crl_envs.protocols.roles import RoleOption, parse_choice, resolve_role, role_player
from crl_kit.errors import ConfigError


class JudgeEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("judge"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "judging"
    PROMPTS = {
        "propose": "{question}",
        "judge": "{question}\n{answers}\nWhich answer is best? Reply with its number.",
    }
    empty_value = 0.0

    FALLBACKS = ("plurality", "none")

    def __init__(self, pool, task, *, judge: RoleOption = None, fallback: str = "plurality", **kwargs):
        super().__init__(pool, task, **kwargs)
        self.judge = resolve_role(self, "judge", judge)
        if fallback not in self.FALLBACKS:
            raise ConfigError(f"judge_v0: unknown fallback {fallback!r}; use one of {self.FALLBACKS}")
        self.fallback = fallback

    def _play(self):
        texts = yield Phase("propose", {a: self.messages("propose") for a in self.members})
        answers = {a: self.extract(texts[a]) for a in self.members}
        standalone = {a: self.task.score_answer(answers[a], self.example) for a in self.members}
        if len(self.members) == 1:
            return Outcome(answer=answers[self.members[0]], answers=answers, standalone=standalone,
                           details={"picked": self.members[0]})
        judge = role_player(self, self.judge)
        shown = format_answers([texts[a] for a in self.members])
        verdict = yield Phase("judge", {judge: self.messages("judge", answers=shown)})
        k = parse_choice(verdict[judge], len(self.members))
        if k is None:
            picked = None
            final = plurality([answers[a] for a in self.members]) if self.fallback == "plurality" else None
        else:
            picked = self.members[k]
            final = answers[picked]
        return Outcome(answer=final, answers=answers, standalone=standalone, details={"judge": judge, "picked": picked})


def env(pool, task, **options) -> JudgeEnv:
    """Make a ``judge_v0`` env (see the module docstring for options)."""
    return JudgeEnv(pool, task, **options)
