"""Callbacks: what happens around the training loop without changing what it computes.

As in TRL (``transformers.TrainerCallback``), a trainer holds a list of callbacks and calls each hook of
every one, in order; a hook gets the trainer, reads the run's progress in ``trainer.state`` (a
:class:`trainers.state.TrainerState`: ``step``, ``rollouts``, ``history``) and its settings in ``trainer.config``,
and steers the fit through ``trainer.control`` (a :class:`trainers.state.TrainerControl`): ``should_stop = True``
ends it after the step, ``should_save = True`` writes a checkpoint after it (both read after ``on_step_end``).
:meth:`trainers.PolicyGradientTrainer.fit` calls, in this order::

    on_train_begin(trainer, steps)      fit() starts (after a resume), to run until ``steps`` (a new control)
      on_log(trainer, metrics)          trainer.log(metrics): a step's metrics (the last of ``trainer.history``)
      on_step_end(trainer, metrics)     the step is done and logged
      on_save(trainer, path)            a checkpoint was written to ``path`` (save_steps, the last step, or
                                        control.should_save)
    on_train_end(trainer, status)       fit() ends: "FINISHED", or "FAILED" / "KILLED" when it ended on an
                                        exception / an interrupt (the exception is raised on after)

Every trainer holds :func:`default_callbacks` (the progress bar, ``metrics.jsonl``, the trackers of
:mod:`crl_envs.tracking`); ``callbacks=[...]`` on the constructor adds yours after them. A callback must not
draw random numbers from torch's global generator: training is deterministic under a seed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from crl_envs.tracking import Trackers, open_trackers
from crl_kit.errors import ConfigTypeError
from crl_kit.safe_io import open_append

#: How :meth:`TrainerCallback.on_train_end` is told that fit() ended well or not (the trackers' run status).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


class TrainerCallback:
    """Hooks into :meth:`trainers.PolicyGradientTrainer.fit`; override the ones you need (each does nothing
    by default). ``trainer`` is the :class:`trainers.PolicyGradientTrainer` calling it: read ``trainer.state``,
    set ``trainer.control``.

    Example (stop once the mean reward reaches 0.9)::

        class StopAtReward(TrainerCallback):
            def on_step_end(self, trainer, metrics):
                trainer.control.should_stop = metrics["reward_mean"] >= 0.9
    """

    def on_train_begin(self, trainer: Any, steps: int) -> None:
        """fit() starts, at ``trainer.step`` (after a resume), and trains until ``steps``."""

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """One optimizer step is done; ``metrics`` is its entry in ``trainer.history``."""

    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """``trainer.log(metrics)``: record one step's metrics."""

    def on_save(self, trainer: Any, path: Path) -> None:
        """``trainer.save_checkpoint()`` wrote the checkpoint ``path``."""

    def on_train_end(self, trainer: Any, status: str) -> None:
        """fit() ends: ``status`` is ``"FINISHED"``, or ``"FAILED"`` / ``"KILLED"`` on an exception / interrupt."""


class ProgressCallback(TrainerCallback):
    """A tqdm bar over fit()'s steps (``config.progress``), showing each step's mean reward and its share of
    zero-variance groups."""

    def __init__(self) -> None:
        self.bar: Any = None

    def on_train_begin(self, trainer: Any, steps: int) -> None:
        self.bar = tqdm(total=steps, initial=min(trainer.state.step, steps), desc=f"{type(trainer).__name__}",
                        disable=not trainer.config.progress)

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", zero_var=f"{metrics['zero_variance_groups']:.2f}")

    def on_train_end(self, trainer: Any, status: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricsFileCallback(TrainerCallback):
    """Each logged step as one JSON line of ``output_dir/metrics.jsonl`` (nothing without an ``output_dir``);
    appended with ``O_NOFOLLOW``, so never through a planted link."""

    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if not trainer.config.output_dir:
            return
        out = Path(trainer.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open_append(out / "metrics.jsonl") as f:
            f.write(json.dumps(metrics) + "\n")


class TrackersCallback(TrainerCallback):
    """The run's metrics (``train/<name>``) on TensorBoard (``config.tensorboard``) and the trackers of
    ``config.trackers`` (:mod:`crl_envs.tracking`: MLflow, trackio, W&B), with the trainer's setup and config.
    The tracker run opens at the first logged step (with an ``output_dir``) and ends with fit(), marked
    with fit()'s status; a later fit() opens it again (MLflow and trackio continue a run of the same name)."""

    def __init__(self) -> None:
        #: the open tracker run, or None
        self.run: Trackers | None = None

    @property
    def is_open(self) -> bool:
        """Whether a tracker run is open (its TensorBoard events are still being written)."""
        return self.run is not None

    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        config = trainer.config
        names = ("tensorboard",) * config.tensorboard + tuple(config.trackers)
        if not config.output_dir or not names:
            return
        if self.run is None:
            out = Path(config.output_dir)
            self.run = open_trackers(names, config.tracking_dir or out, tensorboard_dir=out,
                                     project=config.tracking_project, run=out.resolve().name,
                                     config={"trainer": type(trainer).__name__, **trainer.setup(),
                                             "config": config.to_dict()})
        self.run.log_metrics({f"train/{k}": v for k, v in metrics.items() if k != "step"}, metrics["step"])

    def on_train_end(self, trainer: Any, status: str) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.close(status)


def default_callbacks() -> list[TrainerCallback]:
    """What every trainer holds before the user's callbacks: the progress bar, ``metrics.jsonl``, the trackers."""
    return [ProgressCallback(), MetricsFileCallback(), TrackersCallback()]


def check_callbacks(callbacks: Iterable[TrainerCallback] | None) -> list[TrainerCallback]:
    """``callbacks=`` as a list of :class:`TrainerCallback` instances, or one line saying what is wrong."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (TrainerCallback, str)) or not isinstance(callbacks, Iterable):
        raise ConfigTypeError(f"callbacks must be a list of trainers.TrainerCallback instances, got {callbacks!r}")
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, TrainerCallback):
            hint = " (a class: pass an instance, e.g. MyCallback())" if isinstance(callback, type) else ""
            raise ConfigTypeError(f"callbacks must hold trainers.TrainerCallback instances, got {callback!r}{hint}")
    return callbacks


__all__ = ["FAILED", "FINISHED", "KILLED", "MetricsFileCallback", "ProgressCallback", "TrackersCallback",
           "TrainerCallback", "check_callbacks", "default_callbacks"]
