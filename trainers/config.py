"""Dataclass configs, one per trainer (the trainer is the algorithm; the config is its settings).

Names follow TRL's ``GRPOConfig`` where a user would look for them (``num_generations``, ``beta``,
``epsilon``, ``loss_type``, ``learning_rate``, ``gradient_accumulation_steps``).
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from crl_envs.tracking import check_trackers
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import check_int

#: Built-in advantage estimators that compare a rollout with its group (they need G >= 2).
GROUP_ESTIMATORS = frozenset({"group_mean", "group_mean_std", "rloo", "shapley_credit"})
#: How several learners take turns (``TrainerConfig.schedule``).
SCHEDULES = ("joint", "round_robin")


def _type_error(owner: str, name: str, value: Any, kind: str) -> TypeError:
    hint = f"; write {value} without quotes" if isinstance(value, str) else ""
    return ConfigTypeError(f"{owner}.{name} must be {kind}, got the {type(value).__name__} {value!r}{hint}")


def _check_number(owner: str, name: str, value: Any, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False, high_open: bool = False, why: str = "") -> None:
    """``value`` is a finite real number in the given range, or a one-line error names the field and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _type_error(owner, name, value, "a number")
    left = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    right = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    bad = not math.isfinite(value)
    bad |= low is not None and (value <= low if low_open else value < low)
    bad |= high is not None and (value >= high if high_open else value > high)
    if bad:
        rng = " and ".join(x for x in (left, right) if x)
        raise ConfigError(f"{owner}.{name} must be {rng}, got {value!r}" + (f" ({why})" if why else ""))


@dataclass
class LoraSettings:
    """LoRA through peft. ``target_modules`` default ``["c_attn"]`` fits GPT-2; Llama-style models
    want e.g. ``["q_proj", "v_proj"]``."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["c_attn"])

    def __post_init__(self) -> None:
        check_int("LoraSettings.r", self.r, minimum=1)
        _check_number("LoraSettings", "alpha", self.alpha, low=0, low_open=True)
        _check_number("LoraSettings", "dropout", self.dropout, low=0, high=1, high_open=True)
        if isinstance(self.target_modules, str) or not self.target_modules or not all(
                isinstance(m, str) for m in self.target_modules):
            raise ConfigTypeError(f"LoraSettings.target_modules must be a non-empty list of module names (str), "
                            f"got {self.target_modules!r}")


@dataclass
class TrainerConfig:
    """Settings shared by every policy-gradient trainer.

    Args:
        steps: optimizer steps of :meth:`fit`.
        questions_per_step: training questions per step (each played ``num_generations`` times).
        num_generations: G, rollouts per question (the group of the group baseline).
        temperature / top_p / max_new_tokens: the learner's sampling while training (256 new
            tokens by default, TRL's ``max_completion_length``; the zoo's answers need about 20).
        partner_temperature: the other agents' sampling (0 = greedy: partners are deterministic,
            so the learner's tokens are the only source of variance within a group).
        learning_rate, weight_decay, max_grad_norm: AdamW and gradient clipping.
        epsilon / epsilon_high: the PPO clip range ``[1 - epsilon, 1 + epsilon_high]``.
        num_iterations: optimisation passes over each batch of rollouts (1 = on-policy).
        gradient_accumulation_steps: micro-batches one step's rollouts are split into (the
            normalisation is global, so the gradient does not depend on this).
        advantage: a name in :data:`trainers.advantages.ADVANTAGES`.
        loss_type: a name in :data:`trainers.losses.LOSSES` (``"grpo"``, ``"dapo"``, ``"dr_grpo"``).
        beta: weight of the k3 KL to the reference (the initial policy); 0 loads no reference.
        lora: :class:`LoraSettings` to train a LoRA adapter instead of every weight.
        lora_shared_base: with ``lora`` and several learners that are copies of one base model, hold the
            base once and each learner as its own named peft adapter on it (its own optimizer over its
            adapter, its own checkpoint); False: each learner is its own copy of the model.
        protocol_options: keyword arguments of the protocol factory (e.g. ``{"rounds": 2}``).
        seed: seeds question order, sampling and initialisation.
        output_dir: where metrics (JSONL + TensorBoard) and checkpoints go (``None``: nothing written).
        save_steps: checkpoint every this many steps (and at the end).
        tensorboard: also write TensorBoard events.
        trackers: more trackers to log to, offline, next to ``output_dir`` (``"mlflow"``, ``"trackio"``,
            ``"wandb"``; see :mod:`crl_envs.tracking`): per step metrics and the config.
        tracking_project: the project (experiment) the trackers file this run under; the run is named by
            ``output_dir``'s last component.
        tracking_dir: where ``trackers`` keep their stores (``None``: ``output_dir``); a study passes its
            ``out``, so that its training runs share one MLflow database.
        progress: show progress bars.
        schedule: with several learners, ``"joint"`` (every step updates all of them from the same
            episodes) or ``"round_robin"`` (step t updates ``learners[t % k]``; the others play their
            current policy greedily as partners). Ignored with one learner.
    """

    steps: int = 20
    questions_per_step: int = 8
    num_generations: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    partner_temperature: float = 0.0
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    num_iterations: int = 1
    gradient_accumulation_steps: int = 1
    advantage: str = "group_mean"
    loss_type: str = "dapo"
    beta: float = 0.0
    lora: LoraSettings | None = None
    lora_shared_base: bool = False
    protocol_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    output_dir: str | None = None
    save_steps: int = 10
    tensorboard: bool = True
    trackers: tuple[str, ...] = ()
    tracking_project: str = "crl-envs"
    tracking_dir: str | None = None
    progress: bool = True
    schedule: str = "joint"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"{name}.schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        for field_name in ("steps", "questions_per_step", "num_generations", "max_new_tokens", "num_iterations",
                           "gradient_accumulation_steps", "save_steps"):
            check_int(f"{name}.{field_name}", getattr(self, field_name), minimum=1)
        check_int(f"{name}.seed", self.seed, minimum=0)
        _check_number(name, "temperature", self.temperature, low=0, low_open=True,
                      why="greedy rollouts have no exploration and no valid log-probs to correct")
        _check_number(name, "top_p", self.top_p, low=0, high=1, low_open=True)
        _check_number(name, "partner_temperature", self.partner_temperature, low=0)
        _check_number(name, "learning_rate", self.learning_rate, low=0, low_open=True)
        _check_number(name, "weight_decay", self.weight_decay, low=0)
        _check_number(name, "max_grad_norm", self.max_grad_norm, low=0, low_open=True)
        _check_number(name, "epsilon", self.epsilon, low=0, high=1, low_open=True, high_open=True)
        if self.epsilon_high is not None:
            _check_number(name, "epsilon_high", self.epsilon_high, low=0, low_open=True,
                          why="the clip range is [1 - epsilon, 1 + epsilon_high]; epsilon_high <= 0 removes the "
                              "gradient of every positive advantage (None: epsilon_high = epsilon)")
        _check_number(name, "beta", self.beta, low=0)
        for field_name in ("advantage", "loss_type"):
            if not isinstance(getattr(self, field_name), str):
                raise ConfigTypeError(f"{name}.{field_name} must be a registered name (a str), got {getattr(self, field_name)!r}")
        if self.num_generations < 2 and self.advantage in GROUP_ESTIMATORS:
            raise ConfigError(
                f"{name}.num_generations={self.num_generations} with advantage={self.advantage!r}: a group baseline "
                "needs at least 2 rollouts per question (with 1 every advantage is 0, or NaN with the std); "
                "set num_generations >= 2 (TRL requires it too)"
            )
        if not isinstance(self.protocol_options, dict):
            raise ConfigTypeError(f"{name}.protocol_options must be a dict of the protocol's keyword arguments, "
                            f"got {type(self.protocol_options).__name__}")
        if self.output_dir is not None and not isinstance(self.output_dir, (str, os.PathLike)):
            raise ConfigTypeError(f"{name}.output_dir must be a path (str) or None, got {self.output_dir!r}")
        for field_name in ("tensorboard", "progress", "lora_shared_base"):
            if not isinstance(getattr(self, field_name), bool):
                raise ConfigTypeError(f"{name}.{field_name} must be True or False, got {getattr(self, field_name)!r}")
        self.trackers = check_trackers(self.trackers, f"{name}.trackers")
        if self.tracking_dir is not None and not isinstance(self.tracking_dir, (str, os.PathLike)):
            raise ConfigTypeError(f"{name}.tracking_dir must be a path (str) or None, got {self.tracking_dir!r}")
        if self.trackers and self.output_dir is None:
            raise ConfigError(f"{name}.trackers={list(self.trackers)!r} needs output_dir= (they write next to it)")
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        if self.lora is not None and not isinstance(self.lora, LoraSettings):
            raise ConfigTypeError(f"{name}.lora must be a LoraSettings (or a dict of its fields) or None, got {self.lora!r}")
        if self.lora_shared_base and self.lora is None:
            raise ConfigError(f"{name}.lora_shared_base=True holds each learner as a LoRA adapter on one base: "
                              "also set lora=LoraSettings(...)")
        from trainers.controls import check_learning_rate  # noqa: PLC0415  (it imports the runner)

        check_learning_rate(self.learning_rate, lora=self.lora is not None, where=f"{name}.learning_rate")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CRLConfig(TrainerConfig):
    """C-RL: reward = the system's score; group-mean baseline (no counterfactual rollouts)."""


