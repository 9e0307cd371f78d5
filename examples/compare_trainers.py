"""Compare C-RL with its baselines on the zoo: untrained, C-RL, GRPO, LOO-reward, Shapley-credit.

    python examples/compare_trainers.py --out results.json [--plot results.png]
           [--protocols debate judge judge-plurality vote] [--seeds 0 1 2] [--steps 24] [--lr 5e-5] [--n-eval 200]

For every protocol and seed, each trainer starts from the same zoo model (``--learner``), trains
for ``--steps`` steps on arith *train* questions, and is evaluated (greedy, every agent) on the
same held-out *test* questions before and after. Every trainer of a protocol runs with the same
settings; the per-protocol defaults are in :data:`PROTOCOLS` (``--lr`` overrides them all). ``results.json`` holds, per protocol, trainer and
seed: ``system_before``, ``system_after``, ``standalone_before``, ``standalone_after``,
``rollouts`` (episodes played in training, every coalition counted), ``seconds``, and the
per-question scores. It is written after every run; rerunning skips finished runs (resume).

The summary gives Δ system and Δ standalone per trainer with 95% CIs from a two-level bootstrap
(seeds, then questions within a seed, paired before/after).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

import agents.zoo  # registers the "zoo" pool
import trainers
from crl_envs import tasks

TRAINERS = ["crl", "grpo", "loo_reward", "shapley_credit"]

#: The setups compared, by label: the protocol (default: the label), its factory options
#: (``"{learner}"`` is replaced by the learner's id), and the learning rate and steps every trainer
#: uses there. debate: 5e-5 (2e-4 and 1e-3 were not better for C-RL; 2e-4 cost it 9 points).
#: judge (the learner judges): 1e-3, as a verdict is a one-token choice that 5e-5 barely moves in
#: 24 steps; ``fallback="none"`` so that only naming a candidate gives an answer, and 96 steps, as
#: judging is found later than deferring (C-RL seed 0: +2.8 points at 48 steps, +16.5 at 96).
#: judge-plurality: the default fallback, under which the learner can defer to the vote by naming
#: nobody, which C-RL finds within 48 steps.
PROTOCOLS: dict[str, dict] = {
    "debate": {"options": {"rounds": 2}, "lr": 5e-5, "steps": 24},
    "judge": {"options": {"judge": "{learner}", "fallback": "none"}, "lr": 1e-3, "steps": 96},
    "judge-plurality": {"protocol": "judge", "options": {"judge": "{learner}"}, "lr": 1e-3, "steps": 48},
    "vote": {"options": {}, "lr": 5e-5, "steps": 24},
}


def bootstrap_delta(runs: list[dict], key: str, n_boot: int = 5000, seed: int = 0) -> tuple[float, float, float]:
    """Mean Δ (after - before) over seeds and questions; 95% CI resampling seeds, then questions."""
    diffs = [np.asarray(r["per_question"][f"{key}_after"]) - np.asarray(r["per_question"][f"{key}_before"]) for r in runs]
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        chosen = rng.integers(0, len(diffs), size=len(diffs))
        boots[b] = np.mean([diffs[c][rng.integers(0, diffs[c].size, size=diffs[c].size)].mean() for c in chosen])
    return float(np.mean([d.mean() for d in diffs])), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def protocol_settings(protocol: str, args) -> dict:
    """The settings every trainer of the setup ``protocol`` (a label of :data:`PROTOCOLS`) runs with
    (stored in results.json)."""
    if protocol not in PROTOCOLS:
        raise SystemExit(f"compare_trainers has no settings for protocol {protocol!r}; add it to PROTOCOLS "
                         f"(known: {sorted(PROTOCOLS)})")
    spec = PROTOCOLS[protocol]
    options = {k: v.format(learner=args.learner) if isinstance(v, str) else v for k, v in spec["options"].items()}
    return {"protocol": spec.get("protocol", protocol), "protocol_options": options,
            "learning_rate": args.lr if args.lr is not None else spec["lr"],
            "steps": args.steps or spec["steps"], "questions_per_step": args.questions_per_step, "num_generations": args.G,
            "max_new_tokens": args.max_new_tokens, "learner": args.learner, "n_train": args.n_train,
            "n_eval": args.n_eval, "shapley_coalitions": args.shapley_coalitions}


def config_for(name: str, settings: dict, seed: int) -> trainers.TrainerConfig:
    """Trainer ``name``'s config from a setup's :func:`protocol_settings`."""
    common = dict(steps=settings["steps"], questions_per_step=settings["questions_per_step"],
                  num_generations=settings["num_generations"], learning_rate=settings["learning_rate"],
                  max_new_tokens=settings["max_new_tokens"], seed=seed, progress=False,
                  protocol_options=settings["protocol_options"])
    if name == "shapley_credit":
        return trainers.ShapleyCreditConfig(coalitions_per_question=settings["shapley_coalitions"], **common)
    return trainers.TRAINERS[name].config_class(**common)


def summarise(results: dict) -> str:
    lines = ["| protocol | trainer | Δ system [95% CI] | Δ standalone [95% CI] | rollouts/run | seconds/run |",
             "|---|---|---|---|---|---|"]
    for protocol, by_trainer in results["runs"].items():
        for name, by_seed in by_trainer.items():
            runs = list(by_seed.values())
            if not runs:
                continue
            s, sl, sh = bootstrap_delta(runs, "system")
            a, al, ah = bootstrap_delta(runs, "standalone")
            lines.append(f"| {protocol} | {name} | {100 * s:+.1f} [{100 * sl:+.1f}, {100 * sh:+.1f}] | "
                         f"{100 * a:+.1f} [{100 * al:+.1f}, {100 * ah:+.1f}] | "
                         f"{np.mean([r['rollouts'] for r in runs]):.0f} | {np.mean([r['seconds'] for r in runs]):.0f} |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = list(results["runs"])
    fig, axes = plt.subplots(1, len(protocols), figsize=(5.5 * len(protocols), 4), squeeze=False)
    for ax, protocol in zip(axes[0], protocols):
        names = [n for n in ["untrained", *TRAINERS] if results["runs"][protocol].get(n)]
        for offset, key, colour in ((-0.2, "system", "tab:blue"), (0.2, "standalone", "tab:orange")):
            stats = [bootstrap_delta(list(results["runs"][protocol][n].values()), key) for n in names]
            means = [100 * m for m, _, _ in stats]
            err = [[100 * (m - lo) for m, lo, _ in stats], [100 * (hi - m) for m, _, hi in stats]]
            ax.bar(np.arange(len(names)) + offset, means, 0.4, yerr=err, capsize=3, color=colour, label=f"Δ {key}")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(np.arange(len(names)), names, rotation=20)
        ax.set_title(f"{protocol}: accuracy change after training (points)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="results JSON (resumed if it exists)")
    parser.add_argument("--plot", help="PNG of Δ system / Δ standalone per trainer")
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=list(PROTOCOLS),
                        help="setups to run (labels of PROTOCOLS)")
    parser.add_argument("--trainers", nargs="+", default=TRAINERS, choices=TRAINERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--learner", default="model_4", help="the trained agent (default: zoo-rookie, the weakest)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps for every protocol (default: PROTOCOLS)")
    parser.add_argument("--questions-per-step", type=int, default=8)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--lr", type=float, default=None, help="learning rate for every protocol (default: PROTOCOLS)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--shapley-coalitions", type=int, default=2,
                        help="coalitions sampled per step for Shapley credit (from the Shapley distribution)")
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-eval", type=int, default=200)
    parser.add_argument("--zoo-dir", help="load the zoo's models from this directory (default: the installed zoo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for tiny models on a busy CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.zoo_dir:
        pool = agents.pool([agents.HFAgent(Path(args.zoo_dir) / n, name=n) for n in agents.zoo.NAMES])
    else:
        pool = agents.pool("zoo")
    options = agents.zoo.TASK_OPTIONS
    train = tasks.load("arith", split="train", n=args.n_train, seed=0, **options)
    held_out = tasks.load("arith", split="test", n=args.n_eval, seed=0, **options)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    results["settings"] = vars(args) | {"pool": pool.names}
    stored = results.setdefault("protocol_settings", {})
    settings = {protocol: protocol_settings(protocol, args) for protocol in args.protocols}
    for protocol, wanted in settings.items():  # resuming with other settings would mix incomparable runs
        if results["runs"].get(protocol) and stored.get(protocol) != wanted:
            raise SystemExit(f"{out} holds {protocol} runs made with other settings ({stored.get(protocol)}); "
                             f"now {wanted}. Write to a new --out, or delete {out}.")
        stored[protocol] = wanted

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(out)

    jobs = [(p, n, s) for s in args.seeds for p in args.protocols for n in ["untrained", *args.trainers]]  # seed-major: every protocol early
    baseline_eval: dict[str, trainers.EvalResult] = {}
    for protocol, name, seed in tqdm(jobs, desc="runs"):
        slot = results["runs"].setdefault(protocol, {}).setdefault(name, {})
        if str(seed) in slot:
            continue
        t0 = time.perf_counter()
        algorithm = "crl" if name == "untrained" else name
        trainer = trainers.TRAINERS[algorithm](settings[protocol]["protocol"], pool, train, learner=args.learner,
                                               config=config_for(algorithm, settings[protocol], seed), eval_task=held_out)
        if protocol not in baseline_eval:  # greedy evaluation of the untouched model: the same for every run
            baseline_eval[protocol] = trainer.evaluate()
        before = baseline_eval[protocol]
        if name != "untrained":
            trainer.fit()
        after = trainer.evaluate() if name != "untrained" else before
        slot[str(seed)] = {
            "system_before": before.system_accuracy, "system_after": after.system_accuracy,
            "standalone_before": before.standalone_accuracy, "standalone_after": after.standalone_accuracy,
            "rollouts": trainer.rollouts, "seconds": time.perf_counter() - t0,
            "per_question": {"system_before": before.system.tolist(), "system_after": after.system.tolist(),
                             "standalone_before": before.standalone.tolist(), "standalone_after": after.standalone.tolist()},
        }
        save()
        tqdm.write(f"{protocol} {name} seed {seed}: system {before.system_accuracy:.3f} -> {after.system_accuracy:.3f}, "
                   f"standalone {before.standalone_accuracy:.3f} -> {after.standalone_accuracy:.3f}, "
                   f"{trainer.rollouts} rollouts, {slot[str(seed)]['seconds']:.0f}s")
    table = summarise(results)
    print(table)
    results["summary"] = table
    save()
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
