"""Trainers: make a model a better *collaborator*.

- :class:`CRLTrainer` — C-RL: RL inside the live system on the system's outcome, group baseline.
- Baselines with the same interface: :class:`GRPOTrainer` (standalone correctness),
  :class:`LOORewardTrainer` (explicit leave-one-out counterfactual), :class:`ShapleyCreditTrainer`.
- Plug-in points: :func:`register_advantage`, :func:`register_loss`, or subclass
  :class:`PolicyGradientTrainer` and override ``collect``.
- :mod:`trainers.sb3` — discrete roles (a router) with stable-baselines3.
- :mod:`trainers.trl` — C-RL at scale on TRL's ``GRPOTrainer`` (a rollout function; extra ``crl-envs[trl]``).
- :func:`crossplay` / :func:`trainer_crossplay` — each trained learner with partners it trained with vs partners it never trained with.
- :class:`PlaceboTrainer` — C-RL's rollouts and updates on coin-flip rewards: the control every comparison shows.
- :mod:`trainers.controls` — the system without the learner, parse and verdict rates, the learning-rate bound.
- :mod:`trainers.callbacks` — :class:`TrainerCallback`: the progress bar, metrics.jsonl and the trackers around ``fit()``, and yours.
- :mod:`trainers.state` — :class:`TrainerState` (a run's progress, what checkpoints hold) and :class:`TrainerControl`
  (a callback stops the fit or asks for a checkpoint).
- :func:`compare` — before/after evaluations -> Δ accuracy with paired bootstrap CIs, printed in points.
"""

from crl_envs.valuation.estimators import shapley_weight  # the one place the weights are written
from trainers.advantages import ADVANTAGES, compute_advantages, register_advantage
from trainers.base import PolicyGradientTrainer, RolloutBatch, Trainer
from trainers.baselines import GRPOTrainer, LOORewardTrainer, ShapleyCreditTrainer
from trainers.callbacks import TrainerCallback
from trainers.config import (
    CRLConfig,
    GRPOConfig,
    LOORewardConfig,
    LoraSettings,
    PlaceboConfig,
    ShapleyCreditConfig,
    TrainerConfig,
)
from trainers.crl import CRLTrainer
from trainers.crossplay import CrossPlay, LearnerCrossPlay, crossplay, trainer_crossplay
from trainers.evaluation import (
    EvalResult,
    Improvement,
    PairedCI,
    compare,
    evaluate_policy,
    paired_bootstrap_ci,
)
from trainers.losses import LOSSES, LossInputs, clipped_token_loss, register_loss
from trainers.placebo import PlaceboTrainer, placebo_rewards
from trainers.rollout import LearnerSequence, learner_sequences, rollout_episodes, token_logprobs
from trainers.state import TrainerControl, TrainerState

#: The trainer roster, by name: the one place it is written (the study's ``[training] trainers`` reads it).
TRAINERS = {"crl": CRLTrainer, "grpo": GRPOTrainer, "loo_reward": LOORewardTrainer, "shapley_credit": ShapleyCreditTrainer,
            "placebo": PlaceboTrainer}
#: The default roster of a comparison: C-RL, every baseline (Shapley credit included) and the placebo.
ROSTER: tuple[str, ...] = tuple(TRAINERS)

__all__ = [
    "ADVANTAGES", "compute_advantages", "register_advantage", "EvalResult", "PolicyGradientTrainer", "RolloutBatch",
    "Trainer", "paired_bootstrap_ci", "PairedCI", "Improvement", "compare", "evaluate_policy", "GRPOTrainer", "LOORewardTrainer", "ShapleyCreditTrainer", "shapley_weight",
    "CRLConfig", "GRPOConfig", "LoraSettings", "LOORewardConfig", "ShapleyCreditConfig", "TrainerConfig",
    "CRLTrainer", "LOSSES", "LossInputs", "clipped_token_loss", "register_loss", "LearnerSequence",
    "learner_sequences", "rollout_episodes", "token_logprobs", "TRAINERS", "ROSTER", "CrossPlay", "LearnerCrossPlay",
    "crossplay", "trainer_crossplay", "PlaceboTrainer", "PlaceboConfig", "placebo_rewards", "TrainerCallback",
    "TrainerControl", "TrainerState",
]
