"""The dry run's probe (``crl-envs study CONFIG --dry-run --probe``): before anything trains, whether each
training setting can be compared at all. It plays the training pool, so it sits above the plan and the runner
(the gates below them only read results).

- :func:`zero_variance_probe` — how often the learner's turn can change a setting's outcome (the share of
  groups of G samples whose system scores are all equal: no signal for an outcome reward);
- :func:`setting_probe` — that share, and the system's greedy score with the untrained learner (``before``)
  and without it (``without_learner``) on training questions: where the system scores more without the
  learner, switching the learner off is a "gain", which the ``not_deletion`` gate then refuses
  (paper-small's cascade-first: 0.545 without the learner, 0.170 with it);
- :func:`probe_verdict` — the rule the probe chooses settings by, from those numbers alone (a test replays it
  on recorded numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crl_envs.study.cells.setting import Setting, training_settings
from crl_envs.study.gates import NO_SIGNAL_SHARE

#: Training questions the probe's greedy before/without-learner scores are read on (train split, never eval).
PROBE_SCORE_QUESTIONS = 100


def zero_variance_probe(config: Any, questions: int = 4, seed: int = 0) -> dict[str, float]:
    """Per training setting (``setup/task``), the share of groups whose system scores are all equal when the
    untrained learner samples G rollouts (temperature 1, partners greedy) on ``questions`` training questions:
    before anything trains, how often the learner's turn can change the outcome (1.0: never, no signal)."""
    pool = _training_pool(config)
    return {f"{s.label}/{s.task}": _zero_variance(config, pool, s, questions, seed) for s in training_settings(config)}


def setting_probe(config: Any, questions: int = 8, score_questions: int = PROBE_SCORE_QUESTIONS,
                  seed: int = 0, margin: float = 0.0) -> dict[str, dict[str, Any]]:
    """Per training setting (``setup/task``): ``zero_variance`` (:func:`zero_variance_probe`, on ``questions``),
    ``before`` and ``without_learner`` (the system's mean greedy score with the untrained learner and without it,
    on ``score_questions`` training questions), ``learner`` and the verdict of :func:`probe_verdict` with
    ``margin`` (``passed``, ``reason``).

    Raises:
        ValueError: ``margin`` outside [0, 1), before anything plays."""
    from crl_envs.study.cells.build import build_task
    from trainers.controls import without_learner

    _check_margin(margin)
    pool, out = _training_pool(config), {}
    for s in training_settings(config):
        c = s.common
        qs = build_task(c.task, split=c.train_split, n=score_questions)
        entry = {"learner": c.learner, "protocol": c.protocol, "options": c.options,
                 "zero_variance": _zero_variance(config, pool, s, questions, seed),
                 "before": float(_greedy_scores(c.protocol, pool, qs, c.learner, c.options, c.max_new_tokens,
                                                seed).mean()),
                 "without_learner": float(without_learner(c.protocol, pool, qs, [c.learner],
                                                          max_new_tokens=c.max_new_tokens, protocol_options=c.options,
                                                          seed=seed).mean()),
                 "score_questions": len(qs), "questions": questions, "margin": margin}
        out[f"{s.label}/{s.task}"] = {**entry, **probe_verdict(entry, margin=margin)}
    return out


