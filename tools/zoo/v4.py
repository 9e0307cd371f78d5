"""Build zoo v4: five pools of eight arith models (:data:`agents.zoo.specs.POOLS4`), and measure them.

    python -m tools.zoo.v4 --out DIR [--seed 0] [--jobs 2] [--quick] [--report] [--n-eval 500]

The models are v1's (:mod:`tools.zoo.build`: the same prompts from the envs, targets, sampler and
training loop, 4 layers x width 64), trained from :data:`agents.zoo.specs.SPECS4`: a shared base,
then every run whose parent is finished, longest first, ``--jobs`` at a time. Each run is
deterministic from ``--seed`` plus its spec's ``seed_offset``; a run an earlier build finished in
``DIR`` with the same spec and seed is kept (resume after a crash, or add models). Training prompts
are collected with eight scripted peers, so a model sees 0..7 peers, as in a pool of eight.

**Cost** (estimate, not measured: v1's ``zoo.json`` has 1500-step models at 288-487 s each on one
core with two jobs running, 0.19-0.33 s a step, and its 300-step rookie at 36 s). v4 trains 18,400
steps (base 2000, ladder 2000, eight specialists 8 x 1000, strong 1500, soloist 2000, six clones 6 x
150, eight rookies 2000) plus about 40 validations of 200 questions: 18,400 x 0.19-0.33 s / 2 jobs =
29-51 min, and about 3 min of prompt collection and validation: **about 35-60 wall-minutes on 2
cores with ``--jobs 2``**; a run retried off the loss plateau (base, ladder, specialists, strong,
soloist: validation under 0.15) adds its steps again.

``--report`` plays each pool on ``--n-eval`` arith test questions through ``crl_envs.run_episodes``
(vote_v0 and debate_v0; each member alone is its first answer in vote) and writes ``report4.json``:
per pool, each member's accuracy with its 95% Wilson interval, vote, debate, best single, at least one
right, pairwise error correlations, and two checks against issue #32's bar (:func:`pool_statistics`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from agents.zoo.specs import BASE4, POOLS4, QUICK_TASK_OPTIONS, SPECS4, TASK_OPTIONS, Model4Spec
from tools.zoo.build import load_train_data, train

#: What a run must reach on validation (else it is retried once with the next seed): runs of at least
#: this many steps; shorter runs (rookies, clones) and checkpoints are weak by design.
MIN_VALIDATION, CHECKED_STEPS = 0.15, 1000
#: Issue #32's bar for a pool on a task: the best member this far above the blind baseline, and the best
#: and worst members this many standard errors apart.
LEARNED_MARGIN, SEPARATION_SE = 0.3, 2.0
Z95 = 1.959963984540054


def quick_specs() -> tuple[Model4Spec, list[Model4Spec], dict[str, tuple[str, ...]]]:
    """Tiny versions of some v4 runs (2 layers, width 32, a few steps) and one pool of all they produce:
    every mechanism of the real build (base, checkpoints, a pair blind spot, a child of a child, the
    soloist) in seconds, for the tests."""
    tiny = {"n_layer": 2, "n_embd": 32, "n_head": 2, "learning_rate": 5e-3, "answer_share": 1.0}
    spec = {s.name: s for s in SPECS4}
    base = replace(BASE4, steps=20, **tiny)
    runs = [replace(spec["zoo4-nocarry-borrow"], steps=8, **tiny),
            replace(spec["zoo4-ladder"], steps=12, checkpoints=(6, 12), **tiny),
            replace(spec["zoo4-strong"], steps=8, **tiny),
            replace(spec["zoo4-clone-1"], steps=4, **tiny),
            replace(spec["zoo4-soloist"], steps=8, **tiny)]
    return base, runs, {"zoo4-quick": tuple(n for s in runs for n in s.outputs())}


def run_dirs(spec: Model4Spec, out: Path) -> dict[str, Path]:
    """Where a run saves: ``out/<name>`` for each model it produces (a ladder's checkpoints), and the run
    itself (``out/_base`` for the base, ``out/_runs/<name>`` for a ladder, whose last checkpoint it equals)."""
    if spec.name == BASE4.name:
        return {"_base": out / "_base"}
    dirs = {name: out / name for name in spec.outputs()}
    if spec.checkpoints:
        dirs[f"_runs/{spec.name}"] = out / "_runs" / spec.name
    return dirs


def finished(spec: Model4Spec, seed: int, out: Path) -> dict[str, dict[str, Any]] | None:
    """Each saved model's ``training.json`` if an earlier build finished this run in ``out`` with this very
    spec and seed (the same code gives the same weights), else ``None``."""
    done = {}
    for key, path in run_dirs(spec, out).items():
        record = path / "training.json"
        if not (record.exists() and (path / "model.safetensors").exists()):
            return None
        data = json.loads(record.read_text())
        if data.get("spec") != json.loads(json.dumps(asdict(spec))) or data.get("requested_seed") != seed:
            return None
        done[key] = data
    return done


def _job(args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec, out = args.pop("spec"), args.pop("out")
    dirs = run_dirs(spec, out)
    if spec.checkpoints:
        own, steps = dirs[f"_runs/{spec.name}"], {c: dirs[f"{spec.name}-{c}"] for c in spec.checkpoints}
    else:
        (own,), steps = dirs.values(), None
    train(spec, out_dir=own, checkpoints=steps, **args)
    return finished(spec, args["seed"], out) or {}


def build(out: Path, *, seed: int = 0, jobs: int = 2, quick: bool = False, resume: bool = True) -> dict[str, Any]:
    """Train zoo v4 into ``out/<name>/`` and write a summary, ``out/zoo4.json`` (per model: its spec, seconds
    and validation accuracy on held-out train questions); return it.

    Raises:
        ValueError: ``jobs`` under 1.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r}: pass a whole number of parallel training jobs, 1 or more")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if quick:
        base, runs, pools = quick_specs()
    else:
        base, runs, pools = BASE4, list(SPECS4), POOLS4
    names = list(pools["zoo4-quick"] if quick else pools["zoo4-specialists"])  # eight scripted peers (quick: fewer)
    train_task, validation, records = load_train_data(
        seed, n_train=130 if quick else 12000, n_validation=20 if quick else 200, names=names,
        episodes_per_protocol=40 if quick else 400, protocols=["vote", "debate"] if quick else None,
        task_options=QUICK_TASK_OPTIONS if quick else TASK_OPTIONS)
    collect_seconds = round(time.perf_counter() - t0, 1)
    print(f"[zoo4] {len(records)} training prompts from the envs ({collect_seconds:.0f}s)", file=sys.stderr)
    common = {"train_task": train_task, "validation": validation, "records": records, "names": names}
    specs = {s.name: s for s in (base, *runs)}
    results: dict[str, dict[str, Any]] = {}
    pending = dict(specs)
    for name, spec in specs.items():
        done = finished(spec, seed + spec.seed_offset, out) if resume else None
        if done is not None:
            results.update(done)
            del pending[name]
            print(f"[zoo4] {name}: finished by an earlier build, kept", file=sys.stderr)

    def job(spec: Model4Spec) -> dict[str, Any]:
        parent = None if spec.parent is None else out / ("_base" if spec.parent == base.name else spec.parent)
        checked = spec.steps >= CHECKED_STEPS and not quick
        return {**common, "spec": spec, "out": out, "seed": seed + spec.seed_offset, "base_dir": parent,
                "core_only": spec.name == base.name, "min_validation": MIN_VALIDATION if checked else 0.0,
                "max_attempts": 2 if checked else 1, "eval_every": 0 if quick else 400}

    def ready() -> list[Model4Spec]:  # parent finished; longest first, then by name: the same order every time
        return sorted((s for s in pending.values() if s.parent is None or s.parent not in pending),
                      key=lambda s: (-s.steps * s.n_layer * s.n_embd ** 2, s.name))

    if jobs == 1:
        while pending:
            spec = ready()[0]
            results.update(_job(job(pending.pop(spec.name))))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            running: dict[Future, str] = {}
            while pending or running:
                for spec in ready():
                    if len(running) < jobs and spec.name not in running.values():
                        running[pool.submit(_job, job(spec))] = spec.name
                done_futures, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done_futures:
                    results.update(f.result())
                    del pending[running.pop(f)]
    summary = {"seed": seed, "quick": quick, "task": {"name": "arith", **(QUICK_TASK_OPTIONS if quick else TASK_OPTIONS)},
               "prompts": len(records), "collect_seconds": collect_seconds, "jobs": jobs,
               "seconds": round(time.perf_counter() - t0, 1), "pools": {k: list(v) for k, v in pools.items()},
               "models": {key: {"spec": r["spec"], "seconds": r["seconds"], "validation": r["validation"],
                                "seed": r["seed"], **({"checkpoint": r["checkpoint"]} if "checkpoint" in r else {})}
                          for key, r in sorted(results.items())}}
    (out / "zoo4.json").write_text(json.dumps(summary, indent=1))
    return summary


