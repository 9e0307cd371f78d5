"""C-RL: train one agent inside the live system, rewarded by the system's outcome.

G rollouts of the whole system per question; advantage = system score minus the group's mean
(``config.advantage``: ``"group_mean"``, ``"group_mean_std"``, ``"rloo"``). The leave-one-out
counterfactual v(N \\ {i}) does not depend on the learner's actions, so it cancels under the group
baseline: C-RL costs exactly the G system rollouts per question and never plays a coalition
without the learner.

Several learners (``learners=["model_3", "model_4"]``): the same G episodes per question train every
learner; the system's score is each one's credit and each has its own baseline (its groups' mean),
optimizer and checkpoint files. Still no extra rollouts.
"""

from __future__ import annotations

from trainers.base import PolicyGradientTrainer, RolloutBatch
from trainers.config import CRLConfig


class CRLTrainer(PolicyGradientTrainer):
    """``CRLTrainer(protocol, pool, task, learner="model_1", config=CRLConfig(...))``, or
    ``learners=["model_1", "model_3"]`` for several; see :class:`trainers.base.PolicyGradientTrainer`
    for the arguments.

    Example:
        >>> trainer = CRLTrainer(crl_envs.debate_v0, agents.pool("zoo"), "arith", learner="model_1")  # doctest: +SKIP
        >>> trainer.fit(); trainer.evaluate().system_accuracy                                        # doctest: +SKIP
    """

    config_class = CRLConfig
    multi_learner = True

    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        episodes = self.play(examples, seed)
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        return RolloutBatch(episodes, rewards, index, rollouts=len(episodes))
