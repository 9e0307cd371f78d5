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
import math
import os
import shutil
import time
from collections.abc import Sequence
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
    ``context`` goes to the advantage estimator; ``rollouts`` counts every episode played."""

    episodes: list[Episode]
    rewards: torch.Tensor
    index: list[list[int]]
    context: dict[str, torch.Tensor] = field(default_factory=dict)
    rollouts: int = 0


@dataclass
class EvalResult:
    """Per-question scores on held-out questions (greedy decoding for every agent)."""

    example_ids: list[str]
    system: np.ndarray
    standalone: np.ndarray

    @property
    def system_accuracy(self) -> float:
        return float(np.mean(self.system))

    @property
    def standalone_accuracy(self) -> float:
        return float(np.mean(self.standalone))

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system_accuracy, "standalone": self.standalone_accuracy, "n": len(self.example_ids)}


@dataclass
class Improvement:
    """What training changed, on the same held-out questions: system and learner-alone accuracy before and
    after, each change with a paired bootstrap CI. ``print()`` it for a two-line summary in points."""

    before: EvalResult
    after: EvalResult
    system: PairedCI
    standalone: PairedCI

    def __str__(self) -> str:
        b, a = self.before, self.after
        return (f"system accuracy   {b.system_accuracy:.3f} -> {a.system_accuracy:.3f}: {self.system}\n"
                f"learner alone     {b.standalone_accuracy:.3f} -> {a.standalone_accuracy:.3f}: {self.standalone}")

    def to_dict(self) -> dict[str, Any]:
        return {"before": self.before.to_dict(), "after": self.after.to_dict(),
                "system_delta": list(self.system), "standalone_delta": list(self.standalone)}


def compare(before: EvalResult, after: EvalResult, *, level: float = 0.95, seed: int = 0) -> Improvement:
    """The change from ``before`` to ``after`` (two :meth:`PolicyGradientTrainer.evaluate` results on the
    same questions), with paired bootstrap CIs over questions."""
    if before.example_ids != after.example_ids:
        raise ValueError("compare() needs both evaluations on the same questions in the same order; "
                         "evaluate before and after training on the same eval_task")
    return Improvement(before, after, paired_bootstrap_ci(before.system, after.system, level=level, seed=seed),
                       paired_bootstrap_ci(before.standalone, after.standalone, level=level, seed=seed))


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


def evaluate_policy(protocol: Any, pool: Pool, task: Task, learner: str, policy: Agent, *, max_new_tokens: int,
                    protocol_options: dict[str, Any] | None = None, seed: int = 0) -> EvalResult:
    """System and standalone accuracy of ``policy`` playing ``learner`` on ``task`` (greedy, every agent).

    Standalone scores come from ``Episode.standalone`` where the protocol defines them, else from the
    learner answering alone (``vote_v0`` with the learner as the only member). Shared by every trainer,
    ours and TRL's (:mod:`trainers.trl`)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    ids = [ex.id for ex in task]
    kwargs = dict(learner_sampling=greedy, partner_sampling=greedy, examples=ids, samples=1, seed=seed)
    episodes = rollout_episodes(protocol, pool, task, learner, policy, options=protocol_options, **kwargs)
    system = np.array([ep.score for ep in episodes])
    if all(learner in ep.standalone for ep in episodes):
        standalone = np.array([ep.standalone[learner] for ep in episodes])
    else:
        alone = rollout_episodes("vote", pool, task, learner, policy, coalition=[learner], **kwargs)
        standalone = np.array([ep.score for ep in alone])
    return EvalResult(ids, system, standalone)


#: Config fields that do not change what training computes: a checkpoint written under other values resumes.
RESUMABLE_FIELDS = frozenset({"steps", "output_dir", "save_steps", "tensorboard", "progress"})


