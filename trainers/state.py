"""Where a training run stands and what its callbacks ask of the loop, as in TRL (``transformers.TrainerState``
/ ``TrainerControl``), in two small dataclasses of our own:

- :class:`TrainerState` — the steps done, the episodes played, every step's metrics and who the step in progress
  trains: the one place :mod:`trainers.checkpoints` reads and writes (with each learner's weights and optimizer,
  :attr:`trainers.PolicyGradientTrainer.learner_states`) and callbacks read (``trainer.state``);
- :class:`TrainerControl` — what a callback sets to stop :meth:`~trainers.PolicyGradientTrainer.fit` after the
  step or to have a checkpoint written (``trainer.control``).

Example:
    >>> from trainers.state import TrainerControl, TrainerState
    >>> state = TrainerState(step=2, rollouts=16)
    >>> state.to_dict()
    {'step': 2, 'rollouts': 16}
    >>> control = TrainerControl(should_save=True)
    >>> control.new_step(); control.should_save
    False
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crl_kit.errors import ConfigError, ConfigTypeError


@dataclass
class TrainerState:
    """A run's progress, the part of a trainer that changes as it trains (the learners' weights and optimizers
    aside). A checkpoint records :meth:`to_dict` and restores it; ``history`` is kept in step with the
    checkpoint resumed from (``metrics.jsonl`` holds the same lines).

    Raises:
        TypeError / ValueError: one line, for a step or rollout count that is not a non-negative integer.
    """

    #: optimizer steps done (each learner that trains in a step takes one)
    step: int = 0
    #: episodes played so far (every coalition counts)
    rollouts: int = 0
    #: every step's metrics, oldest first (the trainer's ``history``)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: the learners the step in progress updates (all of them before the first step); the loop passes them to
    #: ``collect`` and ``advantages`` as ``training``
    training: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("step", "rollouts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigTypeError(f"TrainerState.{name} must be an int, got {value!r}")
            if value < 0:
                raise ConfigError(f"TrainerState.{name} must be >= 0, got {value}")

    def to_dict(self) -> dict[str, int]:
        """What a checkpoint's ``state.json`` records of the run's progress."""
        return {"step": self.step, "rollouts": self.rollouts}

    def restore(self, saved: dict[str, Any]) -> None:
        """Take the step and rollouts a checkpoint recorded (:meth:`to_dict`); ``history`` is truncated to
        that step by the caller, which reads the metrics file."""
        restored = TrainerState(step=saved["step"], rollouts=saved["rollouts"])  # checked like a new state
        self.step, self.rollouts = restored.step, restored.rollouts


@dataclass
class TrainerControl:
    """What callbacks ask of :meth:`trainers.PolicyGradientTrainer.fit`, read after each step's hooks
    (``on_log``, ``on_step_end``). A fit starts with a new one; the loop sets ``should_save`` before the hooks
    when ``config.save_steps`` or the fit's last step calls for a checkpoint (a callback may clear it)."""

    #: end fit() after this step (its checkpoint is written, as for a fit's last step, with an ``output_dir``)
    should_stop: bool = False
    #: write a checkpoint after this step (needs ``config.output_dir``); reset at the next step
    should_save: bool = False

    def new_step(self) -> None:
        """A step begins: a save asked for the previous one is not carried over."""
        self.should_save = False


__all__ = ["TrainerControl", "TrainerState"]
