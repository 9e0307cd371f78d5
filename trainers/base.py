"""The :class:`Trainer` protocol and :class:`PolicyGradientTrainer`, the loop every built-in trainer
shares: rollout -> rewards -> advantages -> clipped policy-gradient loss -> optimizer step.

A trainer subclass only says how to *collect* a step's rollouts and rewards (:meth:`collect`);
the rest (advantage estimator and loss by name, gradient accumulation, LoRA, KL to the reference,
metrics to JSONL + TensorBoard, checkpoints that resume after a kill, evaluation) is here.
"""

from __future__ import annotations

import abc
import copy
import json
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tqdm.auto import tqdm

from agents import Agent, Pool, SamplingParams, stable_hash
from agents import pool as make_pool
from crl_envs import protocols
from crl_envs import tasks as task_registry
from crl_envs.runner import Episode
from crl_envs.stats import PairedCI, paired_bootstrap_ci  # noqa: F401  (the statistics live there)
from crl_envs.tasks import Task
from crl_envs.tracking import open_trackers
from crl_kit.errors import ConfigError, ConfigTypeError, RunError
from crl_kit.safe_io import atomic_write_text, open_append, read_json, read_regular
from crl_kit.serial import jsonable
from trainers.advantages import ADVANTAGES, compute_advantages
from trainers.config import TrainerConfig
from trainers.losses import LossInputs, get_loss
from trainers.rollout import LearnerSequence, learner_sequences, rollout_episodes, token_logprobs


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


@dataclass
class EvalResult:
    """Per-question scores on held-out questions (greedy decoding for every agent)."""

    example_ids: list[str]
    system: np.ndarray
    standalone: np.ndarray
    #: several learners: each learner's standalone scores (``standalone`` is their per-question mean)
    learners: dict[str, np.ndarray] = field(default_factory=dict)
    #: the system without the learner(s), v(N \\ learners), per question (the reference a gain must beat)
    without_learner: np.ndarray | None = None
    #: share of the fitted steps' groups whose rewards were all equal (no signal); ``None`` before training
    zero_variance_share: float | None = None

    @property
    def system_accuracy(self) -> float:
        return float(np.mean(self.system))

    @property
    def standalone_accuracy(self) -> float:
        return float(np.mean(self.standalone))

    def to_dict(self) -> dict[str, Any]:
        out = {"system": self.system_accuracy, "standalone": self.standalone_accuracy, "n": len(self.example_ids)}
        if self.learners:
            out["learners"] = {j: float(np.mean(v)) for j, v in self.learners.items()}
        if self.without_learner is not None:
            out["without_learner"] = float(np.mean(self.without_learner))
        if self.zero_variance_share is not None:
            out["zero_variance_share"] = self.zero_variance_share
        return out

    def __str__(self) -> str:
        parts = [f"system {self.system_accuracy:.3f}", f"learner alone {self.standalone_accuracy:.3f}"]
        if self.without_learner is not None:
            parts.append(f"without the learner {float(np.mean(self.without_learner)):.3f}")
        if self.zero_variance_share is not None:
            parts.append(f"zero-variance groups {self.zero_variance_share:.0%}")
        return ", ".join(parts)


