"""Knowledge notes (generated-knowledge prompting across models): members write notes, an answerer answers from them.

| | |
|---|---|
| Import | ``crl_envs.knowledge_v0(pool, task, answerer=None)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``answerer_0`` when the answerer is an outside agent |
| Phases | 2: ``note`` every member writes a short note of knowledge that helps answer the question (not the answer); ``answer`` the answerer sees the question and every note, and answers |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the note or answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the answerer's response |
| Final infos | ``answer``, ``score``, ``answers`` (the answerer's), ``standalone`` (empty: no member answers alone) |
| Arguments | ``answerer`` (see below), ``prompts``, ``max_action_chars``, ``render_mode`` |

``answerer``: ``None`` (default) — the first present member (pool order); a pool agent id or index —
that member (if it is masked out, the first present member instead); an :class:`agents.Agent` or spec
string — a fixed outside agent ``answerer_0``, never masked. Notes are shown as "Agent 1",
"Agent 2", ... in pool order among the *present* members.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the member writes a note and (unless an outside answerer is set) answers from its own note |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers
from crl_envs.protocols.roles import RoleOption, resolve_role, role_player


class KnowledgeEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("knowledge"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "note": "{question}\nWrite a short note of facts that help answer this question. Do not answer it.",
        "answer": "{question}\n{notes}\nAnswer the question using these notes.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, answerer: RoleOption = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        self.answerer = resolve_role(self, "answerer", answerer)

    def _play(self):
        notes = yield Phase("note", {a: self.messages("note") for a in self.members})
        answerer = role_player(self, self.answerer)
        shown = format_answers([notes[a] for a in self.members])
        reply = yield Phase("answer", {answerer: self.messages("answer", notes=shown)})
        answer = self.extract(reply[answerer])
        return Outcome(answer=answer, answers={answerer: answer}, details={"answerer": answerer})


def env(pool, task, **options) -> KnowledgeEnv:
    """Make a ``knowledge_v0`` env (see the module docstring for options)."""
    return KnowledgeEnv(pool, task, **options)
