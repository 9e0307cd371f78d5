"""Pools of 16 under exact vote Shapley (issue #54 item 1; ``docs/pools16.md``).

Four pools of 16 seats built from zoo v4's shipped models (:data:`agents.zoo.specs.POOLS16`, each with
its intended shape in :data:`agents.zoo.specs.POOL_SHAPES16`, written before the pool was played):
``zoo16-graded``, ``zoo16-copies`` (one model sampled 16 times: only chance separates the seats),
``zoo16-specialists`` (complementary blind spots) and ``zoo16-tau0`` (built so individual accuracy and
vote Shapley are unrelated). Per pool, on the study's arith questions (:func:`benchmarks.levels.task_for`,
200, seed 0, 24 new tokens): each seat's accuracy alone, its exact Shapley value in vote (every coalition
computed from the seats' solo answers, :mod:`crl_envs.valuation.game`), the cross-fit tau of the two with
its 95% interval, exact p and verdict (:meth:`crl_envs.valuation.ValuationReport.verdict`, the study's),
whether each stated check held (:data:`CHECKS`), and the design's power at n = 16
(:func:`crl_envs.stats.verdict_power`, the spacing :data:`agents.zoo.specs.POOL_SHAPES16` names).

The tau-0 construction is first checked on planted truth (:func:`planted_codes`, ``"tau0"``): answer
tables with that structure played through the vote rule itself (:func:`vote_shapley`:
:func:`crl_envs.protocols.base.plurality_winners` over all 65,535 coalitions, the exact Shapley weights),
its population tau over :data:`PLANTED_QUESTIONS` questions, and the study's verdict on 200-question
draws from it.

Run: ``PYTHONPATH=. nice -n 19 python benchmarks/pools16.py --out docs`` (writes ``docs/pools16.json``;
``--markdown`` prints docs/pools16.md's tables from it). ``tests/test_pools16.py`` checks the
registration, the checks on planted truth, and replays the committed figures of one pool.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

QUESTIONS = 200
SEED = 0
MAX_NEW_TOKENS = 24  # as benchmarks/levels.py and tools/zoo/v4.py
ALPHA = 0.05
#: Questions drawn from a planted population and played (the true tau is computed exactly: planted_truth).
PLANTED_QUESTIONS = 600
#: 200-question draws from the planted population the verdict is run on.
PLANTED_DRAWS = 100


# ---------------------------------------------------------------------- the vote game from answers
def vote_shapley(codes: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``(seats, questions)`` exact Shapley values of vote per question, from each seat's answer code and
    whether it is right (``(questions, seats)`` each; equal codes for equal answers, ``-1`` no answer): every
    coalition's value from :func:`crl_envs.valuation.aggregate_scores` with vote's own rule
    (:func:`crl_envs.protocols.base.plurality_winners`), as :class:`crl_envs.valuation.CoalitionGame`
    computes it, weighted by :func:`crl_envs.valuation.estimators.shapley_weights`."""
    from crl_envs.protocols.base import plurality_winners
    from crl_envs.valuation import aggregate_scores
    from crl_envs.valuation.estimators import shapley_weights

    codes, right = np.asarray(codes, np.int64), np.asarray(right, float)
    q, n = codes.shape
    weights = shapley_weights(n)
    phi = np.zeros((n, q))
    masks = np.arange(1, 1 << n, dtype=np.int64)
    for start in range(0, len(masks), 4096):
        chunk = masks[start:start + 4096]
        phi += weights[:, chunk] @ aggregate_scores(plurality_winners, codes, right.T, chunk).T
    return phi


# ---------------------------------------------------------------------- planted truth
def _tau0_kinds() -> tuple[np.ndarray, np.ndarray]:
    """The planted ``tau0`` pool as question kinds: ``(weights, right)``, ``right[k, i]`` seat ``i``'s chance on kind ``k``."""
    strength = np.linspace(0.80, 0.94, 8)
    right = np.full((6, 16), 0.05)
    right[0, :8] = right[1, :8] = strength  # the common kind and the redundant seats' own kind
    right[0, 8:], right[1, 8:] = 0.9, 0.1
    for pair in range(4):  # each complementary pair's niche
        right[2 + pair, [8 + 2 * pair, 9 + 2 * pair]] = strength[[2 * pair, 2 * pair + 1]]
    return np.array([0.3, 0.3, 0.1, 0.1, 0.1, 0.1]), right


