"""A study's config: pools, protocols, tasks, valuation, training, sampling, executor; validated before
any work, each error one line naming the key and the fix.

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
    max_new_tokens = 24                 # this task's answer length (valuation and training); default [sampling]'s

    [protocols.debate]                  # label = a protocol (default: the label) and its options
    options = {rounds = 2}

    [valuation]                         # one cell per pool x protocol x task x seed: valuation.evaluate
    estimator = "exact"                 # or {exact_up_to = 6, larger = "loo"} (estimator per pool size)
    seeds = [0]
    alpha = 0.05
    delta = 0.3                         # "decoupled": the CI of tau inside (-delta, +delta) (crl_envs.stats)

    pool_tasks = {zoo = ["arith"]}      # optional: a pool valued on some tasks only (default: every task)

    [valuation.families]                # optional: family label = protocol labels or library families
    api = ["routing", "cascade"]        # default: each protocol's library family (crl_envs.protocols.FAMILIES)
    text = ["aggregation", "judging", "text exchange"]

    [training]                          # one cell per setup x task x trainer x seed: a trainer's fit()
    pool = "zoo"                        # one pool, apart from [valuation] pools
    learner = "model_4"                 # or learners = ["model_3", "model_4"] (several, trained together),
                                        #   schedule = "joint" | "round_robin"; a setup may set its own
    trainers = ["crl", "grpo", "placebo"]   # default: trainers.ROSTER (every trainer, Shapley credit and the placebo)
    crossplay = false                   # true: crossplay cells (trained learners with unseen partners)
    tasks = ["arith"]
    seeds = [0, 1, 2]                   # the default: 3 seeds
    steps = 24                          # defaults of steps, learning_rate, questions_per_step and
    learning_rate = 1e-3                #   num_generations: trainers.TrainerConfig's

    [training.lr_rule]                  # optional, instead of learning_rate: a sweep chooses it before the
    candidates = [1e-3, 1e-4, 3e-5]     #   comparison (crl_envs.study.gates.LearningRateRule): GRPO on its own
    select = "largest_kept"             #   seed, scored on questions of another split/seed, never the eval split

    [training.setups.judge-plurality]   # label = a protocol (a [protocols] label or a protocol name)
    protocol = "judge"
    options = {judge = "{learner}"}
    steps = 48                          # a setup's budget and learning rate hold for EVERY trainer

    [sampling]                          # the valuation's sampling (training evaluates greedily)
    temperature = 0.0
    max_new_tokens = 24                 # default trainers.TrainerConfig's; a task's max_new_tokens wins

    [executor]
    kind = "local"                      # "processes" (workers = 2) or "ray" (address = "head:6379")
    coalitions_per_task = 4             # optional: coalitions per lockstep group (default: the executor's)
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def _max_new_tokens(key: str, value: Any) -> int:
    value = _int(key, value, 1, "24")
    if value > MAX_NEW_TOKENS:
        raise _error(key, f"must be at most {MAX_NEW_TOKENS:,} (an answer's tokens), got {value:,}")
    return value


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


# ---------------------------------------------------------------------- the parts
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


@dataclass(frozen=True)
class TaskConfig:
    """A task; ``max_new_tokens`` (``None``: ``[sampling]``'s) is its answer length, kept out of
    :meth:`describe` since it is sampling (cells carry it in their sampling)."""

    label: str
    name: str
    n: int | None
    split: str | None
    seed: int
    options: dict[str, Any]
    max_new_tokens: int | None = None
    content: str | None = None  # a digest of the loaded examples (see _task_content)

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "n": self.n, "split": self.split, "seed": self.seed, "options": self.options}
        return d if self.content is None else {**d, "content": self.content}


@dataclass(frozen=True)
class ProtocolConfig:
    label: str
    protocol: str
    options: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "options": self.options}


@dataclass(frozen=True)
class ValuationConfig:
    pools: list[str]
    protocols: list[str]
    tasks: list[str]
    estimator: str | dict[str, Any]
    samples: int
    seeds: list[int]
    budget: int | None
    alpha: float
    ci_level: float
    bootstrap_resamples: int
    delta: float = 0.3
    families: dict[str, str] = field(default_factory=dict)  # protocol label -> family label
    pool_tasks: dict[str, list[str]] = field(default_factory=dict)  # pool label -> its tasks (default: tasks)

    def tasks_of(self, pool: str) -> list[str]:
        """The tasks pool ``pool`` is valued on: its ``pool_tasks`` entry, else ``tasks``."""
        return self.pool_tasks.get(pool, self.tasks)

    def estimator_for(self, n: int) -> str:
        """The estimator for a pool of ``n`` models (:func:`crl_envs.valuation.estimators.estimator_for`)."""
        return estimator_for(n, self.estimator)


@dataclass(frozen=True)
class SetupConfig:
    label: str
    protocol: str
    options: dict[str, Any]
    steps: int
    learning_rate: float
    #: the pool members trained together in this setup (one: the single-learner case)
    learners: tuple[str, ...] = ()
    #: with several learners, ``"joint"`` or ``"round_robin"`` (:data:`trainers.config.SCHEDULES`)
    schedule: str = "joint"


@dataclass(frozen=True)
class TrainingConfig:
    """``[training]``: every trainer gets each setup's ``steps`` and ``learning_rate`` (one budget and one
    learning-rate rule for all); defaults are :class:`trainers.TrainerConfig`'s."""

    pool: str
    learner: str
    setups: dict[str, SetupConfig]
    tasks: list[str]
    trainers: list[str]
    seeds: list[int]
    questions_per_step: int
    num_generations: int
    n_train: int
    n_eval: int
    train_split: str
    eval_split: str
    shapley_coalitions: int | None
    lora: dict[str, Any] | None
    bootstrap_resamples: int
    ci_level: float
    alpha: float
    threads: int
    #: after each training cell, play its learners with partners they never trained with (crossplay cells)
    crossplay: bool = False
    #: ``[training.lr_rule]``: the learning rate chosen before the comparison by a sweep (None: the setups' rates)
    lr_rule: Any = None


