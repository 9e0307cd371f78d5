"""A study's config: pools, protocols, tasks, valuation, training, sampling, executor; validated before
any work, each error one line naming the key and the fix.

Each option is declared once, as a field of the dataclass of its section (:class:`StudyConfig`'s ``[study]``
fields, :class:`TaskConfig`, :class:`ProtocolConfig`, :class:`ValuationConfig`, :class:`TrainingConfig`,
:class:`SetupConfig`, :class:`SamplingOptions`, :class:`ExecutorConfig`): its type, default, bounds and help
(:func:`option`, in the style of TRL's config dataclasses). One loader (:func:`_read`) reads every section by
those declarations; each section then checks what spans sections (labels, registries, the learners against the
pool). :func:`option_reference` prints them all (docs/studies.md, "Every option").

A config is a TOML file (``tomllib``) or the same structure as a dict. Every section but ``[pools]``,
``[tasks]`` and one of ``[protocols]`` / ``[training]`` is optional:

.. code-block:: toml

    [study]
    name = "paper-small"
    out = "runs/paper-small"            # where cells, logs, study.json, study.md and plots go
    trackers = ["mlflow", "trackio"]    # optional: log training runs and the tables (crl_envs.tracking)

    [pools]                             # label = a named pool, or a list of members
    zoo = "zoo"
    specialists = ["zoo:zoo-nocarry", "zoo:zoo-noborrow", "zoo:zoo-small"]
    scripted = [{expert = 0.8}, {expert = 0.6, name = "e6"}]    # ScriptedAgent.expert(name, accuracy, seed)

    [tasks.arith]                       # label = a task: crl_envs.tasks.load(name, split, n, seed, **options)
    name = "arith"
    n = 100
    max_new_tokens = 24                 # this task's answer length (valuation and training)

    [protocols.debate]                  # label = a protocol (default: the label) and its options
    options = {rounds = 2}

    [valuation]                         # one cell per pool x protocol x task x seed: valuation.evaluate
    estimator = "exact"                 # or {exact_up_to = 6, larger = "loo"} (estimator per pool size)
    seeds = [0]
    delta = 0.3                         # "decoupled": the CI of tau inside (-delta, +delta) (crl_envs.stats)
    pool_tasks = {zoo = ["arith"]}      # optional: a pool valued on some tasks only

    [valuation.families]                # optional: family label = protocol labels or library families
    api = ["routing", "cascade"]
    text = ["aggregation", "judging", "text exchange"]

    [training]                          # one cell per setup x task x trainer x seed: a trainer's fit()
    pool = "zoo"                        # one pool, apart from [valuation] pools
    learner = "model_4"                 # or learners = ["model_3", "model_4"] (several, trained together),
                                        #   schedule = "joint" | "round_robin"; a setup may set its own
    trainers = ["crl", "grpo", "placebo"]
    tasks = ["arith"]
    seeds = [0, 1, 2]
    steps = 24                          # steps and learning_rate: every setup's (a setup may set its own)

    [training.lr_rule]                  # optional, instead of learning_rate: a sweep chooses it before the
    candidates = [1e-3, 1e-4, 3e-5]     #   comparison (crl_envs.study.gates.LearningRateRule): GRPO on its own
    select = "largest_kept"             #   seed, scored on questions of another split/seed, never the eval split

    # [training.pilot]                  # or, instead of lr_rule (crl_envs.study.pilot.PilotConfig): one fit per
    # steps = [20, 50, 100, 200]        #   rate x adapter x pilot seed to the largest checkpoint, scored at each
    # rates = [1e-4, 3e-5, 1e-5]        #   on train-split questions; it fixes steps, rate and adapter

    [training.setups.judge-plurality]   # label = a protocol (a [protocols] label or a protocol name)
    protocol = "judge"
    options = {judge = "{learner}"}
    steps = 48                          # a setup's budget and learning rate hold for EVERY trainer

    [sampling]                          # the valuation's sampling (training evaluates greedily)
    temperature = 0.0

    [executor]
    kind = "local"                      # "processes" (workers = 2) or "ray" (address = "head:6379")
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from crl_envs.tracking import check_trackers
from crl_envs.valuation.estimators import ESTIMATORS, SAMPLED_ESTIMATORS, estimator_class, estimator_for
from crl_kit.errors import ConfigError
from crl_kit.validation import did_you_mean, int_problem

SECTIONS = ("study", "pools", "tasks", "protocols", "valuation", "training", "sampling", "executor")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
#: The longest label: a cell's log file name joins three labels (a file name holds 255 bytes).
MAX_LABEL = 64
#: The most new tokens an answer may be given (a task's or [sampling]'s max_new_tokens): above any model's
#: context; a larger number is a typo, and a decoder would size buffers by it.
MAX_NEW_TOKENS = 1 << 16
#: The most cells a study may plan, and the most coalition runs one valuation cell may plan: a larger
#: plan is refused before it is built (its figure and the key to change named).
MAX_CELLS = 10_000
MAX_COALITION_RUNS = 1_000_000
#: An option with no default (:class:`Option`): the config must give it.
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()


class StudyConfigError(ConfigError):
    """A config mistake: one line naming the key and the fix."""


def _error(key: str, message: str) -> StudyConfigError:
    return StudyConfigError(f"study config: {key}: {message}")


def _check_label(key: str, label: Any, what: str) -> str:
    """A label that names cells, logs and files: letters, digits, '-', '_' or '.', at most MAX_LABEL long
    (no '/', so cell ids are injective; no NUL or control characters; a file name's length)."""
    if not isinstance(label, str) or not _LABEL.match(label) or len(label) > MAX_LABEL:
        shown = repr(label) if len(repr(label)) <= 80 else f"{repr(label)[:60]}... ({len(label)} characters)"
        if isinstance(label, str) and key.endswith(label):  # the key names the label: shown escaped, cut
            key = key[: len(key) - len(label)] + (shown if shown != repr(label) else repr(label))
        raise _error(key, f"a {what} label is 1 to {MAX_LABEL} letters, digits, '-', '_' or '.' (starting with a "
                          f"letter or digit), got {shown}; rename it")
    return label


def _unknown_keys(key: str, given: Mapping[str, Any], valid: Sequence[str]) -> None:
    for k in given:
        if k not in valid:
            hint = did_you_mean(str(k), valid)
            where = f"{key}.{k}" if key else str(k)
            raise _error(where, f"unknown key{hint}; valid keys: {', '.join(valid)}")


def _table(key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _error(key, f"must be a table (e.g. [{key}]), got {type(value).__name__} {value!r}")
    return dict(value)


def _int(key: str, value: Any, minimum: int | None = None, example: str = "") -> int:
    problem = int_problem(value, minimum=minimum, why=f"e.g. {example}" if example else "", name=key)
    if problem is not None:
        raise _error(key, problem)
    return int(value)


def _number(key: str, value: Any, low: float | None = None, high: float | None = None, example: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (low is not None and value < low) or (high is not None and value > high):
        bounds = f" in [{low:g}, {high:g}]" if low is not None and high is not None else \
            f" >= {low:g}" if low is not None else ""
        raise _error(key, f"must be a number{bounds}{f' (e.g. {example})' if example else ''}, got {value!r}")
    return float(value)


def _labels(key: str, value: Any, known: Mapping[str, Any], what: str) -> list[str]:
    if value is None:
        return list(known)
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise _error(key, f"must be a non-empty list of {what} labels, e.g. [{', '.join(repr(k) for k in list(known)[:2])}]")
    for v in value:
        if v not in known:
            hint = did_you_mean(str(v), list(known))
            raise _error(key, f"unknown {what} {v!r}{hint}; defined {what}s: {', '.join(known) or 'none'}")
    if len(set(value)) != len(value):
        raise _error(key, f"lists a {what} twice: {list(value)}")
    return list(value)


def _seeds(key: str, value: Any) -> list[int]:
    if isinstance(value, bool) or not isinstance(value, list) or not value:
        raise _error(key, f"must be a non-empty list of integers, e.g. [0, 1, 2], got {value!r}")
    return [_int(f"{key}[{i}]", s) for i, s in enumerate(value)]


# ---------------------------------------------------------------------- the declarations
@dataclass(frozen=True)
class Option:
    """How one option of the study TOML is read: ``kind`` (its check), ``default`` (the value when it is left out;
    a callable is asked, for defaults that live elsewhere such as :class:`trainers.TrainerConfig`'s; ``None``:
    optional), bounds and an example for the error. The field's ``metadata["help"]`` says what it does."""

    kind: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    example: str = ""
    #: a number strictly inside (low, high); an int option that may also be left unset (None)
    strict: bool = False
    nullable: bool = False

    def describe(self) -> str:
        """The check, as the option reference shows it (e.g. ``int >= 1``, ``number in (0, 1)``)."""
        kind = {"tokens": f"int in [1, {MAX_NEW_TOKENS}]", "any": "", "seeds": "list of ints",
                "split": "str"}.get(self.kind, self.kind)
        if self.low is not None and self.high is not None:
            return f"{kind} in {'(' if self.strict else '['}{self.low:g}, {self.high:g}{')' if self.strict else ']'}"
        return f"{kind} >= {self.low:g}" if self.low is not None else kind

    def default_value(self) -> Any:
        if self.default is REQUIRED:
            return REQUIRED
        return self.default() if callable(self.default) else copy.deepcopy(self.default)


def option(help: str, kind: str = "any", default: Any = None, **check: Any) -> Any:
    """A dataclass field declaring one option, as TRL's config dataclasses do (``metadata["help"]``), with its
    :class:`Option` (``metadata["option"]``) that the one loader (:func:`_read`) checks values by. Kinds:
    ``int``, ``number``, ``bool``, ``str``, ``split``, ``seeds``, ``tokens`` (an answer length), ``table``,
    ``any`` (checked by its section, against other sections: labels, registries)."""
    declared = Option(kind, default, **check)
    metadata = {"help": help, "option": declared}
    if callable(default) or default is REQUIRED:
        return field(metadata=metadata)
    if isinstance(default, (list, dict)):
        return field(default_factory=declared.default_value, metadata=metadata)
    return field(default=default, metadata=metadata)


def options_of(cls: type, *names: str) -> dict[str, Option]:
    """``cls``'s declared options (all, or ``names``), in declaration order."""
    declared = {f.name: f.metadata["option"] for f in fields(cls) if "option" in f.metadata}
    return {n: declared[n] for n in names} if names else declared


def _read(key: str, spec: Mapping[str, Any], declared: Mapping[str, Option],
          defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one loader: refuse a key that is not declared, then check each declared option's value (given, else
    ``defaults``', else its declared default) by its kind. Returns name -> checked value."""
    _unknown_keys(key, spec, list(declared))
    defaults = defaults or {}
    out = {}
    for name, opt in declared.items():
        value = spec[name] if name in spec else defaults[name] if name in defaults else opt.default_value()
        if value is REQUIRED:
            raise _error(f"{key}.{name}", f"is required{f' (e.g. {name} = {opt.example})' if opt.example else ''}")
        out[name] = _checked(f"{key}.{name}", opt, value)
    return out


def _checked(key: str, opt: Option, value: Any) -> Any:
    """``value`` checked (and normalised: ints, floats, lists) as ``opt`` declares, or one line naming ``key``."""
    if value is None and (opt.default is None or opt.nullable):
        return None
    if opt.kind == "int":
        return _int(key, value, None if opt.low is None else int(opt.low), opt.example)
    if opt.kind == "tokens":
        value = _int(key, value, 1, "24")
        if value > MAX_NEW_TOKENS:
            raise _error(key, f"must be at most {MAX_NEW_TOKENS:,} (an answer's tokens), got {value:,}")
        return value
    if opt.kind == "number":
        value = _number(key, value, opt.low, opt.high, opt.example)
        if opt.strict and not opt.low < value < opt.high:
            raise _error(key, f"must lie strictly between {opt.low:g} and {opt.high:g} (e.g. {opt.example}), "
                              f"got {value!r}")
        return value
    if opt.kind == "bool" and not isinstance(value, bool):
        raise _error(key, f"must be true or false, got {value!r}")
    if opt.kind == "str" and not isinstance(value, str):
        raise _error(key, f"must be a string, got {value!r}")
    if opt.kind == "split" and not isinstance(value, str):
        raise _error(key, f"must be a split name such as \"test\", got {value!r}")
    if opt.kind == "seeds":
        return _seeds(key, value)
    if opt.kind == "table":
        return _table(key, value)
    return value


def option_reference() -> str:
    """Every option of the study TOML as Markdown tables, one per section, generated from the declarations
    (docs/studies.md holds this text; a test keeps the two equal)."""
    from crl_envs.study.gates import LearningRateRule
    from crl_envs.study.pilot import PilotConfig

    sections = [("[study]", StudyConfig, ()), ("[pools] scripted member {...}", ScriptedMember, ()),
                ("[tasks.<label>]", TaskConfig, ()), ("[protocols.<label>]", ProtocolConfig, ()),
                ("[valuation]", ValuationConfig, ()), ("[valuation] estimator = {...}", EstimatorRule, ()),
                ("[valuation.sequential]", SequentialConfig, ()),
                ("[training]", TrainingConfig, SETUP_DEFAULTS), ("[training.setups.<label>]", SetupConfig, ()),
                ("[training.lr_rule]", LearningRateRule, ()), ("[training.pilot]", PilotConfig, ()),
                ("[sampling]", SamplingOptions, ()),
                ("[executor]", ExecutorConfig, ())]
    lines = []
    for title, cls, borrowed in sections:
        lines += [f"`{title}`", "", "| option | type | default | help |", "|---|---|---|---|"]
        found = [(f, cls) for f in fields(cls) if "help" in f.metadata]
        found += [(f, SetupConfig) for f in fields(SetupConfig) if f.name in borrowed]
        for f, _ in found:
            opt = f.metadata.get("option")
            default = f.default if opt is None else opt.default
            shown = "" if default is None or default is REQUIRED or default is MISSING else \
                f"`{json.dumps(default())}` ({default.__qualname__})" if callable(default) else f"`{json.dumps(default)}`"
            lines.append(f"| `{f.name}` | {'' if opt is None else opt.describe()} | {shown} | {f.metadata['help'].replace('<', '&lt;')} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the parts
def _trainer_default(name: str) -> Any:
    """A default that :class:`trainers.TrainerConfig` declares (asked when a config is read, not copied here)."""
    def default() -> Any:
        return _trainer_defaults()[name]

    default.__qualname__ = f"trainers.TrainerConfig.{name}"
    return default


def _roster() -> list[str]:
    from trainers import ROSTER

    return list(ROSTER)


_roster.__qualname__ = "trainers.ROSTER"


@dataclass(frozen=True)
class PoolConfig:
    """A pool: a named pool (``"zoo"``) or members (agent specs, or ``{expert = 0.8}`` scripted experts)."""

    label: str
    named: str | None
    members: tuple[Any, ...]

    def describe(self) -> Any:
        """What the pool is, as data (fingerprinted into its cells)."""
        return self.named if self.named is not None else [m if isinstance(m, str) else dict(sorted(m.items()))
                                                          for m in self.members]


@dataclass(frozen=True, kw_only=True)
class ScriptedMember:
    """A scripted pool member, ``{expert = 0.8}``: ``agents.ScriptedAgent.expert(name, accuracy, seed)`` (the
    pool keeps the table as written; this declares its keys)."""

    expert: float = option("the expert's accuracy, in [0, 1] (required)", "number", REQUIRED, low=0.0, high=1.0,
                           example="0.8")
    name: str | None = option("its name (default: expert-<accuracy>)", "str")
    seed: int | None = option("its seed", "int")


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """A task; ``max_new_tokens`` (``None``: ``[sampling]``'s) is its answer length, kept out of
    :meth:`describe` since it is sampling (cells carry it in their sampling)."""

    label: str
    name: str = option("a task of crl_envs.tasks (default: the label)")
    n: int | None = option("questions (default: the task's)", "int", low=1, example="n = 100")
    split: str | None = option("the split (default: the task's)", "split")
    seed: int = option("the seed drawing the questions", "int", 0)
    options: dict[str, Any] = option("the task's own options (crl_envs.tasks.load's keywords)", "table", {})
    max_new_tokens: int | None = option("this task's answer length, for valuation and training (default: "
                                        "[sampling]'s)", "tokens")
    content: str | None = None  # a digest of the loaded examples (see _task_content)

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "n": self.n, "split": self.split, "seed": self.seed, "options": self.options}
        return d if self.content is None else {**d, "content": self.content}


@dataclass(frozen=True, kw_only=True)
class ProtocolConfig:
    label: str
    protocol: str = option("a protocol of crl_envs.protocols (default: the label)")
    options: dict[str, Any] = option("the protocol's options (checked by crl_envs.protocols.check_options)",
                                     "table", {})

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "options": self.options}


@dataclass(frozen=True, kw_only=True)
class EstimatorRule:
    """``[valuation] estimator = {exact_up_to = 6, larger = "loo"}``: an estimator per pool size."""

    exact_up_to: int = option("pools of at most this many models are valued exactly", "int", 8, low=1, example="8")
    larger: str = option("the estimator of larger pools (crl_envs.valuation.estimators.ESTIMATORS)", "any", "loo")
    computed: str | None = option("the estimator of protocols whose coalitions are computed from the members' answers "
                                  "(vote), whatever the pool's size, e.g. \"exact\" (up to 16 models); unset: as the "
                                  "others")


def _design_default(name: str) -> Any:
    """A default :class:`crl_envs.sequential.SequentialDesign` declares (asked when a config is read, not copied)."""
    def default() -> Any:
        from crl_envs.sequential import SequentialDesign

        value = next(f for f in fields(SequentialDesign) if f.name == name).default
        return list(value) if isinstance(value, tuple) else value

    default.__qualname__ = f"SequentialDesign.{name}"
    return default


@dataclass(frozen=True, kw_only=True)
class SequentialConfig:
    """``[valuation.sequential]``: play each setting's questions look by look and stop it when its verdict is
    decided (:class:`crl_envs.sequential.SequentialDesign`, which owns the rules; its levels are ``[valuation]``'s
    ``alpha`` for both verdicts, its margin ``delta``, its resamples ``bootstrap_resamples``). Without the table
    every setting plays all its questions at once."""

    looks: list[int] = option("cumulative questions at each look, increasing; the last is every valued task's n",
                              "any", _design_default("looks"))
    coupled_spending: str = option("how coupled's alpha is spent over the looks (crl_envs.sequential.SPENDING_FUNCTIONS:"
                                   " pocock, obrien-fleming, power:RHO)", "str", _design_default("coupled_spending"))
    decoupled_spending: str = option("how decoupled's alpha is spent over the looks (as coupled_spending)", "str",
                                     _design_default("decoupled_spending"))
    futility_tau: float | None = option("stop inconclusive before the last look when the cross-fit tau is below this and "
                                        "decoupled is out of reach (non-binding; unset: no futility stop)", "number",
                                        _design_default("futility_tau"), low=-1.0, high=1.0, example="0.15",
                                        nullable=True)

    def __post_init__(self) -> None:
        looks = self.looks
        if not isinstance(looks, list) or not looks or any(isinstance(k, bool) or not isinstance(k, int) for k in looks):
            raise _error("valuation.sequential.looks", f"must be a list of question counts, e.g. [50, 100, 150, 200], "
                                                       f"got {looks!r}")
        try:
            self.design(alpha=0.05, delta=0.3, resamples=1, seed=0)  # the design's own checks, before any work
        except ConfigError as e:
            raise _error("valuation.sequential", str(e)) from None

    def design(self, *, alpha: float, delta: float, resamples: int, seed: int):
        """The :class:`crl_envs.sequential.SequentialDesign` of one setting at the study's levels."""
        from crl_envs.sequential import SequentialDesign

        return SequentialDesign(looks=tuple(self.looks), alpha=alpha, decoupled_alpha=alpha, delta=delta,
                                coupled_spending=self.coupled_spending, decoupled_spending=self.decoupled_spending,
                                futility_tau=self.futility_tau, resamples=resamples, seed=seed)


@dataclass(frozen=True, kw_only=True)
class ValuationConfig:
    pools: list[str] = option("the pools valued (default: every pool)")
    protocols: list[str] = option("the protocols valued (default: every protocol)")
    tasks: list[str] = option("the tasks valued (default: every task)")
    estimator: str | dict[str, Any] = option("an estimator of crl_envs.valuation.estimators, or {exact_up_to = 6, "
                                             "larger = \"loo\"} (an estimator per pool size)", "any", "exact")
    samples: int = option("episodes per coalition and question", "int", 1, low=1, example="1")
    seeds: list[int] = option("one cell per seed", "seeds", [0])
    budget: int | None = option("permutations of the sampled estimators (permutation, antithetic; required there)",
                                "int", low=2, example="200")
    alpha: float = option("the verdicts' significance level", "number", 0.05, low=0.0, high=1.0, example="0.05",
                          strict=True)
    ci_level: float = option("the level of the values' bootstrap CIs", "number", 0.95, low=0.0, high=1.0,
                             example="0.95", strict=True)
    bootstrap_resamples: int = option("question-bootstrap resamples", "int", 2000, low=1, example="2000")
    delta: float = option("\"decoupled\": the CI of tau inside (-delta, +delta) (crl_envs.stats)", "number", 0.3,
                          low=0.0, high=1.0, example="0.3", strict=True)
    #: protocol label -> family label
    families: dict[str, str] = option("family label = protocol labels or library families (default: each "
                                      "protocol's library family, crl_envs.protocols.FAMILIES)", "table", {})
    #: pool label -> its tasks (default: tasks)
    pool_tasks: dict[str, list[str]] = option("pool label = the tasks it is valued on (default: every valued task)",
                                              "table", {})
    #: [valuation.sequential], or None: every setting plays all its questions at once
    sequential: SequentialConfig | None = option("[valuation.sequential]: questions played look by look, a setting "
                                                 "stopped when its verdict is decided (see below; unset: all at once)",
                                                 "table", None)

    def tasks_of(self, pool: str) -> list[str]:
        """The tasks pool ``pool`` is valued on: its ``pool_tasks`` entry, else ``tasks``."""
        return self.pool_tasks.get(pool, self.tasks)

    def estimator_for(self, n: int) -> str:
        """The estimator for a pool of ``n`` models (:func:`crl_envs.valuation.estimators.estimator_for`)."""
        return estimator_for(n, self.estimator)


@dataclass(frozen=True, kw_only=True)
class SetupConfig:
    """``[training.setups.<label>]``; ``steps``, ``learning_rate``, ``learners`` and ``schedule`` set in
    ``[training]`` are every setup's default (:data:`SETUP_DEFAULTS`)."""

    label: str
    protocol: str = option("a [protocols] label or a protocol name (default: the label)")
    options: dict[str, Any] = option("the protocol's options; {learner} is the setup's first learner", "table", {})
    steps: int = option("training steps, the same for every trainer", "int", _trainer_default("steps"), low=1,
                        example="24")
    learning_rate: float = option("the learning rate, the same for every trainer (or [training.lr_rule])", "number",
                                  _trainer_default("learning_rate"), low=0.0, high=1.0, example="1e-3")
    #: the pool members trained together in this setup (one: the single-learner case)
    learners: tuple[str, ...] = option("pool agent ids trained together, e.g. [\"model_3\", \"model_4\"] (default: "
                                       "[training]'s learner)")
    #: with several learners, ``"joint"`` or ``"round_robin"`` (:data:`trainers.config.SCHEDULES`)
    schedule: str = option("with several learners, \"joint\" or \"round_robin\" (trainers.config.SCHEDULES)",
                           "any", "joint")
    #: the tasks this setup trains on, a subset of ``[training] tasks`` (default: all of them): settings are the
    #: setups x their tasks, so a probe's choice of (setup, task) pairs is a config, not the whole cross product
    tasks: tuple[str, ...] | None = option("the training tasks this setup trains on, a subset of [training] tasks "
                                           "(default: all of them), e.g. [\"arith\"]")

    def trained_tasks(self, training_tasks: Sequence[str]) -> list[str]:
        """The labels of the tasks this setup trains on, in ``[training] tasks``' order."""
        return [t for t in training_tasks if self.tasks is None or t in self.tasks]


#: The options of a setup that ``[training]`` sets for every setup.
SETUP_DEFAULTS = ("steps", "learning_rate", "learners", "schedule")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """``[training]``: every trainer gets each setup's ``steps`` and ``learning_rate`` (one budget and one
    learning-rate rule for all); defaults are :class:`trainers.TrainerConfig`'s."""

    pool: str = option("the pool trained in (one [pools] label, apart from [valuation]'s)")
    learner: str = option("the pool agent id trained (or learners = [...]: several, trained together)", "any",
                          "model_0")
    setups: dict[str, SetupConfig] = option("label = a setup: [training.setups.<label>] (at least one)", "table", {})
    tasks: list[str] = option("the tasks trained on (default: every task)")
    trainers: list[str] = option("names of trainers.ROSTER (default: all of them)", "any", _roster)
    seeds: list[int] = option("one training cell per trainer and seed", "seeds", [0, 1, 2])
    questions_per_step: int = option("questions per training step", "int", _trainer_default("questions_per_step"),
                                     low=1, example="8")
    num_generations: int = option("generations per question (G)", "int", _trainer_default("num_generations"), low=2,
                                  example="8")
    n_train: int = option("training questions", "int", 1000, low=1, example="1000")
    n_eval: int = option("held-out evaluation questions", "int", 200, low=1, example="200")
    train_split: str = option("the split trained on", "split", "train")
    eval_split: str = option("the held-out split evaluated on", "split", "test")
    shapley_coalitions: int | None = option("coalitions per question of the Shapley-credit trainer "
                                            "(coalitions_per_question)", "int", 2, low=1, example="2", nullable=True)
    lora: dict[str, Any] | None = option("LoRA adapters: {r, alpha, dropout, target_modules} (default: full "
                                         "fine-tuning)", "table")
    bootstrap_resamples: int = option("bootstrap resamples of the deltas' CIs", "int", 5000, low=1)
    ci_level: float = option("the level of the deltas' CIs", "number", 0.95, low=0.5, high=0.999, example="0.95")
    alpha: float = option("the comparisons' significance level", "number", 0.05, low=0.0, high=1.0, example="0.05",
                          strict=True)
    threads: int = option("torch threads per training cell", "int", 1, low=1, example="1")
    #: after each training cell, play its learners with partners they never trained with (crossplay cells)
    crossplay: bool = option("after each training cell, play its learners with partners they never trained with",
                             "bool", False)
    #: ``[training.lr_rule]``: the learning rate chosen before the comparison by a sweep (None: the setups' rates)
    lr_rule: Any = option("[training.lr_rule] (crl_envs.study.gates.LearningRateRule): a sweep chooses the "
                          "learning rate before the comparison")
    #: ``[training.pilot]``: steps, learning rate and adapter fixed before the comparison by a pilot (None: none)
    pilot: Any = option("[training.pilot] (crl_envs.study.pilot.PilotConfig): a pilot fixes steps, learning rate and "
                        "adapter before the comparison (instead of [training.lr_rule])")


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """``[sampling]``: the valuation's sampling (training evaluates greedily); read into ``StudyConfig.sampling``
    as a dict."""

    temperature: float = option("sampling temperature", "number", 0.0, low=0.0, high=10.0, example="0.0")
    top_p: float = option("nucleus sampling's p, > 0", "number", 1.0, low=0.0, high=1.0, example="1.0")
    max_new_tokens: int = option("every task's answer length (a task's max_new_tokens wins)", "tokens",
                                 _trainer_default("max_new_tokens"))


@dataclass(frozen=True, kw_only=True)
class ExecutorConfig:
    kind: str = option("\"local\", \"processes\" or \"ray\" (crl_envs.valuation.executors.EXECUTORS)", "any", "local")
    workers: int | None = option("worker processes (kind = \"processes\" only)", "int", low=1, example="2")
    address: str | None = option("the Ray head, \"host:port\", \"auto\" or \"local\" (kind = \"ray\" only)")
    num_cpus: float = option("CPUs a Ray cell asks for", "number", 1, low=0.01, example="1")
    #: coalitions one lockstep group plays (None: the executor's default, a whole game locally and one
    #: coalition per task on processes and Ray); fewer means smaller batches, but a killed run loses less
    coalitions_per_task: int | None = option("coalitions per lockstep group (default: a whole game locally, one "
                                             "per task on processes and Ray); fewer loses less to a kill", "int",
                                             low=1, example="4")


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """A validated study config (see the module docstring for the format)."""

    name: str = option("names the study (default: the config file's stem)")
    out: Path = option("where cells, logs, study.json, study.md and plots go (default: runs/<name>)")
    pools: dict[str, PoolConfig]
    tasks: dict[str, TaskConfig]
    protocols: dict[str, ProtocolConfig]
    valuation: ValuationConfig | None
    training: TrainingConfig | None
    sampling: dict[str, Any]
    executor: ExecutorConfig
    source: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: trackers the training runs and the study's tables are logged to (:mod:`crl_envs.tracking`)
    trackers: tuple[str, ...] = option("log training runs and the tables to these (crl_envs.tracking), e.g. "
                                       "[\"mlflow\", \"trackio\"]", "any", ())

    def sampling_for(self, task: str) -> dict[str, Any]:
        """``[sampling]`` with the task's own ``max_new_tokens`` where it sets one (valuation and training)."""
        own = self.tasks[task].max_new_tokens
        return self.sampling if own is None else {**self.sampling, "max_new_tokens": own}


# ---------------------------------------------------------------------- reading
def load_config(config: str | os.PathLike | Mapping[str, Any], *, out: str | os.PathLike | None = None) -> StudyConfig:
    """Read and validate a study config (a TOML path or a dict); ``out`` overrides ``[study] out``.

    Example:
        >>> cfg = load_config({"pools": {"p": [{"expert": 0.8}, {"expert": 0.5}]}, "tasks": {"arith": {"n": 5}},
        ...                    "protocols": {"vote": {}}})
        >>> [c for c in cfg.pools], cfg.valuation.estimator_for(2)
        (['p'], 'exact')
    """
    source = None
    if isinstance(config, (str, os.PathLike)):
        source = Path(config)
        if not source.is_file():
            raise StudyConfigError(f"study config: no such file {str(source)!r}; pass the path of a .toml study "
                                   f"config (e.g. studies/paper-small.toml)")
        try:
            raw = tomllib.loads(source.read_text())
        except tomllib.TOMLDecodeError as e:
            raise StudyConfigError(f"study config {source}: not valid TOML ({e}); fix the line it names") from None
    elif isinstance(config, Mapping):
        raw = dict(config)
    else:
        raise StudyConfigError(f"study config must be a path to a .toml file or a dict, got {type(config).__name__}")
    _unknown_keys("", raw, SECTIONS)
    study = _study(_table("study", raw.get("study")), source, out)
    pools = {label: _pool(label, spec) for label, spec in _table("pools", raw.get("pools")).items()}
    if not pools:
        raise _error("pools", "define at least one pool, e.g. [pools] zoo = \"zoo\"")
    tasks = {label: _task(label, spec) for label, spec in _table("tasks", raw.get("tasks")).items()}
    if not tasks:
        raise _error("tasks", "define at least one task, e.g. [tasks.arith] n = 100")
    protocols = {_check_label(f"protocols.{label}", label, "protocol"): _protocol(f"protocols.{label}", label, spec)
                 for label, spec in _table("protocols", raw.get("protocols")).items()}
    sampling = _sampling(_table("sampling", raw.get("sampling")))
    valuation = None
    if "valuation" in raw or ("training" not in raw and protocols):
        valuation = _valuation(_table("valuation", raw.get("valuation")), pools, protocols, tasks)
    training = _training(_table("training", raw["training"]), pools, protocols, tasks) if "training" in raw else None
    if valuation is None and training is None:
        raise _error("protocols", "nothing to run: define [protocols] (for valuation) or [training]")
    _check_cell_count(valuation, training)
    return StudyConfig(**study, pools=pools, tasks=tasks, protocols=protocols, valuation=valuation,
                       training=training, sampling=sampling, executor=_executor(_table("executor", raw.get("executor"))),
                       source=source, raw=raw)


def _study(spec: dict[str, Any], source: Path | None, out: str | os.PathLike | None) -> dict[str, Any]:
    """``[study]``: its name (a label), where it writes (relative to the working directory for a TOML file;
    ``out`` wins) and its trackers."""
    v = _read("study", spec, options_of(StudyConfig))
    try:
        trackers = check_trackers(v["trackers"], "trackers")
    except (TypeError, ValueError) as e:
        raise _error("study.trackers", str(e).removeprefix("trackers: ")) from None
    name = v["name"] if v["name"] is not None else source.stem if source else "study"
    _check_label("study.name", name, "study name")
    out_dir = Path(out) if out is not None else Path(v["out"] if v["out"] is not None else f"runs/{name}")
    if source is not None and not out_dir.is_absolute() and out is None:
        out_dir = Path.cwd() / out_dir
    return {"name": name, "out": out_dir, "trackers": trackers}


def _pool(label: str, spec: Any) -> PoolConfig:
    key = f"pools.{label}"
    _check_label(key, label, "pool")
    import agents

    if isinstance(spec, str):
        if ":" in spec:
            return PoolConfig(label, None, (_member(f"{key}", spec),))
        known = sorted({*agents.pool_names(), "zoo"})
        if spec not in known:
            hint = did_you_mean(spec, known)
            raise _error(key, f"unknown named pool {spec!r}{hint}; named pools: {', '.join(known)}, or give a list "
                              f"of agent specs such as [\"zoo:zoo-small\", \"hf:path/to/model\"]")
        return PoolConfig(label, spec, ())
    if not isinstance(spec, list) or not spec:
        raise _error(key, f"must be a named pool (\"zoo\") or a non-empty list of members, got {spec!r}")
    members = tuple(_member(f"{key}[{i}]", m) for i, m in enumerate(spec))
    return PoolConfig(label, None, members)


def _member(key: str, member: Any) -> Any:
    import agents

    if isinstance(member, str):
        prefix, sep, rest = member.partition(":")
        backends = agents.backend_names()  # importing agents registers every backend (the zoo's included)
        if not sep or not rest:
            raise _error(key, f"malformed agent spec {member!r}; write '<backend>:<model>' with a backend of "
                              f"{', '.join(backends)} (e.g. 'zoo:zoo-small', 'vllm:Qwen/Qwen2.5-7B-Instruct')")
        if prefix not in backends:
            hint = did_you_mean(prefix, backends)
            raise _error(key, f"unknown agent backend {prefix!r}{hint}; backends: {', '.join(backends)}")
        return member
    if isinstance(member, Mapping):
        if "expert" not in member and set(member) <= set(options_of(ScriptedMember)):
            raise _error(key, "a scripted member needs expert = <accuracy in [0, 1]>, e.g. {expert = 0.8}")
        _read(key, member, options_of(ScriptedMember))
        return dict(member)  # as written: its description is fingerprinted
    raise _error(key, f"a member is an agent spec string or {{expert = <accuracy>}}, got {member!r}")


def _task(label: str, spec: Any) -> TaskConfig:
    key = f"tasks.{label}"
    _check_label(key, label, "task")
    v = _read(key, _table(key, spec), options_of(TaskConfig), {"name": label})
    from crl_envs import tasks as task_registry

    known = task_registry.names()
    if v["name"] not in known:
        hint = did_you_mean(str(v["name"]), known)
        raise _error(f"{key}.name", f"unknown task {v['name']!r}{hint}; known tasks: {', '.join(known)}")
    valid = task_registry.option_names(v["name"])
    if v["options"] and valid is not None:
        _unknown_keys(f"{key}.options", v["options"], valid)
    return TaskConfig(label=label, **v, content=_task_content(key, v["name"], v["split"], v["n"], v["seed"],
                                                              v["options"]))


def _task_content(key: str, name: str, split: str | None, n: int | None, seed: int, options: dict[str, Any],
                  where: str | None = None) -> str | None:
    """Load the task as its cells will (every option checked by the task itself, now, not when a cell
    runs). For a task read from a ``path=`` file, return a digest of its examples' content (every row,
    whatever ``n``: ids, questions, answers, metadata), so that a cell's fingerprint changes with its
    data. ``None`` otherwise: a procedural task's examples follow from its description (name, split, n,
    seed, options; code changes bump ``CELL_VERSION``), and a hub dataset named by id only is not
    downloaded here (its cells are keyed by its description)."""
    import hashlib

    from crl_envs import tasks as task_registry
    from crl_kit.serial import digest

    from_file = "path" in (task_registry.option_names(name) or ())
    if from_file and options.get("path") is None:
        return None
    try:
        task = task_registry.load(name, split=split, n=None if from_file else n, seed=seed, **options)
    except (ValueError, TypeError, KeyError, OSError, ImportError) as e:
        text = " ".join(str(e).split()) or type(e).__name__
        raise _error(where or (f"{key}.options" if options else key), f"the task does not load: {text}") from None
    if not from_file:
        return None
    # every row of the file(s), of every split: rows that carry a ``split`` field give each split its own
    path = options["path"]
    files = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    whole = [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files]  # regular files: the task loaded
    return digest([[[e.id, e.question, e.answer, e.metadata] for e in task], whole])


def _protocol(key: str, label: str, spec: Any) -> ProtocolConfig:
    v = _read(key, _table(key, spec), options_of(ProtocolConfig), {"protocol": label})
    from crl_envs import protocols

    name = v["protocol"]
    if not isinstance(name, str) or name.removesuffix("_v0") not in protocols.PROTOCOLS:
        known = list(protocols.PROTOCOLS)
        hint = did_you_mean(str(name), known)
        raise _error(f"{key}.protocol", f"unknown protocol {name!r}{hint}; protocols: {', '.join(known)} "
                                        f"(set protocol = \"...\" when the label is not a protocol name)")
    try:
        protocols.check_options(name, v["options"])
    except ValueError as e:
        raise _error(f"{key}.options", str(e)) from None
    return ProtocolConfig(label=label, protocol=name.removesuffix("_v0"), options=v["options"])


def _sampling(spec: dict[str, Any]) -> dict[str, Any]:
    """``[sampling]`` (:class:`SamplingOptions`) as the dict the cells carry."""
    out = _read("sampling", spec, options_of(SamplingOptions))
    if out["top_p"] == 0.0:
        raise _error("sampling.top_p", "must be > 0 (1.0 keeps every token)")
    return out


def _valuation(spec: dict[str, Any], pools, protocols, tasks) -> ValuationConfig:
    v = _read("valuation", spec, options_of(ValuationConfig))
    if not protocols:
        raise _error("protocols", "valuation needs at least one protocol, e.g. [protocols.vote]")
    estimator = v["estimator"]
    if isinstance(estimator, Mapping):
        estimator = _read("valuation.estimator", estimator, options_of(EstimatorRule))
        names = [estimator["larger"]]
        if estimator["computed"] is None:  # unset: the rule as it was before the key existed (cells keep fingerprints)
            del estimator["computed"]
        else:
            names.append(estimator["computed"])
    else:
        names = [estimator]
    for e in names:
        if e not in ESTIMATORS:
            hint = did_you_mean(str(e), ESTIMATORS)
            raise _error("valuation.estimator", f"unknown estimator {e!r}{hint}; choose one of {', '.join(ESTIMATORS)}")
    _check_budget(v["budget"], names)
    chosen = _labels("valuation.protocols", v["protocols"], protocols, "protocol")
    valued = _labels("valuation.pools", v["pools"], pools, "pool")
    pool_tasks = v["pool_tasks"]
    for pool, listed in pool_tasks.items():
        if pool not in valued:
            raise _error(f"valuation.pool_tasks.{pool}", f"is not a valued pool; valued pools: {', '.join(valued)}")
        pool_tasks[pool] = _labels(f"valuation.pool_tasks.{pool}", listed, tasks, "task")
    valued_tasks = _labels("valuation.tasks", v["tasks"], tasks, "task")
    sequential = None if v["sequential"] is None else \
        _sequential(v["sequential"], {t: tasks[t] for p in valued for t in pool_tasks.get(p, valued_tasks)})
    return ValuationConfig(**{**v, "estimator": estimator, "pools": valued, "protocols": chosen, "pool_tasks": pool_tasks,
                              "families": _families(v["families"], {p: protocols[p] for p in chosen}),
                              "tasks": valued_tasks, "sequential": sequential})


def _sequential(spec: dict[str, Any], tasks: Mapping[str, TaskConfig]) -> SequentialConfig:
    """``[valuation.sequential]``, its last look the question count of every valued task."""
    seq = SequentialConfig(**_read("valuation.sequential", spec, options_of(SequentialConfig)))
    for label, task in tasks.items():
        if task.n != seq.looks[-1]:
            raise _error("valuation.sequential.looks", f"the last look ({seq.looks[-1]}) must be the question count of "
                                                       f"every valued task, but tasks.{label}.n is {task.n}; end the "
                                                       f"looks at {task.n} or set its n to {seq.looks[-1]}")
    return seq


def _check_budget(budget: int | None, names: list[str]) -> None:
    """``[valuation] budget``: required by the sampled estimators (and within their own bounds), refused by the
    others."""
    sampled = any(e in SAMPLED_ESTIMATORS for e in names)
    if sampled and budget is None:
        raise _error("valuation.budget", "the permutation/antithetic estimators need budget = <permutations>, e.g. 200")
    if budget is None:
        return
    if not sampled:
        raise _error("valuation.budget", "only applies to estimator \"permutation\" or \"antithetic\"; remove it")
    for e in names:
        if problem := estimator_class(e).budget_problem(budget):
            raise _error("valuation.budget", f"estimator {e!r} {problem}")
    if budget > MAX_COALITION_RUNS:
        raise _error("valuation.budget", f"{budget:,} permutations is more than the {MAX_COALITION_RUNS:,} a "
                                         f"valuation cell runs; lower it (e.g. budget = 200)")


def _trainer_defaults() -> dict[str, Any]:
    """The defaults of :class:`trainers.TrainerConfig`'s fields (the one place they are written)."""
    from dataclasses import MISSING, fields

    from trainers import TrainerConfig

    return {f.name: f.default for f in fields(TrainerConfig) if f.default is not MISSING}


def _families(spec: dict[str, Any], protocols: Mapping[str, ProtocolConfig]) -> dict[str, str]:
    """``protocol label -> family label``: each protocol's library family, or the ``[valuation.families]``
    table's label whose list names the protocol's label or its library family (exactly one)."""
    from crl_envs import protocols as registry

    library = {label: registry.family(p.protocol) for label, p in protocols.items()}
    if not spec:
        return library
    out: dict[str, str] = {}
    for fam, members in spec.items():
        key = f"valuation.families.{fam}"
        _check_label(key, fam, "family")  # it names a row of study.md: no '|' or newline
        if isinstance(members, str) or not isinstance(members, Sequence) or not members:
            raise _error(key, "must be a non-empty list of protocol labels or library families, e.g. "
                              "[\"routing\", \"cascade\"]")
        for m in members:
            if m not in protocols and m not in registry.FAMILIES:
                raise _error(key, f"{m!r} is neither a valued protocol ({', '.join(protocols)}) nor a library family "
                                  f"({', '.join(registry.FAMILIES)})")
        for label in protocols:
            if label in members or library[label] in members:
                if label in out:
                    raise _error(key, f"protocol {label!r} is already in family {out[label]!r}; list it in one family")
                out[label] = str(fam)
    missing = [p for p in protocols if p not in out]
    if missing:
        raise _error("valuation.families", f"protocols {missing} are in no family; add them (or their library "
                                           f"families {sorted({library[p] for p in missing})}) to one")
    return out


def _training(spec: dict[str, Any], pools, protocols, tasks) -> TrainingConfig:
    if "max_new_tokens" in spec:
        raise _error("training.max_new_tokens", "moved: a task's answer length is [tasks.<label>] max_new_tokens "
                                                "(or [sampling] max_new_tokens for every task), for valuation and "
                                                "training alike; remove it here")
    for k in ("steps", "learning_rate"):
        if isinstance(spec.get(k), Mapping):
            raise _error(f"training.{k}", _PER_TRAINER)
    v = _read("training", spec, {**options_of(TrainingConfig), **options_of(SetupConfig, *SETUP_DEFAULTS)})
    if v["pool"] not in pools:
        raise _error("training.pool", f"must name a pool of [pools] ({', '.join(pools)}), got {v['pool']!r}")
    if "learner" in spec and "learners" in spec:
        raise _error("training.learners", "give learner = \"model_4\" (one) or learners = [...] (several), not both")
    learners = _learners("training", v["learner"] if v["learners"] is None else None, v["learners"])
    schedule = _schedule("training.schedule", v["schedule"])
    if not v["setups"]:
        raise _error("training.setups", "define at least one setup, e.g. [training.setups.vote] (a protocol to train in)")
    trainer_names = _trainer_names(v["trainers"])
    setups = _setups(v["setups"], protocols, learners, schedule, v["steps"], v["learning_rate"])
    where = {label: f"training.setups.{label}.learners" if "learners" in v["setups"][label] else
             "training.learners" if "learners" in spec else "training.learner" for label in setups}
    _check_several(setups, where, trainer_names, pools[v["pool"]], v["crossplay"], v["lora"] is not None)
    if v["lora"] is not None:
        _unknown_keys("training.lora", v["lora"], ["r", "alpha", "dropout", "target_modules"])
    training_tasks = _labels("training.tasks", v["tasks"], tasks, "task")
    for label, setup in setups.items():
        if setup.tasks is not None:
            _labels(f"training.setups.{label}.tasks", list(setup.tasks), dict.fromkeys(training_tasks), "training task")
    for label in training_tasks:  # the splits load (one question)
        t = tasks[label]
        for split_key in ("train_split", "eval_split"):
            _task_content(f"tasks.{label}", t.name, v[split_key], 1, t.seed, t.options, where=f"training.{split_key}")
    lr_rule = _lr_rule(spec, v, trainer_names, tasks)
    pilot = _pilot(spec, v, setups, tasks)
    for k in SETUP_DEFAULTS:
        del v[k]
    config = TrainingConfig(**{**v, "learner": learners[0], "setups": setups, "tasks": training_tasks,
                               "trainers": list(trainer_names), "lr_rule": lr_rule, "pilot": pilot})
    for label in config.tasks:
        _check_held_out(tasks[label], config)
    return config


def _check_held_out(task: TaskConfig, t: TrainingConfig) -> None:
    """Refuse a training task whose eval questions are also questions the training trains on or the learning-rate
    rule selects on, compared by content (each question's text), not by split name: a task read from a file gives
    every split the whole file (unless its rows carry a ``split`` field), so "train" and "test" named the same
    questions. The questions are loaded as the cells load them (:func:`crl_envs.study.cells.build.build_task`). A
    hub dataset named by id, not loaded here, is compared by split name."""
    from crl_envs import tasks as task_registry

    from_file = "path" in (task_registry.option_names(task.name) or ())
    if from_file and task.options.get("path") is None:  # a hub dataset: its publisher's splits
        if t.train_split == t.eval_split:
            raise _error("training.train_split", f"{t.train_split!r} is also the eval split: the training would see "
                                                 f"the test questions; use another split (e.g. \"train\")")
        return

    def questions(split: str, n: int, seed: int) -> set[str]:
        loaded = task_registry.load(task.name, split=split, n=n, seed=seed, **task.options)
        return {" ".join(str(e.question).split()) for e in loaded}

    held_out = questions(t.eval_split, t.n_eval, task.seed)
    uses = [("training.train_split", "trains on", t.train_split, t.n_train, task.seed)]
    if t.lr_rule is not None:
        uses.append(("training.lr_rule.split", "chooses the learning rate on", t.lr_rule.split, t.lr_rule.n,
                     t.lr_rule.task_seed))
    if t.pilot is not None:
        uses.append(("training.pilot.split", "validates the pilot on", t.pilot.split, t.pilot.n, t.pilot.task_seed))
    for key, what, split, n, seed in uses:
        shared = held_out & questions(split, n, seed)
        if shared:
            fix = ("the task is read from a file, which gives every split all its rows: give each row a \"split\" "
                   "field (\"train\" or \"test\") so each split reads its own" if from_file else
                   "use splits that do not share questions")
            raise _error(key, f"{len(shared)} of the {len(held_out)} eval questions of tasks.{task.label} (split "
                              f"{t.eval_split!r}) are questions the study {what} (split {split!r}); {fix}")


_PER_TRAINER = "every trainer gets the same steps and learning rate (one budget and one learning-rate rule for all " \
               "trainers, per setup at most); give one number"


def _trainer_names(trainer_names: Any) -> list[str]:
    """``[training] trainers``: names of :data:`trainers.ROSTER`, none twice."""
    from trainers import ROSTER

    if isinstance(trainer_names, str) or not isinstance(trainer_names, list) or not trainer_names:
        raise _error("training.trainers", f"must be a non-empty list of {', '.join(ROSTER)}")
    for t in trainer_names:
        if t not in ROSTER:
            hint = did_you_mean(str(t), ROSTER)
            raise _error("training.trainers", f"unknown trainer {t!r}{hint}; trainers: {', '.join(ROSTER)}")
    if len(set(trainer_names)) != len(trainer_names):
        raise _error("training.trainers", f"lists a trainer twice: {trainer_names}")
    return trainer_names


def _setups(setups_spec: Mapping[str, Any], protocols: Mapping[str, ProtocolConfig], learners: list[str],
            schedule: str, steps: int, lr: float) -> dict[str, SetupConfig]:
    """``[training.setups.<label>]``: each a protocol (a ``[protocols]`` label or a protocol name, with its
    options), the learners it trains (default ``[training]``'s) and its budget (default ``[training]``'s)."""
    from trainers import ROSTER

    setups = {}
    for label, s in setups_spec.items():
        key = f"training.setups.{label}"
        _check_label(key, label, "setup")
        s = _table(key, s)
        for k in ("steps", "learning_rate"):
            if isinstance(s.get(k), Mapping):
                raise _error(f"{key}.{k}", _PER_TRAINER)
        for t in ROSTER:
            if t in s:
                raise _error(f"{key}.{t}", _PER_TRAINER)
        v = _read(key, s, options_of(SetupConfig), {"protocol": label, "steps": steps, "learning_rate": lr,
                                                     "schedule": schedule})
        own = learners if v["learners"] is None else _learners(key, None, v["learners"])
        base = v["protocol"]
        if base in protocols and "options" not in s:
            proto = protocols[base]
        else:
            proto = _protocol(key, label, {"protocol": protocols[base].protocol if base in protocols else base,
                                           "options": v["options"]})
        setups[label] = SetupConfig(label=label, protocol=proto.protocol, options=proto.options, steps=v["steps"],
                                    learning_rate=v["learning_rate"], learners=tuple(own),
                                    schedule=_schedule(f"{key}.schedule", v["schedule"]),
                                    tasks=None if v["tasks"] is None else tuple(v["tasks"]))
    return setups


def _lr_rule(spec: dict[str, Any], v: dict[str, Any], trainer_names: list[str], tasks) -> Any:
    """``[training.lr_rule]`` (:class:`crl_envs.study.gates.LearningRateRule`), or None; a learning rate given
    beside it, a sweep on the eval split or an unknown trainer is refused."""
    from crl_envs.study.gates import LearningRateRule

    if "lr_rule" not in spec:
        return None
    raw = _table("training.lr_rule", spec["lr_rule"])
    valid = [f for f in LearningRateRule.__dataclass_fields__]
    _unknown_keys("training.lr_rule", raw, valid)
    given = ["training.learning_rate"] * ("learning_rate" in spec) + \
        [f"training.setups.{k}.learning_rate" for k, s in v["setups"].items() if "learning_rate" in _table("x", s)]
    if given:
        raise _error(given[0], "the learning rate is chosen by [training.lr_rule]; remove it (or remove the rule)")
    try:
        rule = LearningRateRule(**{k: tuple(v) if k == "candidates" and isinstance(v, list) else v for k, v in raw.items()})
    except ConfigError as e:
        raise StudyConfigError(str(e)) from None
    _check_selection("training.lr_rule", "the rule", rule, v, tasks, splits='"train" or "validation"')
    return rule


def _check_selection(key: str, what: str, table: Any, v: dict[str, Any], tasks, *, splits: str) -> None:
    """The checks ``[training.lr_rule]`` and ``[training.pilot]`` share: a trainer of the roster, questions from a
    split other than the eval split, and that split loadable for every training task."""
    from trainers import ROSTER

    if table.trainer not in ROSTER:
        raise _error(f"{key}.trainer", f"unknown trainer {table.trainer!r}{did_you_mean(str(table.trainer), ROSTER)}; "
                                       f"trainers: {', '.join(ROSTER)}")
    if table.split == v["eval_split"]:
        raise _error(f"{key}.split", f"{table.split!r} is the eval split: {what} never looks at the test questions; "
                                     f"use another split (e.g. {splits})")
    for label in _labels("training.tasks", v["tasks"], tasks, "task"):
        t = tasks[label]
        _task_content(f"tasks.{label}", t.name, table.split, 1, table.task_seed, t.options, where=f"{key}.split")


def _pilot(spec: dict[str, Any], v: dict[str, Any], setups: Mapping[str, SetupConfig], tasks) -> Any:
    """``[training.pilot]`` (:class:`crl_envs.study.pilot.PilotConfig`), or None; refused beside
    ``[training.lr_rule]`` (it supersedes it), beside a steps or learning rate it fixes, with a seed of the
    comparison's, validating on the eval split, with an unknown trainer or with a setup of several learners."""
    from crl_envs.study.pilot import PilotConfig

    if "pilot" not in spec:
        return None
    if "lr_rule" in spec:
        raise _error("training.lr_rule", "[training.pilot] fixes the learning rate (it supersedes [training.lr_rule]); "
                                         "remove [training.lr_rule]")
    raw = _table("training.pilot", spec["pilot"])
    _unknown_keys("training.pilot", raw, list(PilotConfig.__dataclass_fields__))
    given = [f"training.{k}" for k in ("steps", "learning_rate") if k in spec] + \
        [f"training.setups.{label}.{k}" for label, s in v["setups"].items() for k in ("steps", "learning_rate")
         if k in _table("x", s)]
    if given:
        raise _error(given[0], "[training.pilot] fixes steps and learning rate; remove it (or remove the pilot)")
    try:
        pilot = PilotConfig(**{k: tuple(x) if isinstance(x, list) else x for k, x in raw.items()})
    except ConfigError as e:
        raise StudyConfigError(str(e)) from None
    shared = sorted(set(pilot.seeds) & set(v["seeds"]))
    if shared:
        raise _error("training.pilot.seeds", f"seed {shared[0]} is also a comparison seed (training.seeds); give the "
                                             f"pilot seeds of its own (e.g. [1000])")
    several = [label for label, s in setups.items() if len(s.learners) > 1]
    if several:
        raise _error(f"training.setups.{several[0]}.learners", "trains several learners; [training.pilot] fits one "
                                                              "learner: remove the pilot or train one learner")
    _check_selection("training.pilot", "the pilot", pilot, v, tasks, splits='"train"')
    return pilot


def _learners(key: str, learner: Any, learners: Any) -> list[str]:
    """The trained ids of ``learner =`` / ``learners =``, checked by the trainers' own rule (a list of ids,
    none twice); :func:`_check_several` checks them against the pool."""
    from trainers.learners import learner_ids as _learner_ids

    name = f"{key}.learners" if learners is not None else f"{key}.learner"
    if learners is None and (not isinstance(learner, str) or not re.fullmatch(r"model_\d+", learner)):
        raise _error(name, f"must be a pool agent id such as \"model_4\", got {learner!r}")
    try:
        return _learner_ids(learner if learners is None else None, learners)
    except (TypeError, ValueError) as e:
        raise _error(name, str(e)) from None


def _check_several(setups: Mapping[str, SetupConfig], where: Mapping[str, str], trainer_names: list[str],
                   pool: PoolConfig, crossplay: bool, lora: bool) -> None:
    """Each setup's learners by the trainers' own rules, before anything loads: in the pool, not a served or
    scripted member (:func:`trainers.learners.check_learner_specs`), several only on trainers that train several
    (``multi_learner``); with ``crossplay``, every learner has partners it never trained with
    (:func:`trainers.crossplay.crossplay_settings`). ``where``: setup -> the key its learners came from."""
    from trainers import TRAINERS
    from trainers.crossplay import crossplay_settings
    from trainers.learners import check_learner_specs as _check_learner_specs

    members: Any = pool.members
    if pool.named == "zoo":
        import agents.zoo

        members = [f"zoo:{n}" for n in agents.zoo.NAMES]
    single = [t for t in trainer_names if not TRAINERS[t].multi_learner]
    for label, s in setups.items():
        key = where[label]
        try:
            if members:
                _check_learner_specs([_scripted(m) for m in members], list(s.learners), lora=lora)
        except (TypeError, ValueError) as e:
            raise _error(key, str(e)) from None
        if len(s.learners) > 1 and single:
            multi = [t for t in TRAINERS if TRAINERS[t].multi_learner]
            raise _error(key, f"{len(s.learners)} learners, but trainers {single} train one learner each; set "
                              f"training.trainers to trainers that train several ({', '.join(multi)})")
        n = _pool_size(pool)
        if crossplay and n is not None:
            try:
                crossplay_settings([f"model_{i}" for i in range(n)], s.learners)
            except ValueError as e:
                raise _error("training.crossplay", f"setup {label!r}: {e}; or set crossplay = false") from None


def _pool_size(pool: PoolConfig) -> int | None:
    """The pool's size where the config says it (member lists, the zoo); ``None`` for other named pools."""
    if pool.named == "zoo":
        import agents.zoo

        return len(agents.zoo.NAMES)
    return len(pool.members) if pool.members else None


def _scripted(member: Any) -> Any:
    """A ``{expert = ...}`` member as the scripted agent it builds (cheap), for the trainers' checks."""
    if not isinstance(member, Mapping):
        return member
    from agents import ScriptedAgent

    return ScriptedAgent.expert(member.get("name", f"expert-{member['expert']}"), float(member["expert"]))


def _schedule(key: str, value: Any) -> str:
    """A schedule of :data:`trainers.config.SCHEDULES` (the trainers' list)."""
    from trainers.config import SCHEDULES

    if value not in SCHEDULES:
        raise _error(key, f"must be one of {list(SCHEDULES)} (how several learners take turns), got {value!r}")
    return value


def _executor(spec: dict[str, Any]) -> ExecutorConfig:
    from crl_envs.valuation.executors import EXECUTORS

    v = _read("executor", spec, options_of(ExecutorConfig))
    kind = v["kind"]
    if kind not in EXECUTORS:
        hint = did_you_mean(str(kind), EXECUTORS)
        raise _error("executor.kind", f"unknown executor {kind!r}{hint}; choose one of {', '.join(EXECUTORS)}")
    if v["workers"] is not None and kind != "processes":
        raise _error("executor.workers", f"only applies to kind = \"processes\" (kind is {kind!r}; "
                                         f"{'num_cpus sets a Ray cell' if kind == 'ray' else 'local runs in this process'}"
                                         "); remove it or set kind = \"processes\"")
    address = v["address"]
    if address is not None:
        if kind != "ray":
            raise _error("executor.address", f"only applies to kind = \"ray\" (kind is {kind!r}); remove it")
        from crl_envs.valuation.executors import parse_address

        try:
            if address not in ("auto", "local"):
                parse_address(address)
        except ValueError as e:
            raise _error("executor.address", str(e)) from None
    return ExecutorConfig(**v)


def _check_cell_count(valuation: ValuationConfig | None, training: TrainingConfig | None) -> None:
    """Refuse a grid of more than MAX_CELLS cells before any cell is built (counted, not listed)."""
    parts = []
    if valuation is not None:
        parts.append((len(valuation.pools) * len(valuation.protocols) * len(valuation.tasks) * len(valuation.seeds),
                      "valuation.pools/protocols/tasks/seeds"))
    if training is not None:
        settings = sum(len(s.trained_tasks(training.tasks)) for s in training.setups.values())
        parts.append((settings * (1 + len(training.trainers) * len(training.seeds)),
                      "training.setups/tasks/trainers/seeds"))
    total = sum(n for n, _ in parts)
    if total > MAX_CELLS:
        biggest = max(parts)[1]
        raise _error(biggest.split(".")[0], f"the plan has {total:,} cells, more than the {MAX_CELLS:,} a study "
                                            f"runs; shorten {biggest} (or split the study in several configs)")