#: Planted shapes whose seats are independent given the question's kind, wrong answers never shared:
#: ``name -> (kind weights, right[kind, seat])``.
PLANTED_KINDS: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "graded": (np.ones(1), np.linspace(0.05, 0.90, 16)[None, :]),
    "tau0": _tau0_kinds(),
}


def planted_codes(shape: str, questions: int, rng: np.random.Generator) -> np.ndarray:
    """``(questions, 16)`` answer codes of a planted pool (0 is the right answer):

    - ``"graded"``: accuracies 0.05 .. 0.90 evenly, independent;
    - ``"tau0"`` (the construction of ``zoo16-tau0``, with true niche solvers): seats 0-7 *redundant*, right with
      probability 0.80 .. 0.94 on the same 60% of questions (a common kind and a kind only they solve), 0.05
      elsewhere; seats 8-15 *complementary*, four pairs: right with probability 0.9 on the common kind, 0.1 on
      the redundant seats' kind, 0.80 .. 0.94 on their pair's own niche (10% of questions each), 0.05 on the
      other niches. Alone the redundant seats are stronger; in vote they split each question's credit eight
      ways, a pair splits its niche's two ways;
    - ``"copies"``: every seat right with probability drawn per question (Beta(2.9, 1.1), mean 0.72: the seats
      exchangeable, their errors correlated through the question), wrong answers one common value 60% of the time.

    In ``graded`` and ``tau0`` (:data:`PLANTED_KINDS`) seats are independent given the kind and never share a
    wrong answer, so :func:`planted_truth` computes their population exactly.
    """
    if shape in PLANTED_KINDS:
        weights, right_p = PLANTED_KINDS[shape]
        p = right_p[rng.choice(len(weights), questions, p=weights)]
        right = rng.random((questions, 16)) < p
        return np.where(right, 0, 1 + 1000 * np.arange(16)[None, :] + rng.integers(0, 1000, (questions, 16)))
    if shape == "copies":
        p = rng.beta(2.9, 1.1, questions)[:, None]
        right = rng.random((questions, 16)) < p
        common = rng.random((questions, 16)) < 0.6
        return np.where(right, 0, np.where(common, 1, 2 + rng.integers(0, 1000, (questions, 16))))
    raise ValueError(f"planted shape must be 'graded', 'copies' or 'tau0', got {shape!r}")


def planted_truth(shape: str) -> dict[str, Any]:
    """The population of a planted shape of :data:`PLANTED_KINDS`, exactly: each seat's accuracy, its Shapley value
    in vote and their Kendall tau-b. Per kind, a coalition is right when two or more of its seats are (they agree;
    wrong answers never do), or when exactly one is and it comes first in pool order (vote gives a tie of single
    answers to the first seat): ``P = 1 - P(none) - P(one) + P(only the first)``, independent seats."""
    from crl_envs import stats
    from crl_envs.valuation.estimators import membership, shapley_weights

    weights, right_p = PLANTED_KINDS[shape]
    inside = membership(16).T.astype(float)  # (2^16, 16)
    masks = np.arange(1 << 16)
    first = np.where(masks > 0, np.log2(np.maximum(masks & -masks, 1)).astype(int), 0)
    value = np.zeros(1 << 16)
    for w, p in zip(weights, right_p):
        none = np.exp(inside @ np.log1p(-p))
        one = none * (inside @ (p / (1 - p)))
        only_first = none * p[first] / (1 - p[first])
        value += w * np.where(masks > 0, 1 - none - one + only_first, 0.0)
    accuracy, shapley = weights @ right_p, shapley_weights(16) @ value
    return {"accuracy": accuracy.round(4).tolist(), "shapley": shapley.round(5).tolist(),
            "tau": float(stats.kendall_tau_b(accuracy, shapley))}


