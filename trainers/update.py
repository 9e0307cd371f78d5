"""One policy-gradient update of a learner: the clipped loss (:mod:`trainers.losses`) over its recorded turns,
with gradient accumulation, gradient clipping and the optional KL to a reference; what
:meth:`trainers.PolicyGradientTrainer.optimise` runs for each learner a step trains."""

from __future__ import annotations

import numpy as np
import torch

from trainers.config import TrainerConfig
from trainers.learners import LearnerState
from trainers.losses import LossInputs, get_loss
from trainers.rollout import LearnerSequence, token_logprobs


def policy_gradient_update(state: LearnerState, sequences: list[LearnerSequence],
                           cfg: TrainerConfig) -> dict[str, float]:
    """``cfg.num_iterations`` passes of clipped PG over ``state``'s learner's ``sequences``, each one optimizer
    step of ``gradient_accumulation_steps`` micro-batches (:meth:`trainers.PolicyGradientTrainer.optimise`, which
    activates a shared base's adapter first); returns the update's metrics. Sequences with advantage 0 add
    nothing to a PG loss and are not forwarded unless a KL term needs them (the normalisation still counts them)."""
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
            ref = reference_logprobs(state, prompts, completions, cfg.temperature) if cfg.beta > 0 else None
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
def reference_logprobs(state: LearnerState, prompts: list[list[int]], completions: list[list[int]],
                       temperature: float) -> torch.Tensor:
    """The completions' log-probs under ``state``'s KL reference (the frozen copy, or with LoRA the base model)."""
    pad = state.policy.tokenizer.pad_token_id
    if state.reference is not None:
        lp, _ = token_logprobs(state.reference, prompts, completions, temperature=temperature,
                               pad_id=pad, device=state.device)
        return lp
    with state.policy.model.disable_adapter():  # LoRA: the base model is the reference
        lp, _ = token_logprobs(state.policy.model, prompts, completions, temperature=temperature,
                               pad_id=pad, device=state.device)
    return lp
