"""The paper's statistics, computed from the cells' own results (never asserted); the tests, CIs and
verdict rule live in :mod:`crl_envs.stats`.

Valuation (one setting = pool x protocol x task x seed):

- per setting: individual, LOO and Shapley per model with CIs; for each of Shapley, LOO and Shapley
  minus its singleton term (``Shapley_i - individual_i / n``: what is left of Shapley once the model's
  own accuracy, counted as ``v({i})``, is taken out), Kendall's tau-b against individual strength with
  its exact permutation p, the smallest p these models could give (``min_p_value``, ties counted), a
  ``1 - 2 alpha`` percentile CI from resampling questions (the same question resamples for every
  measure and every setting on the same questions; the models stay fixed, so the CI is the questions'
  sampling error, not the models'), and a ``verdict`` (:func:`crl_envs.stats.verdict`: ``coupled``,
  ``decoupled``, ``untestable`` or ``inconclusive``). The setting's headline measure is Shapley where
  computed, else LOO;
- per (pool, family), per family and over all: the settings together: mean tau-b, a permutation test of
  the sum of taus with **one permutation of model labels per pool** (the settings of a pool share its
  models and individual vector; :func:`crl_envs.stats.grouped_permutation_test`), its smallest attainable
  p, the CI of the mean tau (the settings' question resamples averaged) and a verdict by the same rule;
- counts of each verdict (settings with a design that cannot reject are ``untestable``, never counted
  as uncorrelated);
- LOO vs Shapley: their rank agreement (tau-b, exact p) and LOO's error against exact Shapley;
- the design: per setting ``n``, its smallest attainable p and the power of the exact test at population
  tau = 0.5 (:func:`crl_envs.stats.power_at_tau`).

Training (one setting = setup x task): each trainer's Δ system accuracy (after - before, the
before being the untrained learner's baseline cell), its CI from a bootstrap over seeds, then
questions within a seed (the same resamples for every trainer: paired); the winner (largest Δ, ties
to the first trainer listed) and whether it is significant (the CI of the winner's Δ minus the
runner-up's lies above 0; with one trainer, its Δ's CI above 0). Then: the settings where C-RL is the
strongest collaborator (its Δ at least every other trainer's), each trainer's mean gain over
settings, C-RL's mean gain over each baseline's as a ratio with a bootstrap CI (from the same
resamples; undefined when the baseline's mean gain is not positive), and the largest gain.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from crl_envs.stats import (
    DEFAULT_DELTA,
    VERDICTS,
    correlation,
    design,
    grouped_permutation_test,
    percentile_ci,
    tau_bootstrap,
    verdict,
)
from crl_envs.valuation.report import ValuationReport

#: The compositional measures each setting correlates with individual strength, headline first.
VALUATION_MEASURES = ("shapley", "loo", "shapley_minus_singleton")
POWER_TAU = 0.5


def _keys(names: Sequence[str], ids: Sequence[str]) -> list[str]:
    """Model names where they are unique within the pool, else agent ids."""
    return list(names) if len(set(names)) == len(names) else list(ids)


def _none(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _tables(report: ValuationReport) -> dict[str, np.ndarray]:
    """``measure -> (models, questions)`` for :data:`VALUATION_MEASURES` the report has."""
    out = {"loo": report.loo.per_question}
    if report.shapley is not None:
        out["shapley"] = report.shapley.per_question
        out["shapley_minus_singleton"] = report.shapley.per_question - report.individual.per_question / len(report.ids)
    return {m: out[m] for m in VALUATION_MEASURES if m in out}


def _judge(tau: float | None, p: float | None, min_p: float, boots: np.ndarray | None, alpha: float,
           delta: float) -> dict[str, Any]:
    ci = None if boots is None else percentile_ci(boots, 1 - 2 * alpha)
    out = {"kendall_tau": _none(tau), "p_value": _none(p), "min_p_value": float(min_p),
           "tau_ci": None if ci is None else list(ci), "verdict": verdict(tau, p, min_p, ci, alpha=alpha, delta=delta)}
    if out["verdict"] == "inconclusive" and p is not None and p <= alpha and tau is not None and tau < 0:
        out["note"] = "significant negative tau: individual strength predicts compositional strength inversely"
    return out


def valuation_tables(cells: Sequence[Mapping[str, Any]], alpha: float = 0.05, *, delta: float = DEFAULT_DELTA,
                     families: Mapping[str, str] | None = None, resamples: int = 2000,
                     seed: int = 0) -> dict[str, Any]:
    """``{"settings": [...], "summary": {...}, "design": {...}}`` from valuation cell results
    (``cell["report"]`` a :meth:`ValuationReport.to_dict`, the cell's labels in ``cell["labels"]``).

    Args:
        alpha: the tests' level (the tau CIs are ``1 - 2 alpha``).
        delta: the equivalence margin of ``decoupled``.
        families: ``protocol label -> family label`` (default: the report's library ``family``).
        resamples: question resamples behind each tau CI.
    """
    settings: list[dict[str, Any]] = []
    boots: list[dict[str, np.ndarray]] = []
    pairs: list[dict[str, tuple[np.ndarray, np.ndarray]]] = []
    for cell in cells:
        d, labels = cell["report"], cell["labels"]
        report = ValuationReport.from_dict(d)
        keys = _keys(report.names, report.ids)
        comp = "shapley" if report.shapley is not None else "loo"
        per_model = {m: (None if report.measures.get(m) is None else
                         {key: float(report.measures[m].means[i]) for i, key in enumerate(keys)})
                     for m in ("individual", "loo", "shapley")}
        ci = {m: {key: list(report.measures[m].ci[a]) for key, a in zip(keys, report.ids)}
              for m in ("individual", "loo", "shapley") if report.measures.get(m) is not None}
        x = report.individual.means
        tables = _tables(report)
        b, tests, pr = {}, {}, {}
        for m, table in tables.items():
            c = correlation(x, table.mean(axis=1))
            b[m] = tau_bootstrap(report.individual.per_question, table, resamples=resamples, seed=seed)
            tests[m] = _judge(c.value, c.p_value, c.min_p_value, b[m], alpha, delta)
            pr[m] = (x, table.mean(axis=1))
        n = len(keys)
        entry = {
            "pool": labels["pool"], "family": (families or {}).get(labels["protocol"], d["family"]),
            "protocol": labels["protocol"], "protocol_name": report.protocol, "task": labels["task"],
            "seed": report.seed, "models": keys, "n": n, "estimator": report.estimator,
            "questions": report.n_questions, "system": float(report.system.mean()), "empty_value": report.empty_value,
            **per_model, "ci": ci, "compositional": comp, **tests[comp],
            "measures": tests, "power": {"tau": POWER_TAU, "value": design(n, alpha=alpha, tau=POWER_TAU)["power"]},
        }
        if report.shapley is not None and report.estimator == "exact":
            agree = correlation(report.loo.means, report.shapley.means)
            err = np.abs(report.loo.means - report.shapley.means)
            entry["loo_vs_shapley"] = {"kendall_tau": _none(agree.value), "p_value": _none(agree.p_value),
                                       "mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
                                       "same_top_model": bool(np.argmax(report.loo.means) ==
                                                              np.argmax(report.shapley.means))}
        settings.append(entry)
        boots.append(b)
        pairs.append(pr)

    def together(group: list[int]) -> dict[str, Any]:
        """Counts and the pooled verdict of a group of settings (one permutation of labels per pool)."""
        out: dict[str, Any] = {"settings": len(group),
                               "counts": {v: sum(settings[i]["verdict"] == v for i in group) for v in VERDICTS}}
        measure = "shapley" if all(settings[i]["compositional"] == "shapley" for i in group) else "loo"
        out["measure"] = measure
        informative = [i for i in group if settings[i]["measures"][measure]["kendall_tau"] is not None]
        taus = [settings[i]["measures"][measure]["kendall_tau"] for i in informative]
        out["mean_kendall_tau"] = float(np.mean(taus)) if taus else None
        for m in VALUATION_MEASURES:
            ts = [settings[i]["measures"][m]["kendall_tau"] for i in group if m in settings[i]["measures"]
                  and settings[i]["measures"][m]["kendall_tau"] is not None]
            out.setdefault("mean_kendall_tau_by_measure", {})[m] = float(np.mean(ts)) if ts else None
        if not informative:
            out.update(_judge(None, None, 1.0, None, alpha, delta))
            return out
        test = grouped_permutation_test([pairs[i][measure] for i in informative],
                                        [settings[i]["pool"] for i in informative], draws=20000, seed=seed)
        with warnings.catch_warnings():  # a resample where every setting's ranking is constant: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_boot = np.nanmean(np.stack([boots[i][measure] for i in informative]), axis=0)
        k = len(informative)
        out.update(_judge(test["observed"] / k, test["p_value"], test["min_p_value"], mean_boot, alpha, delta))
        out["pooled"] = {"statistic": "sum of Kendall tau-b over settings, one permutation of model labels per pool",
                         "observed": test["observed"], "p_value": test["p_value"], "exact": test["exact"],
                         "min_p_value": test["min_p_value"], "pools": len({settings[i]["pool"] for i in informative})}
        return out

    by_family: dict[str, list[int]] = defaultdict(list)
    by_pool_family: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, s in enumerate(settings):
        by_family[s["family"]].append(i)
        by_pool_family[(s["pool"], s["family"])].append(i)
    total = together(list(range(len(settings))))
    pool_families = [{"pool": p, "family": f, **together(idx)} for (p, f), idx in sorted(by_pool_family.items())]
    agree = [s["loo_vs_shapley"] for s in settings if "loo_vs_shapley" in s]
    agree_taus = [a["kendall_tau"] for a in agree if a["kendall_tau"] is not None]
    summary = {
        "alpha": alpha, "delta": delta, "tau_ci_level": 1 - 2 * alpha, "settings": len(settings),
        "counts": total["counts"],
        "pool_family_counts": dict(Counter(c["verdict"] for c in pool_families)),
        "test": f"two-sided exact permutation test of Kendall's tau-b (individual vs compositional strength) at "
                f"alpha = {alpha:g}; decoupled: the {100 * (1 - 2 * alpha):g}% question-bootstrap CI of tau inside "
                f"(-{delta:g}, +{delta:g}); untestable: the smallest attainable p exceeds alpha",
        "mean_kendall_tau": total["mean_kendall_tau"], "mean_kendall_tau_by_measure": total["mean_kendall_tau_by_measure"],
        "all": {k: v for k, v in total.items() if k not in ("counts", "settings")},
        "families": {f: together(idx) for f, idx in sorted(by_family.items())},
        "pool_families": pool_families,
        "loo_vs_shapley": None if not agree else {
            "settings": len(agree),
            "mean_kendall_tau": float(np.mean(agree_taus)) if agree_taus else None,
            "same_top_model": sum(a["same_top_model"] for a in agree),
            "mean_abs_error": float(np.mean([a["mean_abs_error"] for a in agree])),
            "max_abs_error": float(np.max([a["max_abs_error"] for a in agree])),
        },
    }
    return {"settings": settings, "summary": summary,
            "design": valuation_design([(s["pool"], s["n"]) for s in settings], alpha=alpha, delta=delta)}


def valuation_design(settings: Sequence[tuple[str, int]], *, alpha: float = 0.05,
                     delta: float = DEFAULT_DELTA) -> dict[str, Any]:
    """What a valuation design can show, from its settings' ``(pool, n models)`` alone: per pool its
    ``n``, settings, smallest attainable p and the exact test's power at tau = 0.5; the settings that can
    never be significant; and :func:`design_paragraph`'s text."""
    pools: dict[str, dict[str, Any]] = {}
    for pool, n in settings:
        entry = pools.setdefault(pool, {"pool": pool, **design(n, alpha=alpha, tau=POWER_TAU), "settings": 0})
        entry["settings"] += 1
    untestable = sum(p["settings"] for p in pools.values() if p["min_p_value"] > alpha)
    out = {"alpha": alpha, "delta": delta, "power_tau": POWER_TAU, "pools": list(pools.values()),
           "settings": len(settings), "untestable_settings": untestable}
    out["paragraph"] = design_paragraph(out)
    return out


def design_paragraph(d: Mapping[str, Any]) -> str:
    """"What this design can and cannot show", computed from :func:`valuation_design`'s numbers."""
    a, pools = d["alpha"], d["pools"]
    parts = [f"{p['pool']} ({p['n']} models: smallest p {p['min_p_value']:.2g}, power {p['power']:.2f} at tau "
             f"{d['power_tau']:g})" for p in pools]
    text = [f"What this design can and cannot show: {d['settings']} settings over {len(pools)} pool(s): "
            + "; ".join(parts) + "."]
    if d["untestable_settings"]:
        text.append(f"{d['untestable_settings']} setting(s) can never reject at alpha = {a:g} whatever the data "
                    f"(untestable, counted as such, never as uncorrelated). Pooling a pool's settings cannot lower "
                    f"its floor (they share one permutation of its models); only more models per pool, or the "
                    f"tests across pools, can.")
    weak = [p["pool"] for p in pools if p["min_p_value"] <= a and p["power"] < 0.8]
    if weak:
        text.append(f"Single settings of {', '.join(weak)} detect a true tau of {d['power_tau']:g} less than 80% of "
                    f"the time: a setting that is not coupled is weak evidence (pooling a pool's settings averages "
                    f"their question noise but keeps the pool's floor).")
    text.append(f"'decoupled' needs the {100 * (1 - 2 * a):g}% CI of tau inside +/-{d['delta']:g}, which few models or "
                f"few questions rarely give; its rate of false 'decoupled' is at most alpha when tau >= "
                f"{d['delta']:g} (crl_envs.stats). The CIs resample questions with the models fixed: they speak for "
                f"these models, not for models in general.")
    return " ".join(text)


# ---------------------------------------------------------------------- training
def _boot_indices(rng: np.random.Generator, seeds: int, questions: int, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, seeds, size=(resamples, seeds)), rng.integers(0, questions, size=(resamples, seeds, questions))


def training_tables(baselines: Mapping[tuple[str, str], Mapping[str, Any]],
                    runs: Mapping[tuple[str, str], Mapping[str, Mapping[int, Mapping[str, Any]]]],
                    trainers: Sequence[str], *, ci_level: float = 0.95, resamples: int = 5000,
                    seed: int = 0, protocols: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"settings": [...], "summary": {...}}``.

    Args:
        baselines: ``(setup, task) -> baseline cell result`` (``system`` per question, untrained).
        runs: ``(setup, task) -> trainer -> seed -> training cell result`` (``system`` after training).
        trainers: the trainers in config order (ties go to the first).
        protocols: ``setup -> protocol name`` (stored with each setting).
    """
    alpha = (1 - ci_level) / 2
    rng = np.random.default_rng(seed)
    settings, boots_by_setting = [], []
    for (setup, task), by_trainer in runs.items():
        before = np.asarray(baselines[(setup, task)]["system"], float)
        present = [t for t in trainers if by_trainer.get(t)]
        if not present:
            continue
        seeds = sorted(set.intersection(*(set(by_trainer[t]) for t in present)))
        if not seeds:
            continue
        diffs = {t: np.stack([np.asarray(by_trainer[t][s]["system"], float) - before for s in seeds]) for t in present}
        seed_idx, q_idx = _boot_indices(rng, len(seeds), len(before), resamples)
        boots = {t: d[seed_idx[..., None], q_idx].mean(axis=(1, 2)) for t, d in diffs.items()}
        delta = {t: float(d.mean()) for t, d in diffs.items()}
        order = sorted(present, key=lambda t: (-delta[t], present.index(t)))
        winner = order[0]
        if len(order) > 1:
            gap = boots[winner] - boots[order[1]]
            significant = bool(np.quantile(gap, alpha) > 0)
        else:
            significant = bool(np.quantile(boots[winner], alpha) > 0)
        settings.append({
            "protocol": setup, "protocol_name": (protocols or {}).get(setup, setup), "task": task,
            "before": float(before.mean()), "seeds": seeds,
            "delta": {t: {"value": delta[t], "ci": [float(np.quantile(boots[t], alpha)),
                                                    float(np.quantile(boots[t], 1 - alpha))],
                          "per_seed": [float(x) for x in diffs[t].mean(axis=1)]} for t in present},
            "winner": winner, "significant": significant, "runner_up": order[1] if len(order) > 1 else None,
        })
        boots_by_setting.append(boots)

    summary: dict[str, Any] = {"settings": len(settings), "ci_level": ci_level}
    if not settings:
        return {"settings": settings, "summary": summary}
    present = [t for t in trainers if all(t in s["delta"] for s in settings)]
    mean_gain = {t: float(np.mean([s["delta"][t]["value"] for s in settings])) for t in present}
    mean_boot = {t: np.mean([b[t] for b in boots_by_setting], axis=0) for t in present}
    summary["mean_gain"] = mean_gain
    summary["mean_gain_ci"] = {t: [float(np.quantile(mean_boot[t], alpha)), float(np.quantile(mean_boot[t], 1 - alpha))]
                               for t in present}
    if "crl" in present and len(present) > 1:
        summary["crl_strongest"] = sum(all(s["delta"]["crl"]["value"] >= s["delta"][t]["value"] for t in present)
                                       for s in settings)
        ratios = {}
        for b in present:
            if b == "crl":
                continue
            if mean_gain[b] <= 0:
                ratios[b] = {"value": None, "ci": None,
                             "note": f"{b}'s mean gain is {mean_gain[b]:+.4f}, not positive: no ratio"}
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                r = mean_boot["crl"] / mean_boot[b]
            ok = bool((mean_boot[b] > 0).all())
            ratios[b] = {"value": mean_gain["crl"] / mean_gain[b],
                         "ci": [float(np.quantile(r, alpha)), float(np.quantile(r, 1 - alpha))] if ok else None,
                         **({} if ok else {"note": f"{b}'s bootstrap mean gain is not always positive: no CI"})}
        summary["gain_ratio"] = ratios
    best = max(((s["delta"][t]["value"], t, s) for s in settings for t in s["delta"]), key=lambda x: x[0])
    summary["max_gain"] = {"value": best[0], "trainer": best[1], "protocol": best[2]["protocol"], "task": best[2]["task"]}
    return {"settings": settings, "summary": summary}