def planted_check(shape: str, *, questions: int = PLANTED_QUESTIONS, draws: int = PLANTED_DRAWS,
                  draw_questions: int = QUESTIONS, seed: int = 0) -> dict[str, Any]:
    """A planted pool: its true tau (:func:`planted_truth`; for ``copies`` undefined, every seat the same in
    distribution), then ``questions`` questions drawn and played through :func:`vote_shapley`: the same-question
    tau of their accuracies and Shapley means (for exchangeable seats, the artefact cross-fitting removes), and
    the study's verdict on ``draws`` draws of ``draw_questions`` of them (cross-fit tau, alpha :data:`ALPHA`):
    the share of each verdict, with its Monte Carlo SE."""
    from crl_envs import stats

    rng = np.random.default_rng([seed, ["graded", "copies", "tau0"].index(shape)])
    codes = planted_codes(shape, questions, rng)
    right = (codes == 0).astype(float)
    phi = vote_shapley(codes, right)
    found: dict[str, int] = {}
    for k in range(draws):
        idx = rng.choice(questions, draw_questions, replace=False)
        cf = stats.crossfit_tau(right[idx].T, phi[:, idx], [f"planted-{shape}-{k}-{i}" for i in idx], level=1 - ALPHA,
                                resamples=200, seed=k)
        got = stats.verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"], alpha=ALPHA,
                            questions=cf["questions"])
        found[got] = found.get(got, 0) + 1
    rates = {v: {"rate": c / draws, "se": math.sqrt(c / draws * (1 - c / draws) / draws)} for v, c in sorted(found.items())}
    truth = planted_truth(shape) if shape in PLANTED_KINDS else None
    return {"shape": shape, "true_tau": None if truth is None else truth["tau"], "truth": truth, "questions": questions,
            "accuracy": right.mean(axis=0).round(4).tolist(), "shapley": phi.mean(axis=1).round(5).tolist(),
            "same_question_tau": float(stats.kendall_tau_b(right.mean(axis=0), phi.mean(axis=1))),
            "draws": draws, "draw_questions": draw_questions, "verdicts": rates}


# ---------------------------------------------------------------------- the stated checks
def _cochran_q(right: np.ndarray) -> float:
    """Cochran's Q test p-value that ``(seats, questions)`` 0/1 outcomes have one success rate (related samples:
    the same questions for every seat)."""
    from scipy import stats as sstats

    x = np.asarray(right, float)
    k = x.shape[0]
    col, row = x.sum(axis=0), x.sum(axis=1)
    den = k * col.sum() - (col ** 2).sum()
    if den == 0:
        return 1.0
    q = (k - 1) * (k * (row ** 2).sum() - row.sum() ** 2) / den
    return float(sstats.chi2.sf(q, k - 1))


def _mean_error_correlation(right: np.ndarray, pairs: Sequence[tuple[int, int]]) -> float | None:
    errs = 1 - np.asarray(right, float)
    vals = [np.corrcoef(errs[i], errs[j])[0, 1] for i, j in pairs if errs[i].std() > 0 and errs[j].std() > 0]
    return float(np.mean(vals)) if vals else None


#: Per pool, the checks its stated shape makes (:data:`agents.zoo.specs.POOL_SHAPES16` quotes them):
#: ``name -> (what it says, predicate over the pool's figures)``.
CHECKS: dict[str, dict[str, tuple[str, Callable[[Mapping[str, Any]], bool]]]] = {
    "zoo16-graded": {
        "spread": ("solo accuracies span at least 0.5", lambda f: max(f["accuracy"]) - min(f["accuracy"]) >= 0.5),
        "coupled": ("the cross-fit verdict is coupled", lambda f: f["verdict"]["verdict"] == "coupled"),
    },
    "zoo16-copies": {
        "exchangeable": ("Cochran's Q does not reject one accuracy for all seats (p > 0.05)",
                         lambda f: f["cochran_q_p"] > ALPHA),
        "not_coupled": ("the cross-fit verdict is not coupled", lambda f: f["verdict"]["verdict"] != "coupled"),
    },
    "zoo16-specialists": {
        "vote_above_best": ("vote above the best seat alone", lambda f: f["vote"] > max(f["accuracy"])),
        "complementary": ("at least one seat right on 0.2 more questions than the best seat",
                          lambda f: f["any_right"] >= max(f["accuracy"]) + 0.2),
        "twins_closer": ("errors of a specialist's greedy and sampled seats correlate more than those of different "
                         "specialists", lambda f: f["error_correlation"]["twins"] > f["error_correlation"]["others"]),
    },
    "zoo16-tau0": {
        "near_zero": ("the cross-fit tau lies in (-0.3, 0.3)",
                      lambda f: f["verdict"]["kendall_tau"] is not None and abs(f["verdict"]["kendall_tau"]) < 0.3),
        "not_coupled": ("the cross-fit verdict is not coupled", lambda f: f["verdict"]["verdict"] != "coupled"),
    },
}


