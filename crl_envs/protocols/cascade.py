"""Cascade (FrugalGPT-style): models in a given order answer or defer; the first confident answer stands.

| | |
|---|---|
| Import | ``crl_envs.cascade_v0(pool, task, order=None, threshold=5)`` |
| Family | cascade (MoCo's API level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) |
| Phases | up to one per present member, in ``order``: ``stage_k`` — the k-th present member answers the question alone (it never sees the earlier members' text); the episode ends at the first confident answer |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the extracted answer of the first member that does not defer; the last present member always answers (its prompt offers no way to defer, and its answer stands whatever it says) |
| Final infos | ``answer``, ``score``, ``answers`` and ``standalone`` (per member asked) |
| Arguments | ``order`` (a permutation of the pool's ids or indices; pool order by default), ``threshold`` (default 5), ``prompts``, ``max_action_chars``, ``render_mode`` |

A member (other than the last) **defers** when its text contains the word "defer", when it states a
confidence ("Confidence: N", 0-10) below ``threshold``, or when no answer can be extracted from it.
The confidence clause is removed before the task's extractor reads the answer, so "Confidence: 8"
is never taken for the answer.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | that member is the last, so it answers alone |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

import re

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv
from crl_envs.protocols.roles import resolve_order
from crl_kit.errors import ConfigError

_DEFER = re.compile(r"\bdefer\b", re.IGNORECASE)
_CONFIDENCE = re.compile(r"confidence\s*(?:score)?\s*(?:is|:|=)?\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE)


def read_confidence(text: str) -> tuple[str, float | None]:
    """``text`` without its last confidence clause, and the stated confidence (``None`` if none).

    Example:
        >>> read_confidence("The answer is 7. Confidence: 8/10")
        ('The answer is 7. ', 8.0)
    """
    found = list(_CONFIDENCE.finditer(text))
    if not found:
        return text, None
    m = found[-1]
    return text[: m.start()] + text[m.end():], float(m.group(1))


class CascadeEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("cascade"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "cascade"
    PROMPTS = {
        "ask": "{question}\nEnd with 'Confidence: N' (0-10). If unsure, say 'defer'.",
        "last": "{question}",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, order=None, threshold: float = 5, **kwargs):
        super().__init__(pool, task, **kwargs)
        self.order = resolve_order(self, order)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 10:
            raise ConfigError(f"cascade threshold must be a number in [0, 10], got {threshold!r}")
        self.threshold = threshold

    def defers(self, text: str) -> bool:
        """Whether a (non-last) member's text defers: see the module docstring."""
        body, confidence = read_confidence(text)
        if _DEFER.search(text):
            return True
        if confidence is not None and confidence < self.threshold:
            return True
        return self.extract(body) is None

    def _play(self):
        chain = [a for a in self.order if a in self.members]
        answers: dict[str, str | None] = {}
        final = None
        for k, member in enumerate(chain, start=1):
            last = k == len(chain)
            texts = yield Phase(f"stage_{k}", {member: self.messages("last" if last else "ask")})
            text = texts[member]
            answers[member] = self.extract(read_confidence(text)[0])
            if last or not self.defers(text):
                final = answers[member]
                break
        standalone = {a: self.task.score_answer(v, self.example) for a, v in answers.items()}
        return Outcome(answer=final, answers=answers, standalone=standalone, details={"stopped_at": member})


def env(pool, task, **options) -> CascadeEnv:
    """Make a ``cascade_v0`` env (see the module docstring for options)."""
    return CascadeEnv(pool, task, **options)
