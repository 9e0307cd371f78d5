"""One study training cell and its setting's baseline, before and after #55's savings: forwards, generations,
wall seconds and the ratio, and a check that nothing the cell reports moved.

The cell is ``studies/paper-small.toml``'s ``training/judge/arith/crl/seed0`` (the zoo, the rookie judging with
no fallback, 8 questions x 8 generations a step) at a fixed learning rate, and the setting's ``baseline`` cell.

- **before**: transformers' exact ``NewGELUActivation`` (``fuse_gelu=False``: eight elementwise ops where
  :func:`agents.hf.fuse_gelu_activations` runs one), every rollout request generated (``trainer.rollout_memo = None``); the update forwards whole rows,
  the shared prompt of a question's G samples G times (``token_logprobs(share_prompts=False)``); the held-out
  evaluation plays the system twice (``trainer.evaluate`` for the scores, then ``rates`` for the parse/verdict
  rates), the baseline cell three times (scores, rates, the system without the learner).
- **after**: what the cells run now: greedy partners' answers generated once per question for all G samples and
  every step (:attr:`trainers.PolicyGradientTrainer.rollout_memo`); each distinct prompt forwarded once in the
  update (:func:`trainers.rollout.token_logprobs`); scores and rates read one greedy play
  (:func:`crl_envs.study.cells.trained.evaluation_with_rates`).

The memo and the one-play evaluation change nothing (bit-identical); sharing prompts in the update and the fused
activation change the loss by float rounding (~1e-6), so the script prints the largest difference in the history's numbers and the
trained weights, and checks that the scores, rates and baseline are identical.

It also checks that the update needs no forward beyond the one with gradients: the "old" log-probs are the
rollout's own (``Generation.logprobs``), and they equal the teacher-forced ones of that forward to float
tolerance (the largest difference is printed).

Counts (forwards per step, generations) do not depend on the machine's load; the seconds do, and the script
prints the load average beside them. Run it alone on an idle machine for timings:

    nice -n 0 python benchmarks/training_cell.py                       # 20 steps, 200 held-out questions
    python benchmarks/training_cell.py --steps 2 --n-eval 16 --logprob-check   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import torch

import agents.hf
import trainers.base
import trainers.update
from agents.base import Agent
from crl_envs import study
from crl_envs.study.cells.trained import (
    build_trainer,
    learner_rates,
    rates,
    scores,
    trained_evaluation,
    untrained_evaluation,
)
from trainers.controls import without_learner
from trainers.evaluation import evaluate_policy

CELL = "training/judge/arith/crl/seed0"
TIMING_KEYS = {"seconds", "rollout_seconds", "tokens_per_second"}

#: what the run is doing now ("rollout", "update", "evaluation"), and what each stage counted
_stage = ["setup"]
forwards: Counter = Counter()
generations: Counter = Counter()
logprob_gap = [0.0]


@contextmanager
def stage(name: str):
    before, _stage[0] = _stage[0], name
    try:
        yield
    finally:
        _stage[0] = before


def count_forwards(module: torch.nn.Module) -> None:
    """Count ``module``'s top-level forwards, by stage and by whether they build a graph."""
    def hook(_module, _args, _kwargs, _output):
        forwards[(_stage[0], "grad" if torch.is_grad_enabled() else "no_grad")] += 1
    module.register_forward_hook(hook, with_kwargs=True)


_generate = Agent.generate


def _counting_generate(self: Agent, requests):
    generations[(_stage[0], self.name)] += len(requests)
    return _generate(self, requests)


_token_logprobs = trainers.update.token_logprobs


def history_difference(before: dict[str, Any], after: dict[str, Any]) -> tuple[float, str]:
    """The largest difference between two steps' metrics, relative to the larger value where that is above 1e-3
    (absolute below: a loss of ~1e-9 is noise either way), and its key (inf when a key or a non-number differs)."""
    if before.keys() != after.keys():
        return math.inf, "keys"
    gap = (0.0, "")
    for key, x in before.items():
        y = after[key]
        if isinstance(x, float) and isinstance(y, float):
            gap = max(gap, (abs(x - y) / max(abs(x), abs(y), 1e-3), key))
        elif x != y:
            return math.inf, key
    return gap