def check(pool: str, figures: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each stated check of ``pool`` (:data:`CHECKS`) on its figures: ``{name: {"says", "held"}}``."""
    return {name: {"says": says, "held": bool(test(figures))} for name, (says, test) in CHECKS[pool].items()}


def figures(names: Sequence[str], individual: np.ndarray, shapley: np.ndarray, system: np.ndarray,
            verdict: Mapping[str, Any]) -> dict[str, Any]:
    """A pool's figures from its ``(seats, questions)`` solo scores and Shapley values and vote's per-question
    scores: what :data:`CHECKS` read and docs/pools16.md prints."""
    right = np.asarray(individual, float)
    n = len(names)
    twins = [(i, i + n // 2) for i in range(n // 2)]
    others = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in twins and names[i] != names[j]]
    return {"names": list(names), "accuracy": right.mean(axis=1).round(4).tolist(),
            "shapley": np.asarray(shapley).mean(axis=1).round(5).tolist(), "vote": round(float(np.mean(system)), 4),
            "any_right": round(float(right.max(axis=0).mean()), 4), "cochran_q_p": _cochran_q(right),
            "error_correlation": {"twins": _mean_error_correlation(right, twins),
                                  "others": _mean_error_correlation(right, others)},
            "verdict": {k: verdict[k] for k in ("kendall_tau", "p_value", "min_p_value", "tau_ci", "tau_ci_level",
                                                 "verdict")}}


# ---------------------------------------------------------------------- measuring the pools
def measure(pool_name: str, questions: int = QUESTIONS, seed: int = SEED) -> dict[str, Any]:
    """One pool of 16 valued exactly in vote on the study's arith questions, its figures and checks."""
    import agents
    from benchmarks.levels import task_for
    from crl_envs import valuation

    report = valuation.evaluate("vote", agents.pool(pool_name), task_for(questions, seed), seed=seed,
                                sampling=agents.SamplingParams(max_new_tokens=MAX_NEW_TOKENS), cache_dir=False,
                                progress=False, ci_level=1 - ALPHA)
    found = figures(report.names, report.individual.per_question, report.shapley.per_question, report.system,
                    report.verdict("shapley"))
    return {**found, "example_ids": list(report.example_ids),
            "individual_per_question": report.individual.per_question.astype(int).tolist(),
            "shapley_per_question": report.shapley.per_question.round(8).tolist(), "checks": check(pool_name, found)}


def power(pool_name: str, questions: int = QUESTIONS) -> dict[str, Any]:
    """The design's power for this pool at n = 16 (:func:`crl_envs.stats.verdict_power`, the pool's stated spacing):
    coupled at tau 0.5 and decoupled at tau 0, and coupled at tau 0 (the false "coupled" rate)."""
    from agents.zoo.specs import POOL_SHAPES16
    from crl_envs.stats import verdict_power

    spacing = POOL_SHAPES16[pool_name][2]
    return {"spacing": spacing,
            "coupled_at_0.5": verdict_power(16, questions, verdict="coupled", planted=spacing).to_dict(),
            "coupled_at_0": verdict_power(16, questions, verdict="coupled", tau=0.0, planted=spacing).to_dict(),
            "decoupled_at_0": verdict_power(16, questions, verdict="decoupled", planted=spacing).to_dict()}


def markdown(result: Mapping[str, Any]) -> str:
    """docs/pools16.md's tables from the JSON: the planted check, then per pool its seats and figures."""
    from agents.zoo.specs import POOL_SHAPES16
    from crl_envs.stats import format_power, interval

    first = next(iter(result["planted"].values()))
    lines = [f"| planted shape | true tau | same-question tau ({first['questions']} questions) | verdicts over "
             f"{first['draws']} draws of {first['draw_questions']} questions |", "|---|---|---|---|"]
    for shape, p in result["planted"].items():
        rates = ", ".join(f"{v} {r['rate']:.2f} ± {r['se']:.2f}" for v, r in p["verdicts"].items())
        true = "undefined (seats identical in distribution)" if p["true_tau"] is None else f"{p['true_tau']:+.3f}"
        lines.append(f"| {shape} | {true} | {p['same_question_tau']:+.3f} | {rates} |")
    lines += ["", "| pool | alone (range) | vote | cross-fit tau | verdict | stated checks held |", "|---|---|---|---|---|---|"]
    for name, p in result["pools"].items():
        v, held = p["verdict"], sum(c["held"] for c in p["checks"].values())
        tau = "n/a" if v["kendall_tau"] is None else f"{v['kendall_tau']:+.2f}"
        lines.append(f"| {name} | {min(p['accuracy']):.2f} .. {max(p['accuracy']):.2f} | {p['vote']:.3f} | {tau} | "
                     f"{v['verdict']} | {held} of {len(p['checks'])} |")
    lines.append("")
    for name, p in result["pools"].items():
        v = p["verdict"]
        ci = interval(v["tau_ci"], v["kendall_tau"], lambda x: f"{x:+.2f}", zero_width="every pair's order determined")
        pw = result["power"][name]
        lines += [f"### {name}", "", f"Stated shape: {POOL_SHAPES16[name][0]}.", "",
                  f"Stated effect: {POOL_SHAPES16[name][1]}.", "",
                  "| seat | alone | vote Shapley |", "|---|---|---|"]
        lines += [f"| {s} | {a:.3f} | {sh:+.4f} |" for s, a, sh in zip(p["names"], p["accuracy"], p["shapley"])]
        tau = "n/a" if v["kendall_tau"] is None else f"{v['kendall_tau']:+.2f}"
        pv = "n/a" if v["p_value"] is None else f"{v['p_value']:.3g}"
        ec = p["error_correlation"]
        lines += ["", f"vote {p['vote']:.3f}, best seat {max(p['accuracy']):.3f}, at least one right {p['any_right']:.3f}, "
                  f"Cochran's Q p {p['cochran_q_p']:.3g}"
                  + (f", error correlation twins {ec['twins']:+.2f} / others {ec['others']:+.2f}"
                     if "twins_closer" in p["checks"] else "")
                  + f"; cross-fit tau {tau} (95% interval {ci}), exact p {pv}: **{v['verdict']}**.", "",
                  f"Power at n = 16, {result['questions']} questions ({pw['spacing']} spacing): coupled at tau 0.5 "
                  f"{format_power(pw['coupled_at_0.5'])}; coupled at tau 0 {format_power(pw['coupled_at_0'])}; "
                  f"decoupled at tau 0 {format_power(pw['decoupled_at_0'])}.", "",
                  "| check | says | held |", "|---|---|---|"]
        lines += [f"| {c} | {r['says']} | {'yes' if r['held'] else '**no**'} |" for c, r in p["checks"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from agents.zoo.specs import POOLS16

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--pools", default=",".join(POOLS16), help="pools to measure (merged into --out's JSON)")
    parser.add_argument("--planted", default="tau0,graded,copies", help="planted shapes to check ('' for none)")
    parser.add_argument("--markdown", action="store_true", help="print docs/pools16.md's tables from --out's pools16.json")
    args = parser.parse_args(argv)
    path = args.out / "pools16.json"
    if args.markdown:
        print(markdown(json.loads(path.read_text())))
        return
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {
        "questions": QUESTIONS, "seed": SEED, "max_new_tokens": MAX_NEW_TOKENS, "alpha": ALPHA, "planted": {},
        "pools": {}, "power": {}}
    for shape in filter(None, args.planted.split(",")):
        result["planted"][shape] = planted_check(shape)
        print("planted", shape, result["planted"][shape]["true_tau"], result["planted"][shape]["verdicts"], flush=True)
    for name in filter(None, args.pools.split(",")):
        result["pools"][name] = measure(name)
        result["power"][name] = power(name)
        print(name, result["pools"][name]["verdict"], result["pools"][name]["checks"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
