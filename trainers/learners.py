"""The learners' side of a trainer: which pool members train (checked before any model is loaded), what
each one owns (:class:`LearnerState`: its policy, optimizer, KL reference and rollout engine), how it is
built (a copy of the pool member, LoRA, or with ``lora_shared_base`` one adapter per learner on one base),
and how its current weights reach the engine that plays its rollouts (:func:`sync_rollout_policy`).

:class:`trainers.PolicyGradientTrainer` holds one :class:`LearnerState` per learner and calls these; the
training loop itself (rollouts, advantages, the loss) stays in :mod:`trainers.base`.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agents import Agent, Pool
from crl_kit.errors import ConfigError, ConfigTypeError
from trainers.config import LoraSettings, TrainerConfig

#: Spec prefixes whose agents cannot be trained here (no transformers model behind them).
SERVED_BACKENDS = ("openai", "vllm", "llamacpp")


# ---------------------------------------------------------------------- which learners, checked early
def learner_ids(learner: str | None, learners: Sequence[str] | None) -> list[str]:
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


def check_learner_specs(pool: Any, ids: list[str], *, lora: bool, shared_base: bool = False) -> None:
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
        if isinstance(spec, str) and spec.split(":", 1)[0] in SERVED_BACKENDS:
            _raise_untrainable(j, f"the {spec.split(':', 1)[0]} backend ({spec!r})", lora=lora)
        elif isinstance(spec, Agent):  # a built agent (a scripted one has no weights)
            check_trainable(j, spec, lora=lora)
    models = {j: members[roster.index(j)].split("?", 1)[0] for j in ids if isinstance(members[roster.index(j)], str)}
    if shared_base and len(set(models.values())) > 1:
        first, *_ = models
        other = next(j for j in models if models[j] != models[first])
        _raise_not_one_base(first, repr(models[first]), other, repr(models[other]), "write both with the same spec")


def _raise_not_one_base(a: str, what_a: str, b: str, what_b: str, fix: str) -> None:
    raise ConfigError(f"config.lora_shared_base=True holds the learners as adapters of one base model, but {a} is "
                     f"{what_a} and {b} is {what_b}: {fix}, or set lora_shared_base=False (one model per learner)")


def check_one_base(ids: list[str], sources: Mapping[str, Agent]) -> None:
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


def check_trainable(learner: str, agent: Agent, *, lora: bool) -> None:
    """``agent`` can be trained (an HF model and tokenizer), or one line says why not."""
    from agents.scripted import ScriptedAgent

    if isinstance(agent, ScriptedAgent):
        raise ConfigTypeError(f"learner {learner!r} is a scripted agent ({agent.name!r}), which has no weights to train: "
                        "make the learner an agents.HFAgent (spec 'hf:<path>')")
    for attr in ("model", "tokenizer", "encode_prompt"):
        if not hasattr(agent, attr):
            _raise_untrainable(learner, f"a {type(agent).__name__} (no {attr!r})", lora=lora)


def per_learner(name: str, value: Any, ids: list[str], *, broadcast: tuple[Any, ...] = ()) -> dict[str, Any]:
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



# ---------------------------------------------------------------------- what one learner owns
@dataclass
class LearnerState:
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

    def mark_updated(self) -> None:
        """The policy's weights changed (an optimizer step, a checkpoint loaded): a separate rollout
        engine now lags them until the next sync."""
        self.stale = self.rollout_policy is not self.policy

    def needs_sync(self, force: bool = False) -> bool:
        """Whether the rollout engine must be given the policy's weights before the next rollouts."""
        return self.rollout_policy is not self.policy and (self.stale or force)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors its optimizer updates, by parameter name, detached copies on the CPU."""
        names = {id(p): n for n, p in self.policy.model.named_parameters()}
        return {names[id(p)]: p.detach().cpu().clone() for p in self.params}


def make_state(learner: str, policy: Agent | None, pool: Pool, config: TrainerConfig) -> LearnerState:
    """Copy ``pool[learner]`` (or take ``policy``), add LoRA / the reference, build its optimizer."""
    source = policy if policy is not None else pool[learner]
    state = LearnerState(policy=source if policy is not None else copy.deepcopy(source))
    state.device = next(state.policy.model.parameters()).device
    if config.lora is not None:
        apply_lora(state.policy, config.lora)
    if config.beta > 0 and config.lora is None:
        state.reference = copy.deepcopy(state.policy.model).eval().requires_grad_(False)
    finish_state(learner, state, [p for p in state.policy.model.parameters() if p.requires_grad], config)
    return state


def finish_state(learner: str, state: LearnerState, params: list[torch.nn.Parameter], config: TrainerConfig) -> None:
    """Give ``state`` its optimizer over ``params`` and its stop token."""
    if not params:
        raise ConfigError(f"learner {learner!r}'s model has no trainable parameters")
    state.params = params
    state.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    eos = state.policy.tokenizer.eos_token_id
    state.eos_token_id = eos if isinstance(eos, int) else None


def make_shared_states(ids: list[str], policy: Agent | None, pool: Pool, config: TrainerConfig) -> dict[str, LearnerState]:
    """``lora_shared_base``: one copy of the first learner's model (checked equal to the others'), one
    named LoRA adapter per learner on it (added in learner order, so each draws the initial weights a
    model of its own would), and per learner an agent that plays with its adapter, its optimizer."""
    from agents.hf import LoraAdapterAgent

    base = policy if policy is not None else copy.deepcopy(pool[ids[0]])
    model = base.model
    for k, j in enumerate(ids):
        settings = lora_settings(config.lora, model if k == 0 else model.get_base_model())
        if k == 0:
            from peft import get_peft_model

            base.model = model = get_peft_model(model, settings, adapter_name=j)
        else:
            model.add_adapter(j, settings)
    model.eval()  # no dropout: the recomputed log-probs must match the sampled ones
    states = {}
    for j in ids:
        agent = LoraAdapterAgent(base, j, name=pool[j].name)
        state = LearnerState(policy=agent, device=next(model.parameters()).device, adapter=j)
        finish_state(j, state, list(agent.adapter_state().values()), config)
        states[j] = state
    return states


# ---------------------------------------------------------------------- LoRA
def lora_settings(lora: LoraSettings, model: torch.nn.Module) -> Any:
    """``lora`` as a ``peft.LoraConfig`` for ``model`` (GPT-2's Conv1D layers are fan-in-fan-out)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
                      fan_in_fan_out=getattr(model.config, "model_type", "") == "gpt2")


