"""The :class:`Trainer` protocol and :class:`PolicyGradientTrainer`, the loop every built-in trainer
shares: rollout -> rewards -> advantages -> clipped policy-gradient loss -> optimizer step.

A trainer subclass only says how to *collect* a step's rollouts and rewards (:meth:`collect`); the loop
(advantage estimator and loss by name, gradient accumulation, KL to the reference) is here, and what it
stands on lives beside it:

- :mod:`trainers.learners` — each learner's state (policy, optimizer, KL reference, LoRA, the rollout engine
  and its weight sync) and the checks of ``learner=`` / ``learners=`` before any model is loaded;
- :mod:`trainers.update` — one learner's clipped policy-gradient update (micro-batches, clipping, KL reference);
- :mod:`trainers.state` — :class:`TrainerState` (steps, rollouts, history: what checkpoints read and write) and
  :class:`TrainerControl` (what a callback sets to stop the fit or have a checkpoint written);
- :mod:`trainers.checkpoints` — checkpoints that resume after a kill, the metrics log kept in step, ``save_model``;
- :mod:`trainers.callbacks` — the progress bar, ``metrics.jsonl`` and the trackers, as callbacks (yours too);
- :mod:`trainers.evaluation` — :func:`evaluate_policy`, :class:`EvalResult`, :func:`compare`.
"""

from __future__ import annotations

import abc
import inspect
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from agents import Agent, Pool, SamplingParams, stable_hash
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.runner import Episode, RequestMemo
from crl_envs.stats import PairedCI, paired_bootstrap_ci  # noqa: F401  (the statistics live there)
from crl_envs.tasks import Task
from crl_envs.valuation.credit import Credit, SystemCredit
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.safe_io import read_json
from crl_kit.serial import jsonable
from trainers import checkpoints as checkpoint_files
from trainers.advantages import ADVANTAGES, compute_advantages
from trainers.callbacks import (
    FAILED,
    FINISHED,
    KILLED,
    TrackersCallback,
    TrainerCallback,
    check_callbacks,
    default_callbacks,
)
from trainers.checkpoints import RESUMABLE_FIELDS  # noqa: F401  (re-exported: it was defined here)
from trainers.config import TrainerConfig
from trainers.evaluation import EvalResult, Improvement, compare, evaluate_policy  # noqa: F401  (re-exported)
from trainers.learners import (
    LearnerState,
    check_learner_specs,
    check_one_base,
    check_trainable,
    learner_ids,
    load_into_rollout_policy,
    make_rollout_policy,
    make_shared_states,
    make_state,
    merged_weights,  # noqa: F401  (re-exported: trainers.base.merged_weights)
    per_learner,
)
from trainers.losses import get_loss
from trainers.rollout import LearnerSequence, learner_sequences, rollout_episodes
from trainers.state import TrainerControl, TrainerState
from trainers.update import policy_gradient_update

# The names these helpers had when they lived here (crl_envs.study.config imports the first two).
_learner_ids, _check_learner_specs, _LearnerState = learner_ids, check_learner_specs, LearnerState


@runtime_checkable
class Trainer(Protocol):
    """What every trainer offers: train, then measure the system and the learner alone."""

    def fit(self) -> list[dict[str, Any]]: ...

    def evaluate(self, task: Task | None = None) -> EvalResult: ...


@dataclass
class RolloutBatch:
    """One step's rollouts. ``rewards[g, k]`` is the reward of episode ``episodes[index[g][k]]``;
    ``context`` goes to the advantage estimator; ``rollouts`` counts every episode played.

    With several learners, ``per_learner[j]`` is learner ``j``'s own view where its credit differs
    from the shared one (its LOO counterfactual, its Shapley coalitions): the groups it trains on
    (``index`` into the same ``episodes``), their rewards and context. A learner absent from it
    trains on the shared batch (C-RL: the system's outcome is every learner's credit)."""

    episodes: list[Episode]
    rewards: torch.Tensor
    index: list[list[int]]
    context: dict[str, torch.Tensor] = field(default_factory=dict)
    rollouts: int = 0
    per_learner: dict[str, RolloutBatch] = field(default_factory=dict)

    def of(self, learner: str) -> RolloutBatch:
        """Learner ``learner``'s view: its entry in ``per_learner``, else this batch."""
        return self.per_learner.get(learner, self)


