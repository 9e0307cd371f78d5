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

from collections.abc import Sequence

from trainers.base import PolicyGradientTrainer, RolloutBatch
from trainers.config import CRLConfig


class CRLTrainer(PolicyGradientTrainer):
    """``CRLTrainer(protocol, pool, task, learner="model_1", config=CRLConfig(...))``, or
    ``learners=["model_1", "model_3"]`` for several; see :class:`trainers.base.PolicyGradientTrainer`
    for the arguments.

    Example:
        >>> import agents, crl_envs
        >>> task = crl_envs.tasks.load("arith", n=200, **agents.zoo.TASK_OPTIONS)
        >>> trainer = CRLTrainer(crl_envs.debate_v0, agents.pool("zoo"), task, learner="model_1")
        >>> trainer.fit()  # minutes of training: tests/test_trainers.py fits small ones  # doctest: +SKIP
        >>> held_out = crl_envs.tasks.load("arith", split="test", n=100, **agents.zoo.TASK_OPTIONS)
        >>> trainer.evaluate(held_out).system_accuracy  # after fit()  # doctest: +SKIP
    """

    config_class = CRLConfig
    multi_learner = True

    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        episodes = self.play(examples, seed, training=self._training_now(training))
        rewards, index = self.group(episodes, [ep.score for ep in episodes], len(examples))
        return RolloutBatch(episodes, rewards, index, rollouts=len(episodes))
