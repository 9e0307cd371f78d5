"""The controls a training run is read beside: the system without the learner, answer and verdict rates,
and the learning-rate bound for full fine-tuning.

- :func:`without_learner` — v(N \\ learners) per held-out question, played through the runner (greedy):
  a system gain that does not beat it is the learner being switched off (deletion), not collaboration.
- :func:`answer_rates` — of the learner's turns, the share whose answer parses, and for a judge the share
  of verdicts that name a valid candidate (``judge_v0`` falls back to the vote on the others).
- :data:`FULL_FINETUNE_LR_BOUND` / :func:`check_learning_rate` — one warning line when a full fine-tune runs
  above the bound (lr 1e-3 on the zoo's 0.25M-parameter models moves most weights by more than lr/2 in one
  step and drops the learner alone from 0.255 to 0.050: issue #46).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agents import Pool, SamplingParams
from crl_envs.protocols.roles import parse_choice
from crl_envs.runner import Episode
from crl_envs.tasks import Task

#: Above this learning rate a full fine-tune (no LoRA) warns: 2x TrainerConfig's default, 10x below the
#: rate that destroyed the zoo's rookie in one step.
FULL_FINETUNE_LR_BOUND = 1e-4


def check_learning_rate(learning_rate: float, *, lora: bool, where: str = "learning_rate") -> bool:
    """Warn in one line when ``learning_rate`` exceeds :data:`FULL_FINETUNE_LR_BOUND` on a full fine-tune;
    returns whether it warned."""
    if lora or learning_rate <= FULL_FINETUNE_LR_BOUND:
        return False
    warnings.warn(f"{where}={learning_rate:g} is above {FULL_FINETUNE_LR_BOUND:g}, the bound for full fine-tuning: "
                  f"small models collapse before any reward matters; lower it, or train LoRA (lora=LoraSettings())",
                  UserWarning, stacklevel=3)
    return True


def without_learner(protocol: Any, pool: Pool, task: Task, learners: Sequence[str], *, max_new_tokens: int,
                    protocol_options: Mapping[str, Any] | None = None, seed: int = 0) -> np.ndarray:
    """Per question of ``task``, the greedy score of ``protocol`` played by the pool without ``learners``
    (the protocol's empty value when nobody is left)."""
    from crl_envs import protocols
    from trainers.rollout import rollout_episodes

    others = [a for a in pool.ids if a not in set(learners)]
    if not others:
        return np.full(len(task), float(protocols.get(protocol)(pool, task).empty_value))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    episodes = rollout_episodes(protocol, pool, task, {}, coalition=others, options=dict(protocol_options or {}),
                                examples=[ex.id for ex in task], samples=1, seed=seed,
                                learner_sampling=greedy, partner_sampling=greedy)
    return np.array([ep.score for ep in episodes], dtype=float)


def answer_rates(episodes: Sequence[Episode], learner: str) -> dict[str, float | None]:
    """``parse_rate``: of the episodes where ``learner`` proposed an answer, the share that parses;
    ``verdict_rate``: of its judge turns (phase ``"judge"``), the share naming a valid candidate
    (``None`` when it has no such turns)."""
    proposed = [ep.answers[learner] is not None for ep in episodes if learner in ep.answers]
    verdicts = [parse_choice(t.text, len(ep.answers) or len(ep.coalition)) is not None
                for ep in episodes for t in ep.transcript if t.agent == learner and t.phase_name == "judge"]
    return {"parse_rate": float(np.mean(proposed)) if proposed else None,
            "verdict_rate": float(np.mean(verdicts)) if verdicts else None}


def zero_variance_share(history: Sequence[Mapping[str, Any]]) -> float | None:
    """The mean share of zero-variance groups over a fit's steps (``None`` before any step)."""
    shares = [m["zero_variance_groups"] for m in history if m.get("zero_variance_groups") is not None]
    return float(np.mean(shares)) if shares else None


def with_controls(trainer: Any, task: Task, result: Any) -> Any:
    """``result`` (a trainer's :class:`trainers.EvalResult` on ``task``) with ``without_learner`` (played once per
    task and trainer, it does not depend on the learner: kept in ``trainer.without_learner_scores``) and the fit's
    ``zero_variance_share``; with an ``output_dir`` the line is appended to ``evaluations.jsonl`` there
    (``metrics.jsonl`` holds the steps)."""
    import json
    from dataclasses import replace
    from pathlib import Path

    cache = trainer.without_learner_scores
    key = (getattr(task, "name", ""), tuple(ex.id for ex in task))
    if key not in cache:
        cache[key] = without_learner(trainer.protocol, trainer.pool, task, trainer.learners,
                                     max_new_tokens=trainer.config.max_new_tokens,
                                     protocol_options=trainer.config.protocol_options, seed=trainer.config.seed)
    result = replace(result, without_learner=cache[key], zero_variance_share=zero_variance_share(trainer.history))
    if trainer.config.output_dir:
        out = Path(trainer.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "evaluations.jsonl", "a") as f:
            f.write(json.dumps({"step": trainer.step, **result.to_dict()}) + "\n")
    return result