#: The methods a subclass may override that the loop passes ``training`` to.
TAKES_TRAINING = ("collect", "advantages")


def _takes_training(method: Callable[..., Any]) -> bool:
    """Whether an overridden :meth:`PolicyGradientTrainer.collect` or ``advantages`` takes ``training``."""
    parameters = inspect.signature(method).parameters.values()
    return any(p.name == "training" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _without_training(cls: type) -> frozenset[str]:
    """Which of :data:`TAKES_TRAINING` ``cls`` overrides without a ``training`` parameter (written before the
    loop passed it): asked once per trainer, with one deprecation warning; those are called without it and
    read :attr:`PolicyGradientTrainer.training`."""
    old = frozenset(name for name in TAKES_TRAINING if not _takes_training(getattr(cls, name)))
    if old:
        methods = ", ".join(f"{cls.__name__}.{name}" for name in sorted(old))
        warnings.warn(f"{methods} without a training parameter is deprecated: add training=None and pass it on "
                      f"(self.play(..., training=training)); it reads self.training meanwhile",
                      DeprecationWarning, stacklevel=3)
    return old


class PolicyGradientTrainer(abc.ABC):
    """Group-baseline policy-gradient training of one or several agents of ``pool`` inside ``protocol``.

    Args:
        protocol: a protocol factory or name (``crl_envs.debate_v0``, ``"vote"``).
        pool: the models; ``pool[learner]`` must expose ``.model`` / ``.tokenizer`` (an
            :class:`agents.HFAgent`). It is deep-copied: the pool itself is never modified.
        task: training questions (a Task or a task name).
        learner: the agent id trained (``"model_0"``, the default when ``learners`` is not given).
        config: the trainer's config dataclass (defaults if ``None``).
        eval_task: held-out questions for :meth:`evaluate` (default: ``task``'s test split when
            ``task`` is a name, else required at :meth:`evaluate`).
        policy: start from this agent instead of a copy of ``pool[learner]`` (several learners: a dict
            learner id -> agent, for any of them).
        rollout_policy: the learner's rollouts on another engine: an agent with ``load_weights``
            (:class:`agents.VLLMAgent` built on the learner's model, its own engine), or ``"vllm"``
            to build one on the learner's model directory. Gradients stay on the HF policy; before
            each step's rollouts the policy's current weights (LoRA merged) are loaded into it
            whenever they changed (:meth:`sync_rollout_policy`), so every rollout is on-policy.
            Partners play on whatever backend the pool gives them (``agents.pool("pretrained-vllm")``).
            Several learners: ``"vllm"`` (one engine each) or a dict learner id -> agent. With
            ``config.lora_shared_base``: ``"vllm"`` is one engine on the base with LoRA on and ``max_loras`` =
            the number of learners, one agent per learner on it (or a dict of agents with ``set_lora``); each
            adapter that changed is re-saved and served under a new ``LoRARequest`` id before the rollouts.
        learners: several pool members trained at once (``["model_3", "model_4"]``), each a trainable
            policy in the same rollouts with its own credit, group baseline, optimizer and checkpoint
            files; ``config.schedule`` says whether a step updates all of them (``"joint"``) or one in
            turn (``"round_robin"``, the others playing greedily as partners). Only trainers whose
            :attr:`multi_learner` is True accept more than one.
        callbacks: :class:`trainers.TrainerCallback` instances called around :meth:`fit` after the defaults
            (the progress bar, ``metrics.jsonl``, the trackers: :func:`trainers.callbacks.default_callbacks`);
            they read :attr:`state` and may set :attr:`control` (stop the fit, ask for a checkpoint).

    Raises:
        ValueError / TypeError: one line, before any model is copied or loaded by the trainer, for a
            learner not in the pool, one listed twice, ``learner`` and ``learners`` both given, a
            learner that is not a transformers model (a scripted agent, a server), LoRA on a backend
            that is not HF, several learners on a trainer that trains one, or with ``config.lora_shared_base``
            learners that are not copies of one base model (different specs, classes, configs, tokenizers or
            weights) or one rollout agent for several learners.
    """

    config_class: type[TrainerConfig] = TrainerConfig
    #: Whether :meth:`collect` handles several learners (:attr:`training`); built-in: C-RL, LOO, Shapley.
    multi_learner: bool = False

    @classmethod
    def credit_for(cls, config: TrainerConfig) -> Credit:
        """The learner's credit under ``config`` (:mod:`crl_envs.valuation.credit`): the coalitions :meth:`collect`
        plays, the reward, and the episodes per question a study's cost estimate reads. C-RL's: the system's score."""
        return SystemCredit()

    @property
    def credit(self) -> Credit:
        """:meth:`credit_for` this trainer's config."""
        return self.credit_for(self.config)

    def __init__(
        self,
        protocol: Any,
        pool: Pool | Sequence[Agent | str] | str,
        task: Task | str,
        learner: str | None = None,
        config: TrainerConfig | None = None,
        *,
        eval_task: Task | str | None = None,
        policy: Agent | Mapping[str, Agent] | None = None,
        rollout_policy: Agent | str | Mapping[str, Agent | str] | None = None,
        learners: Sequence[str] | None = None,
        callbacks: Sequence[TrainerCallback] | None = None,
    ):
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, TrainerConfig):
            raise ConfigTypeError(f"config must be a {self.config_class.__name__}, got {type(self.config).__name__}")
        ids = learner_ids(learner, learners)
        if len(ids) > 1 and not self.multi_learner:
            raise ConfigError(f"{type(self).__name__} trains one learner, got learners={ids}: use CRLTrainer, "
                             "LOORewardTrainer or ShapleyCreditTrainer, or one trainer per learner")
        shared = self.config.lora_shared_base
        check_learner_specs(pool, ids, lora=self.config.lora is not None, shared_base=shared)
        #: called around :meth:`fit`, in order: the defaults, then ``callbacks``
        self.callbacks: list[TrainerCallback] = default_callbacks() + check_callbacks(callbacks)
        self.protocol = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        if isinstance(task, str):
            eval_task = eval_task or task_registry.load(task, split="test")
            task = task_registry.load(task, split="train")
        self.task = task
        self.eval_task = task_registry.load(eval_task) if isinstance(eval_task, str) else eval_task
        policies = per_learner("policy", policy, ids)
        for j in ids:
            if j not in self.pool.ids:
                raise ConfigError(f"learner {j!r} is not in the pool; pool agents are {self.pool.ids}")
            check_trainable(j, policies.get(j, self.pool[j]), lora=self.config.lora is not None)
        if shared:
            check_one_base(ids, {j: policies.get(j, self.pool[j]) for j in ids})
        #: the trained agent ids, in the order given
        self.learners: list[str] = ids
        get_loss(self.config.loss_type)  # fail early on unknown names
        if self.config.advantage not in ADVANTAGES:
            raise ConfigError(f"unknown advantage estimator {self.config.advantage!r}; registered: {sorted(ADVANTAGES)}")
        rollout_policies = per_learner("rollout_policy", rollout_policy, ids, broadcast=("vllm",))
        #: each pool member's content fingerprint before training (the learners' bases): a checkpoint
        #: records it, and a resume onto other weights under the same name is refused
        self.bases: dict[str, str] = {a: (policies[a] if a in policies else self.pool[a]).fingerprint
                                      for a in self.pool.ids}
        torch.manual_seed(self.config.seed)
        self._states: dict[str, LearnerState] = (
            make_shared_states(ids, policies.get(ids[0]), self.pool, self.config) if shared else
            {j: make_state(j, policies.get(j), self.pool, self.config) for j in ids})
        #: the run's progress (:class:`trainers.state.TrainerState`): what checkpoints read and write
        self.state = TrainerState(training=list(ids))
        #: what callbacks ask of the fit in progress (:class:`trainers.state.TrainerControl`; new at each fit)
        self.control = TrainerControl()
        #: the overrides of :data:`TAKES_TRAINING` written without ``training`` (one warning, here)
        self._without_training = _without_training(type(self))
        #: v(N \\ learners) per held-out task (:func:`trainers.controls.with_controls`): the trainer's protocol,
        #: pool, learners and config fix it, so one play per task
        self.without_learner_scores: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}
        self.learner_sampling = SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p,
                                               max_new_tokens=self.config.max_new_tokens)
        self.partner_sampling = SamplingParams(temperature=self.config.partner_temperature,
                                               max_new_tokens=self.config.max_new_tokens)
        self.eval_sampling = SamplingParams(temperature=0.0, max_new_tokens=self.config.max_new_tokens)
        self._attach_rollout_policies(rollout_policies)
        #: weight syncs into the rollout policies so far (all learners), and the last one's seconds
        self.weight_syncs, self.sync_seconds = 0, 0.0
        #: the rollouts' greedy answers of deterministic agents, each generated once (None: every one generated).
        #: Greedy partners answer a question the same in all G samples and every step (request seeds do not
        #: reach a greedy answer, and a key holds the agent's fingerprint, so a learner's changed weights are
        #: asked again): the same episodes for a fraction of the partners' generations (#55)
        self.rollout_memo: RequestMemo | None = RequestMemo(max_entries=50_000, greedy_only=True)

    def _attach_rollout_policies(self, rollout_policies: Mapping[str, Agent | str]) -> None:
        """Give each learner the agent that plays it in rollouts (:func:`trainers.learners.make_rollout_policy`);
        with ``lora_shared_base`` each needs its own."""
        for j in self.learners:
            state = self._states[j]
            adapter = state.adapter is not None
            state.rollout_policy = make_rollout_policy(rollout_policies.get(j), state.policy, adapter=adapter,
                                                       learners=len(self.learners), lora=self.config.lora)
            if adapter:
                state.stale = state.rollout_policy is not state.policy  # serve the adapter from the first rollout
        served = [id(s.rollout_policy) for s in self._states.values()]
        if self.config.lora_shared_base and len(set(served)) < len(served):
            raise ConfigError("rollout_policy gives several learners the same agent: with lora_shared_base each "
                             "learner needs its own (VLLMAgents on one engine, each with its adapter)")

    # ------------------------------------------------------------------ the run's progress, read-only (self.state)
    @property
    def step(self) -> int:
        """Optimizer steps done (:attr:`state`)."""
        return self.state.step

    @property
    def rollouts(self) -> int:
        """Episodes played so far (:attr:`state`)."""
        return self.state.rollouts

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every step's metrics, oldest first (:attr:`state`)."""
        return self.state.history

    @property
    def training(self) -> list[str]:
        """The learners the step in progress updates (all under ``"joint"``, one under ``"round_robin"``; all
        before the first step): passed to :meth:`collect` and :meth:`advantages` as ``training``."""
        return self.state.training

    # ------------------------------------------------------------------ the learners
    @property
    def learner_states(self) -> dict[str, LearnerState]:
        """Learner id -> its :class:`trainers.learners.LearnerState` (policy, optimizer, ...), in :attr:`learners`
        order: with :attr:`state`, what a checkpoint holds."""
        return dict(self._states)

    @property
    def policies(self) -> dict[str, Agent]:
        """Learner id -> its trained policy (an :class:`agents.Agent`), in :attr:`learners` order."""
        return {j: s.policy for j, s in self._states.items()}

    def _only(self, what: str) -> LearnerState:
        if len(self._states) != 1:
            raise ConfigError(f"{type(self).__name__} trains {len(self._states)} learners {self.learners}: "
                             f"trainer.{what} names one; use trainer.policies[<id>] (or the per-learner methods)")
        return next(iter(self._states.values()))

    @property
    def learner(self) -> str:
        """The learner's id (one learner only; see :attr:`learners`)."""
        self._only("learner")
        return self.learners[0]

    policy = property(lambda self: self._only("policy").policy, doc="The one learner's policy (see :attr:`policies`).")
    optimizer = property(lambda self: self._only("optimizer").optimizer, doc="The one learner's optimizer.")
    reference = property(lambda self: self._only("reference").reference, doc="The one learner's KL reference model.")
    rollout_policy = property(lambda self: self._only("rollout_policy").rollout_policy,
                              doc="The agent that plays the one learner in rollouts (the HF policy unless given).")
    eos_token_id = property(lambda self: self._only("eos_token_id").eos_token_id,
                            doc="The stop token trained at the end of every turn that stopped (None: not trained).")
    device = property(lambda self: self._only("device").device, doc="The one learner's device.")

    def learners_for(self, step: int) -> list[str]:
        """The learners a step updates: all (``"joint"``) or ``learners[step % k]`` (``"round_robin"``)."""
        if self.config.schedule == "round_robin":
            return [self.learners[step % len(self.learners)]]
        return list(self.learners)

    # ------------------------------------------------------------------ what a subclass defines
    @abc.abstractmethod
    def collect(self, examples: list[str], seed: int, training: Sequence[str] | None = None) -> RolloutBatch:
        """Play this step's rollouts for ``examples`` (ids) and return their rewards. ``training``: the
        learners this step updates (:meth:`learners_for`; ``None``: :attr:`training`), who sample with the
        learner's settings and are recorded. A collect without the ``training`` parameter still works
        (the loop then calls it with two arguments; :attr:`training` holds the step's learners)."""

    # ------------------------------------------------------------------ building blocks
    def play(self, examples: Sequence[str], seed: int, *, coalition: Sequence[str] | None = None,
             protocol: Any = None, samples: int | None = None, training: Sequence[str] | None = None) -> list[Episode]:
        """Rollouts with the learners' current policies (G per example by default). The learners in
        ``training`` (default :attr:`training`, those this step updates) sample with the learner's settings
        and are recorded; any other learner plays its current policy with the partners' settings."""
        self.sync_rollout_policy()
        training = self.training if training is None else [j for j in training if j in self._states]
        return rollout_episodes(
            protocol or self.protocol, self.pool, self.task, {j: s.rollout_policy for j, s in self._states.items()},
            examples=examples, samples=samples or self.config.num_generations, seed=seed,
            learner_sampling=self.learner_sampling, partner_sampling=self.partner_sampling, coalition=coalition,
            options=self.config.protocol_options if protocol is None else None, training=training,
            memo=self.rollout_memo,
        )

    def group(self, episodes: list[Episode], rewards: Sequence[float], groups: int) -> tuple[torch.Tensor, list[list[int]]]:
        """Episodes ordered group by group (``run_episodes`` order) -> a ``[groups, G]`` reward tensor."""
        g = len(episodes) // groups
        if g * groups != len(episodes):
            raise RuntimeError(f"{len(episodes)} episodes do not split into {groups} groups")
        r = torch.tensor(list(rewards), dtype=torch.float64).reshape(groups, g)
        return r, [list(range(k * g, (k + 1) * g)) for k in range(groups)]

    def questions_for(self, step: int) -> list[str]:
        """The step's training questions: a seeded draw without replacement (same on resume)."""
        n = len(self.task)
        k = min(self.config.questions_per_step, n)
        rng = np.random.default_rng([self.config.seed, step])
        return [self.task[int(i)].id for i in rng.choice(n, size=k, replace=False)]

    def rollout_seed(self, step: int) -> int:
        return stable_hash(self.config.seed, "rollout", step) % (2**31)

    def _training_now(self, training: Sequence[str] | None) -> list[str]:
        """``training`` as a list; ``None``: :attr:`training` (every learner outside a step)."""
        return list(self.training if training is None else training)

    # ------------------------------------------------------------------ one step
    def advantages(self, batch: RolloutBatch, training: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Each learner of ``training`` (default :attr:`training`) -> its advantages ``[groups, G]``:
        ``config.advantage`` applied to its own view of ``batch`` (:meth:`RolloutBatch.of`), so each
        learner's baseline is its own groups' mean."""
        return {j: compute_advantages(self.config.advantage, batch.of(j).rewards, **batch.of(j).context)
                for j in self._training_now(training)}

    def train_step(self) -> dict[str, Any]:
        """One optimizer step of each learner :meth:`learners_for` names, all from the same episodes;
        returns its metrics (several learners: per-learner ones suffixed ``/<id>``)."""
        t0 = time.perf_counter()
        state = self.state
        training = self.learners_for(state.step)
        state.training = training  # for reading, and for an override written without ``training``
        examples, seed = self.questions_for(state.step), self.rollout_seed(state.step)
        passed = {name: {"training": training} for name in TAKES_TRAINING if name not in self._without_training}
        batch = self.collect(examples, seed, **passed.get("collect", {}))
        rollout_seconds = time.perf_counter() - t0
        state.rollouts += batch.rollouts
        advantages = self.advantages(batch, **passed.get("advantages", {}))
        own = {j: self._update_learner(j, batch.of(j), advantages[j]) for j in training}
        metrics = self._step_metrics(batch, own, training, rollout_seconds, seconds=time.perf_counter() - t0)
        state.step += 1
        return metrics

    def _update_learner(self, learner: str, view: RolloutBatch, advantages: torch.Tensor) -> dict[str, Any]:
        """One optimizer step of ``learner`` on its view of the batch, each of its turns weighted by its
        episode's advantage; returns its metrics."""
        state = self._states[learner]
        per_episode = [0.0] * len(view.episodes)
        for g, members in enumerate(view.index):
            for k, e in enumerate(members):
                per_episode[e] = float(advantages[g, k])
        sequences = learner_sequences(view.episodes, learner, per_episode, eos_token_id=state.eos_token_id)
        stats = self.optimise(sequences, learner)
        state.mark_updated()
        standalone = [ep.standalone[learner] for ep in view.episodes if learner in ep.standalone]
        std = view.rewards.std(dim=1, unbiased=False)
        return {
            "standalone_score": float(np.mean(standalone)) if standalone else None,
            "reward_mean": float(view.rewards.mean()),
            "reward_std": float(std.mean()),
            "zero_variance_groups": float((std == 0).double().mean()),
            "advantage_abs_mean": float(advantages.abs().mean()),
            **stats,
        }

    def _step_metrics(self, batch: RolloutBatch, own: dict[str, dict[str, Any]], training: list[str],
                      rollout_seconds: float, *, seconds: float) -> dict[str, Any]:
        """The step's metrics: the system's score, each learner's ``own`` metrics (suffixed ``/<id>`` with
        several learners, whose means are given for the reward and zero-variance share), costs and timings."""
        generated = sum(u.generated_tokens for ep in batch.episodes for u in ep.usage.values())
        system = [ep.score for ep in batch.episodes if set(ep.coalition) == set(self.pool.ids)]
        metrics: dict[str, Any] = {"step": self.step + 1, "system_score": float(np.mean(system)) if system else None}
        if len(self.learners) == 1:
            metrics.update(own[self.learners[0]])
        else:
            metrics["training"] = list(training)
            for key in ("reward_mean", "zero_variance_groups"):
                metrics[key] = float(np.mean([m[key] for m in own.values()]))
            metrics.update({f"{key}/{j}": value for j, m in own.items() for key, value in m.items()})
        metrics.update({
            "rollouts": self.rollouts,
            "tokens_per_second": generated / max(rollout_seconds, 1e-9),
            "rollout_seconds": rollout_seconds,
            "weight_syncs": self.weight_syncs,
            "seconds": seconds,
        })
        return metrics

    def optimise(self, sequences: list[LearnerSequence], learner: str | None = None) -> dict[str, float]:
        """``num_iterations`` passes of clipped PG over ``learner``'s sequences (default: the one learner),
        each one optimizer step built from ``gradient_accumulation_steps`` micro-batches. Sequences with
        advantage 0 add nothing to a PG loss and are not forwarded unless a KL term needs them (the
        normalisation still counts them)."""
        state = self._only("optimise") if learner is None else self._states[learner]
        if state.adapter is None:
            return policy_gradient_update(state, sequences, self.config)
        from agents.hf import active_adapter

        with active_adapter(state.policy.model, state.adapter):  # the shared base: this learner's adapter
            return policy_gradient_update(state, sequences, self.config)

    # ------------------------------------------------------------------ fit / evaluate
    def fit(self, steps: int | None = None, *, resume: bool = True) -> list[dict[str, Any]]:
        """Train until ``steps`` (default ``config.steps``) optimizer steps are done. Returns every step's metrics.

        With ``resume`` (default), the latest checkpoint in ``config.output_dir`` is restored first, and only
        when it was written with the same trainer, learner, protocol, task, pool and config (``steps``,
        ``save_steps``, ``output_dir``, ``tensorboard`` and ``progress`` may differ); one line says so.
        Different settings raise. ``resume=False`` starts over and deletes the run's old checkpoints and
        metrics in ``output_dir``. Around the steps it calls :attr:`callbacks` (:mod:`trainers.callbacks`);
        on an exception they end with ``"FAILED"`` (``"KILLED"`` on an interrupt) and it is raised on.

        A checkpoint is written after every ``config.save_steps``-th step and the fit's last one (with an
        ``output_dir``), and after any step where a callback set ``control.should_save``; a callback that sets
        ``control.should_stop`` ends the fit after the step (:class:`trainers.state.TrainerControl`).

        Raises:
            ConfigError: a callback asked for a checkpoint (``control.should_save``) without ``config.output_dir``.
        """
        steps = self.config.steps if steps is None else steps
        if resume:
            self.load_checkpoint()
        else:
            self._clear_output_dir()
        self.control = TrainerControl()
        self._call("on_train_begin", steps)
        try:
            while self.state.step < steps and not self.control.should_stop:
                self._fit_step(steps)
        except BaseException as e:  # the trackers' run is marked as ended badly, not left RUNNING
            self._call("on_train_end", KILLED if isinstance(e, (KeyboardInterrupt, SystemExit)) else FAILED)
            raise
        self._call("on_train_end", FINISHED)  # the trackers' run ends with fit (a later fit opens a new one)
        return self.history

    def _fit_step(self, steps: int) -> None:
        """One step of :meth:`fit` (which ends at ``steps``): train, log, the callbacks, then the checkpoint the
        schedule or :attr:`control` asks for."""
        control, out = self.control, self.config.output_dir
        control.new_step()
        metrics = self.train_step()
        self.state.history.append(metrics)
        step = self.state.step
        control.should_save = bool(out) and (step % self.config.save_steps == 0 or step == steps)
        self.log(metrics)
        self._call("on_step_end", metrics)
        if control.should_stop and out:  # the fit's last step, as at ``steps``
            control.should_save = True
        if control.should_save:
            if not out:
                raise ConfigError(f"a callback set control.should_save at step {step} but config.output_dir is "
                                  "unset: give the trainer an output_dir to write checkpoints to")
            self.save_checkpoint()

    def evaluate(self, task: Task | str | None = None, *, controls: bool = True) -> EvalResult:
        """System and standalone accuracy of the current policies on held-out questions (greedy); see
        :func:`evaluate_policy`. With ``controls`` also the system without the learner and the fit's
        zero-variance share (:func:`trainers.controls.with_controls`)."""
        task = task_registry.load(task) if isinstance(task, str) else (task or self.eval_task)
        if task is None:
            raise ConfigError("evaluate() needs held-out questions: pass task= or give the trainer eval_task=")
        result = evaluate_policy(self.protocol, self.pool, task, self.policies, max_new_tokens=self.config.max_new_tokens,
                                 protocol_options=self.config.protocol_options, seed=self.config.seed)
        if not controls:
            return result
        from trainers.controls import with_controls  # the references a user reads the result beside

        return with_controls(self, task, result)

    # ------------------------------------------------------------------ rollouts on another engine
    def sync_rollout_policy(self, force: bool = False) -> bool:
        """Load each learner's current weights into its rollout policy if they changed since the last sync
        (or ``force``): the weights with LoRA merged in, or with ``lora_shared_base`` the learner's adapter,
        written to its own directory and served under a new ``LoRARequest`` id. True when any were loaded."""
        loaded = False
        for state in self._states.values():
            if not state.needs_sync(force):
                continue
            t0 = time.perf_counter()
            load_into_rollout_policy(state, owner=self)
            self.sync_seconds = time.perf_counter() - t0
            self.weight_syncs += 1
            loaded = True
        return loaded

    # ------------------------------------------------------------------ callbacks
    def _call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` (``"on_log"``, ...) of every callback, in order, with this trainer and ``args``."""
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def log(self, metrics: dict[str, Any]) -> None:
        """Record one step's metrics: every callback's ``on_log`` (by default ``output_dir/metrics.jsonl``,
        TensorBoard and ``config.trackers``; nothing without an ``output_dir``)."""
        self._call("on_log", metrics)

    # ------------------------------------------------------------------ checkpoints (trainers.checkpoints)
    def trainable_state(self, learner: str | None = None) -> dict[str, torch.Tensor]:
        """The trainable tensors of ``learner`` (default: the one learner)."""
        state = self._only("trainable_state") if learner is None else self._states[learner]
        return state.trainable_state()

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoint-<step>`` atomically: trainable weights (the LoRA adapter
        only, with LoRA), optimizer, step, rollouts, RNG state. Several learners: each learner's weights
        and optimizer in ``checkpoint-<step>/<id>/``. Callbacks' ``on_save`` follow."""
        record = {"config": jsonable(self.config.to_dict()), "trainer": type(self).__name__,
                  "learner": checkpoint_files.learner_key(self.learners), "setup": self.setup()}
        path = checkpoint_files.save_checkpoint(self.config.output_dir, self.state, self._states, record)
        self._call("on_save", path)
        return path

    def checkpoints(self) -> list[Path]:
        """This run's checkpoint directories, oldest first."""
        return checkpoint_files.list_checkpoints(self.config.output_dir)

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def setup(self) -> dict[str, Any]:
        """What, besides the config, a checkpoint must share with this trainer to resume it."""
        return checkpoint_files.setup_of(self)

    def checkpoint_differences(self, state: dict[str, Any]) -> list[str]:
        """``field: saved -> current`` for every setting where the checkpoint's ``state`` differs from this trainer."""
        return checkpoint_files.checkpoint_differences(state, self.config, self.setup())

    def checkpoint_problem(self, path: Path) -> str:
        """What is wrong with the checkpoint directory ``path`` ("" when every file it needs is there and
        reads back), checked before anything is loaded: state.json, rng.pt, and each learner's
        trainable.pt and optimizer.pt (torch archives whose zip index must read)."""
        return checkpoint_files.checkpoint_problem(Path(path), self.learners)

    def load_checkpoint(self, path: str | Path | None = None, *, strict: bool = True) -> bool:
        """Restore the latest (or the given) checkpoint; drop metrics logged after it. False if none.

        Every file is checked before anything is loaded (:meth:`checkpoint_problem`): a damaged latest
        checkpoint is reported in one line and the one before it is used (a damaged ``path`` given
        explicitly raises). With ``strict`` (default) a checkpoint written with other settings (see
        :meth:`fit`; the pool's weights included) raises instead; ``strict=False`` loads it anyway
        (e.g. to continue with a new learning rate)."""
        name, out = type(self).__name__, self.config.output_dir
        path = checkpoint_files.checkpoint_to_load(out, self.learners, path, name=name)
        if path is None:
            checkpoint_files.truncate_metrics(self.state, 0, Path(out) if out else None)
            return False
        differences = self.checkpoint_differences(read_json(path / "state.json"))
        if differences and strict:
            raise ConfigError(
                f"{path} was written with other settings ({'; '.join(differences)}); use a new output_dir, "
                "or fit(resume=False) to start over there, or load_checkpoint(strict=False) to continue from it anyway"
            )
        checkpoint_files.load_checkpoint(path, self.state, self._states, metrics_dir=Path(out or path.parent))
        note = f"; settings differ ({'; '.join(differences)})" if differences else "; same settings"
        print(f"{name}: resumed from {path} at step {self.state.step}{note}")
        return True

    def _clear_output_dir(self) -> None:
        """``fit(resume=False)``: remove this run's checkpoints, metrics and TensorBoard events (those a
        tracker run still writes stay)."""
        tracking = any(isinstance(c, TrackersCallback) and c.is_open for c in self.callbacks)
        checkpoint_files.clear_output_dir(self.config.output_dir, self.state, name=type(self).__name__,
                                          keep_tensorboard=tracking)

    def save_model(self, path: str | Path) -> Path:
        """The trained policy with ``save_pretrained`` (the adapter only, with LoRA) and its tokenizer;
        several learners: each in ``path/<id>``."""
        return checkpoint_files.save_model(self._states, path)
