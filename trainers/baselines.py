"""The baselines C-RL is compared with; same interface, different rewards.

| trainer | reward of a rollout | episodes per question and step |
|---|---|---|
| :class:`GRPOTrainer` | the learner's own correctness, answering alone (no system) | G (learner alone) |
| :class:`LOORewardTrainer` | system score minus v(N \\ {i}) (the system without the learner) | G + ``counterfactual_samples`` |
| :class:`ShapleyCreditTrainer` | Shapley-weighted outcomes of every coalition containing the learner | G x (coalitions) |

Several learners (``learners=[...]``, k of the pool's n, ``schedule="joint"``), per question and step:
C-RL plays G episodes (the system's outcome is every learner's credit: no extra rollouts);
LOO plays G + k x ``counterfactual_samples`` (one coalition without each learner); Shapley plays
G x (2^n - 2^(n-k)) exactly (every coalition containing at least one learner, each trains the learners in
it) or G x k x ``coalitions_per_question`` sampled (each learner draws its own). GRPO trains one learner.
Under ``"round_robin"`` a step costs what one learner's step costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from crl_envs.valuation.estimators import shapley_weight  # the one place the weights are written
from trainers.base import PolicyGradientTrainer, RolloutBatch
from trainers.config import GRPOConfig, LOORewardConfig, ShapleyCreditConfig


class GRPOTrainer(PolicyGradientTrainer):
    """Standard GRPO on the learner's standalone correctness: the learner answers each question
    alone (``vote_v0`` with the learner as the only member: one answer, scored). No system plays
    during training; :meth:`evaluate` still measures the system."""

    config_class = GRPOConfig
    plays_system = False

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        episodes = self.play(examples, seed, protocol="vote", coalition=[self.learner],
                             training=self._training_now(training))
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        return RolloutBatch(episodes, rewards, index, rollouts=len(episodes))


class LOORewardTrainer(PolicyGradientTrainer):
    """Reward = system score minus the system's score without the learner, v(N \\ {i}), computed
    per question by playing the coalition without it (``counterfactual_samples`` extra episodes per
    question, counted in ``rollouts``). The default advantage ``"loo_counterfactual"`` uses that
    counterfactual as the baseline; under ``"group_mean"`` the counterfactual cancels and this is
    C-RL at a higher cost."""

    config_class = LOORewardConfig

    multi_learner = True
    episodes_per_question = 1.125  # G + counterfactual_samples (1) per question, G = 8

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        training = self._training_now(training)
        episodes = self.play(examples, seed, training=training)
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        played = len(episodes)
        counterfactuals = {}
        for j in training:
            others = [a for a in self.pool.ids if a != j]
            if others:
                samples = self.config.counterfactual_samples
                # the other learners play their current policy greedily there, like partners
                without = self.play(examples, seed, coalition=others, samples=samples, training=[])
                played += len(without)
                counterfactuals[j] = torch.tensor([ep.score for ep in without],
                                                  dtype=torch.float64).reshape(len(examples), samples).mean(1)
            else:
                counterfactuals[j] = torch.full((len(examples),), float(self.protocol(self.pool, self.task).empty_value),
                                                dtype=torch.float64)
        if len(training) == 1:
            return RolloutBatch(episodes, rewards, index, context={"counterfactual": counterfactuals[training[0]]},
                                rollouts=played)
        views = {j: RolloutBatch(episodes, rewards, index, context={"counterfactual": c}) for j, c in counterfactuals.items()}
        return RolloutBatch(episodes, rewards, index, rollouts=played, per_learner=views)


class ShapleyCreditTrainer(PolicyGradientTrainer):
    """The learner's Shapley credit φ_i = Σ_S w(S) [v(S ∪ i) - v(S)]. The v(S) terms (coalitions
    without i) are constant within a group and cancel under the group baseline, so only coalitions
    *containing* the learner are played: G rollouts each, per question; a group is a (question,
    coalition) pair whose group-mean advantage is weighted by the coalition's Shapley weight (times
    the number of coalitions, so the weights average 1). ``coalitions_per_question=k`` instead
    draws k coalitions per step from the Shapley distribution (shared by the step's questions),
    each with weight 1 — unbiased, cheaper for large pools."""

    config_class = ShapleyCreditConfig

    multi_learner = True
    episodes_per_question = 2.0  # per sampled coalition

    def coalitions(self, seed: int, learner: str | None = None) -> list[tuple[list[str], float]]:
        """(members, weight) pairs of ``learner`` (default: the one learner) for one step; weights average 1."""
        learner = self.learner if learner is None else learner
        others = [a for a in self.pool.ids if a != learner]
        n = len(self.pool)
        k = self.config.coalitions_per_question
        if k is None:
            every = [list(c) for size in range(len(others) + 1) for c in itertools.combinations(others, size)]
            return [(self._ordered([learner, *c]), len(every) * shapley_weight(len(c) + 1, n)) for c in every]
        position = self.learners.index(learner)
        rng = np.random.default_rng([self.config.seed, seed, *([position] if position else [])])
        drawn = []
        for _ in range(k):
            size = int(rng.integers(0, n))  # partners: 0 .. n-1, uniformly (the Shapley distribution)
            partners = list(rng.choice(others, size=size, replace=False)) if size else []
            drawn.append((self._ordered([learner, *partners]), 1.0))
        return drawn

    def _ordered(self, members: list[str]) -> list[str]:
        return [a for a in self.pool.ids if a in set(members)]

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        """Exact: every coalition containing a learner of ``training`` (default :attr:`training`) is played
        once and trains the learners in it. Sampled: each learner's own draws, played with only that learner
        sampling."""
        training = self._training_now(training)
        plays: list[tuple[list[str], list[str], dict[str, float]]] = []  # (members, learners recorded, weight per learner)
        if self.config.coalitions_per_question is None:
            seen: dict[tuple[str, ...], dict[str, float]] = {}
            for j in training:
                for members, weight in self.coalitions(seed, j):
                    if tuple(members) not in seen:
                        seen[tuple(members)] = {}
                        plays.append((members, [a for a in training if a in members], seen[tuple(members)]))
                    seen[tuple(members)][j] = weight
        else:
            plays = [(members, [j], {j: weight}) for j in training for members, weight in self.coalitions(seed, j)]
        episodes, all_rewards, all_index = [], [], []
        views = {j: ([], [], [], []) for j in training}  # episodes, rewards, index, weights
        for draw, (members, recorded, weights) in enumerate(plays):
            played = self.play(examples, seed + draw, coalition=members, training=recorded)
            r, idx = self.group(played, [ep.score for ep in played], len(examples))
            all_index.extend([[len(episodes) + e for e in group] for group in idx])
            all_rewards.append(r)
            episodes.extend(played)
            for j, weight in weights.items():
                eps, rewards, index, w = views[j]
                index.extend([[len(eps) + e for e in group] for group in idx])
                eps.extend(played)
                rewards.append(r)
                w.extend([weight] * len(examples))
        batches = {j: RolloutBatch(eps, torch.cat(rewards), index, context={"weights": torch.tensor(w, dtype=torch.float64)},
                                   rollouts=len(episodes)) for j, (eps, rewards, index, w) in views.items()}
        if len(training) == 1:
            return batches[training[0]]
        return RolloutBatch(episodes, torch.cat(all_rewards), all_index, rollouts=len(episodes), per_learner=batches)