def probe_verdict(entry: Mapping[str, Any], margin: float = 0.0) -> dict[str, Any]:
    """Whether a setting can be compared, from its probe numbers alone: some signal (``zero_variance`` below
    :data:`crl_envs.study.gates.NO_SIGNAL_SHARE`) and a seat whose deletion cannot pass for a gain (the system
    without the learner scores no more than with it, ``without_learner <= before``) and, with ``margin`` above 0,
    a seat that adds at least ``margin`` (``before - without_learner >= margin``): where the untrained learner adds
    little, a trainer's small gain cannot be told from deleting it, and the ``not_deletion`` gate refuses the
    setting after the training was paid for (paper-cpu-pilot's blender and refine: seats adding 1.9 and 1.5 points
    on the test questions). Returns ``{"passed", "reason"}`` (``reason`` ``None`` when it passes).

    Raises:
        ValueError: ``margin`` outside [0, 1).

    Example:
        >>> probe_verdict({"zero_variance": 0.2, "before": 0.62, "without_learner": 0.60}, margin=0.05)["reason"]
        'the seat adds +2.0 points, below the margin of 5.0: a small gain could not be told from deleting the learner'
    """
    _check_margin(margin)
    reasons = []
    if entry["zero_variance"] >= NO_SIGNAL_SHARE:
        reasons.append(f"no signal: {entry['zero_variance']:.0%} of groups have equal scores (>= "
                       f"{NO_SIGNAL_SHARE:.0%})")
    if entry["without_learner"] > entry["before"] + 1e-12:
        reasons.append(f"deletion would pass for a gain: the system scores {entry['without_learner']:.3f} without "
                       f"the learner, {entry['before']:.3f} with it")
    elif margin > 0 and entry["before"] - entry["without_learner"] < margin - 1e-12:
        reasons.append(f"the seat adds {100 * (entry['before'] - entry['without_learner']):+.1f} points, below the "
                       f"margin of {100 * margin:.1f}: a small gain could not be told from deleting the learner")
    return {"passed": not reasons, "reason": "; ".join(reasons) or None}


def _check_margin(margin: float) -> None:
    if not 0 <= margin < 1:
        raise ValueError(f"probe_verdict: margin must be in [0, 1) (e.g. 0.05), got {margin!r}")


def _training_pool(config: Any) -> Any:
    from crl_envs.study.cells.build import build_pool

    return build_pool(config.pools[config.training.pool].describe())


def _zero_variance(config: Any, pool: Any, setting: Setting, questions: int, seed: int) -> float:
    from agents import SamplingParams
    from crl_envs.study.cells.build import build_task
    from trainers.rollout import rollout_episodes

    c, t = setting.common, config.training
    qs = build_task(c.task, split=c.train_split, n=questions)
    episodes = rollout_episodes(c.protocol, pool, qs, c.learner, pool[c.learner], coalition=None,
                                options=dict(c.options), examples=[ex.id for ex in qs],
                                samples=t.num_generations, seed=seed,
                                learner_sampling=SamplingParams(temperature=1.0, max_new_tokens=c.max_new_tokens),
                                partner_sampling=SamplingParams(temperature=0.0, max_new_tokens=c.max_new_tokens))
    scores = np.array([ep.score for ep in episodes], dtype=float).reshape(len(qs), t.num_generations)
    return float((scores.std(axis=1) == 0).mean())


def _greedy_scores(protocol: str, pool: Any, task: Any, learner: str, options: Mapping[str, Any], tokens: int,
                   seed: int) -> np.ndarray:
    """Per question, the greedy system score with every member (the learner untrained) playing."""
    from agents import SamplingParams
    from trainers.rollout import rollout_episodes

    greedy = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    episodes = rollout_episodes(protocol, pool, task, learner, pool[learner], coalition=None, options=dict(options),
                                examples=[ex.id for ex in task], samples=1, seed=seed,
                                learner_sampling=greedy, partner_sampling=greedy)
    return np.array([ep.score for ep in episodes], dtype=float)


def probe_markdown(probed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The dry run's probe table: per setting its learner, numbers and the probe's choice."""
    if not probed:
        return []
    first = next(iter(probed.values()))
    margin = f"; a seat must add at least {100 * first['margin']:.1f} points" if first.get("margin") else ""
    lines = ["", f"probe (untrained learner; zero-variance share of {first['questions']} training questions x G at "
                 f"temperature 1; greedy system score with and without the learner on {first['score_questions']} "
                 f"training questions{margin}):", "| setting | learner | zero-variance groups | before | without learner | "
                 "probe |", "|---|---|---|---|---|---|"]
    for label, e in probed.items():
        verdict = "chosen" if e["passed"] else f"not comparable: {e['reason']}"
        lines.append(f"| {label} | {e['learner']} | {e['zero_variance']:.0%} | {e['before']:.3f} | "
                     f"{e['without_learner']:.3f} | {verdict} |")
    chosen = [label for label, e in probed.items() if e["passed"]]
    lines.append(f"probe: {len(chosen)} of {len(probed)} settings chosen" + (f" ({', '.join(chosen)})" if chosen else ""))
    return lines