@dataclass(frozen=True)
class ExecutorConfig:
    kind: str
    workers: int | None
    address: str | None
    num_cpus: float
    #: coalitions one lockstep group plays (None: the executor's default, a whole game locally and one
    #: coalition per task on processes and Ray); fewer means smaller batches, but a killed run loses less
    coalitions_per_task: int | None = None


@dataclass(frozen=True)
class StudyConfig:
    """A validated study config (see the module docstring for the format)."""

    name: str
    out: Path
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
    trackers: tuple[str, ...] = ()

    def sampling_for(self, task: str) -> dict[str, Any]:
        """``[sampling]`` with the task's own ``max_new_tokens`` where it sets one (valuation and training)."""
        own = self.tasks[task].max_new_tokens
        return self.sampling if own is None else {**self.sampling, "max_new_tokens": own}


# ---------------------------------------------------------------------- parsing
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
    study = _table("study", raw.get("study"))
    _unknown_keys("study", study, ["name", "out", "trackers"])
    try:
        trackers = check_trackers(study.get("trackers", []), "trackers")
    except (TypeError, ValueError) as e:
        raise _error("study.trackers", str(e).removeprefix("trackers: ")) from None
    name = study.get("name", source.stem if source else "study")
    _check_label("study.name", name, "study name")
    out_dir = Path(out) if out is not None else Path(study.get("out", f"runs/{name}"))
    if source is not None and not out_dir.is_absolute() and out is None:
        out_dir = Path.cwd() / out_dir

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
    return StudyConfig(name=name, out=out_dir, pools=pools, tasks=tasks, protocols=protocols, valuation=valuation,
                       training=training, sampling=sampling, executor=_executor(_table("executor", raw.get("executor"))),
                       source=source, raw=raw, trackers=trackers)


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
        _unknown_keys(key, member, ["expert", "name", "seed"])
        if "expert" not in member:
            raise _error(key, "a scripted member needs expert = <accuracy in [0, 1]>, e.g. {expert = 0.8}")
        _number(f"{key}.expert", member["expert"], 0.0, 1.0, "0.8")
        if "seed" in member:
            _int(f"{key}.seed", member["seed"])
        if "name" in member and not isinstance(member["name"], str):
            raise _error(f"{key}.name", f"must be a string, got {member['name']!r}")
        return dict(member)
    raise _error(key, f"a member is an agent spec string or {{expert = <accuracy>}}, got {member!r}")


