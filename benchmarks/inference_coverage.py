"""How often the valuation's interval and verdicts hold their stated rates, on planted truth in real tables.

The population is a real setting of paper-small (``tests/data/inference_tables.json``: the per-question
individual and Shapley tables of 8-model zoo4 pools on 200 arith questions, from the study's own cells).
A population tau is planted by re-assigning the Shapley rows to the models (a permutation of rows whose
200-question means have Kendall tau-b ``tau`` with the individual means); a simulated study draws ``N``
questions with replacement from the 200, gives them fresh ids (a fresh cross-fit split) and runs
:func:`crl_envs.stats.crossfit_tau` and :func:`crl_envs.stats.verdict` on them, as the study does.

Printed per setting, N and planted tau: the coverage of the ``1 - alpha`` interval of tau (the one the
study prints: the taus consistent with the pairwise orders the questions determine), beside the 90%
percentile and bias-corrected (BC) bootstrap intervals of the same resamples that the study printed
before (the BC: BCa without the acceleration); the rate of each verdict; and the Monte Carlo SE of a
rate (``sqrt(p (1 - p) / studies)``). ``tests/test_inference_calibration.py`` asserts the same rates
at N = 200 with fewer studies.

Usage:
    python benchmarks/inference_coverage.py                       # N = 200, 1000; 400 studies per row
    python benchmarks/inference_coverage.py --sizes 200 1000 4000 --studies 1000
    python benchmarks/inference_coverage.py --extract CELL.json ...   # rebuild the tables from cell results
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from crl_envs import stats  # noqa: E402

TABLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "inference_tables.json"
ALPHA, DELTA = 0.05, 0.3
#: tau of 8 models lies on a lattice of 1/14: 10/28 is the first value outside the +/-0.3 margin
TAUS = (-10 / 28, 0.0, 8 / 28, 10 / 28, 20 / 28)


def load_tables(path: Path = TABLES) -> dict[str, dict[str, np.ndarray]]:
    """``setting -> {"individual", "shapley"}``: ``(8, 200)`` per-question tables."""
    d = json.loads(Path(path).read_text())
    return {k: {m: np.asarray(v[m], float) for m in ("individual", "shapley")} for k, v in d["settings"].items()}


@functools.lru_cache(maxsize=8)
def _permutations(n: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(n))))


def plant(individual: np.ndarray, shapley: np.ndarray, tau: float) -> tuple[np.ndarray, float]:
    """Row orders of ``shapley`` whose population tau-b with ``individual`` is the closest to ``tau`` that the
    tables allow (every one of them), and that tau."""
    perms = _permutations(individual.shape[0])
    taus = stats.kendall_tau_b(individual.mean(axis=1), shapley.mean(axis=1)[perms])
    gap = np.abs(taus - tau)
    best = np.flatnonzero(gap <= gap.min() + 1e-9)
    return perms[best], float(taus[best[0]])


def bc_interval(estimate: float, boots: np.ndarray, level: float) -> list[float] | None:
    """The bias-corrected percentile interval (BCa with acceleration 0; ties on the estimate count half)."""
    b = boots[~np.isnan(boots)]
    if b.size == 0:
        return None
    below = (np.sum(b < estimate - 1e-12) + 0.5 * np.sum(np.abs(b - estimate) <= 1e-12)) / b.size
    z0 = scipy_stats.norm.ppf(np.clip(below, 1 / (2 * b.size), 1 - 1 / (2 * b.size)))
    z = scipy_stats.norm.ppf([(1 - level) / 2, (1 + level) / 2])
    return list(np.quantile(b, scipy_stats.norm.cdf(2 * z0 + z)))


def simulate(individual: np.ndarray, shapley: np.ndarray, tau: float, questions: int, studies: int, *,
             seed: int = 0, resamples: int = 1000, alpha: float = ALPHA, delta: float = DELTA) -> dict[str, Any]:
    """``studies`` simulated studies of ``questions`` questions at planted ``tau``: coverage of each interval,
    the rate of each verdict and the mean estimate."""
    rng = np.random.default_rng([seed, questions, round(1000 * (tau + 1))])
    orders, truth = plant(individual, shapley, tau)
    hits: dict[str, list[bool]] = {"interval": [], "percentile 90%": [], "BC 90%": []}
    verdicts, estimates, widths, undefined = [], [], [], 0
    for s in range(studies):
        y = shapley[orders[rng.integers(len(orders))]]
        idx = rng.integers(0, individual.shape[1], questions)
        ids = [f"q{s}-{k}-{rng.integers(1 << 62)}" for k in range(questions)]
        cf = stats.crossfit_tau(individual[:, idx], y[:, idx], ids, level=1 - alpha, resamples=resamples,
                                seed=int(rng.integers(1 << 30)))
        verdicts.append(stats.verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"],
                                      alpha=alpha, delta=delta, questions=cf["questions"]))
        if cf["tau_ci"] is None:
            undefined += 1
            continue
        estimates.append(cf["kendall_tau"])
        widths.append(cf["tau_ci"][1] - cf["tau_ci"][0])
        others = {"interval": cf["tau_ci"], "percentile 90%": stats.percentile_ci(cf["boots"], 0.9),
                  "BC 90%": bc_interval(cf["kendall_tau"], cf["boots"], 0.9)}
        for k, ci in others.items():
            hits[k].append(ci is not None and ci[0] - 1e-9 <= truth <= ci[1] + 1e-9)
    rates = {v: verdicts.count(v) / studies for v in stats.VERDICTS}
    return {"tau": truth, "questions": questions, "studies": studies, "undefined": undefined,
            "coverage": {k: float(np.mean(v)) if v else None for k, v in hits.items()},
            "verdicts": rates, "mean_estimate": float(np.mean(estimates)) if estimates else None,
            "mean_width": float(np.mean(widths)) if widths else None}


def mc_se(rate: float, studies: int) -> float:
    """The Monte Carlo standard error of a rate measured on ``studies`` studies."""
    return math.sqrt(max(rate * (1 - rate), 1e-12) / studies)


def extract(cell_paths: list[str], out: Path = TABLES) -> None:
    """Write the tables file from valuation cell results (``run_cell``'s dicts, labelled by file name)."""
    settings = {}
    for p in cell_paths:
        r = json.loads(Path(p).read_text())["report"]
        m = r["measures"]
        settings[Path(p).stem] = {"names": r["names"], "example_ids": r["example_ids"],
                                  **{k: np.round(np.asarray(m[k]["per_question"]), 12).tolist()
                                     for k in ("individual", "shapley")}}
    out.write_text(json.dumps({"source": "paper-small valuation cells (studies/paper-small.toml), report "
                                         "measures' per_question tables", "settings": settings}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    p.add_argument("--studies", type=int, default=400)
    p.add_argument("--taus", type=float, nargs="+", default=list(TAUS))
    p.add_argument("--extract", nargs="+", default=None, metavar="CELL.json")
    args = p.parse_args()
    if args.extract:
        extract(args.extract)
        return
    tables = load_tables()
    print(f"load average {os.getloadavg()[0]:.1f}; alpha {ALPHA}, margin +/-{DELTA}; interval at {1 - ALPHA:.0%}; "
          f"{args.studies} studies per row (Monte Carlo SE of a rate p: sqrt(p(1-p)/{args.studies}), "
          f"{mc_se(0.05, args.studies):.3f} at 0.05)")
    print("| setting | N | tau | cover: interval (95%) | percentile 90% | BC 90% | mean width | coupled | decoupled | "
          "inconclusive |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t in tables.items():
        for n in args.sizes:
            for tau in args.taus:
                r = simulate(t["individual"], t["shapley"], tau, n, args.studies)
                c, v = r["coverage"], r["verdicts"]
                print(f"| {name} | {n} | {r['tau']:+.3f} | {c['interval']:.3f} | {c['percentile 90%']:.3f} | "
                      f"{c['BC 90%']:.3f} | {r['mean_width']:.2f} | {v['coupled']:.3f} | {v['decoupled']:.3f} | "
                      f"{v['inconclusive']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
