"""Mixture-of-Agents (Wang et al., 2024): layers of proposers, each seeing the previous layer; an aggregator answers.

| | |
|---|---|
| Import | ``crl_envs.moa_v0(pool, task, layers=2, aggregator=None)`` |
| Family | aggregation (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``), plus ``aggregator_0`` when the aggregator is an outside agent |
| Phases | ``layers + 1`` steps: ``layer_1`` every member answers alone; ``layer_k`` (1 < k <= layers) every member sees all of layer k-1's responses (its own included) and answers again; ``aggregate`` the aggregator sees the last layer's responses and gives the final answer |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's extraction of the aggregator's response (``None``, scored 0, if it has none) |
| Final infos | ``answer``, ``score``, ``answers`` (last layer, per member), ``standalone`` (layer-1 correctness per member) |
| Arguments | ``layers`` (>= 1, default 2), ``aggregator`` (see below), ``prompts``, ``max_action_chars``, ``render_mode`` |

``aggregator``: ``None`` (default) — the first present member (pool order) aggregates; a pool agent
id or index — that member aggregates (it also proposes); if it is masked out, the first present
member aggregates instead; an :class:`agents.Agent` or spec string — a fixed outside agent
``aggregator_0``, never masked, not a player of the coalition game. Responses are shown as
"Agent 1", "Agent 2", ... in pool order among the *present* members.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | the member answers, refines its own answer through the layers, and (unless an outside aggregator is set) aggregates its own last response |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv, format_answers
from crl_envs.protocols.roles import RoleOption, resolve_role, role_player
from crl_kit.errors import ConfigError


class MoAEnv(ProtocolEnv):
    metadata = {"name": roster.versioned("moa"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "aggregation"
    PROMPTS = {
        "propose": "{question}",
        "refine": "{question}\n{responses}\nUsing these responses, give a better answer.",
        "aggregate": "{question}\n{responses}\nSynthesise these responses into one final answer.",
    }
    empty_value = 0.0

    def __init__(self, pool, task, *, layers: int = 2, aggregator: RoleOption = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 1:
            raise ConfigError(f"moa layers must be an int >= 1, got {layers!r}")
        self.layers = layers
        self.aggregator = resolve_role(self, "aggregator", aggregator)

    def _play(self):
        texts = yield Phase("layer_1", {a: self.messages("propose") for a in self.members})
        first = {a: self.extract(texts[a]) for a in self.members}
        for k in range(2, self.layers + 1):
            shown = format_answers([texts[a] for a in self.members])
            texts = yield Phase(f"layer_{k}", {a: self.messages("refine", responses=shown) for a in self.members})
        aggregator = role_player(self, self.aggregator)
        shown = format_answers([texts[a] for a in self.members])
        final = yield Phase("aggregate", {aggregator: self.messages("aggregate", responses=shown)})
        answers = {a: self.extract(texts[a]) for a in self.members}
        standalone = {a: self.task.score_answer(first[a], self.example) for a in self.members}
        return Outcome(answer=self.extract(final[aggregator]), answers=answers, standalone=standalone,
                       details={"aggregator": aggregator})


def env(pool, task, **options) -> MoAEnv:
    """Make a ``moa_v0`` env (see the module docstring for options)."""
    return MoAEnv(pool, task, **options)
