"""Plug a custom algorithm into the trainers: a new advantage estimator, a new loss, a new reward.

    python examples/custom_algorithm.py [--steps 5]

1. ``register_advantage(name, fn)``: ``fn(rewards [groups, G], **context) -> advantages`` — here
   ``"best_of_group"``, which only reinforces rollouts that beat the group's mean.
2. ``register_loss(name, fn)``: ``fn(LossInputs) -> (loss, stats)`` — here plain REINFORCE
   (no ratio clipping), normalised per token like ``dapo``.
3. A ``PolicyGradientTrainer`` subclass overriding ``collect`` — here the system's score plus a
   bonus when the learner's own last answer is the system's answer (a "be on the winning side"
   reward). Everything else (rollouts, loss, checkpoints, metrics, evaluate) is inherited.
"""

from __future__ import annotations

import argparse

import torch

import agents
import agents.zoo  # registers the "zoo" pool
from crl_envs import tasks
from trainers import (
    CRLConfig,
    LossInputs,
    PolicyGradientTrainer,
    RolloutBatch,
    register_advantage,
    register_loss,
)


def best_of_group(rewards: torch.Tensor, **_) -> torch.Tensor:
    """``max(r_g - mean(r), 0)``: learn only from the rollouts that did better than their group."""
    return (rewards - rewards.mean(dim=1, keepdim=True)).clamp(min=0)


def reinforce(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """``-A * log π(token)`` summed over the learner's tokens / the step's token count."""
    per_token = -inputs.advantages.reshape(-1, 1).to(inputs.logprobs) * inputs.logprobs * inputs.mask
    return per_token.sum() / max(inputs.total_tokens, 1), {}


register_advantage("best_of_group", best_of_group)
register_loss("reinforce", reinforce)


class WinningSideTrainer(PolicyGradientTrainer):
    """Reward = system score + ``bonus`` if the learner's final answer is the system's answer."""

    config_class = CRLConfig
    bonus = 0.25

    def collect(self, examples: list[str], seed: int, training: list[str] | None = None) -> RolloutBatch:
        episodes = self.play(examples, seed, training=training)
        rewards = []
        for ep in episodes:
            on_winning_side = ep.answer is not None and ep.answers.get(self.learner) == ep.answer
            rewards.append(ep.score + self.bonus * on_winning_side)
        r, index = self.group(episodes, rewards, len(examples))
        return RolloutBatch(episodes, r, index, rollouts=len(episodes))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--protocol", default="vote")
    parser.add_argument("--zoo-dir", help="load the zoo's models from this directory (default: the installed zoo)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.zoo_dir:
        pool = agents.pool([agents.HFAgent(f"{args.zoo_dir}/{n}", name=n) for n in agents.zoo.NAMES])
    else:
        pool = agents.pool("zoo")
    train = tasks.load("arith", split="train", n=100, **agents.zoo.TASK_OPTIONS)
    held_out = tasks.load("arith", split="test", n=100, **agents.zoo.TASK_OPTIONS)
    config = CRLConfig(steps=args.steps, advantage="best_of_group", loss_type="reinforce", learning_rate=5e-5,
                       max_new_tokens=24)
    trainer = WinningSideTrainer(args.protocol, pool, train, learner="model_1", config=config, eval_task=held_out)
    before = trainer.evaluate()
    history = trainer.fit()
    after = trainer.evaluate()
    print(f"last step: reward {history[-1]['reward_mean']:.3f}, zero-variance groups {history[-1]['zero_variance_groups']:.2f}")
    print(f"system {before.system_accuracy:.3f} -> {after.system_accuracy:.3f}; "
          f"standalone {before.standalone_accuracy:.3f} -> {after.standalone_accuracy:.3f}")


if __name__ == "__main__":
    main()
