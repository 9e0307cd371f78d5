"""The paper's statistics, computed from the cells' own results (never asserted).

Valuation (one setting = pool x protocol x task x seed):

- per setting: individual, LOO and Shapley per model with CIs, and Kendall's tau-b between individual
  strength and compositional strength (Shapley where computed, else LOO) with its exact permutation
  p-value (:func:`crl_envs.valuation.correlation`);
- "individual strength does not predict compositional strength in X of Y settings": the settings
  whose two-sided exact test is not significant at ``alpha`` (settings with a constant ranking carry
  no information and are not counted), per method family and in all;
- per (pool, family) and per family: the pooled stratified permutation test
  (:func:`crl_envs.valuation.pooled_test`);
- LOO vs Shapley: their rank agreement (tau-b, exact p) and LOO's error against exact Shapley.

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
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from crl_envs.valuation.pooled import pooled_test
from crl_envs.valuation.report import ValuationReport, correlation


def _keys(names: Sequence[str], ids: Sequence[str]) -> list[str]:
    """Model names where they are unique within the pool, else agent ids."""
    return list(names) if len(set(names)) == len(names) else list(ids)


def _none(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def valuation_tables(cells: Sequence[Mapping[str, Any]], alpha: float = 0.05) -> dict[str, Any]:
    """``{"settings": [...], "summary": {...}}`` from valuation cell results (``cell["report"]`` a
    :meth:`ValuationReport.to_dict`, plus the cell's labels in ``cell["labels"]``)."""
    settings = []
    reports: dict[int, ValuationReport] = {}
    for k, cell in enumerate(cells):
        d, labels = cell["report"], cell["labels"]
        report = ValuationReport.from_dict(d)
        reports[k] = report
        keys = _keys(report.names, report.ids)
        comp = "shapley" if report.shapley is not None else "loo"
        kt = report.correlation[comp]["kendall"]
        per_model = {m: (None if report.measures.get(m) is None else
                         {key: float(report.measures[m].means[i]) for i, key in enumerate(keys)})
                     for m in ("individual", "loo", "shapley")}
        ci = {m: {key: list(report.measures[m].ci[a]) for key, a in zip(keys, report.ids)}
              for m in ("individual", "loo", "shapley") if report.measures.get(m) is not None}
        entry = {
            "pool": labels["pool"], "family": d["family"], "protocol": labels["protocol"],
            "protocol_name": report.protocol, "task": labels["task"], "seed": report.seed,
            "models": keys, "estimator": report.estimator, "questions": report.n_questions,
            "system": float(report.system.mean()), "empty_value": report.empty_value,
            **per_model, "ci": ci, "compositional": comp,
            "kendall_tau": _none(kt.value), "p_value": _none(kt.p_value),
            "min_p_value": kt.min_p_value,
            "uncorrelated": None if math.isnan(kt.value) else bool(kt.p_value >= alpha),
        }
        if report.shapley is not None and report.estimator == "exact":
            agree = correlation(report.loo.means, report.shapley.means)
            err = np.abs(report.loo.means - report.shapley.means)
            entry["loo_vs_shapley"] = {"kendall_tau": _none(agree.value), "p_value": _none(agree.p_value),
                                       "mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
                                       "same_top_model": bool(np.argmax(report.loo.means) ==
                                                              np.argmax(report.shapley.means))}
        settings.append(entry)

    def count(group: list[int]) -> dict[str, Any]:
        informative = [i for i in group if settings[i]["uncorrelated"] is not None]
        out: dict[str, Any] = {"uncorrelated": sum(settings[i]["uncorrelated"] for i in informative),
                               "settings": len(informative), "constant_rankings": len(group) - len(informative)}
        taus = [settings[i]["kendall_tau"] for i in informative]
        out["mean_kendall_tau"] = float(np.mean(taus)) if taus else None
        if informative:
            measure = "shapley" if all(reports[i].shapley is not None for i in informative) else "loo"
            test = pooled_test([reports[i] for i in informative], measure=measure, draws=20000,
                               labels=[f"{settings[i]['pool']}/{settings[i]['protocol']}/{settings[i]['task']}"
                                       f"/seed{settings[i]['seed']}" for i in informative])
            out["pooled"] = {"measure": measure, "statistic": "sum of Kendall tau-b", "observed": test.observed,
                             "p_value": test.p_value, "exact": test.exact, "min_p_value": test.min_p_value}
        return out

    by_family: dict[str, list[int]] = defaultdict(list)
    by_pool_family: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, s in enumerate(settings):
        by_family[s["family"]].append(i)
        by_pool_family[(s["pool"], s["family"])].append(i)
    total = count(list(range(len(settings))))
    agree = [s["loo_vs_shapley"] for s in settings if "loo_vs_shapley" in s]
    summary = {
        "uncorrelated": total["uncorrelated"], "settings": total["settings"], "alpha": alpha,
        "test": "two-sided exact permutation test of Kendall's tau-b (individual vs compositional strength), "
                f"not significant at alpha = {alpha:g}",
        "constant_rankings": total["constant_rankings"], "mean_kendall_tau": total["mean_kendall_tau"],
        "pooled": total.get("pooled"),
        "families": {f: count(idx) for f, idx in sorted(by_family.items())},
        "pool_families": [{"pool": p, "family": f, **count(idx)} for (p, f), idx in sorted(by_pool_family.items())],
        "loo_vs_shapley": None if not agree else {
            "settings": len(agree),
            "mean_kendall_tau": _none(float(np.nanmean([a["kendall_tau"] if a["kendall_tau"] is not None else np.nan
                                                        for a in agree]))) if any(a["kendall_tau"] is not None
                                                                                  for a in agree) else None,
            "same_top_model": sum(a["same_top_model"] for a in agree),
            "mean_abs_error": float(np.mean([a["mean_abs_error"] for a in agree])),
            "max_abs_error": float(np.max([a["max_abs_error"] for a in agree])),
        },
    }
    return {"settings": settings, "summary": summary}


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
