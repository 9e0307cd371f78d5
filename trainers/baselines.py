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

Each trainer's credit is an object of :mod:`crl_envs.valuation.credit` (:meth:`~PolicyGradientTrainer.credit_for`
its config): it names the coalitions :meth:`collect` plays, their weights, and these counts
(:meth:`~crl_envs.valuation.credit.Credit.episodes_per_question`, which a study's cost estimate reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from crl_envs.valuation.credit import Credit, LOOCredit, ShapleyCredit, StandaloneCredit
from trainers.base import PolicyGradientTrainer, RolloutBatch
from trainers.config import GRPOConfig, LOORewardConfig, ShapleyCreditConfig, TrainerConfig


class GRPOTrainer(PolicyGradientTrainer):
    """Standard GRPO on the learner's standalone correctness: the learner answers each question
    alone (``vote_v0`` with the learner as the only member: one answer, scored). No system plays
    during training; :meth:`evaluate` still measures the system."""

    config_class = GRPOConfig

    @classmethod
    def credit_for(cls, config: TrainerConfig) -> Credit:
        return StandaloneCredit()

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        credit = self.credit
        (alone,) = credit.coalitions(self.pool.ids, self.learner)
        episodes = self.play(examples, seed, protocol=credit.protocol, coalition=list(alone.members),
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

    @classmethod
    def credit_for(cls, config: TrainerConfig) -> Credit:
        return LOOCredit(samples=config.counterfactual_samples)

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        """The G system episodes (rewards: their scores), and per learner the counterfactual v(N \\ {i}) of its
        credit (:class:`~crl_envs.valuation.credit.LOOCredit`) that ``"loo_counterfactual"`` subtracts."""
        training = self._training_now(training)
        episodes = self.play(examples, seed, training=training)
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        played = len(episodes)
        credit = self.credit
        counterfactuals = {}
        for j in training:
            (system,) = credit.coalitions(self.pool.ids, j)
            if system.without:
                # the other learners play their current policy greedily there, like partners
                without = self.play(examples, seed, coalition=list(system.without), samples=credit.samples, training=[])
                played += len(without)
                counterfactuals[j] = torch.tensor([ep.score for ep in without],
                                                  dtype=torch.float64).reshape(len(examples), credit.samples).mean(1)
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

    @classmethod
    def credit_for(cls, config: TrainerConfig) -> Credit:
        return ShapleyCredit(coalitions=config.coalitions_per_question)

    def coalitions(self, seed: int, learner: str | None = None) -> list[tuple[list[str], float]]:
        """(members, weight) pairs of ``learner`` (default: the one learner) for one step: its credit's coalitions
        (:class:`~crl_envs.valuation.credit.ShapleyCredit`) and their group weights, which average 1."""
        learner = self.learner if learner is None else learner
        position = self.learners.index(learner) if learner in self.learners else 0
        played = self.credit.coalitions(self.pool.ids, learner, seed=[self.config.seed, seed, *([position] if position else [])])
        return [(list(c.members), c.group_weight) for c in played]

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
