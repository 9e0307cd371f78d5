"""Advantage estimators: how a group of rewards becomes one advantage per rollout.

Every estimator takes ``rewards`` of shape ``[groups, G]`` (a group = the G rollouts of one
question, or of one (question, coalition) pair) plus keyword context, and returns a tensor of the
same shape. Register your own with :func:`register_advantage`; a trainer picks one by name
(``config.advantage``).

Example:
    >>> import torch
    >>> from trainers.advantages import compute_advantages
    >>> compute_advantages("group_mean", torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    tensor([[ 0.5000, -0.5000, -0.5000,  0.5000]])
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from crl_kit.errors import ConfigError, ConfigTypeError

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}
STD_EPS = 1e-4  # TRL's epsilon when dividing by the group std


def register_advantage(name: str, fn: AdvantageFn) -> None:
    """Make ``config.advantage = name`` use ``fn(rewards: Tensor[groups, G], **context) -> Tensor``.

    ``context`` holds what the trainer knows besides the rewards (``counterfactual``: ``[groups]``
    for the LOO trainer; ``weights``: ``[groups]`` for the Shapley-credit trainer); accept
    ``**context`` and ignore what you do not use.
    """
    if not callable(fn):
        raise ConfigTypeError(f"advantage estimator {name!r} must be callable(rewards, **context) -> Tensor")
    ADVANTAGES[name] = fn


def compute_advantages(name: str, rewards: torch.Tensor, **context) -> torch.Tensor:
    """Apply the estimator registered as ``name``; checks the shape it returns."""
    if name not in ADVANTAGES:
        raise ConfigError(f"unknown advantage estimator {name!r}; registered: {sorted(ADVANTAGES)} "
                         "(add one with trainers.register_advantage)")
    if rewards.dim() != 2:
        raise ConfigError(f"rewards must be [groups, G], got shape {tuple(rewards.shape)}")
    out = ADVANTAGES[name](rewards, **context)
    if out.shape != rewards.shape:
        raise RuntimeError(f"advantage estimator {name!r} returned shape {tuple(out.shape)} for rewards {tuple(rewards.shape)}")
    return out


def group_mean(rewards: torch.Tensor, **_) -> torch.Tensor:
    """``A_g = r_g - mean(r)`` (C-RL's default; Dr. GRPO's advantage)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def group_mean_std(rewards: torch.Tensor, **_) -> torch.Tensor:
    """``A_g = (r_g - mean(r)) / (std(r) + 1e-4)`` (GRPO / TRL ``scale_rewards="group"``)."""
    return group_mean(rewards) / (rewards.std(dim=1, keepdim=True) + STD_EPS)


def rloo(rewards: torch.Tensor, **_) -> torch.Tensor:
    """REINFORCE leave-one-out: ``r_g`` minus the mean of the *other* G-1 rewards
    (= ``G/(G-1) * (r_g - mean(r))``)."""
    g = rewards.shape[1]
    if g < 2:
        raise ConfigError("rloo needs num_generations >= 2")
    return (rewards * g - rewards.sum(dim=1, keepdim=True)) / (g - 1)


def loo_counterfactual(rewards: torch.Tensor, *, counterfactual: torch.Tensor | None = None, **_) -> torch.Tensor:
    """The explicit leave-one-out reward ``r_g - v(N \\ {i})`` with ``counterfactual = v(N \\ {i})``
    per group: the counterfactual is the baseline, no group statistics."""
    if counterfactual is None:
        raise ConfigError("loo_counterfactual needs counterfactual= (v of the coalition without the learner, per group); "
                         "use LOORewardTrainer, or pick advantage='group_mean'")
    return rewards - counterfactual.reshape(-1, 1).to(rewards)


def shapley_credit(rewards: torch.Tensor, *, weights: torch.Tensor | None = None, **_) -> torch.Tensor:
    """Shapley credit: each group is one coalition containing the learner; its group-mean advantage
    is scaled by the coalition's Shapley weight (``weights``, normalised so they average 1 over a
    question's groups). The terms of coalitions without the learner are constant within a group and
    cancel, so they are never played."""
    if weights is None:
        raise ConfigError("shapley_credit needs weights= (one Shapley weight per group); use ShapleyCreditTrainer")
    return weights.reshape(-1, 1).to(rewards) * group_mean(rewards)


def none(rewards: torch.Tensor, **_) -> torch.Tensor:
    """No baseline: the reward itself (plain REINFORCE)."""
    return rewards.clone()


for _name, _fn in {"group_mean": group_mean, "group_mean_std": group_mean_std, "rloo": rloo,
                   "loo_counterfactual": loo_counterfactual, "shapley_credit": shapley_credit, "none": none}.items():
    register_advantage(_name, _fn)