def cell_specs(steps: int, n_eval: int, lr: float) -> tuple[Any, Any]:
    with tempfile.TemporaryDirectory() as out:
        planned = study.plan("studies/paper-small.toml", out=out)
    cell = next(c for c in planned if c.id == CELL)
    baseline = next(c for c in planned if c.kind == "baseline" and c.spec.setup_label == cell.spec.setup_label)
    return (replace(cell.spec, steps=steps, n_eval=n_eval, learning_rate=lr), replace(baseline.spec, n_eval=n_eval))


def run_training(spec: Any, after: bool) -> tuple[dict[str, Any], float, dict[str, float]]:
    """The training cell's fit and evaluation; (what it reports, wall seconds, seconds per part)."""
    t0 = time.perf_counter()
    trainer = build_trainer(spec, "crl", spec.seed, None)
    for policy in trainer.policies.values():
        count_forwards(policy.model)
    if not after:
        trainer.rollout_memo = None
    trainers.update.token_logprobs = functools.partial(_token_logprobs, share_prompts=after)
    parts = {"rollouts": 0.0, "updates": 0.0}
    collect, optimise = trainer.collect, trainer.optimise

    def timed_collect(*args, **kwargs):
        t = time.perf_counter()
        with stage("rollout"):
            out = collect(*args, **kwargs)
        parts["rollouts"] += time.perf_counter() - t
        return out

    def timed_optimise(sequences, learner=None):
        t = time.perf_counter()
        for s in sequences:  # the behaviour log-probs the rollout recorded, before the update fills any stop token
            s.rollout_logprobs = list(s.logprobs)
        with stage("update"):
            out = optimise(sequences, learner)
        parts["updates"] += time.perf_counter() - t
        return out

    trainer.collect, trainer.optimise = timed_collect, timed_optimise
    trainer.fit()
    t = time.perf_counter()
    with stage("evaluation"):
        if after:
            result, learner_rates_ = trained_evaluation(trainer)
        else:
            result, learner_rates_ = trainer.evaluate(controls=False), rates(trainer, trainer.eval_task)
    parts["evaluation"] = time.perf_counter() - t
    history = [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in trainer.history]
    weights = {k: v.detach().clone() for k, v in trainer.trainable_state().items()}
    return {"scores": scores(result), "rates": learner_rates_, "history": history, "weights": weights}, \
        time.perf_counter() - t0, parts


def run_baseline(spec: Any, after: bool) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    with stage("baseline"):
        if after:
            result, learner_rates_ = untrained_evaluation(spec)
            without = result.without_learner
        else:
            from crl_envs.study.cells.build import build_pool, build_task

            pool = build_pool(spec.pool)
            held_out = build_task(spec.task, split=spec.eval_split, n=spec.n_eval)
            policies = {spec.learner: pool[spec.learner]}
            settings = dict(max_new_tokens=spec.max_new_tokens, protocol_options=spec.options, seed=0)
            result = evaluate_policy(spec.protocol, pool, held_out, policies, **settings)
            without = without_learner(spec.protocol, pool, held_out, [spec.learner], **settings)
            learner_rates_ = learner_rates(spec.protocol, pool, held_out, policies, spec.learner, **settings)
    return {"scores": scores(result), "without": np.asarray(without).tolist(), "rates": learner_rates_}, \
        time.perf_counter() - t0


