"""Logit fusion: the coalition decodes one answer from the (weighted) mean of its members' next-token logits.

| | |
|---|---|
| Import | ``crl_envs.logit_fusion_v0(pool, task, weights=None)`` |
| Family | logit (MoCo's logit level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) and the seat ``ensemble``, which answers for them |
| Phases | 1: ``answer`` — the ``ensemble`` seat, played by :class:`agents.logit.LogitEnsemble` of the members, answers the question |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the ensemble's answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | the task's answer extracted from the fused decode |
| Final infos | ``answer``, ``score``, ``answers`` (``{"ensemble": answer}``) |
| Arguments | ``weights`` (agent id -> weight > 0; absent members keep theirs; default uniform), ``prompts``, ``max_action_chars``, ``render_mode`` |

At every decoding step each member's action is its next-token logits for the shared prefix; the env's rule
fuses them, ``z = Σ_i w_i z_i / Σ_i w_i`` over the coalition's members (a renormalised product of experts),
and one token is drawn with the seat's sampling settings (temperature, top-p, seed: ``run_episodes(...,
sampling=...)``). The runner plays a coalition's questions in one call of the ensemble: the members'
forwards run in lockstep over the batch, each with its own KV cache. :class:`LogitStepEnv` is the same
game one decoding step per PettingZoo step, for policies that emit logits themselves.

Members must share a vocabulary (one line otherwise, at construction); they must be transformers models
(``HFAgent``): the logits are read from them. Cost per question as deployed: token forwards summed over the
members (each reads the prompt and every answer token).

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | that model alone, decoding as it would alone |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from agents import Agent, SamplingParams
from agents.logit import Fusion, LogitEnsemble, check_shared_vocabulary
from agents.sampling import sample_next
from crl_envs import roster
from crl_envs.protocols.base import Outcome, Phase, ProtocolEnv
from crl_envs.protocols.levels import SeatEnv
from crl_kit.errors import ConfigError, ConfigTypeError


def check_weights(env: ProtocolEnv, weights: Mapping[str, float] | None) -> dict[str, float] | None:
    """``weights`` (agent id -> a finite number > 0) checked against the pool, or ``None``."""
    if weights is None:
        return None
    if not isinstance(weights, Mapping):
        raise ConfigTypeError(f"weights must be a dict agent id -> weight (e.g. {{'model_0': 2.0}}), got {weights!r}")
    unknown = sorted(set(weights) - set(env.pool.ids))
    if unknown:
        raise ConfigError(f"weights name unknown agents {unknown}; pool agents are {env.pool.ids}")
    for a, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
            raise ConfigError(f"weights[{a!r}] must be a finite number > 0, got {w!r}")
    return {a: float(w) for a, w in weights.items()}


class LogitFusionEnv(SeatEnv):
    metadata = {"name": roster.versioned("logit_fusion"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "logit"
    SEAT = "ensemble"

    def __init__(self, pool, task, *, weights: Mapping[str, float] | None = None, **kwargs):
        self._weights_given = weights
        super().__init__(pool, task, **kwargs)
        self.weights = check_weights(self, weights)

    def fusion(self, members: Sequence[str]) -> Fusion:
        """The rule over ``members`` (agent ids, pool order)."""
        if self._weights_given is None:
            return Fusion("mean")
        weights = check_weights(self, self._weights_given)
        return Fusion("mean", weights=tuple(weights.get(a, 1.0) for a in members))

    def rule(self) -> str:
        w = self._weights_given
        return "mean" if w is None else f"mean{sorted((str(k), v) for k, v in dict(w).items())}"

    def check_pool(self, members: Sequence[Agent]) -> None:
        check_shared_vocabulary(members, "logit_fusion_v0")

    def build(self, members: Sequence[str]) -> Agent:
        agents = [self.pool[a] for a in members]
        return LogitEnsemble(agents, self.fusion(members), name=f"fusion({'+'.join(m.name for m in agents)})")


class LogitStepEnv(ProtocolEnv):
    """Logit fusion one decoding step per ``step``: every member's action is its next-token logits.

    Each phase ``token`` asks every member of the coalition for a ``float32`` vector of the vocabulary's
    size (``Box``): its logits after the prompt and the tokens emitted so far (``infos[a]["token_ids"]``,
    the member's own prompt ids then the answer's, e.g. :func:`agents.logit.next_token_logits`). The env
    fuses them with :class:`agents.logit.Fusion` (the rule of :class:`LogitFusionEnv`), draws the token
    (:func:`agents.sampling.sample_next` with ``sampling``; the draw's seed from ``reset(seed=...)``) and ends
    at an end-of-sequence token or ``max_new_tokens``; the return is the decoded answer's score.

    Args:
        weights: as :class:`LogitFusionEnv`.
        sampling: temperature, top-p and ``max_new_tokens`` of the draw (default greedy, 64 tokens).
    """

    metadata = {"name": "logit_fusion_steps_v0", "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "logit"
    PROMPTS = {"answer": "{question}"}
    empty_value = 0.0

    def __init__(self, pool, task, *, weights: Mapping[str, float] | None = None,
                 sampling: SamplingParams | None = None, **kwargs):
        super().__init__(pool, task, **kwargs)
        members = [self.pool[a] for a in self.pool.ids]
        check_shared_vocabulary(members, "logit_fusion_v0")
        self.weights = check_weights(self, weights)
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise ConfigTypeError(f"sampling must be an agents.SamplingParams, got {type(sampling).__name__}")
        self.sampling = sampling or SamplingParams(max_new_tokens=64)
        self.vocab_size = members[0].model.get_output_embeddings().weight.shape[0]
        self.generated: list[int] = []
        self.prompt_ids: dict[str, list[int]] = {}

    def _make_action_space(self, agent: str) -> spaces.Space:
        return spaces.Box(-np.inf, np.inf, (self.vocab_size,), np.float32)

    def _sanitize(self, agent: str, action: Any) -> Any:
        if isinstance(action, torch.Tensor):
            action = action.detach().cpu().numpy()
        array = np.asarray(action, dtype=np.float32) if action is not None else None
        if array is None or array.shape != (self.vocab_size,):
            raise ConfigError(f"{agent}'s action must be its next-token logits, {self.vocab_size} floats, got "
                              f"{None if array is None else array.shape}")
        if not np.isfinite(array).all():
            raise ConfigError(f"{agent}'s logits hold a NaN or infinite value")
        return array

    def _observe(self):
        obs, infos = super()._observe()
        for a in self.members:
            infos[a]["token_ids"] = self.prompt_ids[a] + self.generated
        return obs, infos

    def _play(self) -> Generator[Phase, dict[str, Any], Outcome]:
        messages = self.messages("answer")
        self.prompt_ids = {a: self.pool[a].encode_prompt(messages) for a in self.members}
        self.generated = []
        lead = self.pool[self.members[0]]
        fusion = Fusion("mean", weights=None if self.weights is None else
                        tuple(self.weights.get(a, 1.0) for a in self.members))
        p = self.sampling
        generator = torch.Generator().manual_seed(int(self.np_random.integers(2**63))) if p.temperature > 0 else None
        eos = set().union(*(self.pool[a].eos_ids for a in self.members))
        reason = "length"
        while len(self.generated) < p.max_new_tokens:
            logits = yield Phase("token", {a: messages for a in self.members})
            fused = fusion(torch.stack([torch.as_tensor(logits[a]) for a in self.members]))
            token, _ = sample_next(fused[None], torch.tensor([p.temperature]), torch.tensor([p.top_p]), [generator])
            if int(token) in eos:
                reason = "stop"
                break
            self.generated = [*self.generated, int(token)]
        text = lead.decode_text(self.generated)
        answer = self.task.extract(text, reason)
        return Outcome(answer=answer, answers={a: answer for a in self.members},
                       details={"text": text, "token_ids": list(self.generated)})


def env(pool, task, **options) -> LogitFusionEnv:
    """Make a ``logit_fusion_v0`` env (see the module docstring for options)."""
    return LogitFusionEnv(pool, task, **options)


def steps_env(pool, task, **options) -> LogitStepEnv:
    """The step-level form of ``logit_fusion_v0``: every member's action is its next-token logits."""
    return LogitStepEnv(pool, task, **options)


__all__ = ["LogitFusionEnv", "LogitStepEnv", "env", "steps_env", "check_weights"]