def _task(label: str, spec: Any) -> TaskConfig:
    key = f"tasks.{label}"
    _check_label(key, label, "task")
    spec = _table(key, spec)
    _unknown_keys(key, spec, ["name", "n", "split", "seed", "options", "max_new_tokens"])
    from crl_envs import tasks as task_registry
    name = spec.get("name", label)
    known = task_registry.names()
    if name not in known:
        hint = did_you_mean(str(name), known)
        raise _error(f"{key}.name", f"unknown task {name!r}{hint}; known tasks: {', '.join(known)}")
    n = spec.get("n")
    if n is not None:
        _int(f"{key}.n", n, 1, "n = 100")
    split = spec.get("split")
    if split is not None and not isinstance(split, str):
        raise _error(f"{key}.split", f"must be a split name such as \"test\", got {split!r}")
    options = _table(f"{key}.options", spec.get("options"))
    valid = task_registry.option_names(name)
    if options and valid is not None:
        _unknown_keys(f"{key}.options", options, valid)
    mnt = spec.get("max_new_tokens")
    if mnt is not None:
        _max_new_tokens(f"{key}.max_new_tokens", mnt)
    seed = _int(f"{key}.seed", spec.get("seed", 0))
    return TaskConfig(label, name, n, split, seed, options, mnt,
                      _task_content(key, name, split, n, seed, options))


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
    spec = _table(key, spec)
    _unknown_keys(key, spec, ["protocol", "options"])
    from crl_envs import protocols

    name = spec.get("protocol", label)
    if not isinstance(name, str) or name.removesuffix("_v0") not in protocols.PROTOCOLS:
        known = list(protocols.PROTOCOLS)
        hint = did_you_mean(str(name), known)
        raise _error(f"{key}.protocol", f"unknown protocol {name!r}{hint}; protocols: {', '.join(known)} "
                                        f"(set protocol = \"...\" when the label is not a protocol name)")
    options = _table(f"{key}.options", spec.get("options"))
    try:
        protocols.check_options(name, options)
    except ValueError as e:
        raise _error(f"{key}.options", str(e)) from None
    return ProtocolConfig(label, name.removesuffix("_v0"), options)


def _sampling(spec: dict[str, Any]) -> dict[str, Any]:
    _unknown_keys("sampling", spec, ["temperature", "top_p", "max_new_tokens"])
    out = {"temperature": _number("sampling.temperature", spec.get("temperature", 0.0), 0.0, 10.0, "0.0"),
           "top_p": _number("sampling.top_p", spec.get("top_p", 1.0), 0.0, 1.0, "1.0")}
    out["max_new_tokens"] = _max_new_tokens("sampling.max_new_tokens",
                                            spec.get("max_new_tokens", _trainer_defaults()["max_new_tokens"]))
    if out["top_p"] == 0.0:
        raise _error("sampling.top_p", "must be > 0 (1.0 keeps every token)")
    return out


