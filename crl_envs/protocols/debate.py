"""Multi-agent debate (Du et al., 2023): answer alone, then revise after reading the others.

| | |
|---|---|
| Import | ``crl_envs.debate_v0(pool, task, rounds=2)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) |
| Phases | ``rounds`` steps: ``round_1`` every member answers alone; ``round_k`` (k > 1) every member sees its own previous answer and the other members' previous answers, and answers again |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | plurality of the last round's extracted answers; ties go to the tied answer first given in pool order |
| Final infos | ``answer``, ``score``, ``answers`` (last round, per agent), ``standalone`` (round-1 correctness per agent) |
| Arguments | ``rounds`` (>= 1, default 2), ``prompts``, ``max_action_chars``, ``render_mode`` |

Peers are shown as "Agent 1", "Agent 2", ... in pool order among the *present* members, so an
observation never reveals who is absent.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | self-refinement: each later round shows the model only its own previous answer (template ``refine``) |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers, plurality
from crl_kit.errors import ConfigError


class DebateEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("debate"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "answer": "{question}",
        "debate": "{question}\nOther agents' answers:\n{peers}\nYour previous answer: {own}\n"
        "Considering the other answers, give your updated answer.",
        "refine": "{question}\nYour previous answer: {own}\nReview it and give your final answer.",
    }
    empty_value = 0.0
    #: The template of rounds 2..R for a member who sees peers (``refine`` when it sees none).
    REVISE_TEMPLATE = "debate"

    def __init__(self, pool, task, *, rounds: int = 2, **kwargs):
        super().__init__(pool, task, **kwargs)
        if not isinstance(rounds, int) or rounds < 1:
            raise ConfigError(f"debate rounds must be an int >= 1, got {rounds!r}")
        self.rounds = rounds

    def peers_of(self, agent: str) -> list[str]:
        """Present members whose previous answers ``agent`` reads (pool order): all the others."""
        return [b for b in self.members if b != agent]

    def _play(self):
        texts = yield Phase("round_1", {a: self.messages("answer") for a in self.members})
        first = {a: self.extract(texts[a]) for a in self.members}
        for r in range(2, self.rounds + 1):
            prompts = {}
            for a in self.members:
                peers = [texts[b] for b in self.peers_of(a)]
                if peers:
                    prompts[a] = self.messages(self.REVISE_TEMPLATE, peers=format_answers(peers), own=texts[a].strip())
                else:
                    prompts[a] = self.messages("refine", own=texts[a].strip())
            texts = yield Phase(f"round_{r}", prompts)
        answers = {a: self.extract(texts[a]) for a in self.members}
        final = plurality([answers[a] for a in self.members])
        standalone = {a: self.task.score_answer(first[a], self.example) for a in self.members}
        return Outcome(answer=final, answers=answers, standalone=standalone)


def env(pool, task, **options) -> DebateEnv:
    """Make a ``debate_v0`` env (see the module docstring for options)."""
    return DebateEnv(pool, task, **options)
