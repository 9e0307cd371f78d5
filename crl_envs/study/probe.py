"""The dry run's probe (``crl-envs study CONFIG --dry-run --probe``): before anything trains, how often
the learner's turn can change a training setting's outcome. It plays the training pool, so it sits above
the plan and the runner (the gates below them only read results)."""

from __future__ import annotations

from typing import Any

import numpy as np


def zero_variance_probe(config: Any, questions: int = 4, seed: int = 0) -> dict[str, float]:
    """Per training setting (``setup/task``), the share of groups whose system scores are all equal when the
    untrained learner samples G rollouts (temperature 1, partners greedy) on ``questions`` training questions:
    before anything trains, how often the learner's turn can change the outcome (1.0: never, no signal)."""
    from agents import SamplingParams
    from crl_envs.study.cells.build import build_pool, build_task
    from crl_envs.study.cells.setting import substitute
    from trainers.rollout import rollout_episodes

    t = config.training
    pool = build_pool(config.pools[t.pool].describe())
    out = {}
    for label, setup in t.setups.items():
        learner = setup.learners[0] if setup.learners else t.learner
        for task in t.tasks:
            tokens = config.sampling_for(task)["max_new_tokens"]
            qs = build_task(config.tasks[task].describe(), split=t.train_split, n=questions)
            episodes = rollout_episodes(setup.protocol, pool, qs, learner, pool[learner], coalition=None,
                                        options=substitute(setup.options, learner), examples=[ex.id for ex in qs],
                                        samples=t.num_generations, seed=seed,
                                        learner_sampling=SamplingParams(temperature=1.0, max_new_tokens=tokens),
                                        partner_sampling=SamplingParams(temperature=0.0, max_new_tokens=tokens))
            scores = np.array([ep.score for ep in episodes], dtype=float).reshape(len(qs), t.num_generations)
            out[f"{label}/{task}"] = float((scores.std(axis=1) == 0).mean())
    return out
