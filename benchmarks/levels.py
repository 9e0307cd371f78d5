"""Do models' values agree across collaboration levels? (issue #56; ``docs/levels.md``)

For the zoo v1 pool and zoo v4 pools, each model's exact Shapley value in five games on the same arith
questions: the text level (``vote``, ``debate``), the logit level (``logit_fusion``) and the weight level
(``soup``: the zoo's shared bases are not shipped, so task arithmetic and TIES, which need them, are left
out here). Then, for every pair of levels, whether the two rankings of the pool's models agree: Kendall's
tau-b **cross-fitted** (:func:`crl_envs.stats.crossfit_tau`: one level's values from one half of the questions,
the other's from the other half, halves fixed by a hash of each question id, so a model's lucky questions
cannot raise both; exact permutation p-value, 90% BCa interval over questions), beside the same-question tau.

Run: ``PYTHONPATH=. python benchmarks/levels.py --out docs`` (writes ``docs/levels.json`` and
``docs/levels.png``; coalition runs cached in ``--cache-dir``, so an interrupted run resumes).
``tests/test_levels.py::test_committed_levels_figures`` re-plays one pool's fusion and soup coalitions
and recomputes every cross-fit tau from the committed per-question values.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

POOLS = ("zoo", "zoo4-specialists", "zoo4-clones")
#: game name -> (level, protocol)
GAMES = {"vote": ("text", "vote"), "debate": ("text", "debate"), "fusion": ("logit", "logit_fusion"),
         "soup": ("weight", "soup")}
QUESTIONS = 100
MAX_NEW_TOKENS = 24  # as tools/zoo/v4.py evaluates the v4 models
CI_LEVEL = 0.9


def task_for(questions: int = QUESTIONS, seed: int = 0):
    import agents.zoo
    from crl_envs import tasks

    return tasks.load("arith", split="test", n=questions, seed=seed, **agents.zoo.TASK_OPTIONS)


def value(pool_name: str, game: str, questions: int = QUESTIONS, seed: int = 0, cache_dir: Any = None):
    """The exact :class:`~crl_envs.valuation.ValuationReport` of ``pool_name`` in ``game`` (greedy, 24 tokens)."""
    import agents
    from crl_envs import valuation

    sampling = agents.SamplingParams(max_new_tokens=MAX_NEW_TOKENS)
    return valuation.evaluate(GAMES[game][1], agents.pool(pool_name), task_for(questions, seed), seed=seed,
                              sampling=sampling, cache_dir=cache_dir, progress=False, ci_level=CI_LEVEL)


def _grand_tokens(report) -> float:
    costs = report.coalition_costs
    return float(costs.spends[costs.masks.index((1 << len(report.ids)) - 1)].tokens.mean())


def agreement(a, b, example_ids) -> dict[str, Any]:
    """Cross-fit and same-question Kendall tau between two ``(models, questions)`` Shapley tables."""
    import numpy as np

    from crl_envs.stats import correlation, crossfit_tau, verdict

    fit = crossfit_tau(np.asarray(a), np.asarray(b), example_ids, level=CI_LEVEL)
    same = correlation(np.asarray(a).mean(axis=1), np.asarray(b).mean(axis=1))
    found = verdict(fit["kendall_tau"], fit["p_value"], fit["min_p_value"], fit["tau_ci"], questions=fit["questions"])
    return {"kendall_tau": fit["kendall_tau"], "p_value": fit["p_value"], "min_p_value": fit["min_p_value"],
            "tau_ci": fit["tau_ci"], "questions": fit["questions"], "verdict": found,
            "same_question_tau": None if np.isnan(same.value) else float(same.value),
            "same_question_p": None if np.isnan(same.value) else float(same.p_value)}


def pooled(result: dict[str, Any]) -> dict[str, Any]:
    """Each pair of games over every pool that played both: the sum of the pools' cross-fit taus against the
    exact null that permutes each pool's model labels independently (:func:`crl_envs.stats.grouped_permutation_test`),
    and whether the pools' taus disagree (:func:`crl_envs.stats.heterogeneity`)."""
    import numpy as np

    from crl_envs.stats import crossfit_tau, grouped_permutation_test, heterogeneity

    out = {}
    pairs = dict.fromkeys(k for p in result["pools"].values() for k in p["agreement"])
    for pair in pairs:
        a, b = pair.split("~")
        fits, names = [], []
        for name, p in result["pools"].items():
            if pair in p["agreement"]:
                fits.append(crossfit_tau(np.asarray(p["games"][a]["shapley_per_question"]),
                                         np.asarray(p["games"][b]["shapley_per_question"]), p["example_ids"],
                                         level=CI_LEVEL))
                names.append(name)
        if len(fits) < 2:
            continue
        test = grouped_permutation_test([(f["x"], f["y"]) for f in fits], names)
        taus = [np.nan if f["kendall_tau"] is None else f["kendall_tau"] for f in fits]
        het = heterogeneity(taus, [f["boots"] for f in fits])
        out[pair] = {"pools": names, "mean_tau": float(np.nanmean(taus)),
                     "p_value": float(test["p_value"]), "exact": bool(test["exact"]),
                     "heterogeneous": bool(het["heterogeneous"])}
    return out