def apply_lora(policy: Agent, lora: LoraSettings) -> None:
    """Wrap ``policy``'s model in a peft LoRA model (in place), in eval mode."""
    from peft import get_peft_model

    policy.model = get_peft_model(policy.model, lora_settings(lora, policy.model))
    policy.model.eval()  # no dropout: the recomputed log-probs must match the sampled ones


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


# ---------------------------------------------------------------------- rollouts on another engine
def make_rollout_policy(rollout_policy: Agent | str | None, policy: Agent, *, adapter: bool, learners: int,
                        lora: LoraSettings | None) -> Agent:
    """The agent that plays ``policy`` in rollouts: the policy itself (``None``); for ``"vllm"`` an engine
    on the learner's directory, synced by ``load_weights`` (the weights, LoRA merged in), or with
    ``lora_shared_base`` (``adapter``) on the learners' base with LoRA on and ``max_loras`` = the number
    of ``learners``, so every adapter stays resident, synced by ``set_lora``; or a given agent that has that
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
            return VLLMAgent(source, name=policy.name, enable_lora=True, max_loras=learners,
                             max_lora_rank=lora_rank_slot(lora.r))
        return VLLMAgent(source, name=policy.name, share_engine=False)
    if isinstance(rollout_policy, str):
        raise ConfigError(f"rollout_policy must be an agent with {sync} or 'vllm', got {rollout_policy!r}")
    if not callable(getattr(rollout_policy, sync, None)):
        why = ("with lora_shared_base each learner's adapter is served by path after each step; pass an "
               "agents.VLLMAgent with enable_lora=True") if adapter else \
            ("the learner's new weights could not reach it after each step; pass an agents.VLLMAgent")
        raise ConfigTypeError(f"rollout_policy {rollout_policy!r} has no {sync}(): {why}")
    return rollout_policy


def load_into_rollout_policy(state: LearnerState, owner: object) -> None:
    """Load ``state``'s current weights into its rollout policy: the weights with LoRA merged in, or with
    ``lora_shared_base`` the learner's adapter, written to its own directory (removed with ``owner``) and
    served under a new ``LoRARequest`` id."""
    if state.adapter is not None:
        if state.served is None:
            state.served = Path(tempfile.mkdtemp(prefix=f"crl-envs-adapter-{state.adapter}-"))
            weakref.finalize(owner, shutil.rmtree, state.served, ignore_errors=True)
        state.rollout_policy.set_lora(state.policy.save_adapter(state.served))
    else:
        state.rollout_policy.load_weights(merged_weights(state.policy.model))
    state.stale = False
