"""Cross-play: does a trained collaborator still help with partners it never trained with?

After training, each learner is played (greedy, held-out questions) in its *trained-with* setting, the
coalition it trained in with the other learners as trained, and in *unseen* settings: the same
coalition with the other learners untrained (their original pool versions), and other coalitions
(other sizes, other members, e.g. members of a larger pool that were not in training).

Accuracies differ between coalitions whatever the training (a smaller coalition scores less), so the
gap compares *gains*: in each setting, the learner's gain is the system's accuracy with the learner
trained minus the same setting with the learner untrained (everything else equal). ``gap`` =
gain with its training partners minus its mean gain with unseen partners, per question, with a paired
bootstrap CI. A collaborator that only works with its training partners has a large positive gap.

Example:
    >>> trainer = trainers.CRLTrainer("debate", pool, train, learners=["model_3", "model_4"])  # doctest: +SKIP
    >>> trainer.fit()                                                                          # doctest: +SKIP
    >>> print(trainer_crossplay(trainer, held_out))                                            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents import Agent, Pool, SamplingParams
from crl_envs.runner import run_episodes
from crl_envs.stats import PairedCI, paired_bootstrap_ci
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError


@dataclass
class LearnerCrossPlay:
    """One learner's cross-play: accuracies and gains with its training partners and with unseen ones.

    ``trained_with_gain`` / ``unseen_gain``: accuracy with the learner trained minus untrained, in the
    trained-with setting / averaged over the unseen settings; ``gap`` = their per-question difference."""

    learner: str
    trained_with: str
    unseen: list[str]
    trained_with_accuracy: float
    unseen_accuracy: float
    trained_with_gain: PairedCI
    unseen_gain: PairedCI
    gap: PairedCI
    #: per held-out question: ``"trained_with_gain"`` and ``"unseen_gain"`` (mean over unseen settings)
    per_question: dict[str, np.ndarray] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trained_with": self.trained_with, "unseen": self.unseen,
                "trained_with_accuracy": self.trained_with_accuracy, "unseen_accuracy": self.unseen_accuracy,
                "trained_with_gain": list(self.trained_with_gain), "unseen_gain": list(self.unseen_gain),
                "gap": list(self.gap)}


@dataclass
class CrossPlay:
    """Cross-play of every learner; ``settings`` holds each played setting's per-question system scores,
    keyed by its label (``"model_0+model_1+model_3 | trained: model_3"``)."""

    example_ids: list[str]
    learners: dict[str, LearnerCrossPlay]
    settings: dict[str, np.ndarray] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = ["learner     trained-with acc  unseen acc  gain trained-with  gain unseen  gap (points, 95% CI)"]
        for j, r in self.learners.items():
            lines.append(f"{j:<11} {r.trained_with_accuracy:16.3f}  {r.unseen_accuracy:10.3f}  "
                         f"{100 * r.trained_with_gain.delta:+17.1f}  {100 * r.unseen_gain.delta:+11.1f}  "
                         f"{100 * r.gap.delta:+.1f} [{100 * r.gap.low:+.1f}, {100 * r.gap.high:+.1f}] "
                         f"({len(r.unseen)} unseen settings)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"n": len(self.example_ids), "learners": {j: r.to_dict() for j, r in self.learners.items()},
                "settings": {k: float(np.mean(v)) for k, v in self.settings.items()}}


def _label(coalition: Sequence[str], trained: Sequence[str]) -> str:
    return f"{'+'.join(coalition)} | trained: {', '.join(trained) or 'none'}"


Setting = tuple[list[str], list[str]]  # (coalition, its members that play trained), in pool order


def crossplay_settings(pool_ids: Sequence[str], learners: Sequence[str], *, trained_with: Sequence[str] | None = None,
                       coalitions: Sequence[Sequence[str]] | None = None
                       ) -> dict[str, tuple[tuple[Setting, Setting], list[tuple[Setting, Setting]]]]:
    """What :func:`crossplay` plays (and a study's plan prices), without playing it: per learner, its
    trained-with pair (the training coalition with every learner trained / with it untrained) and its
    unseen pairs (a setting with it trained / the same with it untrained). Arguments as in :func:`crossplay`.

    Raises:
        ValueError: as :func:`crossplay`."""
    pool_ids = list(pool_ids)
    learners = list(learners)
    trained_with = list(pool_ids if trained_with is None else trained_with)
    for name, members in (("policies", learners), ("trained_with", trained_with)):
        unknown = [a for a in members if a not in pool_ids]
        if unknown:
            raise ConfigError(f"{name} names {unknown}, which are not in the pool; pool agents are {pool_ids}")
    outside = [j for j in learners if j not in trained_with]
    if outside:
        raise ConfigError(f"learners {outside} are not in trained_with={trained_with}: name the coalition they trained in")
    ordered = lambda members: [a for a in pool_ids if a in set(members)]  # noqa: E731
    if coalitions is None:
        coalitions = [list(c) for size in range(2, len(pool_ids) + 1) for c in itertools.combinations(pool_ids, size)
                      if set(c) & set(learners) and set(c) != set(trained_with)]
    for c in coalitions:
        if isinstance(c, str) or len(c) == 0 or any(a not in pool_ids for a in c):
            raise ConfigError(f"coalition {c!r} must be a non-empty list of pool agents {pool_ids}")
    coalitions = [ordered(c) for c in coalitions]
    everyone = set(learners)
    home = ordered(trained_with)

    def setting(coalition: list[str], trained: set[str]) -> Setting:
        return coalition, [a for a in coalition if a in trained]

    out = {}
    for j in learners:
        pairs = []
        if len(everyone & set(home)) > 1:
            pairs.append((setting(home, {j}), setting(home, set())))
        pairs += [(setting(c, everyone), setting(c, everyone - {j})) for c in coalitions if j in c]
        if not pairs:
            raise ConfigError(f"learner {j!r} has no unseen setting (pool {pool_ids}, trained with {home}): pass "
                             "coalitions= or a pool with members it did not train with")
        out[j] = ((setting(home, everyone), setting(home, everyone - {j})), pairs)
    return out


def crossplay(protocol: Any, pool: Pool, task: Task, policies: Mapping[str, Agent], *,
              trained_with: Sequence[str] | None = None, coalitions: Sequence[Sequence[str]] | None = None,
              max_new_tokens: int = 256, protocol_options: dict[str, Any] | None = None, seed: int = 0,
              level: float = 0.95) -> CrossPlay:
    """Play each trained learner with partners it trained with and with partners it never trained with.

    Args:
        protocol: the protocol factory or name the learners trained in.
        pool: the pool with the *untrained* versions of the learners (``trainer.pool``); it may hold
            members that were not in training (then name the training members in ``trained_with``).
        task: held-out questions.
        policies: learner id -> trained policy (``trainer.policies``).
        trained_with: the coalition the learners trained in (default: the whole pool).
        coalitions: the unseen coalitions to play (default: every coalition of two or more pool members
            that contains a learner, other than ``trained_with``); with several learners, ``trained_with``
            with the other learners untrained is always one more unseen setting.
        max_new_tokens, protocol_options, seed: as in training (every agent decodes greedily).
        level: the CIs' level.

    Returns:
        A :class:`CrossPlay`. Cost: each distinct (coalition, trained learners) setting is played once
        on ``task``: at most ``2 x (1 + len(coalitions))`` settings per learner, shared between learners.

    Raises:
        ValueError: a learner not in the pool or not in ``trained_with``, a coalition with a member not in
            the pool, or a learner with no unseen setting (a pool of two and one learner: pass ``coalitions``).
    """
    learners = list(policies)
    plan = crossplay_settings(pool.ids, learners, trained_with=trained_with, coalitions=coalitions)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    ids = [ex.id for ex in task]
    scores: dict[str, np.ndarray] = {}

    def system(setting: tuple[list[str], list[str]]) -> tuple[str, np.ndarray]:
        coalition, trained_here = setting
        label = _label(coalition, trained_here)
        if label not in scores:
            episodes = run_episodes(protocol, pool, task, coalition=coalition, samples=1, seed=seed,
                                    policies={a: policies[a] for a in trained_here}, sampling=greedy, examples=ids,
                                    options=protocol_options, record=[], progress=False)
            scores[label] = np.array([ep.score for ep in episodes], dtype=float)
        return label, scores[label]

    results = {}
    for j in learners:
        (home_with, home_without), pairs = plan[j]
        home_label, with_j = system(home_with)
        without_j = system(home_without)[1]
        unseen = [(*system(a), system(b)[1]) for a, b in pairs]  # (label, with j trained, with j untrained)
        unseen_gain = np.mean([a - b for _, a, b in unseen], axis=0)
        home_gain = with_j - without_j
        results[j] = LearnerCrossPlay(
            learner=j, trained_with=home_label, unseen=[u[0] for u in unseen],
            trained_with_accuracy=float(with_j.mean()), unseen_accuracy=float(np.mean([a.mean() for _, a, _ in unseen])),
            trained_with_gain=paired_bootstrap_ci(without_j, with_j, level=level, seed=seed),
            unseen_gain=paired_bootstrap_ci(np.zeros_like(unseen_gain), unseen_gain, level=level, seed=seed),
            gap=paired_bootstrap_ci(unseen_gain, home_gain, level=level, seed=seed),
            per_question={"trained_with_gain": home_gain, "unseen_gain": unseen_gain},
        )
    return CrossPlay(ids, results, scores)


def trainer_crossplay(trainer: Any, task: Task | None = None, *,
                      coalitions: Sequence[Sequence[str]] | None = None) -> CrossPlay:
    """:func:`crossplay` of a trained :class:`~trainers.PolicyGradientTrainer`'s policies, with its protocol,
    pool (the untrained versions), decoding length, protocol options and seed, on ``task`` (default: its
    ``eval_task``).

    Raises:
        ValueError: no held-out questions (neither ``task`` nor the trainer's ``eval_task``)."""
    task = task if task is not None else trainer.eval_task
    if task is None:
        raise ConfigError("trainer_crossplay() needs held-out questions: pass task= or give the trainer eval_task=")
    cfg = trainer.config
    return crossplay(trainer.protocol, trainer.pool, task, trainer.policies, coalitions=coalitions,
                     max_new_tokens=cfg.max_new_tokens, protocol_options=cfg.protocol_options, seed=cfg.seed)