@dataclass
class Improvement:
    """What training changed, on the same held-out questions: system and learner-alone accuracy before and
    after, each change with a paired bootstrap CI. ``print()`` it for a two-line summary in points."""

    before: EvalResult
    after: EvalResult
    system: PairedCI
    standalone: PairedCI
    #: several learners: each learner's own (standalone) change
    learners: dict[str, PairedCI] = field(default_factory=dict)

    def __str__(self) -> str:
        b, a = self.before, self.after
        lines = [f"system accuracy   {b.system_accuracy:.3f} -> {a.system_accuracy:.3f}: {self.system}",
                 f"learner alone     {b.standalone_accuracy:.3f} -> {a.standalone_accuracy:.3f}: {self.standalone}"]
        lines += [f"{j} alone{' ' * max(1, 10 - len(j))}{np.mean(b.learners[j]):.3f} -> {np.mean(a.learners[j]):.3f}: {ci}"
                  for j, ci in self.learners.items()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out = {"before": self.before.to_dict(), "after": self.after.to_dict(),
               "system_delta": list(self.system), "standalone_delta": list(self.standalone)}
        if self.learners:
            out["learner_deltas"] = {j: list(ci) for j, ci in self.learners.items()}
        return out


def compare(before: EvalResult, after: EvalResult, *, level: float = 0.95, seed: int = 0) -> Improvement:
    """The change from ``before`` to ``after`` (two :meth:`PolicyGradientTrainer.evaluate` results on the
    same questions), with paired bootstrap CIs over questions."""
    if before.example_ids != after.example_ids:
        raise ConfigError("compare() needs both evaluations on the same questions in the same order; "
                         "evaluate before and after training on the same eval_task")
    learners = {j: paired_bootstrap_ci(before.learners[j], after.learners[j], level=level, seed=seed)
                for j in before.learners if j in after.learners}
    return Improvement(before, after, paired_bootstrap_ci(before.system, after.system, level=level, seed=seed),
                       paired_bootstrap_ci(before.standalone, after.standalone, level=level, seed=seed), learners)


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model's weights under the base model's parameter names, with active LoRA adapters merged in
    (``W + scale * B @ A``, computed without modifying the model): what an inference engine loads."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return {name: t.detach() for name, t in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    modules = dict(base.named_modules())
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            owner, _, leaf = name.partition(".base_layer.")
            layer = modules[owner]
            tensor = tensor.detach()
            if leaf == "weight" and isinstance(layer, LoraLayer) and not layer.merged:
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            name = f"{owner}.{leaf}"
        out[name] = tensor.detach()
    return out


def evaluate_policy(protocol: Any, pool: Pool, task: Task, learner: str | Mapping[str, Agent],
                    policy: Agent | None = None, *, max_new_tokens: int,
                    protocol_options: dict[str, Any] | None = None, seed: int = 0) -> EvalResult:
    """System and standalone accuracy of ``policy`` playing ``learner`` on ``task`` (greedy, every agent).

    Several learners: ``learner`` is a dict ``id -> policy`` (``policy`` unused); all play together, and
    :attr:`EvalResult.learners` holds each one's standalone scores (``standalone`` is their mean).

    Standalone scores come from ``Episode.standalone`` where the protocol defines them, else from the
    learner answering alone (``vote_v0`` with the learner as the only member). Shared by every trainer,
    ours and TRL's (:mod:`trainers.trl`)."""
    policies = dict(learner) if isinstance(learner, Mapping) else {learner: policy}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    ids = [ex.id for ex in task]
    kwargs = dict(learner_sampling=greedy, partner_sampling=greedy, examples=ids, samples=1, seed=seed)
    episodes = rollout_episodes(protocol, pool, task, policies, options=protocol_options, **kwargs)
    system = np.array([ep.score for ep in episodes])
    own = {}
    for j, p in policies.items():
        if all(j in ep.standalone for ep in episodes):
            own[j] = np.array([ep.standalone[j] for ep in episodes])
        else:
            alone = rollout_episodes("vote", pool, task, j, p, coalition=[j], **kwargs)
            own[j] = np.array([ep.score for ep in alone])
    standalone = next(iter(own.values())) if len(own) == 1 else np.mean(list(own.values()), axis=0)
    return EvalResult(ids, system, standalone, own if len(own) > 1 else {})


#: Config fields that do not change what training computes: a checkpoint written under other values resumes.
RESUMABLE_FIELDS = frozenset({"steps", "output_dir", "save_steps", "tensorboard", "trackers", "tracking_project",
                              "tracking_dir", "progress"})



#: Spec prefixes whose agents cannot be trained here (no transformers model behind them).
_SERVED_BACKENDS = ("openai", "vllm", "llamacpp")


def _learner_ids(learner: str | None, learners: Sequence[str] | None) -> list[str]:
    """The trained ids from ``learner=`` / ``learners=``, checked (no pool needed)."""
    if learners is None:
        learner = "model_0" if learner is None else learner
        if not isinstance(learner, str):
            raise ConfigTypeError(f"learner must be an agent id such as 'model_1', got {learner!r}; "
                            "for several pass learners=['model_1', 'model_3']")
        return [learner]
    if learner is not None:
        raise ConfigError(f"pass learner= (one) or learners= (several), not both; got learner={learner!r} and "
                         f"learners={learners!r}")
    if isinstance(learners, str) or not isinstance(learners, Sequence) or not all(isinstance(j, str) for j in learners):
        raise ConfigTypeError(f"learners must be a list of agent ids such as ['model_1', 'model_3'], got {learners!r}")
    if not learners:
        raise ConfigError("learners=[] trains nobody: list at least one agent id, e.g. learners=['model_1']")
    for j in learners:
        if list(learners).count(j) > 1:
            raise ConfigError(f"learners lists {j!r} twice: each pool member is one policy, list it once")
    return list(learners)


def _check_learner_specs(pool: Any, ids: list[str], *, lora: bool, shared_base: bool = False) -> None:
    """Checks that need no model: with the pool given as agents / spec strings, a learner id past its end,
    a learner on a served backend (``openai:``, ``vllm:``, ``llamacpp:``), and with ``shared_base`` learners
    whose specs name different models."""
    if isinstance(pool, (Pool, str)) or not isinstance(pool, Sequence):
        return
    members = list(pool)
    if any(isinstance(m, str) and ":" not in m for m in members):
        return  # a named pool inside: its size is known once built
    roster = [f"model_{i}" for i in range(len(members))]
    for j in ids:
        if j not in roster:
            raise ConfigError(f"learner {j!r} is not in the pool; pool agents are {roster}")
        spec = members[roster.index(j)]
        if isinstance(spec, str) and spec.split(":", 1)[0] in _SERVED_BACKENDS:
            _raise_untrainable(j, f"the {spec.split(':', 1)[0]} backend ({spec!r})", lora=lora)
        elif isinstance(spec, Agent):  # a built agent (a scripted one has no weights)
            _check_trainable(j, spec, lora=lora)
    models = {j: members[roster.index(j)].split("?", 1)[0] for j in ids if isinstance(members[roster.index(j)], str)}
    if shared_base and len(set(models.values())) > 1:
        first, *_ = models
        other = next(j for j in models if models[j] != models[first])
        _raise_not_one_base(first, repr(models[first]), other, repr(models[other]), "write both with the same spec")


def _raise_not_one_base(a: str, what_a: str, b: str, what_b: str, fix: str) -> None:
    raise ConfigError(f"config.lora_shared_base=True holds the learners as adapters of one base model, but {a} is "
                     f"{what_a} and {b} is {what_b}: {fix}, or set lora_shared_base=False (one model per learner)")


def _check_one_base(ids: list[str], sources: Mapping[str, Agent]) -> None:
    """The learners' models are copies of one base: the same class, config, tokenizer vocabulary and every
    weight equal (exact); else one line names the first pair that differs and what differs."""
    first = ids[0]
    a = sources[first]
    config_a = {k: v for k, v in a.model.config.to_dict().items() if k not in ("_name_or_path", "name_or_path")}
    weights_a = a.model.state_dict()
    for j in ids[1:]:
        b = sources[j]
        if b is a:
            continue
        config_b = {k: v for k, v in b.model.config.to_dict().items() if k not in ("_name_or_path", "name_or_path")}
        if type(b.model) is not type(a.model) or config_b != config_a:
            _raise_not_one_base(first, f"a {type(a.model).__name__} ({a.name!r})", j,
                                f"a {type(b.model).__name__} with another config ({b.name!r})", "train copies of one model")
        if a.tokenizer.get_vocab() != b.tokenizer.get_vocab():
            _raise_not_one_base(first, repr(a.name), j, f"{b.name!r} with another tokenizer", "train copies of one model")
        weights_b = b.model.state_dict()
        differ = next((n for n, t in weights_a.items() if n not in weights_b or t.dtype != weights_b[n].dtype
                       or t.shape != weights_b[n].shape or not torch.equal(t, weights_b[n].to(t.device))), None)
        if differ is not None:
            _raise_not_one_base(first, repr(a.name), j, f"{b.name!r}, whose weights differ (e.g. {differ})",
                                "train copies of one model")


def _raise_untrainable(learner: str, what: str, *, lora: bool) -> None:
    if lora:
        raise ConfigError(f"config.lora is set but learner {learner!r} is {what}: LoRA trains a transformers model; "
                         f"make the learner 'hf:<path>' (rollout_policy='vllm' keeps rollouts on vLLM)")
    raise ConfigTypeError(f"learner {learner!r} is {what}, which exposes no transformers model with token log-probs: "
                    "make the learner an agents.HFAgent (spec 'hf:<path>')")


def _check_trainable(learner: str, agent: Agent, *, lora: bool) -> None:
    """``agent`` can be trained (an HF model and tokenizer), or one line says why not."""
    from agents.scripted import ScriptedAgent

    if isinstance(agent, ScriptedAgent):
        raise ConfigTypeError(f"learner {learner!r} is a scripted agent ({agent.name!r}), which has no weights to train: "
                        "make the learner an agents.HFAgent (spec 'hf:<path>')")
    for attr in ("model", "tokenizer", "encode_prompt"):
        if not hasattr(agent, attr):
            _raise_untrainable(learner, f"a {type(agent).__name__} (no {attr!r})", lora=lora)


def _per_learner(name: str, value: Any, ids: list[str], *, broadcast: tuple[Any, ...] = ()) -> dict[str, Any]:
    """``policy=`` / ``rollout_policy=`` as learner id -> value (a dict for several learners)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        unknown = set(value) - set(ids)
        if unknown:
            raise ConfigError(f"{name} names {sorted(unknown)}, which are not learners; learners are {ids}")
        return dict(value)
    if len(ids) > 1 and not (isinstance(value, str) and value in broadcast):
        raise ConfigTypeError(f"{name}= with several learners must be a dict learner id -> agent, got {value!r}")
    return {j: value for j in ids}


@dataclass
class _LearnerState:
    """What one learner owns: its policy, optimizer, KL reference and rollout engine."""

    policy: Agent
    optimizer: Any = None
    reference: torch.nn.Module | None = None
    rollout_policy: Agent | None = None
    stale: bool = False  # the rollout engine lags the policy's weights
    eos_token_id: int | None = None
    device: Any = None
    adapter: str | None = None  # lora_shared_base: the learner's adapter in the shared model
    params: list[torch.nn.Parameter] = field(default_factory=list)  # what its optimizer updates
    served: Path | None = None  # lora_shared_base on vLLM: where its adapter is written for the engine


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
    #: Episodes per question and step, as a multiple of G (a study's cost estimate reads it), and whether they
    #: are system episodes (False: the learner alone, one call each).
    episodes_per_question: float = 1.0
    plays_system: bool = True

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
    ):
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, TrainerConfig):
            raise ConfigTypeError(f"config must be a {self.config_class.__name__}, got {type(self.config).__name__}")
        ids = _learner_ids(learner, learners)
        if len(ids) > 1 and not self.multi_learner:
            raise ConfigError(f"{type(self).__name__} trains one learner, got learners={ids}: use CRLTrainer, "
                             "LOORewardTrainer or ShapleyCreditTrainer, or one trainer per learner")
        shared = self.config.lora_shared_base
        _check_learner_specs(pool, ids, lora=self.config.lora is not None, shared_base=shared)
        self.protocol = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        if isinstance(task, str):
            eval_task = eval_task or task_registry.load(task, split="test")
            task = task_registry.load(task, split="train")
        self.task = task
        self.eval_task = task_registry.load(eval_task) if isinstance(eval_task, str) else eval_task
        policies = _per_learner("policy", policy, ids)
        for j in ids:
            if j not in self.pool.ids:
                raise ConfigError(f"learner {j!r} is not in the pool; pool agents are {self.pool.ids}")
            _check_trainable(j, policies.get(j, self.pool[j]), lora=self.config.lora is not None)
        if shared:
            _check_one_base(ids, {j: policies.get(j, self.pool[j]) for j in ids})
        #: the trained agent ids, in the order given
        self.learners: list[str] = ids
        get_loss(self.config.loss_type)  # fail early on unknown names
        if self.config.advantage not in ADVANTAGES:
            raise ConfigError(f"unknown advantage estimator {self.config.advantage!r}; registered: {sorted(ADVANTAGES)}")
        rollout_policies = _per_learner("rollout_policy", rollout_policy, ids, broadcast=("vllm",))
        #: each pool member's content fingerprint before training (the learners' bases): a checkpoint
        #: records it, and a resume onto other weights under the same name is refused
        self._bases = {a: (policies[a] if a in policies else self.pool[a]).fingerprint for a in self.pool.ids}
        torch.manual_seed(self.config.seed)
        self._states: dict[str, _LearnerState] = (self._make_shared_states(ids, policies.get(ids[0])) if shared else
                                                  {j: self._make_state(j, policies.get(j)) for j in ids})
        #: learners updated by the step being collected (all under ``"joint"``, one under ``"round_robin"``)
        self.training: list[str] = list(ids)
        self.step = 0
        self.rollouts = 0
        self.history: list[dict[str, Any]] = []
        self._writer = None
        self.learner_sampling = SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p,
                                               max_new_tokens=self.config.max_new_tokens)
        self.partner_sampling = SamplingParams(temperature=self.config.partner_temperature,
                                               max_new_tokens=self.config.max_new_tokens)
        self.eval_sampling = SamplingParams(temperature=0.0, max_new_tokens=self.config.max_new_tokens)
        for j in ids:
            state = self._states[j]
            adapter = state.adapter is not None
            state.rollout_policy = self._make_rollout_policy(rollout_policies.get(j), state.policy, adapter=adapter)
            if adapter:
                state.stale = state.rollout_policy is not state.policy  # serve the adapter from the first rollout
        served = [id(s.rollout_policy) for s in self._states.values()]
        if shared and len(set(served)) < len(served):
            raise ConfigError("rollout_policy gives several learners the same agent: with lora_shared_base each "
                             "learner needs its own (VLLMAgents on one engine, each with its adapter)")
        #: weight syncs into the rollout policies so far (all learners), and the last one's seconds
        self.weight_syncs, self.sync_seconds = 0, 0.0

    def _make_state(self, learner: str, policy: Agent | None) -> _LearnerState:
        """Copy ``pool[learner]`` (or take ``policy``), add LoRA / the reference, build its optimizer."""
        source = policy if policy is not None else self.pool[learner]
        state = _LearnerState(policy=source if policy is not None else copy.deepcopy(source))
        state.device = next(state.policy.model.parameters()).device
        if self.config.lora is not None:
            self._apply_lora(state.policy)
        if self.config.beta > 0 and self.config.lora is None:
            state.reference = copy.deepcopy(state.policy.model).eval().requires_grad_(False)
        self._finish_state(learner, state, [p for p in state.policy.model.parameters() if p.requires_grad])
        return state

    def _finish_state(self, learner: str, state: _LearnerState, params: list[torch.nn.Parameter]) -> None:
        """Give ``state`` its optimizer over ``params`` and its stop token."""
        if not params:
            raise ConfigError(f"learner {learner!r}'s model has no trainable parameters")
        state.params = params
        state.optimizer = torch.optim.AdamW(params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay)
        eos = state.policy.tokenizer.eos_token_id
        state.eos_token_id = eos if isinstance(eos, int) else None

    def _make_shared_states(self, ids: list[str], policy: Agent | None) -> dict[str, _LearnerState]:
        """``lora_shared_base``: one copy of the first learner's model (checked equal to the others'), one
        named LoRA adapter per learner on it (added in learner order, so each draws the initial weights a
        model of its own would), and per learner an agent that plays with its adapter, its optimizer."""
        from agents.hf import LoraAdapterAgent

        base = policy if policy is not None else copy.deepcopy(self.pool[ids[0]])
        model = base.model
        for k, j in enumerate(ids):
            settings = self._lora_settings(model if k == 0 else model.get_base_model())
            if k == 0:
                from peft import get_peft_model

                base.model = model = get_peft_model(model, settings, adapter_name=j)
            else:
                model.add_adapter(j, settings)
        model.eval()  # no dropout: the recomputed log-probs must match the sampled ones
        states = {}
        for j in ids:
            agent = LoraAdapterAgent(base, j, name=self.pool[j].name)
            state = _LearnerState(policy=agent, device=next(model.parameters()).device, adapter=j)
            self._finish_state(j, state, list(agent.adapter_state().values()))
            states[j] = state
        return states

    # ------------------------------------------------------------------ the learners
    @property
    def policies(self) -> dict[str, Agent]:
        """Learner id -> its trained policy (an :class:`agents.Agent`), in :attr:`learners` order."""
        return {j: s.policy for j, s in self._states.items()}

    def _only(self, what: str) -> _LearnerState:
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
    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        """Play this step's rollouts for ``examples`` (ids) and return their rewards."""

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

    # ------------------------------------------------------------------ one step
    def advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Each learner of :attr:`training` -> its advantages ``[groups, G]``: ``config.advantage`` applied to
        its own view of ``batch`` (:meth:`RolloutBatch.of`), so each learner's baseline is its own groups' mean."""
        return {j: compute_advantages(self.config.advantage, batch.of(j).rewards, **batch.of(j).context)
                for j in self.training}

    def train_step(self) -> dict[str, Any]:
        """One optimizer step of each learner :meth:`learners_for` names, all from the same episodes;
        returns its metrics (several learners: per-learner ones suffixed ``/<id>``)."""
        t0 = time.perf_counter()
        self.training = self.learners_for(self.step)
        batch = self.collect(self.questions_for(self.step), self.rollout_seed(self.step))
        rollout_seconds = time.perf_counter() - t0
        self.rollouts += batch.rollouts
        advantages = self.advantages(batch)
        own: dict[str, dict[str, Any]] = {}
        for j in self.training:
            view, state = batch.of(j), self._states[j]
            per_episode = [0.0] * len(view.episodes)
            for g, members in enumerate(view.index):
                for k, e in enumerate(members):
                    per_episode[e] = float(advantages[j][g, k])
            sequences = learner_sequences(view.episodes, j, per_episode, eos_token_id=state.eos_token_id)
            stats = self.optimise(sequences, j)
            state.stale = state.rollout_policy is not state.policy
            standalone = [ep.standalone[j] for ep in view.episodes if j in ep.standalone]
            std = view.rewards.std(dim=1, unbiased=False)
            own[j] = {
                "standalone_score": float(np.mean(standalone)) if standalone else None,
                "reward_mean": float(view.rewards.mean()),
                "reward_std": float(std.mean()),
                "zero_variance_groups": float((std == 0).double().mean()),
                "advantage_abs_mean": float(advantages[j].abs().mean()),
                **stats,
            }
        seconds = time.perf_counter() - t0
        generated = sum(u.completion_tokens for ep in batch.episodes for u in ep.usage.values())
        system = [ep.score for ep in batch.episodes if set(ep.coalition) == set(self.pool.ids)]
        metrics: dict[str, Any] = {"step": self.step + 1, "system_score": float(np.mean(system)) if system else None}
        if len(self.learners) == 1:
            metrics.update(own[self.learners[0]])
        else:
            metrics["training"] = list(self.training)
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
        self.step += 1
        return metrics

    def optimise(self, sequences: list[LearnerSequence], learner: str | None = None) -> dict[str, float]:
        """``num_iterations`` passes of clipped PG over ``learner``'s sequences (default: the one learner),
        each one optimizer step built from ``gradient_accumulation_steps`` micro-batches. Sequences with
        advantage 0 add nothing to a PG loss and are not forwarded unless a KL term needs them (the
        normalisation still counts them)."""
        state = self._only("optimise") if learner is None else self._states[learner]
        if state.adapter is None:
            return self._optimise(sequences, state)
        from agents.hf import active_adapter

        with active_adapter(state.policy.model, state.adapter):  # the shared base: this learner's adapter
            return self._optimise(sequences, state)

    def _optimise(self, sequences: list[LearnerSequence], state: _LearnerState) -> dict[str, float]:
        cfg = self.config
        loss_fn = get_loss(cfg.loss_type)
        total_tokens = sum(len(s.completion_ids) for s in sequences)
        total_sequences = len(sequences)
        work = [s for s in sequences if s.advantage != 0.0 or cfg.beta > 0]
        sums = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "grad_norm": 0.0}
        forwarded = sum(len(s.completion_ids) for s in work)
        model = state.policy.model
        pad = state.policy.tokenizer.pad_token_id
        for _ in range(cfg.num_iterations):
            state.optimizer.zero_grad(set_to_none=True)
            if not work:
                break
            chunks = np.array_split(np.arange(len(work)), min(cfg.gradient_accumulation_steps, len(work)))
            for chunk in chunks:
                part = [work[i] for i in chunk]
                prompts = [s.prompt_ids for s in part]
                completions = [s.completion_ids for s in part]
                logprobs, mask = token_logprobs(model, prompts, completions, temperature=cfg.temperature,
                                                pad_id=pad, device=state.device)
                old = torch.zeros_like(logprobs)
                for row, s in enumerate(part):
                    old[row, : len(s.logprobs)] = torch.tensor(s.logprobs)
                unknown = torch.isnan(old)
                if unknown.any():  # stop tokens: the policy that sampled them is the current one (first pass)
                    old = torch.where(unknown, logprobs.detach(), old)
                    for row, s in enumerate(part):
                        s.logprobs = old[row, : len(s.logprobs)].tolist()
                ref = self._reference_logprobs(prompts, completions, state) if cfg.beta > 0 else None
                inputs = LossInputs(
                    logprobs=logprobs, old_logprobs=old, advantages=torch.tensor([s.advantage for s in part]),
                    mask=mask, total_tokens=total_tokens, total_sequences=total_sequences, max_len=cfg.max_new_tokens,
                    ref_logprobs=ref, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, beta=cfg.beta,
                )
                loss, part_stats = loss_fn(inputs)
                loss.backward()
                sums["loss"] += float(loss.detach())
                for key in ("clipped_tokens", "kl_sum"):
                    sums[key] += part_stats.get(key, 0.0)
            sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(state.params, cfg.max_grad_norm))
            state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        passes = cfg.num_iterations
        return {
            "loss": sums["loss"] / passes,
            "kl": sums["kl_sum"] / max(forwarded * passes, 1) if cfg.beta > 0 else None,  # no reference when beta = 0
            "clip_fraction": sums["clipped_tokens"] / max(forwarded * passes, 1),
            "grad_norm": sums["grad_norm"],
            "learner_sequences": total_sequences,
            "learner_tokens": total_tokens,
        }

    @torch.no_grad()
    def _reference_logprobs(self, prompts, completions, state: _LearnerState) -> torch.Tensor:
        pad = state.policy.tokenizer.pad_token_id
        if state.reference is not None:
            lp, _ = token_logprobs(state.reference, prompts, completions, temperature=self.config.temperature,
                                   pad_id=pad, device=state.device)
            return lp
        with state.policy.model.disable_adapter():  # LoRA: the base model is the reference
            lp, _ = token_logprobs(state.policy.model, prompts, completions, temperature=self.config.temperature,
                                   pad_id=pad, device=state.device)
        return lp

    # ------------------------------------------------------------------ fit / evaluate
    def fit(self, steps: int | None = None, *, resume: bool = True) -> list[dict[str, Any]]:
        """Train until ``steps`` (default ``config.steps``) optimizer steps are done. Returns every step's metrics.

        With ``resume`` (default), the latest checkpoint in ``config.output_dir`` is restored first, and only
        when it was written with the same trainer, learner, protocol, task, pool and config (``steps``,
        ``save_steps``, ``output_dir``, ``tensorboard`` and ``progress`` may differ); one line says so.
        Different settings raise. ``resume=False`` starts over and deletes the run's old checkpoints and
        metrics in ``output_dir``."""
        steps = self.config.steps if steps is None else steps
        if resume:
            self.load_checkpoint()
        else:
            self._clear_output_dir()
        bar = tqdm(total=steps, initial=min(self.step, steps), desc=f"{type(self).__name__}",
                   disable=not self.config.progress)
        try:
            while self.step < steps:
                metrics = self.train_step()
                self.history.append(metrics)
                self.log(metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", zero_var=f"{metrics['zero_variance_groups']:.2f}")
                if self.config.output_dir and (self.step % self.config.save_steps == 0 or self.step == steps):
                    self.save_checkpoint()
        except BaseException as e:  # the trackers' run is marked as ended badly, not left RUNNING
            if self._writer is not None:
                self._writer.close("KILLED" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "FAILED")
                self._writer = None
            raise
        bar.close()
        if self._writer is not None:  # the trackers' run ends with fit (a later fit opens a new one)
            self._writer.close()
            self._writer = None
        return self.history

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
    def _make_rollout_policy(self, rollout_policy: Agent | str | None, policy: Agent, *, adapter: bool) -> Agent:
        """The agent that plays ``policy`` in rollouts: the policy itself (``None``); for ``"vllm"`` an engine
        on the learner's directory, synced by ``load_weights`` (the weights, LoRA merged in), or with
        ``lora_shared_base`` (``adapter``) on the learners' base with LoRA on and ``max_loras`` = the number
        of learners, so every adapter stays resident, synced by ``set_lora``; or a given agent that has that
        sync method."""
        if rollout_policy is None:
            return policy
        sync = "set_lora" if adapter else "load_weights"
        if rollout_policy == "vllm":
            from agents.vllm import VLLMAgent, lora_rank_slot

            model = policy.model.get_base_model() if adapter else policy.model
            source = getattr(model, "name_or_path", None) or model.config._name_or_path
            if not source or not Path(source).is_dir():
                whose, fix = (("learners' base", "{id: VLLMAgent(<directory>, enable_lora=True)}") if adapter else
                              ("learner", "VLLMAgent(<directory>, share_engine=False)"))
                raise ConfigError(f"rollout_policy='vllm' needs the {whose} loaded from a model directory, got "
                                  f"{source!r}; pass rollout_policy={fix}")
            if adapter:
                return VLLMAgent(source, name=policy.name, enable_lora=True, max_loras=len(self.learners),
                                 max_lora_rank=lora_rank_slot(self.config.lora.r))
            return VLLMAgent(source, name=policy.name, share_engine=False)
        if isinstance(rollout_policy, str):
            raise ConfigError(f"rollout_policy must be an agent with {sync} or 'vllm', got {rollout_policy!r}")
        if not callable(getattr(rollout_policy, sync, None)):
            why = ("with lora_shared_base each learner's adapter is served by path after each step; pass an "
                   "agents.VLLMAgent with enable_lora=True") if adapter else \
                ("the learner's new weights could not reach it after each step; pass an agents.VLLMAgent")
            raise ConfigTypeError(f"rollout_policy {rollout_policy!r} has no {sync}(): {why}")
        return rollout_policy

    def sync_rollout_policy(self, force: bool = False) -> bool:
        """Load each learner's current weights into its rollout policy if they changed since the last sync
        (or ``force``): the weights with LoRA merged in, or with ``lora_shared_base`` the learner's adapter,
        written to its own directory and served under a new ``LoRARequest`` id. True when any were loaded."""
        loaded = False
        for state in self._states.values():
            if state.rollout_policy is state.policy or not (state.stale or force):
                continue
            t0 = time.perf_counter()
            if state.adapter is not None:
                if state.served is None:
                    state.served = Path(tempfile.mkdtemp(prefix=f"crl-envs-adapter-{state.adapter}-"))
                    weakref.finalize(self, shutil.rmtree, state.served, ignore_errors=True)
                state.rollout_policy.set_lora(state.policy.save_adapter(state.served))
            else:
                state.rollout_policy.load_weights(merged_weights(state.policy.model))
            self.sync_seconds = time.perf_counter() - t0
            self.weight_syncs += 1
            state.stale = False
            loaded = True
        return loaded

    # ------------------------------------------------------------------ LoRA
    def _lora_settings(self, model: torch.nn.Module) -> Any:
        """``config.lora`` as a ``peft.LoraConfig`` for ``model`` (GPT-2's Conv1D layers are fan-in-fan-out)."""
        from peft import LoraConfig

        lora = self.config.lora
        return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
                          fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2")

    def _apply_lora(self, policy: Agent) -> None:
        from peft import get_peft_model

        policy.model = get_peft_model(policy.model, self._lora_settings(policy.model))
        policy.model.eval()  # no dropout: the recomputed log-probs must match the sampled ones

    # ------------------------------------------------------------------ logging and checkpoints
    def log(self, metrics: dict[str, Any]) -> None:
        if not self.config.output_dir:
            return
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open_append(out / "metrics.jsonl") as f:  # O_NOFOLLOW: never appended through a planted link
            f.write(json.dumps(metrics) + "\n")
        names = ("tensorboard",) * self.config.tensorboard + tuple(self.config.trackers)
        if names:
            if self._writer is None:  # crl_envs.tracking: TensorBoard, MLflow, trackio, W&B
                self._writer = open_trackers(names, self.config.tracking_dir or out, tensorboard_dir=out,
                                             project=self.config.tracking_project, run=out.resolve().name,
                                             config={"trainer": type(self).__name__, **self.setup(),
                                                     "config": self.config.to_dict()})
            self._writer.log_metrics({f"train/{k}": v for k, v in metrics.items() if k != "step"}, metrics["step"])

    def trainable_state(self, learner: str | None = None) -> dict[str, torch.Tensor]:
        """The trainable tensors of ``learner`` (default: the one learner)."""
        state = self._only("trainable_state") if learner is None else self._states[learner]
        names = {id(p): n for n, p in state.policy.model.named_parameters()}
        return {names[id(p)]: p.detach().cpu().clone() for p in state.params}

    def _learner_dir(self, root: Path, learner: str) -> Path:
        """Where ``learner``'s files go inside a checkpoint: the checkpoint itself for one learner, else ``<id>/``."""
        return root if len(self.learners) == 1 else root / learner

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoint-<step>`` atomically: trainable weights (the LoRA adapter
        only, with LoRA), optimizer, step, rollouts, RNG state. Several learners: each learner's weights
        and optimizer in ``checkpoint-<step>/<id>/``."""
        if not self.config.output_dir:
            raise ConfigError("save_checkpoint needs config.output_dir")
        root = Path(self.config.output_dir)
        final = root / f"checkpoint-{self.step:06d}"
        tmp = root / f".tmp-checkpoint-{self.step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for j, learner_state in self._states.items():
            where = self._learner_dir(tmp, j)
            where.mkdir(exist_ok=True)
            torch.save(self.trainable_state(j), where / "trainable.pt")
            torch.save(learner_state.optimizer.state_dict(), where / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        state = {"step": self.step, "rollouts": self.rollouts, "config": jsonable(self.config.to_dict()),
                 "trainer": type(self).__name__, "learner": self._learner_key(), "setup": self.setup()}
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    def checkpoints(self) -> list[Path]:
        """This run's checkpoint directories, oldest first."""
        if not self.config.output_dir or not Path(self.config.output_dir).is_dir():
            return []
        return sorted(p for p in Path(self.config.output_dir).glob("checkpoint-*") if (p / "state.json").exists())

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def setup(self) -> dict[str, Any]:
        """What, besides the config, a checkpoint must share with this trainer to resume it."""
        return {"trainer": type(self).__name__, "learner": self._learner_key(),
                "protocol": getattr(self.protocol, "__name__", str(self.protocol)),
                "task": {"name": self.task.name, "n": len(self.task),
                         "ids": stable_hash(*[ex.id for ex in self.task]) % (2**61)},
                "pool": [self.pool[a].name for a in self.pool.ids],
                "bases": [self._bases[a] for a in self.pool.ids]}

    def checkpoint_differences(self, state: dict[str, Any]) -> list[str]:
        """``field: saved -> current`` for every setting where the checkpoint's ``state`` differs from this trainer."""
        defaults = jsonable(type(self.config)().to_dict())
        saved_cfg = {**{k: v for k, v in defaults.items() if k not in state.get("config", {})},  # fields added since
                     **state.get("config", {})}
        saved_cfg = {k: v for k, v in saved_cfg.items() if k not in RESUMABLE_FIELDS}
        current_cfg = {k: v for k, v in jsonable(self.config.to_dict()).items() if k not in RESUMABLE_FIELDS}
        saved = {**{f"config.{k}": v for k, v in saved_cfg.items()}, **state.get("setup", {})}
        current = {**{f"config.{k}": v for k, v in current_cfg.items()},
                   **{k: v for k, v in jsonable(self.setup()).items() if k in state.get("setup", {})}}
        if "setup" not in state:  # written before setups were stored: the trainer and learner were
            saved.update(trainer=state.get("trainer"), learner=state.get("learner"))
            current.update(trainer=type(self).__name__, learner=self._learner_key())
        return [f"{k}: {saved.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
                for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]

    def checkpoint_problem(self, path: Path) -> str:
        """What is wrong with the checkpoint directory ``path`` ("" when every file it needs is there and
        reads back), checked before anything is loaded: state.json, rng.pt, and each learner's
        trainable.pt and optimizer.pt (torch archives whose zip index must read)."""
        import zipfile

        try:
            state = read_json(path / "state.json")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"{path / 'state.json'} is unreadable ({type(e).__name__})"
        if not isinstance(state, dict) or not isinstance(state.get("step"), int) \
                or not isinstance(state.get("rollouts"), int):
            return f"{path / 'state.json'} holds no step and rollouts"
        files = [path / "rng.pt"] + [self._learner_dir(path, j) / name for j in self._states
                                     for name in ("trainable.pt", "optimizer.pt")]
        for f in files:
            if not f.is_file() or f.is_symlink():
                return f"{f} is missing"
            try:
                with zipfile.ZipFile(f) as archive:
                    bad = archive.testzip()
            except (OSError, zipfile.BadZipFile) as e:
                return f"{f} is damaged ({type(e).__name__}: {e})"
            if bad is not None:
                return f"{f} is damaged (its member {bad} fails its checksum)"
        return ""

    def load_checkpoint(self, path: str | Path | None = None, *, strict: bool = True) -> bool:
        """Restore the latest (or the given) checkpoint; drop metrics logged after it. False if none.

        Every file is checked before anything is loaded (:meth:`checkpoint_problem`): a damaged latest
        checkpoint is reported in one line and the one before it is used (a damaged ``path`` given
        explicitly raises). With ``strict`` (default) a checkpoint written with other settings (see
        :meth:`fit`; the pool's weights included) raises instead; ``strict=False`` loads it anyway
        (e.g. to continue with a new learning rate)."""
        if path is not None:
            path = Path(path)
            problem = self.checkpoint_problem(path)
            if problem:
                raise RunError(f"cannot resume from {path}: {problem}; pass another checkpoint or fit(resume=False)")
        else:
            path = None
            for candidate in reversed(self.checkpoints()):
                problem = self.checkpoint_problem(candidate)
                if not problem:
                    path = candidate
                    break
                print(f"{type(self).__name__}: skipping a damaged checkpoint: {problem}")
        if path is None:
            self._truncate_metrics(0, Path(self.config.output_dir) if self.config.output_dir else None)
            return False
        state = read_json(path / "state.json")
        differences = self.checkpoint_differences(state)
        if differences and strict:
            raise ConfigError(
                f"{path} was written with other settings ({'; '.join(differences)}); use a new output_dir, "
                "or fit(resume=False) to start over there, or load_checkpoint(strict=False) to continue from it anyway"
            )
        loaded = {}
        for j, learner_state in self._states.items():
            where = self._learner_dir(path, j)
            weights = torch.load(where / "trainable.pt", map_location=learner_state.device)
            missing = set(self.trainable_state(j)) - set(weights)
            if missing:
                raise RunError(f"checkpoint {path} lacks {len(missing)} trainable tensors of {j} (e.g. "
                                   f"{sorted(missing)[0]}); was it written with the same model and LoRA settings?")
            loaded[j] = (weights, torch.load(where / "optimizer.pt", map_location=learner_state.device))
        for j, learner_state in self._states.items():  # every file read: only now is anything replaced
            weights, optimizer = loaded[j]
            learner_state.policy.model.load_state_dict(weights, strict=False)
            learner_state.optimizer.load_state_dict(optimizer)
            learner_state.stale = learner_state.rollout_policy is not learner_state.policy
        torch.set_rng_state(torch.load(path / "rng.pt")["torch"])
        self.step, self.rollouts = int(state["step"]), int(state["rollouts"])
        self._truncate_metrics(self.step, Path(self.config.output_dir or path.parent))
        note = f"; settings differ ({'; '.join(differences)})" if differences else "; same settings"
        print(f"{type(self).__name__}: resumed from {path} at step {self.step}{note}")
        return True

    def _truncate_metrics(self, step: int, root: Path | None) -> None:
        """Keep the metrics of steps up to ``step`` (the checkpoint resumed from; 0 when none): a run
        stopped after its last checkpoint logs those steps again, and must not list them twice."""
        if root is None:
            return
        log = root / "metrics.jsonl"
        try:
            text = read_regular(log).decode()
        except FileNotFoundError:
            return
        kept = []
        for line in text.splitlines():
            try:
                if line and json.loads(line)["step"] <= step:
                    kept.append(line)
            except (json.JSONDecodeError, KeyError, TypeError):  # a line cut by a kill: dropped
                continue
        atomic_write_text(log, "".join(line + "\n" for line in kept))
        self.history = [json.loads(line) for line in kept]

    def _clear_output_dir(self) -> None:
        """``fit(resume=False)``: remove this run's checkpoints, metrics and TensorBoard events."""
        if not self.config.output_dir or not Path(self.config.output_dir).is_dir():
            return
        root = Path(self.config.output_dir)
        old = sorted(root.glob("checkpoint-*")) + sorted(root.glob(".tmp-checkpoint-*"))
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
        (root / "metrics.jsonl").unlink(missing_ok=True)
        if self._writer is None:
            shutil.rmtree(root / "tensorboard", ignore_errors=True)
        if old:
            print(f"{type(self).__name__}: starting over in {root} (resume=False): removed {len(old)} old checkpoint(s)")
        self.history = []

    def save_model(self, path: str | Path) -> Path:
        """The trained policy with ``save_pretrained`` (the adapter only, with LoRA) and its tokenizer;
        several learners: each in ``path/<id>``."""
        path = Path(path)
        for j, state in self._states.items():
            if state.adapter is not None:  # the shared base: this learner's adapter alone
                state.policy.save_adapter(self._learner_dir(path, j))
            else:
                state.policy.model.save_pretrained(self._learner_dir(path, j))
            state.policy.tokenizer.save_pretrained(self._learner_dir(path, j))
        return path

    def _learner_key(self) -> str | list[str]:
        """The learner(s) as checkpoints record them: the id for one, the list for several."""
        return self.learners[0] if len(self.learners) == 1 else list(self.learners)
