"""Relay: members improve one answer in turn, each seeing only the current draft.

| | |
|---|---|
| Import | ``crl_envs.relay_v0(pool, task, order=None, passes=1)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) |
| Phases | ``passes`` x (number of present members) steps ``relay_k``, one member each, in ``order``: the first answers the question alone; each next one sees the question and the current draft only, and writes an improved draft |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the draft text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the last draft |
| Final infos | ``answer``, ``score``, ``answers`` (each member's last draft, extracted), ``standalone`` (the first member's correctness: only it answers alone) |
| Arguments | ``order`` (a permutation of the pool's ids or indices; pool order by default), ``passes`` (>= 1, default 1), ``prompts``, ``max_action_chars``, ``render_mode`` |

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the member answers, then (``passes`` > 1) improves its own draft |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv
from crl_envs.protocols.roles import resolve_order
from crl_kit.errors import ConfigError


class RelayEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("relay"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "start": "{question}",
        "improve": "{question}\nDraft: {draft}\nImprove this answer.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, order=None, passes: int = 1, **kwargs):
        super().__init__(pool, task, **kwargs)
        self.order = resolve_order(self, order)
        if not isinstance(passes, int) or isinstance(passes, bool) or passes < 1:
            raise ConfigError(f"relay passes must be an int >= 1, got {passes!r}")
        self.passes = passes

    def _play(self):
        chain = [a for a in self.order if a in self.members] * self.passes
        draft: str | None = None
        answers: dict[str, str | None] = {}
        standalone: dict[str, float] = {}
        for k, member in enumerate(chain, start=1):
            prompt = self.messages("start") if draft is None else self.messages("improve", draft=draft.strip())
            texts = yield Phase(f"relay_{k}", {member: prompt})
            draft = texts[member]
            answers[member] = self.extract(draft)
            if k == 1:
                standalone[member] = self.task.score_answer(answers[member], self.example)
        return Outcome(answer=self.extract(draft), answers=answers, standalone=standalone)


def env(pool, task, **options) -> RelayEnv:
    """Make a ``relay_v0`` env (see the module docstring for options)."""
    return RelayEnv(pool, task, **options)
