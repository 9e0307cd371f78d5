"""What a training comparison checks before it compares, and the learning-rate rule it fixes beforehand.

- :class:`LearningRateRule` — ``[training.lr_rule]``: a short sweep of one trainer (GRPO by default) over
  candidate learning rates, on a seed and questions of its own (never the held-out test questions), and the
  rule that picks the rate every trainer then gets (:func:`choose_learning_rate`).
- :func:`setting_gates` — per training setting, the gates printed in the report; a setting that fails one
  is "not comparable: <reason>" instead of wins and losses (issue #46: at lr 1e-3 every trainer's "gain" was
  the learner switched off, which a placebo reproduced and the system without the learner matched).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crl_kit.errors import ConfigError

#: How :func:`choose_learning_rate` picks: ``"largest_kept"`` the largest candidate whose learner-alone score on
#: the selection questions does not fall by more than ``tolerance``; ``"best"`` the highest score after the sweep.
SELECTIONS = ("largest_kept", "best")


@dataclass(frozen=True)
class LearningRateRule:
    """``[training.lr_rule]``: the learning rate every trainer of a setup gets, chosen before the comparison."""

    candidates: tuple[float, ...] = field(default=(1e-3, 1e-4, 3e-5),
                                          metadata={"help": "learning rates the sweep trains at"})
    select: str = field(default="largest_kept", metadata={"help": f"one of {SELECTIONS}"})
    tolerance: float = field(default=0.0, metadata={"help": "largest_kept: the fall in learner-alone accuracy allowed"})
    trainer: str = field(default="grpo", metadata={"help": "the trainer the sweep runs (a trainers.ROSTER name)"})
    seed: int = field(default=1000, metadata={"help": "the sweep's training seed (none of the comparison's seeds)"})
    steps: int | None = field(default=None, metadata={"help": "the sweep's steps (default: the setup's)"})
    split: str = field(default="train", metadata={"help": "the split of the selection questions (never the eval split)"})
    task_seed: int = field(default=1, metadata={"help": "the seed drawing the selection questions"})
    n: int = field(default=100, metadata={"help": "selection questions"})

    def __post_init__(self) -> None:
        key = "training.lr_rule"
        lrs = self.candidates
        if not isinstance(lrs, (list, tuple)) or not lrs or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in lrs):
            raise ConfigError(f"study config: {key}.candidates must be a non-empty list of learning rates in (0, 1], "
                              f"e.g. [1e-3, 1e-4, 3e-5], got {lrs!r}")
        if len(set(lrs)) != len(lrs):
            raise ConfigError(f"study config: {key}.candidates lists a learning rate twice: {list(lrs)}")
        object.__setattr__(self, "candidates", tuple(sorted((float(x) for x in lrs), reverse=True)))
        if self.select not in SELECTIONS:
            raise ConfigError(f"study config: {key}.select must be one of {list(SELECTIONS)}, got {self.select!r}")
        if not isinstance(self.tolerance, (int, float)) or isinstance(self.tolerance, bool) or not 0 <= self.tolerance < 1:
            raise ConfigError(f"study config: {key}.tolerance must be a number in [0, 1) (e.g. 0.0), got {self.tolerance!r}")
        for name, low in (("seed", 0), ("n", 1), ("task_seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(f"study config: {key}.{name} must be an integer >= {low}, got {v!r}")
        if self.steps is not None and (not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1):
            raise ConfigError(f"study config: {key}.steps must be an integer >= 1 (or left out: the setup's), "
                              f"got {self.steps!r}")


def learner_kept(before: float, after: float, tolerance: float = 0.0) -> bool:
    """Whether training kept the learner's own accuracy: ``after`` fell by at most ``tolerance`` below ``before``
    (1e-12 of float slack). The one learner-kept rule: the lr rule's ``largest_kept`` and the pilot
    (:func:`crl_envs.study.pilot.choose_pilot`) both read it.

    Example:
        >>> learner_kept(0.30, 0.29), learner_kept(0.30, 0.29, tolerance=0.01), learner_kept(0.30, 0.31)
        (False, True, True)
    """
    return after >= before - tolerance - 1e-12


def choose_learning_rate(sweep: Mapping[float, Mapping[str, float]], select: str, tolerance: float = 0.0
                         ) -> dict[str, Any]:
    """The rate a rule picks from ``sweep`` (lr -> ``{"before", "after"}``: the learner's accuracy alone on the
    selection questions before and after the sweep's training). ``largest_kept``: the largest lr with
    ``after >= before - tolerance`` (none kept: the smallest lr); ``best``: the highest ``after`` (ties: the
    smaller lr). Returns ``{"learning_rate", "reason"}``."""
    if not sweep:
        raise ValueError("choose_learning_rate needs at least one swept learning rate")
    lrs = sorted(sweep, reverse=True)
    if select == "best":
        top = max(sweep[lr]["after"] for lr in lrs)
        lr = min(x for x in lrs if sweep[x]["after"] >= top)
        return {"learning_rate": lr, "reason": f"best learner-alone selection accuracy after the sweep ({top:.3f})"}
    kept = [lr for lr in lrs if learner_kept(sweep[lr]["before"], sweep[lr]["after"], tolerance)]
    if kept:
        return {"learning_rate": kept[0], "reason": f"largest rate whose learner-alone selection accuracy did not fall "
                                                     f"by more than {tolerance:g}"}
    return {"learning_rate": lrs[-1], "reason": "every rate lowered the learner alone: the smallest"}


# ---------------------------------------------------------------------- gates
@dataclass(frozen=True)
class Gate:
    """One check of a setting: its ``name``, whether it ``passed`` and what it measured (``detail``)."""

    name: str
    passed: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


#: A learner "collapses" when its accuracy alone after training is at most this fraction of before (CI below 0),
#: whatever the system's Δ.
COLLAPSE_FRACTION = 0.5
#: Above this share of zero-variance groups a trainer's updates carry (almost) no signal: reported, not gated.
NO_SIGNAL_SHARE = 0.9


def setting_gates(*, alone_before: float, alone_delta: Mapping[str, Mapping[str, Any]],
                  system_delta: Mapping[str, Mapping[str, Any]], trainers: Sequence[str],
                  without_learner: float | None, before: float,
                  vs_without_learner: Mapping[str, Mapping[str, Any]] | None = None,
                  zero_variance: Mapping[str, float | None] | None = None,
                  rates_before: Mapping[str, float | None] | None = None,
                  rates_after: Mapping[str, Mapping[str, float | None]] | None = None) -> dict[str, Any]:
    """The gates of one training setting (``*_delta``: trainer -> ``{"value", "ci"}``, as
    :func:`crl_envs.study.stats.training_tables` computes them):

    - ``grpo_keeps_learner``: GRPO's learner-alone Δ CI does not lie below 0 (the learning rate does not destroy
      the model GRPO is rewarded to improve);
    - ``placebo_present``: the placebo ran, so every trainer is compared with it;
    - ``no_collapse``: no trainer's learner alone falls to ``COLLAPSE_FRACTION`` of before (CI below 0),
      whatever the system's Δ;
    - ``not_deletion``: every trainer that gains (system Δ above 0) beats the system without the learner with
      evidence: the CI of its paired difference, system after training minus ``without_learner`` per seed and
      question (``vs_without_learner``: trainer -> ``{"value", "ci"}``, as ``delta_vs_without_learner``), lies
      above 0. A gain not shown to beat removing the learner is deletion: comparing point means let a learner
      that defers on 99 of 100 questions pass at 0.74 against 0.73 (difference CI [0.000, 0.023]) and be scored a
      win. Superiority, not non-inferiority, because the gate's claim is that the learner adds something; a
      trainer without its difference (none given) has no evidence and fails. Trainers that do not gain are not
      judged by it (there is no gain to attribute).

    Reported beside them, not gated: each trainer's zero-variance share, parse and verdict rates before/after.
    Returns ``{"gates": [...], "comparable": bool, "reason": str | None, "signals": {...}}``."""
    gates = []
    if "grpo" in alone_delta:
        lo = alone_delta["grpo"]["ci"][0] if alone_delta["grpo"].get("ci") else None
        hi = alone_delta["grpo"]["ci"][1] if alone_delta["grpo"].get("ci") else None
        ok = hi is None or hi >= 0
        gates.append(Gate("grpo_keeps_learner", ok, f"GRPO's learner-alone Δ {100 * alone_delta['grpo']['value']:+.1f} "
                          f"points, CI [{_pts(lo)}, {_pts(hi)}]"))
    gates.append(Gate("placebo_present", "placebo" in trainers and "placebo" in system_delta,
                      "the placebo trainer ran" if "placebo" in system_delta else "no placebo in the roster"))
    collapsed = [t for t in alone_delta if alone_before > 0 and alone_before + alone_delta[t]["value"]
                 <= COLLAPSE_FRACTION * alone_before and (alone_delta[t].get("ci") or [0, -1])[1] < 0]
    gates.append(Gate("no_collapse", not collapsed, "learner alone collapses under " + ", ".join(collapsed)
                      if collapsed else f"no learner alone falls to {COLLAPSE_FRACTION:g}x its {alone_before:.3f}"))
    if without_learner is not None:
        deleted = [t for t in system_delta if system_delta[t]["value"] > 1e-12
                   and not _above_zero((vs_without_learner or {}).get(t))]
        gates.append(Gate("not_deletion", not deleted,
                          (", ".join(deleted) + f": the system's gain does not beat the system without the learner "
                           f"({without_learner:.3f})") if deleted else
                          f"every gain beats the system without the learner ({without_learner:.3f}) or is none"))
    failed = [g for g in gates if not g.passed]
    signals = {"zero_variance": dict(zero_variance or {}), "rates_before": dict(rates_before or {}),
               "rates_after": {t: dict(v) for t, v in (rates_after or {}).items()}}
    return {"gates": [g.to_dict() for g in gates], "comparable": not failed,
            "reason": "; ".join(f"{g.name}: {g.detail}" for g in failed) or None, "signals": signals}


def _above_zero(difference: Mapping[str, Any] | None) -> bool:
    """Whether a ``{"value", "ci"}`` difference's CI lies above 0 (no CI: no evidence, ``False``)."""
    ci = (difference or {}).get("ci")
    return bool(ci) and ci[0] is not None and ci[0] > 0


def _pts(v: float | None) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{100 * v:+.1f}"