def _jsonable(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists, paths and other objects strings)."""
    return json.loads(json.dumps(value, default=str))


class PolicyGradientTrainer(abc.ABC):
    """Group-baseline policy-gradient training of one agent of ``pool`` inside ``protocol``.

    Args:
        protocol: a protocol factory or name (``crl_envs.debate_v0``, ``"vote"``).
        pool: the models; ``pool[learner]`` must expose ``.model`` / ``.tokenizer`` (an
            :class:`agents.HFAgent`). It is deep-copied: the pool itself is never modified.
        task: training questions (a Task or a task name).
        learner: the agent id trained (``"model_0"``, ...).
        config: the trainer's config dataclass (defaults if ``None``).
        eval_task: held-out questions for :meth:`evaluate` (default: ``task``'s test split when
            ``task`` is a name, else required at :meth:`evaluate`).
        policy: start from this agent instead of a copy of ``pool[learner]``.
        rollout_policy: the learner's rollouts on another engine: an agent with ``load_weights``
            (:class:`agents.VLLMAgent` built on the learner's model, its own engine), or ``"vllm"``
            to build one on the learner's model directory. Gradients stay on the HF policy; before
            each step's rollouts the policy's current weights (LoRA merged) are loaded into it
            whenever they changed (:meth:`sync_rollout_policy`), so every rollout is on-policy.
            Partners play on whatever backend the pool gives them (``agents.pool("pretrained-vllm")``).
    """

    config_class: type[TrainerConfig] = TrainerConfig

    def __init__(
        self,
        protocol: Any,
        pool: Pool | Sequence[Agent | str] | str,
        task: Task | str,
        learner: str = "model_0",
        config: TrainerConfig | None = None,
        *,
        eval_task: Task | str | None = None,
        policy: Agent | None = None,
        rollout_policy: Agent | str | None = None,
    ):
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, TrainerConfig):
            raise TypeError(f"config must be a {self.config_class.__name__}, got {type(self.config).__name__}")
        self.protocol = protocols.get(protocol)
        self.pool = pool if isinstance(pool, Pool) else make_pool(pool)
        if isinstance(task, str):
            eval_task = eval_task or task_registry.load(task, split="test")
            task = task_registry.load(task, split="train")
        self.task = task
        self.eval_task = task_registry.load(eval_task) if isinstance(eval_task, str) else eval_task
        if learner not in self.pool.ids:
            raise ValueError(f"learner {learner!r} is not in the pool; pool agents are {self.pool.ids}")
        self.learner = learner
        get_loss(self.config.loss_type)  # fail early on unknown names
        if self.config.advantage not in ADVANTAGES:
            raise ValueError(f"unknown advantage estimator {self.config.advantage!r}; registered: {sorted(ADVANTAGES)}")
        source = policy if policy is not None else self.pool[learner]
        for attr in ("model", "tokenizer", "encode_prompt"):
            if not hasattr(source, attr):
                raise TypeError(
                    f"learner {learner!r} is a {type(source).__name__}, which exposes no {attr!r}: training needs a "
                    "transformers model with token log-probs; make the learner an agents.HFAgent (spec 'hf:<path>')"
                )
        torch.manual_seed(self.config.seed)
        self.policy = source if policy is not None else copy.deepcopy(source)
        self.device = next(self.policy.model.parameters()).device
        if self.config.lora is not None:
            self._apply_lora()
        self.reference = None
        if self.config.beta > 0 and self.config.lora is None:
            self.reference = copy.deepcopy(self.policy.model).eval().requires_grad_(False)
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the learner's model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=self.config.learning_rate, weight_decay=self.config.weight_decay)
        self.step = 0
        self.rollouts = 0
        self.history: list[dict[str, Any]] = []
        self._writer = None
        self.learner_sampling = SamplingParams(temperature=self.config.temperature, top_p=self.config.top_p,
                                               max_new_tokens=self.config.max_new_tokens)
        self.partner_sampling = SamplingParams(temperature=self.config.partner_temperature,
                                               max_new_tokens=self.config.max_new_tokens)
        eos = self.policy.tokenizer.eos_token_id
        #: The stop token trained at the end of every turn that stopped (``None``: not trained).
        self.eos_token_id: int | None = eos if isinstance(eos, int) else None
        self.eval_sampling = SamplingParams(temperature=0.0, max_new_tokens=self.config.max_new_tokens)
        #: the agent that plays the learner in rollouts (the HF policy itself unless ``rollout_policy``)
        self.rollout_policy: Agent = self._make_rollout_policy(rollout_policy)
        #: weight syncs into :attr:`rollout_policy` so far, and the last one's seconds
        self.weight_syncs, self.sync_seconds = 0, 0.0
        self._rollout_weights_stale = False  # the engine was built on the weights the policy starts from

    # ------------------------------------------------------------------ what a subclass defines
    @abc.abstractmethod
    def collect(self, examples: list[str], seed: int) -> RolloutBatch:
        """Play this step's rollouts for ``examples`` (ids) and return their rewards."""

    # ------------------------------------------------------------------ building blocks
    def play(self, examples: Sequence[str], seed: int, *, coalition: Sequence[str] | None = None,
             protocol: Any = None, samples: int | None = None) -> list[Episode]:
        """Rollouts with the current policy as the learner (G per example by default)."""
        self.sync_rollout_policy()
        return rollout_episodes(
            protocol or self.protocol, self.pool, self.task, self.learner, self.rollout_policy, examples=examples,
            samples=samples or self.config.num_generations, seed=seed, learner_sampling=self.learner_sampling,
            partner_sampling=self.partner_sampling, coalition=coalition,
            options=self.config.protocol_options if protocol is None else None,
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
    def train_step(self) -> dict[str, Any]:
        """One optimizer step; returns its metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        batch = self.collect(self.questions_for(self.step), self.rollout_seed(self.step))
        rollout_seconds = time.perf_counter() - t0
        self.rollouts += batch.rollouts
        advantages = compute_advantages(cfg.advantage, batch.rewards, **batch.context)
        per_episode = [0.0] * len(batch.episodes)
        for g, members in enumerate(batch.index):
            for k, e in enumerate(members):
                per_episode[e] = float(advantages[g, k])
        sequences = learner_sequences(batch.episodes, self.learner, per_episode, eos_token_id=self.eos_token_id)
        stats = self.optimise(sequences)
        self._rollout_weights_stale = self.rollout_policy is not self.policy
        seconds = time.perf_counter() - t0
        generated = sum(u.completion_tokens for ep in batch.episodes for u in ep.usage.values())
        system = [ep.score for ep in batch.episodes if set(ep.coalition) == set(self.pool.ids)]
        standalone = [ep.standalone[self.learner] for ep in batch.episodes if self.learner in ep.standalone]
        metrics = {
            "step": self.step + 1,
            "system_score": float(np.mean(system)) if system else None,
            "standalone_score": float(np.mean(standalone)) if standalone else None,
            "reward_mean": float(batch.rewards.mean()),
            "reward_std": float(batch.rewards.std(dim=1, unbiased=False).mean()),
            "zero_variance_groups": float((batch.rewards.std(dim=1, unbiased=False) == 0).double().mean()),
            "advantage_abs_mean": float(advantages.abs().mean()),
            **stats,
            "rollouts": self.rollouts,
            "tokens_per_second": generated / max(rollout_seconds, 1e-9),
            "rollout_seconds": rollout_seconds,
            "weight_syncs": self.weight_syncs,
            "seconds": seconds,
        }
        self.step += 1
        return metrics

    def optimise(self, sequences: list[LearnerSequence]) -> dict[str, float]:
        """``num_iterations`` passes of clipped PG over the learner's sequences, each one optimizer
        step built from ``gradient_accumulation_steps`` micro-batches. Sequences with advantage 0
        add nothing to a PG loss and are not forwarded unless a KL term needs them (the
        normalisation still counts them)."""
        cfg = self.config
        loss_fn = get_loss(cfg.loss_type)
        total_tokens = sum(len(s.completion_ids) for s in sequences)
        total_sequences = len(sequences)
        work = [s for s in sequences if s.advantage != 0.0 or cfg.beta > 0]
        sums = {"loss": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0, "grad_norm": 0.0}
        forwarded = sum(len(s.completion_ids) for s in work)
        model = self.policy.model
        pad = self.policy.tokenizer.pad_token_id
        for _ in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            if not work:
                break
            chunks = np.array_split(np.arange(len(work)), min(cfg.gradient_accumulation_steps, len(work)))
            for chunk in chunks:
                part = [work[i] for i in chunk]
                prompts = [s.prompt_ids for s in part]
                completions = [s.completion_ids for s in part]
                logprobs, mask = token_logprobs(model, prompts, completions, temperature=cfg.temperature,
                                                pad_id=pad, device=self.device)
                old = torch.zeros_like(logprobs)
                for row, s in enumerate(part):
                    old[row, : len(s.logprobs)] = torch.tensor(s.logprobs)
                unknown = torch.isnan(old)
                if unknown.any():  # stop tokens: the policy that sampled them is the current one (first pass)
                    old = torch.where(unknown, logprobs.detach(), old)
                    for row, s in enumerate(part):
                        s.logprobs = old[row, : len(s.logprobs)].tolist()
                ref = self._reference_logprobs(prompts, completions) if cfg.beta > 0 else None
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
            params = [p for p in model.parameters() if p.requires_grad]
            sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
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
    def _reference_logprobs(self, prompts, completions) -> torch.Tensor:
        pad = self.policy.tokenizer.pad_token_id
        if self.reference is not None:
            lp, _ = token_logprobs(self.reference, prompts, completions, temperature=self.config.temperature,
                                   pad_id=pad, device=self.device)
            return lp
        with self.policy.model.disable_adapter():  # LoRA: the base model is the reference
            lp, _ = token_logprobs(self.policy.model, prompts, completions, temperature=self.config.temperature,
                                   pad_id=pad, device=self.device)
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
        while self.step < steps:
            metrics = self.train_step()
            self.history.append(metrics)
            self.log(metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", zero_var=f"{metrics['zero_variance_groups']:.2f}")
            if self.config.output_dir and (self.step % self.config.save_steps == 0 or self.step == steps):
                self.save_checkpoint()
        bar.close()
        if self._writer is not None:
            self._writer.flush()
        return self.history

    def evaluate(self, task: Task | str | None = None) -> EvalResult:
        """System and standalone accuracy of the current policy on held-out questions (greedy); see
        :func:`evaluate_policy`."""
        task = task_registry.load(task) if isinstance(task, str) else (task or self.eval_task)
        if task is None:
            raise ValueError("evaluate() needs held-out questions: pass task= or give the trainer eval_task=")
        return evaluate_policy(self.protocol, self.pool, task, self.learner, self.policy,
                               max_new_tokens=self.config.max_new_tokens,
                               protocol_options=self.config.protocol_options, seed=self.config.seed)

    # ------------------------------------------------------------------ rollouts on another engine
    def _make_rollout_policy(self, rollout_policy: Agent | str | None) -> Agent:
        if rollout_policy is None:
            return self.policy
        if rollout_policy == "vllm":
            from agents.vllm import VLLMAgent

            source = getattr(self.policy.model, "name_or_path", None) or self.policy.model.config._name_or_path
            if not source or not Path(source).is_dir():
                raise ValueError(f"rollout_policy='vllm' needs the learner loaded from a model directory, got "
                                 f"{source!r}; pass rollout_policy=VLLMAgent(<directory>, share_engine=False)")
            return VLLMAgent(source, name=self.policy.name, share_engine=False)
        if isinstance(rollout_policy, str):
            raise ValueError(f"rollout_policy must be an agent with load_weights or 'vllm', got {rollout_policy!r}")
        if not callable(getattr(rollout_policy, "load_weights", None)):
            raise TypeError(f"rollout_policy {rollout_policy!r} has no load_weights(): the learner's new weights could "
                            "not reach it after each step; pass an agents.VLLMAgent")
        return rollout_policy

    def sync_rollout_policy(self, force: bool = False) -> bool:
        """Load the policy's current weights (LoRA adapters merged in) into :attr:`rollout_policy` if they
        changed since the last sync (or ``force``); True when weights were loaded."""
        if self.rollout_policy is self.policy or not (self._rollout_weights_stale or force):
            return False
        t0 = time.perf_counter()
        self.rollout_policy.load_weights(merged_weights(self.policy.model))
        self.sync_seconds = time.perf_counter() - t0
        self.weight_syncs += 1
        self._rollout_weights_stale = False
        return True

    # ------------------------------------------------------------------ LoRA
    def _apply_lora(self) -> None:
        from peft import LoraConfig, get_peft_model

        lora = self.config.lora
        model = self.policy.model
        settings = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                              target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
                              fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2")
        self.policy.model = get_peft_model(model, settings)
        self.policy.model.eval()  # no dropout: the recomputed log-probs must match the sampled ones

    # ------------------------------------------------------------------ logging and checkpoints
    def log(self, metrics: dict[str, Any]) -> None:
        if not self.config.output_dir:
            return
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.config.tensorboard:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(out / "tensorboard"))
            for key, value in metrics.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._writer.add_scalar(f"train/{key}", value, metrics["step"])

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.policy.model.named_parameters() if p.requires_grad}

    def save_checkpoint(self) -> Path:
        """Write ``output_dir/checkpoint-<step>`` atomically: trainable weights (the LoRA adapter
        only, with LoRA), optimizer, step, rollouts, RNG state."""
        if not self.config.output_dir:
            raise ValueError("save_checkpoint needs config.output_dir")
        root = Path(self.config.output_dir)
        final = root / f"checkpoint-{self.step:06d}"
        tmp = root / f".tmp-checkpoint-{self.step:06d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(self.trainable_state(), tmp / "trainable.pt")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        state = {"step": self.step, "rollouts": self.rollouts, "config": _jsonable(self.config.to_dict()),
                 "trainer": type(self).__name__, "learner": self.learner, "setup": self.setup()}
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    def latest_checkpoint(self) -> Path | None:
        if not self.config.output_dir or not Path(self.config.output_dir).is_dir():
            return None
        found = sorted(p for p in Path(self.config.output_dir).glob("checkpoint-*") if (p / "state.json").exists())
        return found[-1] if found else None

    def setup(self) -> dict[str, Any]:
        """What, besides the config, a checkpoint must share with this trainer to resume it."""
        return {"trainer": type(self).__name__, "learner": self.learner,
                "protocol": getattr(self.protocol, "__name__", str(self.protocol)),
                "task": {"name": self.task.name, "n": len(self.task),
                         "ids": stable_hash(*[ex.id for ex in self.task]) % (2**61)},
                "pool": [self.pool[a].name for a in self.pool.ids]}

    def checkpoint_differences(self, state: dict[str, Any]) -> list[str]:
        """``field: saved -> current`` for every setting where the checkpoint's ``state`` differs from this trainer."""
        saved_cfg = {k: v for k, v in state.get("config", {}).items() if k not in RESUMABLE_FIELDS}
        current_cfg = {k: v for k, v in _jsonable(self.config.to_dict()).items() if k not in RESUMABLE_FIELDS}
        saved = {**{f"config.{k}": v for k, v in saved_cfg.items()}, **state.get("setup", {})}
        current = {**{f"config.{k}": v for k, v in current_cfg.items()},
                   **{k: v for k, v in _jsonable(self.setup()).items() if k in state.get("setup", {})}}
        if "setup" not in state:  # written before setups were stored: the trainer and learner were
            saved.update(trainer=state.get("trainer"), learner=state.get("learner"))
            current.update(trainer=type(self).__name__, learner=self.learner)
        return [f"{k}: {saved.get(k, '<unset>')!r} -> {current.get(k, '<unset>')!r}"
                for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]

    def load_checkpoint(self, path: str | Path | None = None, *, strict: bool = True) -> bool:
        """Restore the latest (or the given) checkpoint; drop metrics logged after it. False if none.

        With ``strict`` (default) a checkpoint written with other settings (see :meth:`fit`) raises
        instead; ``strict=False`` loads it anyway (e.g. to continue with a new learning rate)."""
        path = Path(path) if path is not None else self.latest_checkpoint()
        if path is None:
            return False
        state = json.loads((path / "state.json").read_text())
        differences = self.checkpoint_differences(state)
        if differences and strict:
            raise ValueError(
                f"{path} was written with other settings ({'; '.join(differences)}); use a new output_dir, "
                "or fit(resume=False) to start over there, or load_checkpoint(strict=False) to continue from it anyway"
            )
        weights = torch.load(path / "trainable.pt", map_location=self.device)
        missing = set(self.trainable_state()) - set(weights)
        if missing:
            raise RuntimeError(f"checkpoint {path} lacks {len(missing)} trainable tensors (e.g. {sorted(missing)[0]}); "
                               "was it written with the same model and LoRA settings?")
        self.policy.model.load_state_dict(weights, strict=False)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device))
        self._rollout_weights_stale = self.rollout_policy is not self.policy
        torch.set_rng_state(torch.load(path / "rng.pt")["torch"])
        self.step, self.rollouts = int(state["step"]), int(state["rollouts"])
        log = Path(self.config.output_dir or path.parent) / "metrics.jsonl"
        if log.exists():
            kept = [line for line in log.read_text().splitlines() if line and json.loads(line)["step"] <= self.step]
            log.write_text("".join(line + "\n" for line in kept))
            self.history = [json.loads(line) for line in kept]
        note = f"; settings differ ({'; '.join(differences)})" if differences else "; same settings"
        print(f"{type(self).__name__}: resumed from {path} at step {self.step}{note}")
        return True

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
        """The trained policy with ``save_pretrained`` (the adapter only, with LoRA) and its tokenizer."""
        path = Path(path)
        self.policy.model.save_pretrained(path)
        self.policy.tokenizer.save_pretrained(path)
        return path
