"""Cell specs: everything a cell's result depends on, one frozen dataclass per kind (TRL-config style: each
field declared once with its help, the checks that belong to a spec in ``__post_init__``).

A cell's fingerprint is the digest of its spec's :meth:`CellSpec.payload`, the plain dict the study hashed
when specs were dicts: the same keys, values and order, and a field marked ``absent_when_none`` left at
``None`` is absent, as its key was (``learners`` and ``schedule`` of a one-learner setup; the
``learning_rate_choice`` a run adds). So every committed cell file keeps its fingerprint.

- :class:`ValuationSpec` — ``valuation``: a pool x protocol x task x seed and how it is valued;
- :class:`SettingSpec` — ``baseline``: one training setting (setup x task), what every cell of it shares;
- :class:`TrainerSpec` — a setting plus one trainer's budget and seed; :class:`SweepSpec` (``lr_sweep``: one
  candidate rate, scored on its selection questions), :class:`PilotSpec` (``pilot``: one rate and adapter of
  ``[training.pilot]``, evaluated at each checkpoint), :class:`TrainingSpec` (``training``) and
  :class:`CrossplaySpec` (``crossplay``: a training cell's, with that cell's fingerprint).

Example:
    >>> spec = SettingSpec(pool="zoo", pool_label="zoo", learner="model_4", setup_label="alone", protocol="vote",
    ...                    options={}, task={"name": "arith", "n": 8, "split": "test", "seed": 0, "options": {}},
    ...                    task_label="arith", train_split="train", eval_split="test", n_train=8, n_eval=8,
    ...                    max_new_tokens=24, threads=1)
    >>> "learners" in spec.payload(), SettingSpec.from_payload(spec.payload()) == spec
    (False, True)
    >>> SettingSpec.from_payload({**spec.payload(), "n_eval": 0})
    Traceback (most recent call last):
    ...
    crl_kit.errors.ConfigError: SettingSpec.n_eval must be an int >= 1, got 0
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import did_you_mean, finite_number, int_problem, is_int

S = TypeVar("S", bound="CellSpec")


def spec_field(help: str, *, absent_when_none: bool = False) -> Any:
    """A spec field with its ``help``; ``absent_when_none``: optional, and left out of the payload at ``None``
    (a key the spec dict did not hold then)."""
    metadata = {"help": help, "absent_when_none": absent_when_none}
    return field(default=None, metadata=metadata) if absent_when_none else field(default=MISSING, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class CellSpec:
    """The base of every kind's spec: its payload (what the fingerprint hashes), its rebuild from one, and the
    one-line errors its checks raise."""

    def payload(self) -> dict[str, Any]:
        """The spec as the plain dict its fingerprint hashes (field order; optional fields at ``None`` left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.metadata.get("absent_when_none") and getattr(self, f.name) is None)}

    def values(self) -> dict[str, Any]:
        """Every field's value by name, optional ones at ``None`` included (to build a spec extending this one)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def extending(cls: type[S], base: CellSpec, **more: Any) -> S:
        """A ``cls`` spec of ``base``'s fields (those ``cls`` has) with ``more`` set or replaced."""
        names = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in base.values().items() if k in names}, **more})

    @classmethod
    def from_payload(cls: type[S], payload: Mapping[str, Any]) -> S:
        """The spec whose :meth:`payload` is ``payload`` (a spec read back from JSON).

        Raises:
            ConfigError: a key the spec has no field for, or a required field missing."""
        names = [f.name for f in fields(cls)]
        for key in payload:
            if key not in names:
                raise ConfigError(f"{cls.__name__} has no field {key!r}{did_you_mean(key, names)}; remove it")
        missing = [f.name for f in fields(cls) if f.name not in payload and not f.metadata.get("absent_when_none")]
        if missing:
            raise ConfigError(f"{cls.__name__} lacks {', '.join(missing)}; give every field the kind's spec declares")
        return cls(**payload)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise one line for a field whose value this kind of spec cannot hold (the subclasses' checks)."""

    # ------------------------------------------------------------------ the checks' words
    def _fail(self, name: str, problem: str, *, wrong_type: bool = False) -> None:
        raise (ConfigTypeError if wrong_type else ConfigError)(f"{type(self).__name__}.{name} {problem}")

    def _int(self, name: str, minimum: int | None = None, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if value is None and optional:
            return
        problem = int_problem(value, minimum=minimum)
        if problem:
            self._fail(name, problem, wrong_type=not is_int(value))

    def _label(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, str) or not value or "/" in value:
            self._fail(name, f"must be a non-empty label without '/', got {value!r}", wrong_type=not isinstance(value, str))

    def _table(self, name: str, keys: tuple[str, ...], value: Any = None) -> None:
        value = getattr(self, name) if value is None else value
        if not isinstance(value, Mapping) or any(k not in value for k in keys):
            self._fail(name, f"must be a table with {', '.join(keys)}, got {value!r}", wrong_type=not isinstance(value, Mapping))

    def _pool(self) -> None:
        if not (isinstance(self.pool, str) and self.pool) and not (isinstance(self.pool, list) and self.pool):
            self._fail("pool", f"must be a named pool or a non-empty list of members, got {self.pool!r}",
                       wrong_type=True)


#: The keys of a task description (:meth:`crl_envs.study.config.TaskConfig.describe`).
TASK_KEYS = ("name", "n", "split", "seed", "options")


@dataclass(frozen=True, kw_only=True)
class ValuationSpec(CellSpec):
    """A ``valuation`` cell: one pool x protocol x task x seed, valued by :func:`crl_envs.valuation.evaluate`."""

    pool: Any = spec_field("the pool (PoolConfig.describe): a named pool or its members")
    pool_label: str = spec_field("the pool's label in the config")
    protocol: dict[str, Any] = spec_field("the protocol played: {protocol, options} (ProtocolConfig.describe)")
    protocol_label: str = spec_field("the protocol's label in the config")
    task: dict[str, Any] = spec_field("the task: {name, n, split, seed, options} (TaskConfig.describe)")
    task_label: str = spec_field("the task's label in the config")
    estimator: Any = spec_field("the estimator's name, or {exact_up_to, larger}")
    samples: int = spec_field("episodes per coalition and question")
    seed: int = spec_field("the seed of the coalitions' episodes and of the sampled estimators")
    budget: int | None = spec_field("permutations of a sampled estimator (None: the estimator takes none)")
    sampling: dict[str, Any] = spec_field("the models' sampling: {temperature, top_p, max_new_tokens}")
    ci_level: float = spec_field("the level of the values' bootstrap CIs")
    bootstrap_resamples: int = spec_field("question-bootstrap resamples")
    sequential: dict[str, Any] | None = spec_field(
        "the sequential design (crl_envs.sequential.SequentialDesign's fields): questions played look by look, the "
        "setting stopped when its verdict is decided; None: all at once", absent_when_none=True)

    def check(self) -> None:
        self._pool()
        if self.sequential is not None:
            self._table("sequential", ())
            self.design()  # the design's own checks (one line), before any work
        for name in ("pool_label", "protocol_label", "task_label"):
            self._label(name)
        self._table("protocol", ("protocol", "options"))
        self._table("task", TASK_KEYS)
        self._table("sampling", ("temperature", "top_p", "max_new_tokens"))
        self._int("samples", 1)
        self._int("seed")
        self._int("budget", 1, optional=True)
        self._int("bootstrap_resamples", 1)
        level = finite_number(self.ci_level)
        if level is None or not 0 < level < 1:
            self._fail("ci_level", f"must be a number in (0, 1), got {self.ci_level!r}")

    def design(self) -> Any:
        """The :class:`crl_envs.sequential.SequentialDesign` of :attr:`sequential` (``None`` without one).

        Raises:
            ConfigError: a field the design does not have, or a value it refuses."""
        if self.sequential is None:
            return None
        from crl_envs.sequential import SequentialDesign

        names = [f.name for f in fields(SequentialDesign)]
        unknown = [k for k in self.sequential if k not in names]
        if unknown:
            self._fail("sequential", f"has no field {unknown[0]!r}{did_you_mean(unknown[0], names)}; give "
                                     f"SequentialDesign's fields only")
        return SequentialDesign(**self.sequential)


@dataclass(frozen=True, kw_only=True)
class SettingSpec(CellSpec):
    """A ``baseline`` cell's spec, and what every cell of one training setting (setup x task) shares."""

    pool: Any = spec_field("the pool (PoolConfig.describe): a named pool or its members")
    pool_label: str = spec_field("the pool's label in the config")
    learner: str = spec_field("the (first) learner's id in the pool")
    setup_label: str = spec_field("the setup's label (a sweep of a trainer that plays alone: 'alone')")
    protocol: str = spec_field("the protocol the setup plays")
    options: dict[str, Any] = spec_field("the protocol's options, {learner} substituted")
    task: dict[str, Any] = spec_field("the task: {name, n, split, seed, options} (TaskConfig.describe)")
    task_label: str = spec_field("the task's label in the config")
    train_split: str = spec_field("the split the trainers train on")
    eval_split: str = spec_field("the held-out split they are evaluated on")
    n_train: int = spec_field("training questions")
    n_eval: int = spec_field("held-out evaluation questions")
    max_new_tokens: int = spec_field("the generation limit of every model call")
    threads: int = spec_field("torch threads the cell runs on")
    learners: list[str] | None = spec_field("a setup's learners, when it trains several (the first is learner)",
                                            absent_when_none=True)
    schedule: str | None = spec_field("how several learners take turns, when not 'joint'", absent_when_none=True)

    def check(self) -> None:
        self._pool()
        for name in ("pool_label", "setup_label", "task_label"):
            self._label(name)
        self._table("options", ())
        self._table("task", TASK_KEYS)
        for name, low in (("n_train", 1), ("n_eval", 1), ("max_new_tokens", 1), ("threads", 1)):
            self._int(name, low)
        if self.learners is not None and (not isinstance(self.learners, list) or len(self.learners) < 2
                                          or self.learners[0] != self.learner):
            self._fail("learners", f"must be two or more learner ids starting with learner {self.learner!r}, got "
                                   f"{self.learners!r} (one learner: leave learners out)")
        if self.schedule is not None and self.learners is None:
            self._fail("schedule", f"is {self.schedule!r} without learners; a schedule needs several learners")


@dataclass(frozen=True, kw_only=True)
class TrainerSpec(SettingSpec):
    """A setting's spec with one trainer's fit: its trainer, seed and budget."""

    trainer: str = spec_field("the trainer (a name of trainers.TRAINERS)")
    seed: int = spec_field("the trainer's seed")
    steps: int = spec_field("training steps")
    learning_rate: Any = spec_field("the learning rate, or the rule picking it: {rule, tolerance, sweep: lr -> "
                                    "the sweep cell's fingerprint}")
    questions_per_step: int = spec_field("questions per training step")
    num_generations: int = spec_field("generations per question (G)")
    shapley_coalitions: int | None = spec_field("coalitions per question of a trainer that takes them (None: "
                                                "the others)")
    lora: dict[str, Any] | None = spec_field("LoRA adapters {r, alpha, dropout, target_modules} (None: full "
                                             "fine-tuning)")
    learning_rate_choice: dict[str, Any] | None = spec_field(
        "what the rule chose from the sweep (set when a run resolves the rule; never planned)", absent_when_none=True)
    pilot: dict[str, Any] | None = spec_field(
        "[training.pilot]'s rule and cells: {select, tolerance, margin, setup_label, lora, cells: [{learning_rate, "
        "adapter, seed, fingerprint}]}; until a run resolves it, steps is the largest checkpoint (what the plan "
        "prices), learning_rate the largest rate and lora None", absent_when_none=True)
    pilot_choice: dict[str, Any] | None = spec_field(
        "what the pilot chose (set when a run resolves it; never planned)", absent_when_none=True)

    def check(self) -> None:
        super().check()
        self._int("seed")
        for name, low in (("steps", 1), ("questions_per_step", 1), ("num_generations", 1)):
            self._int(name, low)
        self._int("shapley_coalitions", 1, optional=True)
        if isinstance(self.learning_rate, Mapping):
            self._table("learning_rate", ("rule", "tolerance", "sweep"))
            if self.learning_rate_choice is not None:
                self._fail("learning_rate_choice", "is set while learning_rate is still a rule; resolve the rule first")
        elif (lr := finite_number(self.learning_rate)) is None or lr <= 0:
            self._fail("learning_rate", f"must be a positive number or a rule table, got {self.learning_rate!r}")
        if self.lora is not None:
            self._table("lora", ())
        if self.pilot is not None:
            self._table("pilot", ("select", "tolerance", "margin", "setup_label", "lora", "cells"))
            if isinstance(self.learning_rate, Mapping):
                self._fail("pilot", "is set beside a learning-rate rule; the pilot supersedes [training.lr_rule]")


@dataclass(frozen=True, kw_only=True)
class SweepSpec(TrainerSpec):
    """An ``lr_sweep`` cell: a trainer at one candidate rate, scored alone on its selection questions."""

    selection: dict[str, Any] = spec_field("the selection questions: {split, seed, n} (never the eval split)")
    selection_n: int = spec_field("how many selection questions (selection['n'])")

    def check(self) -> None:
        super().check()
        self._table("selection", ("split", "seed", "n"))
        self._int("selection_n", 1)
        if self.selection["n"] != self.selection_n:
            self._fail("selection_n", f"is {self.selection_n!r} but selection.n is {self.selection['n']!r}; they "
                                      f"are one number")


@dataclass(frozen=True, kw_only=True)
class PilotSpec(TrainerSpec):
    """A ``pilot`` cell: a trainer at one rate and adapter on a pilot seed, fitted once to the largest checkpoint
    and evaluated at each on its validation questions (never the eval split): the learner alone and each system
    in ``systems``."""

    adapter: str = spec_field("what trains: \"full\" fine-tuning or \"lora\" (lora holds its settings)")
    checkpoints: list[int] = spec_field("the steps evaluated, rising; the fit runs to the last")
    validation: dict[str, Any] = spec_field("the validation questions: {split, seed, n} (never the eval split)")
    systems: list[dict[str, Any]] = spec_field("the systems scored at each checkpoint: {setup_label, protocol, "
                                               "options} of every setting this fit serves")

    def check(self) -> None:
        super().check()
        self._table("validation", ("split", "seed", "n"))
        if self.adapter not in ("full", "lora") or (self.adapter == "lora") != (self.lora is not None):
            self._fail("adapter", f"must be \"full\" (lora None) or \"lora\" (lora set), got {self.adapter!r} with "
                                  f"lora {self.lora!r}")
        if not isinstance(self.checkpoints, list) or not self.checkpoints or self.checkpoints != sorted(
                set(self.checkpoints)) or self.checkpoints[-1] != self.steps:
            self._fail("checkpoints", f"must be rising steps ending at steps ({self.steps!r}), got {self.checkpoints!r}")
        if not isinstance(self.systems, list) or not self.systems:
            self._fail("systems", f"must list the settings' systems, got {self.systems!r}")
        for system in self.systems:
            self._table("systems", ("setup_label", "protocol", "options"), system)


@dataclass(frozen=True, kw_only=True)
class TrainingSpec(TrainerSpec):
    """A ``training`` cell: one trainer's fit with one seed in one setting, then its evaluation."""


@dataclass(frozen=True, kw_only=True)
class CrossplaySpec(TrainingSpec):
    """A ``crossplay`` cell: a training cell's spec and fingerprint (its learners are restored from that cell's
    final checkpoint)."""

    training_fingerprint: str = spec_field("the fingerprint of the training cell whose learners play")

    def check(self) -> None:
        super().check()
        if not isinstance(self.training_fingerprint, str) or not re.fullmatch(r"[0-9a-f]{32}", self.training_fingerprint):
            self._fail("training_fingerprint", f"must be a cell fingerprint (32 hex digits), got "
                                               f"{self.training_fingerprint!r}")
