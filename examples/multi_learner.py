"""Several learners at once: one rookie vs two rookies trained jointly vs round-robin, same total steps.

    python examples/multi_learner.py [--protocol vote] [--steps 12] [--seeds 0 1 2] [--n-eval 100] [--out runs/multi_learner.json]

Pool: zoo-nocarry, zoo-noborrow and two zoo-rookies (``model_2``, ``model_3``; the rookies are the weak
members that can improve). Four conditions, the same settings (lr 1e-4) and the same number of steps:

- ``one``: ``learner="model_2"`` (``model_3`` stays as it was);
- ``joint``: ``learners=["model_2", "model_3"]``, every step updates both from the same episodes;
- ``round_robin``: the same two, one per step in turn (each gets half the updates);
- ``placebo``: joint's rollouts and updates on coin-flip rewards (:class:`trainers.PlaceboTrainer`), the control.

Printed per condition: the system's Δ accuracy and each rookie's own (standalone) Δ, mean over seeds,
with a 95% bootstrap CI over held-out questions of the seed-averaged per-question change; the
cross-play gap (:func:`trainers.crossplay`: the gain a learner gives with its training partners minus
its gain with partners it never trained with, over every 3-member coalition and the pool with the other
rookie untrained); the share of zero-variance groups (no signal); the system's Δ minus what deleting the
condition's learners gives (system without them minus system before; negative: training did worse than
deletion); seconds per step, with the machine's load average (``uptime``), and the memory the
trained copies hold (weights + AdamW state: k separate models cost k times one). The learners here are
separate models; with ``lora=`` and ``lora_shared_base=True`` the trainer holds them as LoRA adapters on one
shared base instead (docs/training.md, "k adapters on one base").

Measured: vote, the defaults (2026-12-06, ``--out docs/multi_learner.json``, committed;
tests/test_multi_learner_figures.py re-runs one seed and checks the tables below and in README.md and
docs/training.md). The machine was loaded (2 cores shared with a study run, load average 2.4 to 3.0), so
s/step is a loaded figure, not a comparison. Δ in points, 95% CI over questions:

vote, 12 steps, seeds [0, 1, 2], 100 held-out questions; before: system 0.610; without model_2 0.730, without model_2+model_3 0.740
| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | zero-variance groups | system Δ minus deleting its learners | s/step | trained state |
|---|---|---|---|---|---|---|---|---|
| one | +6.0 [+2.0, +10.3] | -7.0 [-11.7, -2.7] | +0.0 [+0.0, +0.0] | -9.0 / - | 86% | -6.0 | 0.68 | 2.83 MB |
| joint | +5.0 [+0.7, +9.7] | -11.7 [-17.3, -6.7] | -8.3 [-13.3, -4.0] | -3.5 / -1.8 | 81% | -8.0 | 0.41 | 5.67 MB |
| round_robin | +5.3 [+1.7, +9.3] | -1.7 [-4.7, +1.3] | -5.3 [-9.3, -1.7] | -1.5 / -2.0 | 85% | -7.7 | 0.28 | 5.67 MB |
| placebo | +10.7 [+4.3, +17.3] | -7.7 [-13.7, -2.0] | -14.3 [-22.0, -7.3] | -2.3 / -2.6 | 0% | -2.3 | 0.71 | 5.67 MB |

Earlier (2026-12-03, lr 1e-3, no placebo or without-learner reference; not re-run since and not checked by
the suite; load average 5 to 18, so s/step is noise):
debate (2 rounds), 8 steps, seeds 0 1 2, 60 questions; system before 0.450:

| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | s/step | trained state |
|---|---|---|---|---|---|---|
| one | +8.3 [-1.7, +18.9] | -22.8 [-33.9, -12.8] | +0.0 [+0.0, +0.0] | -18.9 / - | 9.37 | 2.83 MB |
| joint | +4.4 [-6.7, +15.6] | -23.3 [-35.0, -12.8] | -25.0 [-36.7, -15.0] | -3.9 / -4.4 | 5.85 | 5.67 MB |
| round_robin | +3.9 [-6.7, +14.4] | -21.1 [-32.8, -10.0] | -21.1 [-31.7, -11.1] | -7.5 / -3.6 | 4.09 | 5.67 MB |

What the vote table shows: the gain is deletion plus optimiser noise, not collaboration. The placebo (coin
flips) gains the most, +10.7 [+4.3, +17.3], against C-RL's +5.0 to +6.0; the system without the rookies
(0.730 without model_2, 0.740 without both) beats every trained system, so every "system Δ minus deleting its
learners" is negative; the rookies get worse alone (all but round-robin's model_2 significantly); and 81-86%
of C-RL's groups have all-equal rewards (a rookie is rarely the deciding vote: little signal). The cross-play
gaps are gaps between such updates. The earlier debate table has none of these references and is read the
same way until re-run (issue #46: the 2026-12-03 vote table at lr 1e-3, +12.0 to +12.7, was this artefact).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import time

import numpy as np
import torch

import agents
import agents.zoo
import trainers
import trainers.controls
from crl_envs import tasks

POOL = ["zoo:zoo-nocarry", "zoo:zoo-noborrow", "zoo:zoo-rookie", "zoo:zoo-rookie"]
ROOKIES = ["model_2", "model_3"]
CONDITIONS = {"one": dict(learner="model_2"), "joint": dict(learners=ROOKIES),
              "round_robin": dict(learners=ROOKIES, schedule="round_robin"),
              # the control: joint's rollouts and updates on coin-flip rewards (trainers.PlaceboTrainer)
              "placebo": dict(learners=ROOKIES, trainer="placebo")}


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


#: lr at trainers.controls.FULL_FINETUNE_LR_BOUND: 1e-3 destroyed the rookies before any reward mattered (#46)
SETTINGS = dict(questions_per_step=4, num_generations=8, max_new_tokens=24, learning_rate=1e-4)


def held_out(n_eval: int) -> tasks.Task:
    """The first ``n_eval`` held-out questions (a shorter list is a prefix of a longer one)."""
    return tasks.load("arith", split="test", n=n_eval, **agents.zoo.TASK_OPTIONS)


def untrained(protocol: str, eval_task: tasks.Task, options: dict) -> trainers.EvalResult:
    """The pool before training, on ``eval_task``."""
    pool = agents.pool(POOL)
    return trainers.evaluate_policy(protocol, pool, eval_task, {j: pool[j] for j in ROOKIES},
                                    max_new_tokens=SETTINGS["max_new_tokens"], protocol_options=options)


def run_seed(protocol: str, condition: str, seed: int, steps: int, eval_task: tasks.Task, options: dict) -> dict:
    """One condition, one seed: train, then the per-question scores after training and the cross-play."""
    pool = agents.pool(POOL)
    train = tasks.load("arith", split="train", n=1000, **agents.zoo.TASK_OPTIONS)
    coalitions = [list(c) for c in itertools.combinations(pool.ids, 3) if set(c) & set(ROOKIES)]
    who = dict(CONDITIONS[condition])
    schedule = who.pop("schedule", "joint")
    trainer_class = trainers.TRAINERS[who.pop("trainer", "crl")]
    config = trainer_class.config_class(steps=steps, **SETTINGS, protocol_options=options, seed=seed,
                                        schedule=schedule, progress=False)
    trainer = trainer_class(protocol, pool, train, config=config, eval_task=eval_task, **who)
    load_before, t0 = load(), time.perf_counter()
    trainer.fit()
    seconds = (time.perf_counter() - t0) / steps
    policies = {j: trainer.policies.get(j, pool[j]) for j in ROOKIES}  # the untrained rookie where one learns
    after = trainers.evaluate_policy(protocol, pool, eval_task, policies, max_new_tokens=SETTINGS["max_new_tokens"],
                                     protocol_options=options, seed=seed)
    cross = trainers.trainer_crossplay(trainer, coalitions=coalitions)
    state_bytes = sum(p.numel() * p.element_size() * 3 for pol in trainer.policies.values()
                      for p in pol.model.parameters() if p.requires_grad)  # weights + AdamW's two moments
    return {"seed": seed, "system": after.system.tolist(), "alone": {j: after.learners[j].tolist() for j in ROOKIES},
            "crossplay": {j: {**r.to_dict(), "per_question": {k: v.tolist() for k, v in r.per_question.items()}}
                          for j, r in cross.learners.items()},
            "seconds_per_step": seconds, "load": load_before, "state_bytes": state_bytes,
            "zero_variance": trainers.controls.zero_variance_share(trainer.history)}


def run(protocol: str, steps: int, seeds: list[int], n_eval: int, options: dict) -> dict:
    eval_task = held_out(n_eval)
    before = untrained(protocol, eval_task, options)
    out = {"protocol": protocol, "options": options, "steps": steps, "seeds": seeds, "n_eval": n_eval,
           "pool": POOL, "settings": SETTINGS,
           "before": {"system": before.system_accuracy, "per_question": {
               "system": before.system.tolist(), **{j: before.learners[j].tolist() for j in ROOKIES}},
               # the system without the learners: a gain that does not beat it is deletion (#46)
               "without_learners": {"+".join(who): float(np.mean(trainers.controls.without_learner(
                   protocol, agents.pool(POOL), eval_task, who, max_new_tokens=SETTINGS["max_new_tokens"],
                   protocol_options=options))) for who in (["model_2"], ROOKIES)}},
           "conditions": {}, "runs": {}}
    for name in CONDITIONS:
        runs = []
        for seed in seeds:
            r = run_seed(protocol, name, seed, steps, eval_task, options)
            runs.append(r)
            print(f"{name} seed {seed}: system {before.system_accuracy:.3f} -> {np.mean(r['system']):.3f}, "
                  f"{r['seconds_per_step']:.2f} s/step (load: {r['load']})", flush=True)
        out["runs"][name] = runs
        out["conditions"][name] = summarise(out["before"], runs)
    return out


def summarise(before: dict, runs: list[dict]) -> dict:
    """Δs with CIs over questions of the seed-averaged per-question change; cross-play gaps; cost.

    ``before``: the committed ``"before"`` entry; ``runs``: one condition's per-seed entries (:func:`run_seed`)."""
    def delta(key: str, get) -> list[float]:
        after = np.mean([get(r) for r in runs], axis=0)
        return list(trainers.paired_bootstrap_ci(before["per_question"][key], after))

    result = {"system": delta("system", lambda r: r["system"]),
              "per_seed_system": [float(np.mean(r["system"]) - before["system"]) for r in runs]}
    for j in ROOKIES:
        result[f"{j}_alone"] = delta(j, lambda r, j=j: r["alone"][j])
    for j in runs[0]["crossplay"]:
        gaps = [r["crossplay"][j] for r in runs]
        result[f"{j}_crossplay"] = {"trained_with_gain": float(np.mean([g["trained_with_gain"][0] for g in gaps])),
                                    "unseen_gain": float(np.mean([g["unseen_gain"][0] for g in gaps])),
                                    "gap": float(np.mean([g["gap"][0] for g in gaps])),
                                    "gap_ci_seed0": gaps[0]["gap"]}
    result["zero_variance"] = float(np.mean([r["zero_variance"] for r in runs]))
    result["seconds_per_step"] = float(np.mean([r["seconds_per_step"] for r in runs]))
    result["loads"] = [r["load"] for r in runs]
    result["trained_state_MB"] = runs[0]["state_bytes"] / 2**20
    return result


