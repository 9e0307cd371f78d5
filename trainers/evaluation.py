"""What a trained policy scores: held-out evaluation (:func:`evaluate_policy`, :class:`EvalResult`) and the
change training made (:func:`compare`, :class:`Improvement`). Shared by every trainer, ours and TRL's
(:mod:`trainers.trl`); :meth:`trainers.PolicyGradientTrainer.evaluate` calls :func:`evaluate_policy`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents import Agent, Pool, SamplingParams
from crl_envs.runner import Episode
from crl_envs.stats import PairedCI, paired_bootstrap_ci
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError
from trainers.rollout import rollout_episodes


@dataclass
class EvalResult:
    """Per-question scores on held-out questions (greedy decoding for every agent)."""

    example_ids: list[str]
    system: np.ndarray
    standalone: np.ndarray
    #: several learners: each learner's standalone scores (``standalone`` is their per-question mean)
    learners: dict[str, np.ndarray] = field(default_factory=dict)
    #: the system without the learner(s), v(N \\ learners), per question (the reference a gain must beat)
    without_learner: np.ndarray | None = None
    #: share of the fitted steps' groups whose rewards were all equal (no signal); ``None`` before training
    zero_variance_share: float | None = None

    @property
    def system_accuracy(self) -> float:
        return float(np.mean(self.system))

    @property
    def standalone_accuracy(self) -> float:
        return float(np.mean(self.standalone))

    def to_dict(self) -> dict[str, Any]:
        out = {"system": self.system_accuracy, "standalone": self.standalone_accuracy, "n": len(self.example_ids)}
        if self.learners:
            out["learners"] = {j: float(np.mean(v)) for j, v in self.learners.items()}
        if self.without_learner is not None:
            out["without_learner"] = float(np.mean(self.without_learner))
        if self.zero_variance_share is not None:
            out["zero_variance_share"] = self.zero_variance_share
        return out

    def __str__(self) -> str:
        parts = [f"system {self.system_accuracy:.3f}", f"learner alone {self.standalone_accuracy:.3f}"]
        if self.without_learner is not None:
            parts.append(f"without the learner {float(np.mean(self.without_learner)):.3f}")
        if self.zero_variance_share is not None:
            parts.append(f"zero-variance groups {self.zero_variance_share:.0%}")
        return ", ".join(parts)


@dataclass
class Improvement:
    """What training changed, on the same held-out questions: system and learner-alone accuracy before and
    after, each change with a paired bootstrap CI. ``print()`` it for a two-line summary in points."""

    before: EvalResult
    after: EvalResult
    system: PairedCI
    standalone: PairedCI
    #: several learners: each learner's own (standalone) change
    learners: dict[str, PairedCI] = field(default_factory=dict)

    def __str__(self) -> str:
        b, a = self.before, self.after
        lines = [f"system accuracy   {b.system_accuracy:.3f} -> {a.system_accuracy:.3f}: {self.system}",
                 f"learner alone     {b.standalone_accuracy:.3f} -> {a.standalone_accuracy:.3f}: {self.standalone}"]
        lines += [f"{j} alone{' ' * max(1, 10 - len(j))}{np.mean(b.learners[j]):.3f} -> {np.mean(a.learners[j]):.3f}: {ci}"
                  for j, ci in self.learners.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out = {"before": self.before.to_dict(), "after": self.after.to_dict(),
               "system_delta": list(self.system), "standalone_delta": list(self.standalone)}
        if self.learners:
            out["learner_deltas"] = {j: list(ci) for j, ci in self.learners.items()}
        return out


def compare(before: EvalResult, after: EvalResult, *, level: float = 0.95, seed: int = 0) -> Improvement:
    """The change from ``before`` to ``after`` (two :meth:`PolicyGradientTrainer.evaluate` results on the
    same questions), with paired bootstrap CIs over questions."""
    if before.example_ids != after.example_ids:
        raise ConfigError("compare() needs both evaluations on the same questions in the same order; "
                         "evaluate before and after training on the same eval_task")
    learners = {j: paired_bootstrap_ci(before.learners[j], after.learners[j], level=level, seed=seed)
                for j in before.learners if j in after.learners}
    return Improvement(before, after, paired_bootstrap_ci(before.system, after.system, level=level, seed=seed),
                       paired_bootstrap_ci(before.standalone, after.standalone, level=level, seed=seed), learners)



def greedy_episodes(protocol: Any, pool: Pool, task: Task, learner: str | Mapping[str, Agent],
                    policy: Agent | None = None, *, max_new_tokens: int,
                    protocol_options: dict[str, Any] | None = None, seed: int = 0) -> list[Episode]:
    """The play :func:`evaluate_policy` scores: every question of ``task`` once, every agent greedy, ``policy``
    (several learners: the dict ``learner``) playing the learner(s), their turns recorded. A caller that reads
    more from the same play (the learner's parse and verdict rates) plays it once and passes it on."""
    policies = dict(learner) if isinstance(learner, Mapping) else {learner: policy}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return rollout_episodes(protocol, pool, task, policies, options=protocol_options, learner_sampling=greedy,
                            partner_sampling=greedy, examples=[ex.id for ex in task], samples=1, seed=seed)


def evaluate_policy(protocol: Any, pool: Pool, task: Task, learner: str | Mapping[str, Agent],
                    policy: Agent | None = None, *, max_new_tokens: int,
                    protocol_options: dict[str, Any] | None = None, seed: int = 0,
                    episodes: Sequence[Episode] | None = None) -> EvalResult:
    """System and standalone accuracy of ``policy`` playing ``learner`` on ``task`` (greedy, every agent).

    Several learners: ``learner`` is a dict ``id -> policy`` (``policy`` unused); all play together, and
    :attr:`EvalResult.learners` holds each one's standalone scores (``standalone`` is their mean).

    Standalone scores come from ``Episode.standalone`` where the protocol defines them, else from the
    learner answering alone (``vote_v0`` with the learner as the only member). ``episodes``: the play
    :func:`greedy_episodes` gave for these same arguments, scored instead of played again. Shared by every
    trainer, ours and TRL's (:mod:`trainers.trl`)."""
    policies = dict(learner) if isinstance(learner, Mapping) else {learner: policy}
    settings = dict(max_new_tokens=max_new_tokens, protocol_options=protocol_options, seed=seed)
    ids = [ex.id for ex in task]
    if episodes is None:
        episodes = greedy_episodes(protocol, pool, task, policies, **settings)
    elif [ep.example_id for ep in episodes] != ids:
        raise ConfigError("evaluate_policy(episodes=...) needs greedy_episodes() of the same task: one episode per "
                          "question, in the task's order")
    system = np.array([ep.score for ep in episodes])
    own = {}
    for j, p in policies.items():
        if all(j in ep.standalone for ep in episodes):
            own[j] = np.array([ep.standalone[j] for ep in episodes])
        else:
            greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
            alone = rollout_episodes("vote", pool, task, j, p, coalition=[j], learner_sampling=greedy,
                                     partner_sampling=greedy, examples=ids, samples=1, seed=seed)
            own[j] = np.array([ep.score for ep in alone])
    standalone = next(iter(own.values())) if len(own) == 1 else np.mean(list(own.values()), axis=0)
    return EvalResult(ids, system, standalone, own if len(own) > 1 else {})