def check_logprobs_in_update() -> None:
    """Wrap the update's forward to measure the gap between the rollout's log-probs and the teacher-forced ones."""
    real = trainers.base.policy_gradient_update

    def checked(state, sequences, cfg):
        work = [s for s in sequences if s.advantage != 0.0 or cfg.beta > 0]
        if work:
            with stage("check"), torch.no_grad():  # not counted: a check, not part of the update
                lp, _ = _token_logprobs(state.policy.model, [s.prompt_ids for s in work],
                                        [s.completion_ids for s in work], temperature=cfg.temperature,
                                        pad_id=state.policy.tokenizer.pad_token_id, device=state.device)
            for row, s in enumerate(work):
                known = [(i, v) for i, v in enumerate(s.rollout_logprobs) if v == v]  # nan: the stop token
                if known:
                    gap = max(abs(float(lp[row, i]) - v) for i, v in known)
                    logprob_gap[0] = max(logprob_gap[0], gap)
        return real(state, sequences, cfg)

    trainers.base.policy_gradient_update = checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-5, help="the rate paper-small's rule chose (3e-5)")
    parser.add_argument("--skip-before", action="store_true", help="time the cells as they run now only")
    parser.add_argument("--logprob-check", action="store_true",
                        help="also measure the rollout's log-probs against a teacher-forced forward (adds a forward "
                             "per step to the updates' seconds: leave it off for timings)")
    args = parser.parse_args()
    training_spec, baseline_spec = cell_specs(args.steps, args.n_eval, args.lr)
    torch.set_num_threads(training_spec.threads)
    Agent.generate = _counting_generate
    if args.logprob_check:
        check_logprobs_in_update()
    print(f"cell {CELL}: {args.steps} steps, {training_spec.questions_per_step} questions x "
          f"{training_spec.num_generations} generations a step, lr {args.lr:g}, {args.n_eval} held-out questions; "
          f"load average at start {os.getloadavg()[0]:.2f}")
    runs = {}
    fuse = agents.hf.fuse_gelu_activations
    for mode in ([] if args.skip_before else ["before"]) + ["after"]:
        forwards.clear()
        generations.clear()
        agents.hf.fuse_gelu_activations = fuse if mode == "after" else (lambda model: 0)
        trained, trained_s, parts = run_training(training_spec, after=mode == "after")
        base, base_s = run_baseline(baseline_spec, after=mode == "after")
        runs[mode] = (trained, base, trained_s, base_s)
        per_step = {k: v / args.steps for k, v in forwards.items() if k[0] in ("rollout", "update")}
        print(f"\n{mode}: training cell {trained_s:.1f} s (rollouts {parts['rollouts']:.1f} s, updates "
              f"{parts['updates']:.1f} s, evaluation {parts['evaluation']:.1f} s), baseline cell {base_s:.1f} s; "
              f"load average {os.getloadavg()[0]:.2f}")
        print("  learner forwards per step: " + ", ".join(f"{s} {g} {n:.1f}" for (s, g), n in sorted(per_step.items())))
        by_stage: Counter = Counter()
        for (s, _name), n in generations.items():
            by_stage[s] += n
        print("  generations (requests answered by a model): " + ", ".join(f"{s} {n}" for s, n in sorted(by_stage.items())))
    if args.logprob_check:
        print(f"\nlargest |rollout log-prob - teacher-forced log-prob| of a sampled token: {logprob_gap[0]:.2e}")
    if "before" in runs:
        (t0, b0, s0, c0), (t1, b1, s1, c1) = runs["before"], runs["after"]
        weight_gap = max(float((t0["weights"][k] - t1["weights"][k]).abs().max()) for k in t0["weights"])
        history_gap, key = max((history_difference(m0, m1) for m0, m1 in zip(t0["history"], t1["history"])),
                               default=(0.0, ""))
        same = (t0["scores"] == t1["scores"] and t0["rates"] == t1["rates"] and b0 == b1
                and len(t0["history"]) == len(t1["history"]) and history_gap < 1e-4)
        print(f"largest difference in the history's numbers {history_gap:.1e} ({key}), in a trained weight "
              f"{weight_gap:.1e} (float rounding of the shared-prompt forward)")
        print(f"identical held-out scores, rates and baseline, history within 1e-4: {same}")
        print(f"training cell {s0 / s1:.2f}x faster, baseline cell {c0 / c1:.2f}x faster, "
              f"both {(s0 + c0) / (s1 + c1):.2f}x")
        if not same:
            raise SystemExit("the savings moved a result: see above")


if __name__ == "__main__":
    main()
