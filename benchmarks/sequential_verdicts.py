"""The sequential verdict's error rates and savings against the fixed design, on planted truth.

Each simulated setting is planted by :func:`crl_envs.stats.plant_setting` (the generator behind
:func:`crl_envs.stats.verdict_power`, :data:`crl_envs.stats.PLANTING`): ``n`` models whose
(individual, compositional) strengths have copula tau ``tau``, questions independent. On the same
tables two designs give a verdict through the study's own rule (:func:`crl_envs.stats.crossfit_tau`,
:func:`crl_envs.stats.verdict`):

- **fixed**: one look at the last look's questions (``SequentialDesign(looks=(N,))``: exactly the
  study's verdict at ``N`` questions);
- **sequential**: :class:`crl_envs.sequential.SequentialDesign` (looks, Lan-DeMets spending with a union
  bound over looks, non-binding futility), stopping at the first look that decides.

Printed per ``n`` and ``tau``: the rate of each verdict under both designs, the false rates against their
stated levels (false ``coupled``: coupled at copula tau 0, stated ``alpha / 2`` one-sided; false
``decoupled``: decoupled while the setting's own population tau is outside the margin, stated
``decoupled_alpha``), how often the two designs agree, and the mean question x coalition evaluations
(questions used x ``2**n`` coalitions) of the sequential design over the fixed design's, each with its
Monte Carlo SE. ``tests/test_sequential.py`` asserts the same rates with fewer runs.

Usage:
    python benchmarks/sequential_verdicts.py                      # n = 8, 16; tau 0, 0.5, 0.9; 1000 runs each
    python benchmarks/sequential_verdicts.py --sizes 8 --runs 200 --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from crl_envs import stats  # noqa: E402
from crl_envs.sequential import SequentialDesign, read_look, reallocate, sequential_verdict  # noqa: E402

#: The sequential design per pool size: looks every 50 questions up to paper-small's 200, decoupled spent
#: O'Brien-Fleming-type, coupled spent by the power family ``alpha t**4`` (Kim & DeMets 1987). With 8 models the
#: exact test's p-values are coarse (critical tau in steps of 1/14): rho = 4 keeps 0.034 for the last look, enough
#: for the fixed design's critical tau (0.643 at p = 0.031), where Pocock moves every look's critical tau a step up
#: (power at tau 0.5: 0.21 against the fixed 0.36 in a 150-run pilot, seed 7). Futility below a cross-fit tau of
#: 0.3 with 8 models, 0.15 with 16 (16 models' early taus are lower: at 0.3, 79 of 300 settings at tau 0.5 stopped
#: for futility and power fell to 0.65 against the fixed 0.74, seed 1; at 0.15, 0.75 against 0.80, seed 5;
#: ``power:2`` at 0.15: 0.73, saving 1.61x instead of 1.37x).
DESIGNS = {8: SequentialDesign(looks=(50, 100, 150, 200), coupled_spending="power:4", futility_tau=0.3),
           16: SequentialDesign(looks=(50, 100, 150, 200), coupled_spending="power:4", futility_tau=0.15)}
TAUS = (0.0, 0.5, 0.9)


def design_for(n: int) -> SequentialDesign:
    """The design :data:`DESIGNS` gives ``n`` models (the nearest size's)."""
    return DESIGNS[min(DESIGNS, key=lambda k: (abs(k - n), k))]


def simulate(n: int, tau: float, runs: int, design: SequentialDesign | None = None, *, spacing: str = "graded",
             seed: int = 0) -> list[dict[str, Any]]:
    """``runs`` planted settings, each with its fixed and sequential verdict, questions used and own tau."""
    design = design or design_for(n)
    rng = np.random.default_rng([seed, n, round(1e6 * (tau + 1))])
    fixed = SequentialDesign(looks=(design.looks[-1],), alpha=design.alpha, decoupled_alpha=design.decoupled_alpha,
                             delta=design.delta, resamples=design.resamples, seed=design.seed)
    out = []
    for _ in range(runs):
        s = stats.plant_setting(rng, n, design.looks[-1], tau, stats.PLANTED_POOLS[spacing])
        f = sequential_verdict(s.individual, s.compositional, s.example_ids, fixed)
        q = sequential_verdict(s.individual, s.compositional, s.example_ids, design)
        out.append({"fixed": f.verdict, "sequential": q.verdict, "questions": q.questions, "stopped": q.stopped,
                    "population_tau": s.tau})
    return out


def study(n: int, taus: tuple[float, ...], studies: int, *, per_setting: int = 200, cap: int = 400, batch: int = 50,
          spacing: str = "graded", seed: int = 0) -> dict[str, Any]:
    """Whole studies of ``len(taus)`` settings sharing ``len(taus) * per_setting`` questions: the fixed design
    gives each ``per_setting``; the sequential one reads looks every ``batch`` up to ``cap`` (the design of
    :func:`design_for` stretched to them) and :func:`crl_envs.sequential.reallocate` gives each round's
    questions to the settings still open. Returns verdict counts per design and the questions spent."""
    base = design_for(n)
    design = SequentialDesign(looks=tuple(range(batch, cap + 1, batch)), coupled_spending=base.coupled_spending,
                              decoupled_spending=base.decoupled_spending, futility_tau=base.futility_tau)
    fixed = SequentialDesign(looks=(per_setting,))
    rng = np.random.default_rng([seed, n, len(taus), 17])
    counts = {d: {v: 0 for v in ("coupled", "decoupled", "inconclusive", "untestable")} for d in ("fixed", "sequential")}
    spent = []
    for _ in range(studies):
        plants = [stats.plant_setting(rng, n, cap, tau, stats.PLANTED_POOLS[spacing]) for tau in taus]
        for s in plants:
            counts["fixed"][sequential_verdict(s.individual, s.compositional, s.example_ids, fixed).verdict] += 1
        used, final = [0] * len(plants), ["inconclusive"] * len(plants)
        open_, left = [True] * len(plants), len(plants) * per_setting
        while any(open_) and left > 0:
            give = reallocate(used, open_, budget=left, cap=cap, batch=batch)
            if not any(give):
                break
            for i, g in enumerate(give):
                if g == 0:
                    continue
                used[i], left = used[i] + g, left - g
                if used[i] % batch:  # a partial batch is no look: the setting stays as it is
                    open_[i] = False
                    continue
                look = read_look(plants[i].individual, plants[i].compositional, plants[i].example_ids, design,
                                 used[i] // batch - 1)
                decided = look["verdict"] in ("coupled", "decoupled")
                final[i] = look["verdict"] if decided or used[i] == cap else "inconclusive"
                open_[i] = not decided and not look["futile"] and used[i] < cap
        for v in final:
            counts["sequential"][v] += 1
        spent.append(sum(used))
    return {"n": n, "taus": list(taus), "studies": studies, "per_setting": per_setting, "cap": cap, "counts": counts,
            "questions": {"fixed": len(taus) * per_setting, "sequential": float(np.mean(spent))}}


def _rate(hits: int, runs: int) -> dict[str, float]:
    p = hits / runs
    return {"value": p, "se": math.sqrt(p * (1 - p) / runs), "hits": hits, "runs": runs}


def summarise(rows: list[dict[str, Any]], n: int, tau: float, design: SequentialDesign | None = None) -> dict[str, Any]:
    """Rates (with Monte Carlo SEs) and the evaluation ratio of one scenario's runs."""
    design = design or design_for(n)
    runs, last = len(rows), design.looks[-1]
    out: dict[str, Any] = {"n": n, "tau": tau, "runs": runs}
    for d in ("fixed", "sequential"):
        out[d] = {v: _rate(sum(r[d] == v for r in rows), runs) for v in ("coupled", "decoupled", "inconclusive")}
        outside = [r for r in rows if abs(r["population_tau"]) >= design.delta]
        out[d]["false_decoupled"] = _rate(sum(r[d] == "decoupled" for r in outside), max(1, len(outside)))
    out["agree"] = _rate(sum(r["fixed"] == r["sequential"] for r in rows), runs)
    used = np.array([r["questions"] for r in rows], float)
    ratio = used.mean() / last
    out["evaluations"] = {"sequential": float(used.mean() * 2**n), "fixed": float(last * 2**n), "ratio": ratio,
                          "ratio_se": float(used.std(ddof=1) / math.sqrt(runs) / last) if runs > 1 else 0.0,
                          "saving": 1 / ratio}
    out["stopped"] = {k: sum(r["stopped"] == k for r in rows) for k in ("decided", "futility", "last look")}
    return out


def _fmt(r: dict[str, float]) -> str:
    return f"{r['value']:.3f} ± {r['se']:.3f}" if 0 < r["hits"] < r["runs"] else f"{r['value']:.3f} ({r['hits']}/{r['runs']})"


def describe(n: int, design: SequentialDesign) -> str:
    """One line naming a design's looks, levels and futility rule."""
    return (f"n = {n}: looks {list(design.looks)}, coupled alpha {design.alpha} spent {design.coupled_spending} "
            f"({', '.join(f'{a:.4f}' for a in design.coupled_levels)}), decoupled alpha {design.decoupled_alpha} spent "
            f"{design.decoupled_spending} ({', '.join(f'{b:.2g}' for b in design.decoupled_levels)}), futility below "
            f"tau {design.futility_tau}; fixed: one look at {design.looks[-1]}. Stated levels: false coupled <= "
            f"{design.alpha / 2:g} (one-sided), false decoupled <= {design.decoupled_alpha:g}.")


def table(results: list[dict[str, Any]], designs: dict[int, SequentialDesign] | None = None) -> str:
    """The markdown table the benchmark prints (``designs``: per ``n``, default :func:`design_for`)."""
    designs = designs or {}
    lines = [*(describe(n, designs.get(n) or design_for(n)) for n in sorted({r["n"] for r in results})), "",
             "| n | tau | runs | coupled fixed | coupled seq | decoupled fixed | decoupled seq | false decoupled "
             "fixed / seq | agree | evaluations seq / fixed | saving | stopped (decided/futility/last) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        e = r["evaluations"]
        lines.append(f"| {r['n']} | {r['tau']:g} | {r['runs']} | {_fmt(r['fixed']['coupled'])} | "
                     f"{_fmt(r['sequential']['coupled'])} | {_fmt(r['fixed']['decoupled'])} | "
                     f"{_fmt(r['sequential']['decoupled'])} | {_fmt(r['fixed']['false_decoupled'])} / "
                     f"{_fmt(r['sequential']['false_decoupled'])} | {_fmt(r['agree'])} | "
                     f"{e['ratio']:.3f} ± {e['ratio_se']:.3f} | {e['saving']:.2f}x | "
                     f"{r['stopped']['decided']}/{r['stopped']['futility']}/{r['stopped']['last look']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16])
    p.add_argument("--taus", type=float, nargs="+", default=list(TAUS))
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="write the results here too")
    p.add_argument("--coupled-spending", default=None, help="override the designs' coupled spending, e.g. power:4")
    p.add_argument("--futility-tau", type=float, default=None, help="override the designs' futility threshold")
    p.add_argument("--studies", type=int, default=0,
                   help="also this many whole studies (settings at each tau of --taus, 5 each) sharing their budget")
    args = p.parse_args(argv)
    if args.studies:
        for n in args.sizes:
            r = study(n, tuple(t for t in args.taus for _ in range(5)), args.studies, seed=args.seed)
            print(f"n = {n}, {r['studies']} studies of {len(r['taus'])} settings (taus {sorted(set(r['taus']))}), "
                  f"{r['per_setting']} questions a setting or, sequential, shared up to {r['cap']} each: verdicts "
                  f"{r['counts']}; questions per study fixed {r['questions']['fixed']}, sequential "
                  f"{r['questions']['sequential']:.0f}")
    start, results = time.time(), []
    overrides = {k: v for k, v in (("coupled_spending", args.coupled_spending), ("futility_tau", args.futility_tau))
                 if v is not None}
    designs = {n: dataclasses.replace(design_for(n), **overrides) for n in args.sizes}
    for n in args.sizes:
        for tau in args.taus:
            results.append(summarise(simulate(n, tau, args.runs, designs[n], seed=args.seed), n, tau, designs[n]))
            print(f"n={n} tau={tau:g}: {time.time() - start:.0f} s, load average {os.getloadavg()[0]:.2f}",
                  file=sys.stderr, flush=True)
            if args.json:  # after each scenario: a long run leaves what it finished
                args.json.write_text(json.dumps(results, indent=1))
    print(table(results, designs))
    print(f"\n{time.time() - start:.0f} s, load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
