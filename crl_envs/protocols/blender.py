"""LLM-Blender (Jiang et al., 2023): members propose, a ranker compares candidates pairwise, a fuser merges the top-k.

| | |
|---|---|
| Import | ``crl_envs.blender_v0(pool, task, top_k=2, ranker=None, fuser=None)`` |
| Family | judging (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``ranker_0`` / ``fuser_0`` when those roles are outside agents |
| Phases | ``answer`` every member answers alone; then, only when there are more candidates than ``top_k``, one ``compare_k`` step per pair of candidates (the ranker sees the two, the earlier pool member's first, and replies 1 or 2); ``fuse`` the fuser sees the top-k candidates (best first) and gives the final answer |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer, comparison or fused text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the fuser's response |
| Final infos | ``answer``, ``score``, ``answers`` (per member, first answers), ``standalone`` (per member correctness) |
| Arguments | ``top_k`` (>= 1, default 2), ``ranker``, ``fuser`` (see below), ``prompts``, ``max_action_chars``, ``render_mode`` |

Ranking: a candidate's score is its number of pairwise wins; the first integer of the ranker's
reply picks the winner (1 or 2); any other reply gives no win. Ties keep pool order. With at most
``top_k`` candidates nothing is compared and the fuser sees them all in pool order.

``ranker`` / ``fuser``: ``None`` (default) — the first present member (pool order); a pool agent id or
index — that member (if it is masked out, the first present member instead); an :class:`agents.Agent`
or spec string — a fixed outside agent (``ranker_0`` / ``fuser_0``), never masked. Candidates are
shown as "Agent 1", "Agent 2", ... by position in the prompt, never by pool id.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | no comparison; the fuser rewrites the single candidate |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from itertools import combinations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers
from crl_envs.protocols.roles import RoleOption, parse_choice, resolve_role, role_player
from crl_kit.errors import ConfigError


class BlenderEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("blender"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "judging"
    PROMPTS = {
        "answer": "{question}",
        "compare": "{question}\n{answers}\nWhich answer is better? Reply 1 or 2.",
        "fuse": "{question}\n{answers}\nFuse these answers into one best answer.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, top_k: int = 2, ranker: RoleOption = None, fuser: RoleOption = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ConfigError(f"blender top_k must be an int >= 1, got {top_k!r}")
        self.top_k = top_k
        self.ranker = resolve_role(self, "ranker", ranker)
        self.fuser = resolve_role(self, "fuser", fuser)

    def _play(self):
        texts = yield Phase("answer", {a: self.messages("answer") for a in self.members})
        ranked = list(self.members)
        wins = dict.fromkeys(self.members, 0)
        if len(self.members) > self.top_k:
            ranker = role_player(self, self.ranker)
            for k, (a, b) in enumerate(combinations(self.members, 2), start=1):
                reply = yield Phase(f"compare_{k}", {
                    ranker: self.messages("compare", answers=format_answers([texts[a], texts[b]]))
                })
                choice = parse_choice(reply[ranker], 2)
                if choice is not None:
                    wins[(a, b)[choice]] += 1
            ranked.sort(key=lambda m: -wins[m])  # stable: ties keep pool order
        top = ranked[: self.top_k]
        fuser = role_player(self, self.fuser)
        fused = yield Phase("fuse", {fuser: self.messages("fuse", answers=format_answers([texts[a] for a in top]))})
        answers = {a: self.extract(texts[a]) for a in self.members}
        standalone = {a: self.task.score_answer(answers[a], self.example) for a in self.members}
        return Outcome(answer=self.extract(fused[fuser]), answers=answers, standalone=standalone,
                       details={"wins": wins, "top": top})


def env(pool, task, **options) -> BlenderEnv:
    """Make a ``blender_v0`` env (see the module docstring for options)."""
    return BlenderEnv(pool, task, **options)