# ---------------------------------------------------------------------- measuring the pools
def wilson_interval(right: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``right / n`` (95% with the default ``z``)."""
    p = right / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson correlation (the phi coefficient on 0/1 errors); ``None`` when either never varies."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def pool_statistics(scores: Mapping[str, Sequence[float]], *, vote: Sequence[float], debate: Sequence[float],
                    baseline: float) -> dict[str, Any]:
    """A pool's figures from per-question scores (1 right, 0 wrong; the same questions in every list):
    each member's accuracy with its 95% Wilson interval, vote, debate, best single, at least one right,
    each pair's error correlation (Pearson on the 0/1 errors; ``None`` where a member's errors never
    vary) and their mean, and issue #32's checks: ``learned`` (best member at least
    :data:`LEARNED_MARGIN` above the blind ``baseline``) and ``separable`` (best minus worst at least
    :data:`SEPARATION_SE` standard errors of their paired per-question difference apart).

    Raises:
        ValueError: no members, or lists of different lengths.
    """
    names = list(scores)
    n = len(vote)
    if not names or n == 0 or any(len(scores[m]) != n for m in names) or len(debate) != n:
        raise ValueError("pool_statistics needs one score per question for every member, vote and debate "
                         f"(got {[len(scores[m]) for m in names]}, vote {n}, debate {len(debate)})")
    acc = {m: sum(scores[m]) / n for m in names}
    best, worst = max(names, key=acc.get), min(names, key=acc.get)
    diff = [b - w for b, w in zip(scores[best], scores[worst])]
    mean_diff = sum(diff) / n
    se = math.sqrt(sum((d - mean_diff) ** 2 for d in diff) / (n - 1) / n) if n > 1 else 0.0
    errors = {m: [1.0 - s for s in scores[m]] for m in names}
    pairs = {f"{a} | {b}": _correlation(errors[a], errors[b]) for i, a in enumerate(names) for b in names[i + 1:]}
    defined = [r for r in pairs.values() if r is not None]
    return {
        "n": n,
        "members": {m: {"accuracy": round(acc[m], 4), "ci95": [round(v, 4) for v in wilson_interval(sum(scores[m]), n)]}
                    for m in names},
        "vote": round(sum(vote) / n, 4), "debate": round(sum(debate) / n, 4),
        "best_single": {"name": best, "accuracy": round(acc[best], 4)},
        "worst_single": {"name": worst, "accuracy": round(acc[worst], 4)},
        "any_right": round(sum(any(scores[m][q] == 1.0 for m in names) for q in range(n)) / n, 4),
        "error_correlation": {k: None if r is None else round(r, 4) for k, r in pairs.items()},
        "mean_error_correlation": round(sum(defined) / len(defined), 4) if defined else None,
        "baseline": baseline,
        "learned": acc[best] - baseline >= LEARNED_MARGIN,
        "best_minus_worst_se": None if se == 0 else round(mean_diff / se, 2),
        "separable": mean_diff > 0 if se == 0 else mean_diff >= SEPARATION_SE * se,
    }


def evaluate(models_dir: Path, pools: Mapping[str, Sequence[str]] | None = None, *, n: int = 500, seed: int = 0,
             task_options: Mapping[str, Any] | None = None, progress: bool = False) -> dict[str, Any]:
    """Each pool on ``n`` arith test questions: vote_v0 and debate_v0 through ``crl_envs.run_episodes``
    (each member alone is its first answer in vote), summed up by :func:`pool_statistics` against the
    task's blind baseline (the most common train answer).

    Raises:
        FileNotFoundError: a member is not in ``models_dir``.
    """
    import agents
    import crl_envs
    from agents import SamplingParams
    from crl_envs.tasks import load
    from crl_envs.tasks.procedural import majority_baseline

    options = dict(task_options or TASK_OPTIONS)
    pools = dict(pools or POOLS4)
    missing = sorted({m for ms in pools.values() for m in ms if not (Path(models_dir) / m / "config.json").exists()})
    if missing:
        raise FileNotFoundError(f"{len(missing)} v4 models missing from {models_dir} ({missing[:3]}...); build them "
                                f"with `python -m tools.zoo.v4 --out {models_dir}`")
    task = load("arith", split="test", n=n, seed=seed, **options)
    baseline = float(majority_baseline(load, "arith", n_test=n, **options)["majority"])
    sampling = SamplingParams(max_new_tokens=24)
    cache: dict[str, Any] = {}
    report: dict[str, Any] = {"n": n, "seed": seed, "task": {"name": "arith", **options}, "baseline": baseline,
                              "pools": {}}
    for name, members in pools.items():
        pool = agents.pool([cache.setdefault(m, agents.HFAgent(Path(models_dir) / m, name=m, batch_size=256))
                            for m in members])
        vote = crl_envs.run_episodes("vote", pool, task, seed=seed, sampling=sampling, progress=progress)
        debate = crl_envs.run_episodes("debate", pool, task, seed=seed, sampling=sampling, progress=progress)
        scores = {m: [ep.standalone[aid] for ep in vote] for aid, m in zip(pool.ids, pool.names)}
        report["pools"][name] = pool_statistics(scores, vote=[ep.score for ep in vote],
                                                debate=[ep.score for ep in debate], baseline=baseline)
    return report


def markdown(report: dict[str, Any]) -> str:
    """Per pool: each member's accuracy with its 95% interval, then the pool's figures and checks."""
    lines = []
    for name, p in report["pools"].items():
        lines += [f"### {name}", "", "| member | accuracy | 95% CI |", "|---|---|---|"]
        lines += [f"| {m} | {r['accuracy']:.3f} | {r['ci95'][0]:.3f}-{r['ci95'][1]:.3f} |" for m, r in p["members"].items()]
        corr = p["mean_error_correlation"]
        lines += ["", f"vote {p['vote']:.3f}, debate {p['debate']:.3f}, best single {p['best_single']['accuracy']:.3f}, "
                  f"at least one right {p['any_right']:.3f}, mean error correlation "
                  f"{'n/a' if corr is None else f'{corr:.2f}'}; learned (best ≥ baseline {p['baseline']:.3f} + "
                  f"{LEARNED_MARGIN}): {'yes' if p['learned'] else 'no'}; best vs worst separable (≥ {SEPARATION_SE:g} "
                  f"SE): {'yes' if p['separable'] else 'no'}", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.zoo.v4", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to write the models into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="runs trained in parallel (one CPU thread each)")
    parser.add_argument("--quick", action="store_true", help="tiny models on one-digit questions, in seconds (tests)")
    parser.add_argument("--report", action="store_true", help="then measure the pools (writes report4.json)")
    parser.add_argument("--n-eval", type=int, default=500, help="test questions per pool for --report")
    args = parser.parse_args(argv)
    summary = build(args.out, seed=args.seed, jobs=args.jobs, quick=args.quick)
    print(f"zoo v4 built in {summary['seconds']:.0f}s -> {args.out}")
    for key, row in summary["models"].items():
        print(f"{key:28s} validation {row['validation']:.3f}  {row['seconds']:.0f}s")
    if args.report:
        report = evaluate(args.out, summary["pools"], n=40 if args.quick else args.n_eval, seed=args.seed,
                          task_options=QUICK_TASK_OPTIONS if args.quick else TASK_OPTIONS)
        (args.out / "report4.json").write_text(json.dumps(report, indent=1))
        print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
