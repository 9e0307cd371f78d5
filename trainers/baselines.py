"""The baselines C-RL is compared with; same interface, different rewards.

| trainer | reward of a rollout | episodes per question and step |
|---|---|---|
| :class:`GRPOTrainer` | the learner's own correctness, answering alone (no system) | G (learner alone) |
| :class:`LOORewardTrainer` | system score minus v(N \\ {i}) (the system without the learner) | G + ``counterfactual_samples`` |
| :class:`ShapleyCreditTrainer` | Shapley-weighted outcomes of every coalition containing the learner | G x (coalitions) |
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from trainers.base import PolicyGradientTrainer, RolloutBatch
from trainers.config import GRPOConfig, LOORewardConfig, ShapleyCreditConfig


class GRPOTrainer(PolicyGradientTrainer):
    """Standard GRPO on the learner's standalone correctness: the learner answers each question
    alone (``vote_v0`` with the learner as the only member: one answer, scored). No system plays
    during training; :meth:`evaluate` still measures the system."""

    config_class = GRPOConfig

    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        episodes = self.play(examples, seed, protocol="vote", coalition=[self.learner])
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        return RolloutBatch(episodes, rewards, index, rollouts=len(episodes))


class LOORewardTrainer(PolicyGradientTrainer):
    """Reward = system score minus the system's score without the learner, v(N \\ {i}), computed
    per question by playing the coalition without it (``counterfactual_samples`` extra episodes per
    question, counted in ``rollouts``). The default advantage ``"loo_counterfactual"`` uses that
    counterfactual as the baseline; under ``"group_mean"`` the counterfactual cancels and this is
    C-RL at a higher cost."""

    config_class = LOORewardConfig

    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        episodes = self.play(examples, seed)
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        others = [a for a in self.pool.ids if a != self.learner]
        played = len(episodes)
        if others:
            samples = self.config.counterfactual_samples
            without = self.play(examples, seed, coalition=others, samples=samples)
            played += len(without)
            counterfactual = torch.tensor([ep.score for ep in without], dtype=torch.float64).reshape(len(examples), samples).mean(1)
        else:
            counterfactual = torch.full((len(examples),), float(self.protocol(self.pool, self.task).empty_value),
                                        dtype=torch.float64)
        return RolloutBatch(episodes, rewards, index, context={"counterfactual": counterfactual}, rollouts=played)


def shapley_weight(size: int, n: int) -> float:
    """Shapley weight of a coalition of ``size`` members containing player i, out of ``n``:
    ``(size-1)! (n-size)! / n!``; they sum to 1 over all coalitions containing i."""
    return math.factorial(size - 1) * math.factorial(n - size) / math.factorial(n)


class ShapleyCreditTrainer(PolicyGradientTrainer):
    """The learner's Shapley credit φ_i = Σ_S w(S) [v(S ∪ i) - v(S)]. The v(S) terms (coalitions
    without i) are constant within a group and cancel under the group baseline, so only coalitions
    *containing* the learner are played: G rollouts each, per question; a group is a (question,
    coalition) pair whose group-mean advantage is weighted by the coalition's Shapley weight (times
    the number of coalitions, so the weights average 1). ``coalitions_per_question=k`` instead
    draws k coalitions per step from the Shapley distribution (shared by the step's questions),
    each with weight 1 — unbiased, cheaper for large pools."""

    config_class = ShapleyCreditConfig

    def coalitions(self, seed: int) -> list[tuple[list[str], float]]:
        """(members, weight) pairs for one step; weights average 1."""
        others = [a for a in self.pool.ids if a != self.learner]
        n = len(self.pool)
        k = self.config.coalitions_per_question
        if k is None:
            every = [list(c) for size in range(len(others) + 1) for c in itertools.combinations(others, size)]
            return [(self._ordered([self.learner, *c]), len(every) * shapley_weight(len(c) + 1, n)) for c in every]
        rng = np.random.default_rng([self.config.seed, seed])
        drawn = []
        for _ in range(k):
            size = int(rng.integers(0, n))  # partners: 0 .. n-1, uniformly (the Shapley distribution)
            partners = list(rng.choice(others, size=size, replace=False)) if size else []
            drawn.append((self._ordered([self.learner, *partners]), 1.0))
        return drawn

    def _ordered(self, members: list[str]) -> list[str]:
        return [a for a in self.pool.ids if a in set(members)]

    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        episodes, rewards, index, weights = [], [], [], []
        for draw, (members, weight) in enumerate(self.coalitions(seed)):
            played = self.play(examples, seed + draw, coalition=members)
            r, idx = self.group(played, [ep.score for ep in played], len(examples))
            index.extend([[len(episodes) + e for e in group] for group in idx])
            episodes.extend(played)
            rewards.append(r)
            weights.extend([weight] * len(examples))
        return RolloutBatch(episodes, torch.cat(rewards), index,
                            context={"weights": torch.tensor(weights, dtype=torch.float64)}, rollouts=len(episodes))
