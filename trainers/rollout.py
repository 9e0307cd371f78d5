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
    share_prompts: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token given its prompt, under ``softmax(logits / temperature)``.

    Returns ``(logprobs, mask)``, both ``[B, max completion length]``; ``mask`` is 1 exactly on the completion
    tokens. Rows whose prompts are all different take one teacher-forced forward over the batch (prompts
    left-padded to a common width, so every completion starts at the same column, as in
    :class:`agents.HFAgent`'s decoding; completions right-padded). Rows that share a prompt (a question's G
    samples, whose greedy partners said the same) forward each distinct prompt once (:func:`_shared_prompts`): in
    judge_v0 on the zoo the prompts are most of the tokens, so the update's forward and backward cost about
    1/G of the whole rows'. ``share_prompts=False`` forwards whole rows always (the equivalence tests and
    ``benchmarks/training_cell.py`` compare both; they differ by float rounding, ~1e-6).
    """
    from agents.hf import left_pad

    distinct, rows = distinct_prompts(prompts)
    targets, mask = right_pad(completions, pad_id, device)
    if share_prompts and len(distinct) < len(prompts):
        return _shared_prompts(model, distinct, torch.tensor(rows, device=device), targets, mask,
                               temperature=temperature, pad_id=pad_id, device=device)
    prompt_ids, prompt_attention, _ = left_pad(prompts, pad_id, device)
    width, length = prompt_ids.shape[1], targets.shape[1]
    ids = torch.cat([prompt_ids, targets], dim=1)
    attention = torch.cat([prompt_attention, mask.to(prompt_attention.dtype)], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False).logits
    logits = logits[:, width - 1 : width + length - 1, :].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs * mask, mask


def distinct_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The distinct prompts in order of first appearance, and each row's index among them."""
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    where = {p: i for i, p in enumerate(distinct)}
    return distinct, [where[tuple(p)] for p in prompts]


def right_pad(completions: Sequence[Sequence[int]], pad_id: int, device: torch.device | str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions right-padded with ``pad_id`` to the longest: ``(targets, mask)``, both ``[B, longest]``, the
    mask (float) 1 exactly on the completion tokens."""
    length = max(len(c) for c in completions)
    targets = torch.full((len(completions), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(completions), length))
    for row, c in enumerate(completions):
        targets[row, : len(c)] = torch.tensor(list(c), dtype=torch.long)
        mask[row, : len(c)] = 1
    return targets.to(device), mask.to(device)


def _shared_prompts(
    model: torch.nn.Module,
    distinct: Sequence[Sequence[int]],
    rows: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float,
    pad_id: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` forwarding each distinct prompt once: the ``distinct`` prompts (left-padded) with a KV
    cache, whose rows are then gathered to every row (``rows``: each row's distinct prompt), and the completions
    (``targets``, right-padded, :func:`right_pad`) through it. The gather's backward adds up the rows' gradients
    into their shared prompt, so the gradient is the whole rows' (tests/test_trainers.py compares both, values and
    gradients, to float tolerance)."""
    from agents.hf import _cache_of, left_pad

    ids, attention, positions = left_pad(distinct, pad_id, device)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    length = targets.shape[1]
    # index_select, not indexing: its backward (index_add_) adds the rows' gradients in a fixed order on CPU, where
    # indexing's (index_put_ with accumulate) gave run-to-run differences of ~1e-7 in the trained weights
    logits = out.logits[:, -1:, :].index_select(0, rows)  # predicts each completion's first token
    if length > 1:  # the completions but their last token, after their prompt's cache
        cache = _cache_of(out)
        cache.reorder_cache(rows)  # every layer's keys and values: index_select(0, rows)
        seen = torch.cat([attention[rows], mask[:, :-1].to(attention.dtype)], dim=1)
        after = positions[rows][:, -1:] + 1 + torch.arange(length - 1, device=device)
        rest = model(input_ids=targets[:, :-1], attention_mask=seen, position_ids=after, past_key_values=cache,
                     use_cache=True).logits
        logits = torch.cat([logits, rest], dim=1)
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs * mask, mask
