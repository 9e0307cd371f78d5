"""C-RL at the logit level: a learner inside a logit ensemble, trained on the ensemble's outcome.

The ensemble (``logit_fusion_v0`` or ``logit_contrast_v0``: :class:`agents.logit.LogitEnsemble`) decodes
answers ``y`` from the fused distribution ``p(y_t) = softmax(f(z_1, .., z_k) / T)``, where ``z_j`` are the
members' next-token logits and ``f`` the rule (:class:`agents.logit.Fusion`; linear in each ``z_j``). The
reward ``R`` is the ensemble's score. Only the learner's logits ``z_ℓ`` depend on its weights ``θ``.

**Estimator** (REINFORCE with a group baseline): for each question, ``group`` answers are sampled; each gets
the advantage ``A = R − mean(R of its group)``, and

    ∇_θ J ≈ mean over answers of  A · Σ_t ∇_θ log p(y_t | x, y_<t)

with ``log p`` the sampled token's log-probability **under the fused distribution**, differentiated through
the learner's share only: ``∇_θ log p(y_t) = (c_ℓ / T) (e_{y_t} − p_t)ᵀ ∂z_ℓ,t/∂θ``, ``c_ℓ`` the learner's
coefficient in the rule (its normalised weight for the mean; ``1 + λ`` / ``λ`` / ``−λ`` for the top, a better
or a worse member of the contrast). :func:`ensemble_logprob` computes it by teacher forcing every member
over prompt and answer (the other members without a graph); ``tests/test_levels.py`` checks the gradient
against that closed form on a planted case.

Example:
    >>> import agents, crl_envs
    >>> pool = agents.pool("zoo:zoo-rookie", "zoo:zoo-nocarry")
    >>> task = crl_envs.tasks.load("arith", n=4, **agents.zoo.TASK_OPTIONS)
    >>> log = train_in_ensemble(pool, task, "model_0", LogitCRLConfig(steps=1, questions=2, group=2))
    >>> sorted(log[0])
    ['loss', 'reward', 'step']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents import Agent, Pool, SamplingParams
from agents import pool as make_pool
from agents.logit import LogitEnsemble
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.protocols.levels import SeatEnv
from crl_envs.runner import run_episodes
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError
from crl_kit.validation import check_int


def ensemble_logprob(ensemble: LogitEnsemble, learner: int, prompt_ids: Sequence[Sequence[int]],
                     answer_ids: Sequence[int], temperature: float) -> torch.Tensor:
    """``Σ_t log p(y_t | x, y_<t)`` of ``answer_ids`` under the ensemble's fused distribution at ``temperature``,
    with the autograd graph through member ``learner``'s logits only (a scalar tensor)."""
    if not temperature > 0:
        raise ConfigError(f"the policy gradient needs sampled answers: temperature must be > 0, got {temperature}")
    if not answer_ids:
        return torch.zeros((), requires_grad=True)
    fused = ensemble.fused_logits(prompt_ids, answer_ids, grad_members=[learner])
    logp = torch.log_softmax(fused / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(list(answer_ids), device=logp.device)[:, None]).sum()


def reinforce_loss(ensemble: LogitEnsemble, learner: int, rollouts: Sequence[tuple[Sequence[Sequence[int]],
                   Sequence[int], float]], temperature: float) -> torch.Tensor:
    """``−mean(A · Σ_t log p(y_t))`` over ``(prompt ids per member, answer ids, advantage)`` rollouts."""
    terms = [advantage * ensemble_logprob(ensemble, learner, prompts, answer, temperature)
             for prompts, answer, advantage in rollouts]
    return -torch.stack(terms).mean()


@dataclass
class LogitCRLConfig:
    """Settings of :func:`train_in_ensemble`.

    Args:
        steps: optimizer steps.
        questions: questions per step (drawn in turn from the task).
        group: sampled answers per question (the baseline is their mean reward).
        temperature: sampling temperature of the fused distribution (> 0).
        max_new_tokens: answer length limit.
        learning_rate: Adam's step size on the learner's weights.
        seed: seeds the rollouts.
    """

    steps: int = 20
    questions: int = 8
    group: int = 4
    temperature: float = 1.0
    max_new_tokens: int = 32
    learning_rate: float = 1e-4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "questions", "max_new_tokens"):
            check_int(f"LogitCRLConfig.{name}", getattr(self, name), minimum=1)
        check_int("LogitCRLConfig.group", self.group, minimum=2, why="the baseline is the group's mean")
        if not self.temperature > 0 or not self.learning_rate > 0:
            raise ConfigError("LogitCRLConfig.temperature and learning_rate must be > 0")


def train_in_ensemble(pool: Pool | Sequence[Agent | str], task: Task | str, learner: str,
                      config: LogitCRLConfig | None = None, *, protocol: str = "logit_fusion",
                      options: Mapping[str, Any] | None = None) -> list[dict[str, float]]:
    """Train pool member ``learner`` (an HFAgent, updated in place) inside the logit ensemble of the whole pool,
    on the ensemble's score (see the module docstring for the estimator). Returns one record per step:
    ``step``, ``reward`` (mean score of the step's sampled answers, before the update) and ``loss``.

    Raises:
        ValueError: a protocol that is not logit-level, an unknown learner, or bad settings.
    """
    config = config or LogitCRLConfig()
    pool = pool if isinstance(pool, Pool) else make_pool(pool)
    task = task if isinstance(task, Task) else task_registry.load(task)
    factory = protocols.get(protocol)
    template = factory(pool, task, **dict(options or {}))
    if not isinstance(template, SeatEnv) or template.FAMILY != "logit":
        raise ConfigError(f"train_in_ensemble needs a logit-level protocol (logit_fusion, logit_contrast), got {protocol!r}")
    if learner not in pool.ids:
        raise ConfigError(f"learner {learner!r} is not in the pool; its agents are {pool.ids}")
    model = pool[learner].model
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    sampling = {template.SEAT: SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens)}
    log = []
    for step in range(config.steps):
        chosen = [(step * config.questions + k) % len(task) for k in range(config.questions)]
        episodes = run_episodes(factory, pool, task, samples=config.group, seed=config.seed + step, examples=chosen,
                                sampling=sampling, options=options, record=[template.SEAT], progress=False)
        ensemble = template.coalition_model(pool.ids)
        index = next(j for j, m in enumerate(ensemble.members) if m is pool[learner])
        rollouts = []
        for k in range(0, len(episodes), config.group):
            group = episodes[k : k + config.group]
            mean = sum(ep.score for ep in group) / len(group)
            for ep in group:
                turn = ep.turns_of(template.SEAT)[0]
                rollouts.append((ensemble.encode(turn.messages), turn.token_ids or [], ep.score - mean))
        loss = reinforce_loss(ensemble, index, rollouts, config.temperature)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log.append({"step": step, "reward": sum(ep.score for ep in episodes) / len(episodes), "loss": float(loss.detach())})
    return log


__all__ = ["ensemble_logprob", "reinforce_loss", "LogitCRLConfig", "train_in_ensemble"]