def _valuation(spec: dict[str, Any], pools, protocols, tasks) -> ValuationConfig:
    valid = ["pools", "protocols", "tasks", "estimator", "samples", "seeds", "budget", "alpha", "ci_level",
             "bootstrap_resamples", "delta", "families", "pool_tasks"]
    _unknown_keys("valuation", spec, valid)
    if not protocols:
        raise _error("protocols", "valuation needs at least one protocol, e.g. [protocols.vote]")
    estimator = spec.get("estimator", "exact")
    if isinstance(estimator, Mapping):
        _unknown_keys("valuation.estimator", estimator, ["exact_up_to", "larger"])
        estimator = {"exact_up_to": _int("valuation.estimator.exact_up_to", estimator.get("exact_up_to", 8), 1, "8"),
                     "larger": estimator.get("larger", "loo")}
        names = [estimator["larger"]]
    else:
        names = [estimator]
    for e in names:
        if e not in ESTIMATORS:
            hint = did_you_mean(str(e), ESTIMATORS)
            raise _error("valuation.estimator", f"unknown estimator {e!r}{hint}; choose one of {', '.join(ESTIMATORS)}")
    budget = spec.get("budget")
    sampled = any(e in SAMPLED_ESTIMATORS for e in names)
    if sampled and budget is None:
        raise _error("valuation.budget", "the permutation/antithetic estimators need budget = <permutations>, e.g. 200")
    if budget is not None:
        if not sampled:
            raise _error("valuation.budget", "only applies to estimator \"permutation\" or \"antithetic\"; remove it")
        _int("valuation.budget", budget, 2, "200")
        for e in names:
            if problem := estimator_class(e).budget_problem(budget):
                raise _error("valuation.budget", f"estimator {e!r} {problem}")
        if budget > MAX_COALITION_RUNS:
            raise _error("valuation.budget", f"{budget:,} permutations is more than the {MAX_COALITION_RUNS:,} a "
                                             f"valuation cell runs; lower it (e.g. budget = 200)")
    alpha = _number("valuation.alpha", spec.get("alpha", 0.05), 0.0, 1.0, "0.05")
    if not 0 < alpha < 1:
        raise _error("valuation.alpha", f"must lie strictly between 0 and 1 (e.g. 0.05), got {alpha!r}")
    ci = _number("valuation.ci_level", spec.get("ci_level", 0.95), 0.0, 1.0, "0.95")
    if not 0 < ci < 1:
        raise _error("valuation.ci_level", f"must lie strictly between 0 and 1 (e.g. 0.95), got {ci!r}")
    delta = _number("valuation.delta", spec.get("delta", 0.3), 0.0, 1.0, "0.3")
    if not 0 < delta < 1:
        raise _error("valuation.delta", f"must lie strictly between 0 and 1 (e.g. 0.3), got {delta!r}")
    chosen = _labels("valuation.protocols", spec.get("protocols"), protocols, "protocol")
    valued = _labels("valuation.pools", spec.get("pools"), pools, "pool")
    pool_tasks = _table("valuation.pool_tasks", spec.get("pool_tasks"))
    for pool, listed in pool_tasks.items():
        if pool not in valued:
            raise _error(f"valuation.pool_tasks.{pool}", f"is not a valued pool; valued pools: {', '.join(valued)}")
        pool_tasks[pool] = _labels(f"valuation.pool_tasks.{pool}", listed, tasks, "task")
    return ValuationConfig(
        pools=valued, pool_tasks=pool_tasks,
        protocols=chosen, delta=delta,
        families=_families(_table("valuation.families", spec.get("families")), {p: protocols[p] for p in chosen}),
        tasks=_labels("valuation.tasks", spec.get("tasks"), tasks, "task"),
        estimator=estimator, samples=_int("valuation.samples", spec.get("samples", 1), 1, "1"),
        seeds=_seeds("valuation.seeds", spec.get("seeds", [0])), budget=budget, alpha=alpha, ci_level=ci,
        bootstrap_resamples=_int("valuation.bootstrap_resamples", spec.get("bootstrap_resamples", 2000), 1, "2000"))


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
    valid = ["pool", "learner", "setups", "tasks", "trainers", "seeds", "steps", "learning_rate", "questions_per_step",
             "num_generations", "n_train", "n_eval", "train_split", "eval_split",
             "shapley_coalitions", "lora", "bootstrap_resamples", "ci_level", "alpha", "threads", "learners",
             "schedule", "crossplay", "lr_rule"]
    if "max_new_tokens" in spec:
        raise _error("training.max_new_tokens", "moved: a task's answer length is [tasks.<label>] max_new_tokens "
                                                "(or [sampling] max_new_tokens for every task), for valuation and "
                                                "training alike; remove it here")
    _unknown_keys("training", spec, valid)
    defaults = _trainer_defaults()
    pool = spec.get("pool")
    if pool not in pools:
        raise _error("training.pool", f"must name a pool of [pools] ({', '.join(pools)}), got {pool!r}")
    if "learner" in spec and "learners" in spec:
        raise _error("training.learners", "give learner = \"model_4\" (one) or learners = [...] (several), not both")
    learners = _learners("training", spec.get("learner", "model_0") if "learners" not in spec else None,
                         spec.get("learners"))
    learner = learners[0]
    schedule = _schedule("training.schedule", spec.get("schedule", "joint"))
    crossplay = spec.get("crossplay", False)
    if not isinstance(crossplay, bool):
        raise _error("training.crossplay", f"must be true or false, got {crossplay!r}")
    for k in ("steps", "learning_rate"):
        if isinstance(spec.get(k), Mapping):
            raise _error(f"training.{k}", _PER_TRAINER)
    steps = _int("training.steps", spec.get("steps", defaults["steps"]), 1, "24")
    lr = _number("training.learning_rate", spec.get("learning_rate", defaults["learning_rate"]), 0.0, 1.0, "1e-3")
    setups_spec = _table("training.setups", spec.get("setups"))
    if not setups_spec:
        raise _error("training.setups", "define at least one setup, e.g. [training.setups.vote] (a protocol to train in)")
    trainer_names = _trainer_names(spec)
    setups = _setups(setups_spec, protocols, learners, schedule, steps, lr)
    where = {label: f"training.setups.{label}.learners" if "learners" in setups_spec[label] else
             "training.learners" if "learners" in spec else "training.learner" for label in setups}
    _check_several(setups, where, trainer_names, pools[pool], crossplay, spec.get("lora") is not None)
    lora = spec.get("lora")
    if lora is not None:
        lora = _table("training.lora", lora)
        _unknown_keys("training.lora", lora, ["r", "alpha", "dropout", "target_modules"])
    sc = spec.get("shapley_coalitions", 2)
    alpha = _number("training.alpha", spec.get("alpha", 0.05), 0.0, 1.0, "0.05")
    if not 0 < alpha < 1:
        raise _error("training.alpha", f"must lie strictly between 0 and 1 (e.g. 0.05), got {alpha!r}")
    for label in _labels("training.tasks", spec.get("tasks"), tasks, "task"):  # the splits load (one question)
        t = tasks[label]
        for split_key, default in (("train_split", "train"), ("eval_split", "test")):
            _task_content(f"tasks.{label}", t.name, str(spec.get(split_key, default)), 1, t.seed, t.options,
                          where=f"training.{split_key}")
    lr_rule = _lr_rule(spec, setups_spec, trainer_names, tasks)
    config = TrainingConfig(
        pool=pool, learner=learner, setups=setups,
        tasks=_labels("training.tasks", spec.get("tasks"), tasks, "task"), trainers=list(trainer_names),
        seeds=_seeds("training.seeds", spec.get("seeds", [0, 1, 2])),
        questions_per_step=_int("training.questions_per_step",
                                spec.get("questions_per_step", defaults["questions_per_step"]), 1, "8"),
        num_generations=_int("training.num_generations", spec.get("num_generations", defaults["num_generations"]),
                             2, "8"),
        n_train=_int("training.n_train", spec.get("n_train", 1000), 1, "1000"),
        n_eval=_int("training.n_eval", spec.get("n_eval", 200), 1, "200"),
        train_split=str(spec.get("train_split", "train")), eval_split=str(spec.get("eval_split", "test")),
        shapley_coalitions=None if sc is None else _int("training.shapley_coalitions", sc, 1, "2"),
        lora=lora, bootstrap_resamples=_int("training.bootstrap_resamples", spec.get("bootstrap_resamples", 5000), 1),
        ci_level=_number("training.ci_level", spec.get("ci_level", 0.95), 0.5, 0.999, "0.95"), alpha=alpha,
        threads=_int("training.threads", spec.get("threads", 1), 1, "1"), crossplay=crossplay, lr_rule=lr_rule)
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


