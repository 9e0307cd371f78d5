"""Train routing_v0's router with MaskablePPO (sb3-contrib) on the zoo; compare with random routing
and the best single model.

    python examples/sb3_router.py [--timesteps 20000] [--n-train 400] [--n-eval 200] [--out router.json]

The router observes hashed character n-grams of the question (trainers.sb3.HashedFeatures) and picks
a pool index; the chosen zoo model answers (greedy). Every model's answer to every question is
precomputed in one batched pass per model through crl_envs.run_episodes and loaded into the
wrapper's cache, so PPO's steps cost no model calls. Reported on held-out questions: the learned
router, random routing (exact expectation: the mean of the models' accuracies), the best single
model (chosen on the training questions), and the oracle (some model is right).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import agents
import agents.zoo  # registers the "zoo" pool
import crl_envs
from agents import SamplingParams
from crl_envs import tasks
from trainers.sb3 import HashedFeatures, SingleAgentEnv


def routed_scores(pool, task, sampling) -> tuple[np.ndarray, list]:
    """``scores[q, k]``: model k's correctness on question q when routed to; and every episode."""
    columns, episodes = [], []
    for k in range(len(pool)):
        router = agents.ScriptedAgent(f"always-{k}", lambda ex, msgs, k=k: str(k))
        eps = crl_envs.run_episodes("routing", pool, task, options={"router": "discrete", "router_agent": router},
                                    sampling=sampling, progress=False)
        columns.append([ep.score for ep in eps])
        episodes.extend(eps)
    return np.array(columns).T, episodes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=20000)
    parser.add_argument("--n-train", type=int, default=400)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--zoo-dir", help="load the zoo's models from this directory (default: the installed zoo)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # PPO's tiny MLP is much faster single-threaded on a busy CPU
    from sb3_contrib import MaskablePPO

    t0 = time.perf_counter()
    if args.zoo_dir:
        pool = agents.pool([agents.HFAgent(f"{args.zoo_dir}/{n}", name=n) for n in agents.zoo.NAMES])
    else:
        pool = agents.pool("zoo")
    train = tasks.load("arith", split="train", n=args.n_train, seed=args.seed, **agents.zoo.TASK_OPTIONS)
    held_out = tasks.load("arith", split="test", n=args.n_eval, seed=args.seed, **agents.zoo.TASK_OPTIONS)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    train_scores, train_eps = routed_scores(pool, train, sampling)
    test_scores, test_eps = routed_scores(pool, held_out, sampling)

    options = {"router": "discrete"}
    env = SingleAgentEnv("routing", pool, train, options=options, sampling=sampling,
                         featurizer=HashedFeatures(args.features))
    env.prefill(train_eps)
    model = MaskablePPO("MlpPolicy", env, n_steps=256, batch_size=64, n_epochs=4, learning_rate=1e-3,
                        seed=args.seed, verbose=0)
    model.learn(args.timesteps)

    evaluation = SingleAgentEnv("routing", pool, held_out, options=options, sampling=sampling,
                                featurizer=HashedFeatures(args.features), examples="cycle")
    evaluation.prefill(test_eps)
    rewards, picks = [], []
    for _ in range(len(held_out)):
        obs, _ = evaluation.reset(seed=args.seed if not rewards else None)
        action, _ = model.predict(obs, action_masks=evaluation.action_masks(), deterministic=True)
        _, reward, _, _, _ = evaluation.step(int(action))
        rewards.append(reward)
        picks.append(int(action))
    best = int(np.argmax(train_scores.mean(axis=0)))
    result = {
        "ppo_router": float(np.mean(rewards)),
        "random_routing": float(test_scores.mean()),
        "best_single_model": float(test_scores[:, best].mean()),
        "best_single_model_name": pool.names[best],
        "oracle": float(test_scores.max(axis=1).mean()),
        "per_model": dict(zip(pool.names, test_scores.mean(axis=0).round(4).tolist())),
        "picks": {pool.names[k]: picks.count(k) for k in range(len(pool))},
        "model_calls_during_ppo": env.model_calls,
        "timesteps": args.timesteps,
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