#: the short table's row labels (README.md, docs/training.md)
LABELS = {"one": "one", "joint": "two, joint", "round_robin": "two, round-robin", "placebo": "two, placebo (coin flips)"}


def table(out: dict, *, brief: bool = False) -> str:
    """The results as a markdown table: in full (a title line, CIs on every Δ, seconds per step, trained
    state), or ``brief`` (what README.md and docs/training.md quote: no title, CIs on the system's Δ only,
    no cost columns)."""
    pts = lambda ci: f"{100 * ci[0]:+.1f} [{100 * ci[1]:+.1f}, {100 * ci[2]:+.1f}]"  # noqa: E731
    alone = (lambda ci: f"{100 * ci[0]:+.1f}") if brief else pts  # noqa: E731
    without, before = out["before"]["without_learners"], out["before"]["system"]
    if brief:
        lines = ["| learners | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap (2 / 3) | "
                 "zero-variance groups | system Δ minus deleting its learners |", "|---|---|---|---|---|---|---|"]
    else:
        lines = [f"{out['protocol']}, {out['steps']} steps, seeds {out['seeds']}, {out['n_eval']} held-out questions; "
                 f"before: system {out['before']['system']:.3f}; " + ", ".join(
                     f"without {k} {v:.3f}" for k, v in without.items()),
                 "| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | "
                 "zero-variance groups | system Δ minus deleting its learners | s/step | trained state |",
                 "|---|---|---|---|---|---|---|---|---|"]
    for name, c in out["conditions"].items():
        gaps = " / ".join(f"{100 * c[f'{j}_crossplay']['gap']:+.1f}" if f"{j}_crossplay" in c else "-" for j in ROOKIES)
        row = [LABELS[name] if brief else name, pts(c["system"]), alone(c["model_2_alone"]),
               alone(c["model_3_alone"]), gaps, f"{c['zero_variance']:.0%}",
               f"{100 * (c['system'][0] - (without['model_2' if name == 'one' else '+'.join(ROOKIES)] - before)):+.1f}"]
        if not brief:
            row += [f"{c['seconds_per_step']:.2f}", f"{c['trained_state_MB']:.2f} MB"]
        lines.append(f"| {' | '.join(row)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="vote", choices=["vote", "debate"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--n-eval", type=int, default=100)
    parser.add_argument("--out", default="runs/multi_learner.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: one thread is faster on a busy CPU
    options = {"rounds": 2} if args.protocol == "debate" else {}
    out = run(args.protocol, args.steps, args.seeds, args.n_eval, options)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(table(out))
    print(table(out, brief=True))
    return out


if __name__ == "__main__":
    main()