def _trainer_names(spec: Mapping[str, Any]) -> list[str]:
    """``[training] trainers``: names of :data:`trainers.ROSTER`, none twice (default: the whole roster)."""
    from trainers import ROSTER

    trainer_names = spec.get("trainers", list(ROSTER))
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
        _unknown_keys(key, s, ["protocol", "options", "steps", "learning_rate", "learners", "schedule"])
        own = learners if "learners" not in s else _learners(key, None, s["learners"])
        base = s.get("protocol", label)
        if base in protocols and "options" not in s:
            proto = protocols[base]
        else:
            proto = _protocol(key, label, {"protocol": protocols[base].protocol if base in protocols else base,
                                           "options": s.get("options", {})})
        setups[label] = SetupConfig(label, proto.protocol, proto.options,
                                    _int(f"{key}.steps", s.get("steps", steps), 1, "24"),
                                    _number(f"{key}.learning_rate", s.get("learning_rate", lr), 0.0, 1.0, "1e-3"),
                                    tuple(own), _schedule(f"{key}.schedule", s.get("schedule", schedule)))
    return setups


def _lr_rule(spec: dict[str, Any], setups_spec: Mapping[str, Any], trainer_names: list[str], tasks) -> Any:
    """``[training.lr_rule]`` (:class:`crl_envs.study.gates.LearningRateRule`), or None; a learning rate given
    beside it, a sweep on the eval split or an unknown trainer is refused."""
    from crl_envs.study.gates import LearningRateRule
    from trainers import ROSTER

    if "lr_rule" not in spec:
        return None
    raw = _table("training.lr_rule", spec["lr_rule"])
    valid = [f for f in LearningRateRule.__dataclass_fields__]
    _unknown_keys("training.lr_rule", raw, valid)
    given = ["training.learning_rate"] * ("learning_rate" in spec) + \
        [f"training.setups.{k}.learning_rate" for k, s in setups_spec.items() if "learning_rate" in _table("x", s)]
    if given:
        raise _error(given[0], "the learning rate is chosen by [training.lr_rule]; remove it (or remove the rule)")
    try:
        rule = LearningRateRule(**{k: tuple(v) if k == "candidates" and isinstance(v, list) else v for k, v in raw.items()})
    except ConfigError as e:
        raise StudyConfigError(str(e)) from None
    if rule.trainer not in ROSTER:
        raise _error("training.lr_rule.trainer", f"unknown trainer {rule.trainer!r}{did_you_mean(str(rule.trainer), ROSTER)}; "
                                                 f"trainers: {', '.join(ROSTER)}")
    if rule.split == str(spec.get("eval_split", "test")):
        raise _error("training.lr_rule.split", f"{rule.split!r} is the eval split: the rule never looks at the test "
                                               f"questions; use another split (e.g. \"train\" or \"validation\")")
    for label in _labels("training.tasks", spec.get("tasks"), tasks, "task"):
        t = tasks[label]
        _task_content(f"tasks.{label}", t.name, rule.split, 1, rule.task_seed, t.options, where="training.lr_rule.split")
    return rule


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

    _unknown_keys("executor", spec, ["kind", "workers", "address", "num_cpus", "coalitions_per_task"])
    kind = spec.get("kind", "local")
    if kind not in EXECUTORS:
        hint = did_you_mean(str(kind), EXECUTORS)
        raise _error("executor.kind", f"unknown executor {kind!r}{hint}; choose one of {', '.join(EXECUTORS)}")
    workers = spec.get("workers")
    if workers is not None:
        _int("executor.workers", workers, 1, "2")
        if kind != "processes":
            raise _error("executor.workers", f"only applies to kind = \"processes\" (kind is {kind!r}; "
                                             f"{'num_cpus sets a Ray cell' if kind == 'ray' else 'local runs in this process'}"
                                             "); remove it or set kind = \"processes\"")
    address = spec.get("address")
    if address is not None:
        if kind != "ray":
            raise _error("executor.address", f"only applies to kind = \"ray\" (kind is {kind!r}); remove it")
        from crl_envs.valuation.executors import parse_address

        try:
            if address not in ("auto", "local"):
                parse_address(address)
        except ValueError as e:
            raise _error("executor.address", str(e)) from None
    per_task = spec.get("coalitions_per_task")
    if per_task is not None:
        _int("executor.coalitions_per_task", per_task, 1, "4")
    return ExecutorConfig(kind, workers, address, _number("executor.num_cpus", spec.get("num_cpus", 1), 0.01, None, "1"),
                          per_task)


def _check_cell_count(valuation: ValuationConfig | None, training: TrainingConfig | None) -> None:
    """Refuse a grid of more than MAX_CELLS cells before any cell is built (counted, not listed)."""
    parts = []
    if valuation is not None:
        parts.append((len(valuation.pools) * len(valuation.protocols) * len(valuation.tasks) * len(valuation.seeds),
                      "valuation.pools/protocols/tasks/seeds"))
    if training is not None:
        parts.append((len(training.setups) * len(training.tasks) * (1 + len(training.trainers) * len(training.seeds)),
                      "training.setups/tasks/trainers/seeds"))
    total = sum(n for n, _ in parts)
    if total > MAX_CELLS:
        biggest = max(parts)[1]
        raise _error(biggest.split(".")[0], f"the plan has {total:,} cells, more than the {MAX_CELLS:,} a study "
                                            f"runs; shorten {biggest} (or split the study in several configs)")
