"""Policy-gradient losses over the learner's own tokens, with TRL's normalisations.

A loss takes :class:`LossInputs` (per-token log-probs with grad, the behaviour policy's log-probs,
one advantage per sequence, a mask that is 1 exactly on tokens the learner generated, optionally
the reference's log-probs) and returns ``(loss, stats)``. The batch totals in ``LossInputs``
(``total_tokens``, ``total_sequences``) are those of the *whole* step, so the losses of its
micro-batches add up to the loss of the full batch (gradient accumulation changes nothing).

Built in (clipped PPO/GRPO objective, ``-min(ρA, clip(ρ, 1-ε, 1+ε_high)A)`` per token, plus
``beta`` times the k3 KL estimator ``exp(ref - lp) - (ref - lp) - 1``):

| name | normalisation |
|---|---|
| ``grpo`` | mean over each sequence's tokens, then sum over sequences / ``total_sequences`` |
| ``dapo`` | sum over all tokens / ``total_tokens`` (TRL's default) |
| ``dr_grpo`` | sum over all tokens / (``total_sequences`` * ``max_len``), a constant |

A *sequence* is one learner turn: in a multi-phase protocol (debate) the learner speaks once per
round, and each turn is a sequence carrying its episode's advantage.

Register another with :func:`register_loss`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from crl_kit.errors import ConfigError, ConfigTypeError


@dataclass
class LossInputs:
    """Everything a loss may use; tensors are ``[B, T]`` except ``advantages`` (``[B]``)."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    total_tokens: int
    total_sequences: int
    max_len: int
    ref_logprobs: torch.Tensor | None = None
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0


LossFn = Callable[[LossInputs], tuple[torch.Tensor, dict[str, float]]]
LOSSES: dict[str, LossFn] = {}


def register_loss(name: str, fn: LossFn) -> None:
    """Make ``config.loss_type = name`` use ``fn(inputs: LossInputs) -> (loss, stats)``.

    ``stats`` values are *sums* over the micro-batch (the trainer adds them up over micro-batches
    and divides by the step's token count): use keys ``clipped_tokens`` and ``kl_sum`` to fill the
    clip-fraction and KL metrics.
    """
    if not callable(fn):
        raise ConfigTypeError(f"loss {name!r} must be callable(LossInputs) -> (Tensor, dict)")
    LOSSES[name] = fn


def get_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss_type {name!r}; registered: {sorted(LOSSES)} (add one with trainers.register_loss)")
    return LOSSES[name]


def clipped_token_loss(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped surrogate (+ beta * k3 KL), ``[B, T]``, zero where ``mask`` is 0."""
    mask = inputs.mask.to(inputs.logprobs.dtype)
    low, high = inputs.epsilon, inputs.epsilon if inputs.epsilon_high is None else inputs.epsilon_high
    adv = inputs.advantages.reshape(-1, 1).to(inputs.logprobs)
    log_ratio = (inputs.logprobs - inputs.old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    stats = {}
    with torch.no_grad():
        was_clipped = ((ratio < 1 - low) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
        stats["clipped_tokens"] = float((was_clipped.to(mask) * mask).sum())
    if inputs.beta > 0:
        if inputs.ref_logprobs is None:
            raise ConfigError("beta > 0 needs ref_logprobs (the trainer loads a reference model when beta > 0)")
        delta = (inputs.ref_logprobs - inputs.logprobs) * mask
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + inputs.beta * kl
        stats["kl_sum"] = float((kl.detach() * mask).sum())
    return per_token * mask, stats


def grpo_loss(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    per_token, stats = clipped_token_loss(inputs)
    lengths = inputs.mask.sum(dim=1).clamp(min=1).to(per_token)
    return (per_token.sum(dim=1) / lengths).sum() / max(inputs.total_sequences, 1), stats


def dapo_loss(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    per_token, stats = clipped_token_loss(inputs)
    return per_token.sum() / max(inputs.total_tokens, 1), stats


def dr_grpo_loss(inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    per_token, stats = clipped_token_loss(inputs)
    return per_token.sum() / max(inputs.total_sequences * inputs.max_len, 1), stats


register_loss("grpo", grpo_loss)
register_loss("dapo", dapo_loss)
register_loss("dr_grpo", dr_grpo_loss)
