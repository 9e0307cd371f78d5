"""Several learners at once: one rookie vs two rookies trained jointly vs round-robin, same total steps.

    python examples/multi_learner.py [--protocol vote] [--steps 12] [--seeds 0 1 2] [--n-eval 100] [--out runs/multi.json]

Pool: zoo-nocarry, zoo-noborrow and two zoo-rookies (``model_2``, ``model_3``; the rookies are the weak
members that can improve). Three conditions, C-RL with the same settings and the same number of steps:

- ``one``: ``learner="model_2"`` (``model_3`` stays as it was);
- ``joint``: ``learners=["model_2", "model_3"]``, every step updates both from the same episodes;
- ``round_robin``: the same two, one per step in turn (each gets half the updates).

Printed per condition: the system's Δ accuracy and each rookie's own (standalone) Δ, mean over seeds,
with a 95% bootstrap CI over held-out questions of the seed-averaged per-question change; the
cross-play gap (:func:`trainers.crossplay`: the gain a learner gives with its training partners minus
its gain with partners it never trained with, over every 3-member coalition and the pool with the other
rookie untrained); seconds per step, with the machine's load average (``uptime``), and the memory the
trained copies hold (weights + AdamW state: k separate models cost k times one). LoRA adapters on one
shared base are not implemented yet.

Measured (2026-12-03, a 2-core machine shared with other jobs: load average 5 to 18 during the runs,
so seconds per step are noise, not a comparison). Δ in points, 95% CI over questions:

vote, 12 steps, seeds 0 1 2, 100 questions; system before 0.610:

| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | s/step | trained state |
|---|---|---|---|---|---|---|
| one | +12.0 [+5.0, +19.0] | -24.0 [-32.3, -16.3] | +0.0 [+0.0, +0.0] | -17.7 / - | 4.47 | 2.83 MB |
| joint | +12.0 [+4.7, +19.3] | -24.7 [-33.3, -16.7] | -24.7 [-33.7, -16.7] | -0.8 / -1.3 | 2.24 | 5.67 MB |
| round_robin | +12.7 [+5.7, +20.0] | -20.3 [-28.7, -12.7] | -22.7 [-31.3, -14.7] | -2.2 / -2.0 | 1.41 | 5.67 MB |

debate (2 rounds), 8 steps, seeds 0 1 2, 60 questions; system before 0.450:

| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | s/step | trained state |
|---|---|---|---|---|---|---|
| one | +8.3 [-1.7, +18.9] | -22.8 [-33.9, -12.8] | +0.0 [+0.0, +0.0] | -18.9 / - | 9.37 | 2.83 MB |
| joint | +4.4 [-6.7, +15.6] | -23.3 [-35.0, -12.8] | -25.0 [-36.7, -15.0] | -3.9 / -4.4 | 5.85 | 5.67 MB |
| round_robin | +3.9 [-6.7, +14.4] | -21.1 [-32.8, -10.0] | -21.1 [-31.7, -11.1] | -7.5 / -3.6 | 4.09 | 5.67 MB |

What C-RL finds: each rookie gets worse alone (it learns to stop giving answers that outvote the
specialists) and the system gains. In vote one rookie learning this already gives the whole gain (in
debate no condition's gain excludes 0 at 8 steps); with two, each
one's marginal gain with its trained partner is small (1-2 points in vote: the other already abstains),
and the cross-play gap is negative: a trained rookie helps *more* with unseen partners (smaller
coalitions, an untrained rookie beside it) than with the partners it trained with.
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
from crl_envs import tasks

POOL = ["zoo:zoo-nocarry", "zoo:zoo-noborrow", "zoo:zoo-rookie", "zoo:zoo-rookie"]
ROOKIES = ["model_2", "model_3"]
CONDITIONS = {"one": dict(learner="model_2"), "joint": dict(learners=ROOKIES),
              "round_robin": dict(learners=ROOKIES, schedule="round_robin")}


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run(protocol: str, steps: int, seeds: list[int], n_eval: int, options: dict) -> dict:
    pool = agents.pool(POOL)
    train = tasks.load("arith", split="train", n=1000, **agents.zoo.TASK_OPTIONS)
    held_out = tasks.load("arith", split="test", n=n_eval, **agents.zoo.TASK_OPTIONS)
    coalitions = [list(c) for c in itertools.combinations(pool.ids, 3) if set(c) & set(ROOKIES)]
    before = trainers.evaluate_policy(protocol, pool, held_out, {j: pool[j] for j in ROOKIES}, max_new_tokens=24,
                                      protocol_options=options)
    out = {"protocol": protocol, "options": options, "steps": steps, "seeds": seeds, "n_eval": n_eval,
           "before": before.to_dict(), "conditions": {}}
    for name, who in CONDITIONS.items():
        schedule = who.get("schedule", "joint")
        who = {k: v for k, v in who.items() if k != "schedule"}
        runs = []
        for seed in seeds:
            config = trainers.CRLConfig(steps=steps, questions_per_step=4, num_generations=8, max_new_tokens=24,
                                        learning_rate=1e-3, protocol_options=options, seed=seed, schedule=schedule,
                                        progress=False)
            trainer = trainers.CRLTrainer(protocol, pool, train, config=config, eval_task=held_out, **who)
            load_before, t0 = load(), time.perf_counter()
            trainer.fit()
            seconds = (time.perf_counter() - t0) / steps
            policies = {j: trainer.policies.get(j, pool[j]) for j in ROOKIES}  # the untrained rookie where one learns
            after = trainers.evaluate_policy(protocol, pool, held_out, policies, max_new_tokens=24,
                                             protocol_options=options, seed=seed)
            cross = trainers.trainer_crossplay(trainer, coalitions=coalitions)
            state_bytes = sum(p.numel() * p.element_size() * 3 for pol in trainer.policies.values()
                              for p in pol.model.parameters() if p.requires_grad)  # weights + AdamW's two moments
            runs.append({"seed": seed, "after": after, "cross": cross, "seconds_per_step": seconds,
                         "load": load_before, "state_bytes": state_bytes})
            print(f"{name} seed {seed}: system {before.system_accuracy:.3f} -> {after.system_accuracy:.3f}, "
                  f"{seconds:.2f} s/step (load: {load_before})", flush=True)
        out["conditions"][name] = summarise(before, runs)
    return out


def summarise(before: trainers.EvalResult, runs: list[dict]) -> dict:
    """Δs with CIs over questions of the seed-averaged per-question change; cross-play gaps; cost."""
    def delta(get_before, get_after) -> list[float]:
        after = np.mean([get_after(r["after"]) for r in runs], axis=0)
        return list(trainers.paired_bootstrap_ci(get_before(before), after))

    result = {"system": delta(lambda e: e.system, lambda e: e.system),
              "per_seed_system": [float(r["after"].system_accuracy - before.system_accuracy) for r in runs]}
    for j in ROOKIES:
        result[f"{j}_alone"] = delta(lambda e, j=j: e.learners[j], lambda e, j=j: e.learners[j])
    for j in runs[0]["cross"].learners:
        gaps = [r["cross"].learners[j] for r in runs]
        result[f"{j}_crossplay"] = {"trained_with_gain": float(np.mean([g.trained_with_gain.delta for g in gaps])),
                                    "unseen_gain": float(np.mean([g.unseen_gain.delta for g in gaps])),
                                    "gap": float(np.mean([g.gap.delta for g in gaps])),
                                    "gap_ci_seed0": [g for g in gaps[0].gap]}
    result["seconds_per_step"] = float(np.mean([r["seconds_per_step"] for r in runs]))
    result["loads"] = [r["load"] for r in runs]
    result["trained_state_MB"] = runs[0]["state_bytes"] / 2**20
    return result


def table(out: dict) -> str:
    pts = lambda ci: f"{100 * ci[0]:+.1f} [{100 * ci[1]:+.1f}, {100 * ci[2]:+.1f}]"  # noqa: E731
    lines = [f"{out['protocol']}, {out['steps']} steps, seeds {out['seeds']}, {out['n_eval']} held-out questions; "
             f"before: system {out['before']['system']:.3f}",
             "| condition | system Δ | model_2 alone Δ | model_3 alone Δ | cross-play gap model_2 / model_3 | s/step | "
             "trained state |", "|---|---|---|---|---|---|---|"]
    for name, c in out["conditions"].items():
        gaps = " / ".join(f"{100 * c[f'{j}_crossplay']['gap']:+.1f}" if f"{j}_crossplay" in c else "-" for j in ROOKIES)
        lines.append(f"| {name} | {pts(c['system'])} | {pts(c['model_2_alone'])} | {pts(c['model_3_alone'])} | "
                     f"{gaps} | {c['seconds_per_step']:.2f} | {c['trained_state_MB']:.2f} MB |")
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
    return out


if __name__ == "__main__":
    main()