def pool_result(pool_name: str, played: Any = tuple(GAMES), questions: int = QUESTIONS, seed: int = 0,
                cache_dir: Any = None) -> dict[str, Any]:
    """The values of every game in ``played`` for one pool, and the agreement of every pair of them."""
    games = {}
    for game in played:
        report = value(pool_name, game, questions, seed, cache_dir)
        games[game] = {
            "level": GAMES[game][0], "protocol": report.protocol, "system_value": float(report.system.mean()),
            "shapley": report.shapley.means.tolist(), "shapley_ci": [list(report.shapley.ci[a]) for a in report.ids],
            "shapley_per_question": report.shapley.per_question.tolist(),
            # the grand coalition's cost as deployed: tokens per question (an ensemble's: token forwards of all members)
            "tokens_per_question": _grand_tokens(report),
        }
        names, ids, individual = report.names, report.example_ids, report.individual
    pairs = {}
    order = list(played)
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            pairs[f"{a}~{b}"] = agreement(games[a]["shapley_per_question"], games[b]["shapley_per_question"], ids)
    return {"names": names, "example_ids": ids, "individual": individual.means.tolist(), "games": games,
            "agreement": pairs}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pools = list(result["pools"])
    fig, axes = plt.subplots(1, len(pools), figsize=(5.2 * len(pools), 4.2), squeeze=False)
    for ax, name in zip(axes[0], pools):
        p = result["pools"][name]
        n = len(p["names"])
        width = 0.8 / len(p["games"])
        for k, game in enumerate(p["games"]):
            g = p["games"][game]
            x = np.arange(n) + (k - (len(p["games"]) - 1) / 2) * width
            ci = np.asarray(g["shapley_ci"], float)
            means = np.asarray(g["shapley"])
            ax.bar(x, means, width, label=f"{game} ({g['level']})", color=f"C{list(GAMES).index(game)}",
                   yerr=np.abs(np.stack([means - ci[:, 0], ci[:, 1] - means])), capsize=1.5)
        ax.set_xticks(np.arange(n))
        ax.set_xticklabels([s.replace("zoo4-", "").replace("zoo-", "") for s in p["names"]], rotation=60, fontsize=7)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(f"{name}: exact Shapley ({result['questions']} questions)", fontsize=9)
        ax.set_ylabel("Shapley value (accuracy)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    """The tables docs/levels.md quotes: each pool's v(N) and Shapley values per game, and the agreement of
    every pair of games (cross-fit tau with its interval and exact p; the same-question tau beside it)."""
    from crl_envs.stats import interval

    lines = []
    for name, p in result["pools"].items():
        games = list(p["games"])
        lines += [f"**{name}** (v(N): " + ", ".join(f"{g} {p['games'][g]['system_value']:.2f}" for g in games) + ")", "",
                  "| model | alone | " + " | ".join(f"{g} ({p['games'][g]['level']})" for g in games) + " |",
                  "|---|---|" + "---|" * len(games)]
        for i, model in enumerate(p["names"]):
            cells = []
            for g in games:
                ci = p["games"][g]["shapley_ci"][i]
                cells.append(f"{p['games'][g]['shapley'][i]:+.3f} [{ci[0]:+.2f}, {ci[1]:+.2f}]")
            lines.append(f"| {model} | {p['individual'][i]:.2f} | " + " | ".join(cells) + " |")
        lines += ["", f"| games | cross-fit tau | {CI_LEVEL:.0%} interval | exact p | verdict | same-question tau |",
                  "|---|---|---|---|---|---|"]
        for pair, a in p["agreement"].items():
            tau = "n/a" if a["kendall_tau"] is None else f"{a['kendall_tau']:+.2f}"
            ci = interval(a["tau_ci"], a["kendall_tau"], lambda v: f"{v:+.2f}",
                          zero_width="every pair's order determined: tau is exact")
            pv = "n/a" if a["p_value"] is None else f"{a['p_value']:.3f}"
            same = "n/a" if a["same_question_tau"] is None else f"{a['same_question_tau']:+.2f}"
            lines.append(f"| {pair.replace('~', ' vs ')} | {tau} | {ci} | {pv} | {a['verdict']} | {same} |")
        lines.append("")
    if result.get("pooled"):
        lines += ["| games | pools | mean cross-fit tau | pooled exact p | pools disagree |", "|---|---|---|---|---|"]
        for pair, q in result["pooled"].items():
            lines.append(f"| {pair.replace('~', ' vs ')} | {len(q['pools'])} | {q['mean_tau']:+.2f} | {q['p_value']:.4f} | "
                         f"{'yes' if q['heterogeneous'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--questions", type=int, default=QUESTIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--pools", default=",".join(POOLS))
    parser.add_argument("--markdown", action="store_true",
                        help="print docs/levels.md's tables from --out's levels.json (and draw its plot again)")
    parser.add_argument("--games", default=",".join(GAMES), help="games to play (default: all)")
    parser.add_argument("--debate-pools", default=",".join(POOLS),
                        help="pools that also play debate (its 8-model pools cost the most: 255 coalitions of 2 rounds)")
    args = parser.parse_args()
    if args.markdown:  # the tables, and the plot again, from the JSON
        result = json.loads((args.out / "levels.json").read_text())
        plot(result, args.out / "levels.png")
        print(markdown(result))
        return
    import torch

    torch.set_num_threads(1)
    result = {"questions": args.questions, "seed": args.seed, "max_new_tokens": MAX_NEW_TOKENS, "ci_level": CI_LEVEL,
              "games": {g: {"level": lv, "protocol": p} for g, (lv, p) in GAMES.items()}, "pools": {}}
    for name in args.pools.split(","):
        played = [g for g in args.games.split(",") if g != "debate" or name in args.debate_pools.split(",")]
        result["pools"][name] = pool_result(name, played, args.questions, args.seed, args.cache_dir)
        print(name, json.dumps({k: (v["kendall_tau"], v["tau_ci"]) for k, v in result["pools"][name]["agreement"].items()}),
              flush=True)
    result["pooled"] = pooled(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "levels.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "levels.png")


if __name__ == "__main__":
    main()