#: How a placebo replaces the rewards (:func:`trainers.placebo.placebo_rewards`).
PLACEBO_REWARDS = ("coin", "permuted")


@dataclass
class PlaceboConfig(TrainerConfig):
    """The placebo: C-RL's rollouts and updates, rewards replaced by ``rewards``: ``"coin"`` (seeded fair coin
    flips) or ``"permuted"`` (each group's rewards shuffled within the group)."""

    rewards: str = field(default="coin", metadata={"help": "'coin': fair coin flips; 'permuted': within each group"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rewards not in PLACEBO_REWARDS:
            raise ConfigError(f"PlaceboConfig.rewards must be one of {list(PLACEBO_REWARDS)}, got {self.rewards!r}")


@dataclass
class GRPOConfig(TrainerConfig):
    """Standard GRPO on the learner's standalone correctness (the learner answers alone, no system)."""


@dataclass
class LOORewardConfig(TrainerConfig):
    """Reward = system score minus v(N \\ {i}), the system without the learner, per question.

    ``counterfactual_samples`` rollouts of the coalition without the learner per question (1 is
    exact when partners are greedy). The default advantage uses that counterfactual as the baseline
    (``"loo_counterfactual"``); with ``advantage="group_mean"`` it is C-RL, at a higher cost.
    """

    advantage: str = "loo_counterfactual"
    counterfactual_samples: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(f"{type(self).__name__}.counterfactual_samples", self.counterfactual_samples, minimum=1)


@dataclass
class ShapleyCreditConfig(TrainerConfig):
    """The learner's Shapley credit: every coalition containing it is played G times per question,
    each weighted by its Shapley weight. ``coalitions_per_question=None`` enumerates them all;
    an int samples that many from the Shapley distribution (size uniform, then members uniform)."""

    advantage: str = "shapley_credit"
    coalitions_per_question: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coalitions_per_question is not None:
            check_int(f"{type(self).__name__}.coalitions_per_question", self.coalitions_per_question, minimum=1)
