"""Compare C-RL with its baselines on the zoo: a training-only study (see ``crl_envs.study``).

    python examples/compare_trainers.py [--out runs/compare] [--setups judge-plurality vote debate judge]
           [--trainers crl grpo loo_reward shapley_credit placebo] [--seeds 0 1 2]

For every setup and seed, each trainer starts from the same zoo model (zoo-rookie, ``model_4``), trains
on arith *train* questions, and is evaluated greedily on the same 200 held-out *test* questions; Δ is
measured from the untrained learner's evaluation. Each run is a study cell: a rerun resumes, and the
table (Δ system accuracy and the learner's own Δ per trainer and seed with bootstrap CIs, C-RL's wins,
ties, losses and significant wins against each baseline, mean gains and gain ratios) is the study's
``study.md``, with the learning-rate sweep and choice, the placebo, the system without the learner and the
gates. The same kind of grid as a config file: ``studies/paper-small.toml``'s ``[training]`` section.
"""

from __future__ import annotations

import argparse

import trainers
from crl_envs import study

#: The setups, by label: the protocol (default: the label), its options (``"{learner}"`` is the
#: learner's id), and the steps every trainer uses there. The learning rate is not set per setup: the
#: study's ``[training.lr_rule]`` (below) picks it before any comparison, the same rule for every trainer
#: (issue #46: a per-setup 1e-3 destroyed the learner). judge: ``fallback="none"`` so that only naming a
#: candidate gives an answer, and 96 steps, as judging is found later than deferring. judge-plurality: the
#: default fallback, under which the learner can defer to the vote by naming nobody (the gates compare its
#: gain with the system without the learner).
SETUPS: dict[str, dict] = {
    "debate": {"options": {"rounds": 2}, "steps": 24},
    "judge": {"protocol": "judge", "options": {"judge": "{learner}", "fallback": "none"}, "steps": 96},
    "judge-plurality": {"protocol": "judge", "options": {"judge": "{learner}"}, "steps": 48},
    "vote": {"options": {}, "steps": 24},
}
#: The learning-rate rule (crl_envs.study.gates.LearningRateRule): a GRPO sweep on its own seed.
LR_RULE = {"candidates": [1e-3, 1e-4, 3e-5], "select": "largest_kept"}
TRAINERS = list(trainers.ROSTER)


def config(setups: list[str], trainers: list[str], seeds: list[int], out: str) -> dict:
    """The study config of this comparison."""
    return {
        "study": {"name": "compare-trainers", "out": out},
        "pools": {"zoo": "zoo"},
        "tasks": {"arith": {"max_new_tokens": 24, "options": {"digits": 2, "operations": ["+", "-"]}}},
        "training": {"pool": "zoo", "learner": "model_4", "tasks": ["arith"], "trainers": trainers, "seeds": seeds,
                     "questions_per_step": 8, "num_generations": 8, "n_train": 1000,
                     "n_eval": 200, "shapley_coalitions": 2, "setups": {s: SETUPS[s] for s in setups},
                     "lr_rule": LR_RULE},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/compare-trainers", help="study directory (resumed if it exists)")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--trainers", nargs="+", default=TRAINERS, choices=TRAINERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args(argv)
    result = study.run(config(args.setups, args.trainers, args.seeds, args.out))
    print(open(f"{args.out}/study.md").read())
    return result


if __name__ == "__main__":
    main()
