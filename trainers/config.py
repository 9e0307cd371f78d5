"""Dataclass configs, one per trainer (the trainer is the algorithm; the config is its settings).

Names follow TRL's ``GRPOConfig`` where a user would look for them (``num_generations``, ``beta``,
``epsilon``, ``loss_type``, ``learning_rate``, ``gradient_accumulation_steps``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class LoraSettings:
    """LoRA through peft. ``target_modules`` default ``["c_attn"]`` fits GPT-2; Llama-style models
    want e.g. ``["q_proj", "v_proj"]``."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["c_attn"])


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
        protocol_options: keyword arguments of the protocol factory (e.g. ``{"rounds": 2}``).
        seed: seeds question order, sampling and initialisation.
        output_dir: where metrics (JSONL + TensorBoard) and checkpoints go (``None``: nothing written).
        save_steps: checkpoint every this many steps (and at the end).
        tensorboard: also write TensorBoard events.
        progress: show progress bars.
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
    protocol_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    output_dir: str | None = None
    save_steps: int = 10
    tensorboard: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        positive = ("steps", "questions_per_step", "num_generations", "max_new_tokens", "num_iterations",
                    "gradient_accumulation_steps", "save_steps")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name} must be an int >= 1, got {value!r}")
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 for policy-gradient training (got {self.temperature}); "
                "greedy rollouts have no exploration and no valid log-probs to correct"
            )
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")
        if not 0 < self.epsilon < 1:
            raise ValueError(f"epsilon must be in (0, 1), got {self.epsilon}")
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CRLConfig(TrainerConfig):
    """C-RL: reward = the system's score; group-mean baseline (no counterfactual rollouts)."""


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
        if self.counterfactual_samples < 1:
            raise ValueError(f"counterfactual_samples must be >= 1, got {self.counterfactual_samples}")


@dataclass
class ShapleyCreditConfig(TrainerConfig):
    """The learner's Shapley credit: every coalition containing it is played G times per question,
    each weighted by its Shapley weight. ``coalitions_per_question=None`` enumerates them all;
    an int samples that many from the Shapley distribution (size uniform, then members uniform)."""

    advantage: str = "shapley_credit"
    coalitions_per_question: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coalitions_per_question is not None and self.coalitions_per_question < 1:
            raise ValueError(f"coalitions_per_question must be >= 1 or None, got {self.coalitions_per_question}")
