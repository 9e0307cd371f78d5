"""Rollouts for training: the one runner (:func:`crl_envs.run_episodes`) with the learner's policy
overriding its model, and the learner's tokens pulled out of the episodes.

Every trainer plays through :func:`rollout_episodes` (tests wrap it to count rollouts and coalitions), and
re-scores the learner's tokens with :func:`token_logprobs`, a teacher-forced forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from agents import Agent, Pool, SamplingParams
from crl_envs import protocols
from crl_envs.runner import Episode, RequestMemo, run_episodes
from crl_envs.tasks import Task


def rollout_episodes(
    protocol,
    pool: Pool,
    task: Task,
    learner: str | Mapping[str, Agent],
    policy: Agent | None = None,
    *,
    examples: Sequence[int | str],
    samples: int,
    seed: int,
    learner_sampling: SamplingParams,
    partner_sampling: SamplingParams,
    coalition: Sequence[str] | None = None,
    options: dict | None = None,
    progress: bool = False,
    training: Sequence[str] | None = None,
    memo: RequestMemo | None = None,
) -> list[Episode]:
    """Play ``samples`` episodes per example with ``policy`` as ``learner`` (recorded: its prompt
    and completion token ids and log-probs in every phase it speaks). Every other agent, pool
    member or protocol role, samples with ``partner_sampling``.

    Several learners: ``learner`` is a dict ``agent id -> policy`` (``policy`` unused); the ids in
    ``training`` (default: all) sample with ``learner_sampling`` and are recorded, the others play their
    policy with ``partner_sampling`` like any partner."""
    policies = dict(learner) if isinstance(learner, Mapping) else {learner: policy}
    training = list(policies) if training is None else list(training)
    factory = protocols.get(protocol)
    agent_ids = factory(pool, task, **dict(options or {})).possible_agents  # pool members + roles
    sampling = {a: partner_sampling for a in agent_ids}
    sampling.update({j: learner_sampling for j in training})
    return run_episodes(
        factory, pool, task, coalition=coalition, samples=samples, seed=seed, policies=policies,
        sampling=sampling, examples=list(examples), options=options, record=training, progress=progress, memo=memo,
    )


@dataclass
class LearnerSequence:
    """One learner turn to train on: what it saw, what it said, and the behaviour log-probs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    advantage: float
    episode: int


def learner_sequences(episodes: Sequence[Episode], learner: str, advantages: Sequence[float],
                      eos_token_id: int | None = None) -> list[LearnerSequence]:
    """Every turn of ``learner`` with at least one generated token, tagged with its episode's advantage.

    With ``eos_token_id``, a turn that stopped (``finish_reason == "stop"``) also trains its stop
    token, which the backend does not return: when to stop is part of the policy. Its behaviour
    log-prob is unknown (``nan``); the trainer fills it with the current policy's on the first pass.
    """
    out = []
    for index, (ep, adv) in enumerate(zip(episodes, advantages)):
        for turn in ep.turns_of(learner):
            if turn.token_ids is None or turn.logprobs is None or turn.prompt_token_ids is None:
                raise RuntimeError(
                    f"episode {ep.example_id!r}: the learner's turn in phase {turn.phase_name!r} carries no token ids; "
                    "the learner's policy must be a backend that returns token ids and log-probs (HFAgent)"
                )
            tokens, logprobs = list(turn.token_ids), list(turn.logprobs)
            if eos_token_id is not None and turn.finish_reason == "stop":
                tokens.append(eos_token_id)
                logprobs.append(float("nan"))
            if tokens:
                out.append(LearnerSequence(list(turn.prompt_token_ids), tokens, logprobs, float(adv), index))
    return out


def token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    temperature: float,
    pad_id: int,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token given its prompt, under ``softmax(logits / temperature)``.

    One teacher-forced forward over the batch: prompts left-padded to a common width (so every
    completion starts at the same column, as in :class:`agents.HFAgent`'s decoding), completions
    right-padded. Returns ``(logprobs, mask)``, both ``[B, max completion length]``; ``mask`` is 1
    exactly on the completion tokens.
    """
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    length = max(len(c) for c in completions)
    ids = torch.full((batch, width + length), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width + length), dtype=torch.long)
    mask = torch.zeros((batch, length))
    for row, (p, c) in enumerate(zip(prompts, completions)):
        ids[row, width - len(p) : width] = torch.tensor(list(p), dtype=torch.long)
        ids[row, width : width + len(c)] = torch.tensor(list(c), dtype=torch.long)
        attention[row, width - len(p) : width + len(c)] = 1
        mask[row, : len(c)] = 1
    ids, attention, mask = ids.to(device), attention.to(device), mask.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False).logits
    logits = logits[:, width - 1 : width + length - 1, :].float() / temperature
    targets = ids[:, width : width + length]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs * mask, mask
