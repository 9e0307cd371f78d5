"""The placebo trainer: C-RL's rollouts and updates with the rewards replaced by seeded coin flips.

Every comparison of trainers needs it beside them: it plays exactly what :class:`trainers.CRLTrainer` plays
(G system rollouts per question) and takes the same optimizer steps, but each rollout's reward is a fair
coin (``rewards="coin"``) or the group's own rewards permuted within the group (``rewards="permuted"``:
the same reward distribution, detached from what the learner said). Whatever a trainer gains that the
placebo gains too is the optimiser moving the weights (issue #46: at lr 1e-3 a placebo reproduced vote's
"+2.0", the learner alone falling to 0.000), not credit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from agents import stable_hash
from trainers.base import RolloutBatch
from trainers.config import PlaceboConfig
from trainers.crl import CRLTrainer


def placebo_rewards(rewards: torch.Tensor, kind: str, seed: int) -> torch.Tensor:
    """``rewards`` ``[groups, G]`` replaced: ``"coin"`` fair coin flips, ``"permuted"`` each row shuffled;
    the same ``seed`` gives the same draw."""
    rng = np.random.default_rng(seed)
    if kind == "coin":
        return torch.as_tensor(rng.integers(0, 2, size=tuple(rewards.shape)), dtype=rewards.dtype)
    order = np.argsort(rng.random(tuple(rewards.shape)), axis=1)
    return torch.gather(rewards, 1, torch.as_tensor(order))


class PlaceboTrainer(CRLTrainer):
    """C-RL with uninformative rewards (:func:`placebo_rewards`), same rollouts and optimizer steps; the
    drawn rewards are seeded by ``config.seed`` and the step. Its metrics' ``reward_mean`` and
    ``zero_variance_groups`` describe the drawn rewards (``system_score`` the system's)."""

    config_class = PlaceboConfig

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        batch = super().collect(examples, seed, training)
        drawn = placebo_rewards(batch.rewards, self.config.rewards, stable_hash(self.config.seed, "placebo", seed) % 2**32)
        return RolloutBatch(batch.episodes, drawn, batch.index, rollouts=batch.rollouts)
