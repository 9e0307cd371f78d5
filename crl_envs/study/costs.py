"""What each model costs and with whom it pays, per valuation setting of a study: computed when the tables
are written, from the coalition table and cost measures each valuation cell's report already stores (no
coalition is played, no cell changes).

- :func:`setting_costs` — the cost game's value of each model (Shapley, or LOO for ``estimator = "loo"``;
  1k tokens per question as deployed) with its CI, the grand coalition's cost, and each model's
  compositional value per 1k tokens with its CI (``study.json``: a setting's ``cost`` and ``value_per_1k``);
- :func:`setting_interactions` — the pairwise Shapley interaction index (SII) of every pair with its
  question-bootstrap CI (:func:`crl_envs.valuation.interactions.table_interactions`, shapiq), or why the
  setting has none (``interactions.skipped``: it lacks some of the ``2^n`` coalitions, or it is too large);
- :func:`costs_markdown` — study.md's short sections.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from crl_envs.stats import interval
from crl_envs.study.stats import _keys as model_keys
from crl_envs.valuation.interactions import INSTALL_HINT, TOLERANCE, table_interactions
from crl_envs.valuation.spend import CoalitionCosts

#: Largest pool whose interactions a study computes at table time (``2^n`` shapiq calls once per size, then
#: one product per setting); larger exact pools: ``crl-envs value ... --interactions 2``.
STUDY_MAX_PLAYERS = 10


def _keys(d: Mapping[str, Any]) -> list[str]:
    """The setting's model keys, as ``study.json``'s other per-model tables use them."""
    return model_keys(d["names"], d["ids"])


def setting_costs(d: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"cost": ..., "value_per_1k": ...}`` of a valuation report's dict, or ``None`` where it carries no
    costs (a cell run before costs were kept)."""
    cost = d.get("cost_measures", {}).get("cost")
    if cost is None or d.get("coalition_costs") is None:
        return None
    keys = _keys(d)
    table = CoalitionCosts.from_dict(d["coalition_costs"])
    grand = table.spends[table.masks.index((1 << len(keys)) - 1)].tokens.mean() / 1000
    ratio = d.get("value_per_1k", {})
    return {
        "cost": {"measure": "shapley" if "shapley" in d["measures"] else "loo", "unit": "1k tokens per question",
                 "grand_coalition": float(grand),
                 "mean": {k: cost["mean"][a] for k, a in zip(keys, d["ids"])},
                 "ci": {k: list(cost["ci"][a]) for k, a in zip(keys, d["ids"])}},
        "value_per_1k": {k: ratio[a] for k, a in zip(keys, d["ids"]) if a in ratio},
    }


def setting_interactions(d: Mapping[str, Any], *, resamples: int, ci_level: float = 0.95) -> dict[str, Any]:
    """Every pair's SII with its CI (``pairs``: ``[a, b]``, ``mean``, ``ci``), or ``{"skipped": reason}``."""
    n = len(d["ids"])
    costs = d.get("coalition_costs")
    if costs is None:
        return {"skipped": "its report carries no coalition table (the cell ran before costs were kept)"}
    if n < 2:
        return {"skipped": "one model: no pair"}
    played = len(set(costs["masks"]))
    if played < (1 << n) - 1:
        return {"skipped": f"estimator {d['estimator']} played {played} of {(1 << n) - 1} coalitions; pairwise "
                           f"interactions need every one (estimator = \"exact\")"}
    if n > STUDY_MAX_PLAYERS:
        return {"skipped": f"{n} models: a study computes interactions for at most {STUDY_MAX_PLAYERS} "
                           f"(crl-envs value ... --interactions 2 computes them for one pool)"}
    if importlib.util.find_spec("shapiq") is None:
        return {"skipped": f"shapiq is not installed: {INSTALL_HINT}"}
    values = np.asarray(costs["values"], dtype=float)
    table = np.full((1 << n, values.shape[1]), float(d["empty_value"]))
    table[np.asarray(costs["masks"], dtype=int)] = values
    found = table_interactions(table, d["ids"], index="SII", order=2, seed=d["seed"], ci_level=ci_level,
                               bootstrap_resamples=resamples)
    keys = _keys(d)
    pairs = [{"pair": [keys[t[0]], keys[t[1]]], "mean": float(found.means[k]), "ci": [float(x) for x in found.ci[k]]}
             for k, t in enumerate(found.interactions) if len(t) == 2]
    return {"index": "SII", "order": 2, "ci_level": ci_level, "pairs": pairs}


def add_to_settings(cells: Sequence[Mapping[str, Any]], settings: Sequence[dict[str, Any]], *, resamples: int
                    ) -> None:
    """Give each valuation setting (in the cells' order) its ``cost``, ``value_per_1k`` and ``interactions``."""
    for cell, setting in zip(cells, settings, strict=True):
        d = cell["report"]
        costs = setting_costs(d)
        if costs is not None:
            setting.update(costs)
        setting["interactions"] = setting_interactions(d, resamples=resamples, ci_level=d["ci_level"])


def _where(s: Mapping[str, Any], seeds: bool) -> str:
    return f"{s['protocol']}, {s['task']}" + (f", seed {s['seed']}" if seeds else "")


# a cost that does not vary over questions (every question prices the same calls) has no sampling error
SAME_ON_EVERY_QUESTION = "zero width: the same on every question"


def costs_markdown(settings: Sequence[Mapping[str, Any]]) -> str:
    """Per pool: each setting's most and least cost-effective model (value per 1k tokens), then the share
    of pairs whose interaction CI lies below / above 0 and the most redundant and most synergistic pair."""
    seeds = len({s["seed"] for s in settings}) > 1
    lines: list[str] = []
    pools = list(dict.fromkeys(s["pool"] for s in settings))
    priced = [s for s in settings if s.get("cost")]
    if priced:
        lines += ["### What each model costs (cost Shapley: 1k tokens per question as deployed) and buys "
                  "(compositional value per 1k tokens); CIs over questions", ""]
        lines += _per_pool_tables(pools, priced, ["setting", "grand coalition (1k tok)", "most cost-effective",
                                                  "least cost-effective", "costliest model"],
                                  lambda s: _cost_row(s, seeds))
        if len(priced) < len(settings):
            lines += [f"{len(settings) - len(priced)} settings carry no costs (cells run before costs were kept).", ""]
    found = [s for s in settings if s.get("interactions", {}).get("pairs")]
    if found:
        lines += ["### Pairwise interactions (SII; < 0 redundant, > 0 synergy; CIs over questions)", ""]
        lines += _per_pool_tables(pools, found, ["setting", "pairs", "CI below 0", "CI above 0", "most redundant",
                                                 "most synergistic"], lambda s: _interaction_row(s, seeds))
    skipped = [s for s in settings if "skipped" in s.get("interactions", {})]
    if skipped:
        reasons = dict.fromkeys(s["interactions"]["skipped"] for s in skipped)
        lines.append(f"Interactions skipped in {len(skipped)} settings: " + "; ".join(reasons) + ".")
    return "\n".join(lines).rstrip()


def _per_pool_tables(pools: Sequence[str], settings: Sequence[Mapping[str, Any]], header: Sequence[str],
                     row: Any) -> list[str]:
    """One markdown table per pool that has settings: a bold pool name, ``header``, ``row(setting)`` per setting."""
    lines: list[str] = []
    for pool in pools:
        rows = [s for s in settings if s["pool"] == pool]
        if rows:
            lines += [f"**{pool}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += [row(s) for s in rows] + [""]
    return lines


def _cost_row(s: Mapping[str, Any], seeds: bool) -> str:
    ratio = {k: v["mean"] for k, v in s["value_per_1k"].items() if v["mean"] is not None}
    best = max(ratio, key=ratio.get) if ratio else None
    worst = min(ratio, key=ratio.get) if ratio else None
    cost = s["cost"]["mean"]
    dear = max(cost, key=cost.get)
    dear_ci = interval(s["cost"]["ci"][dear], cost[dear], lambda v: f"{v:.3f}", zero_width=SAME_ON_EVERY_QUESTION)
    return (f"| {_where(s, seeds)} | {s['cost']['grand_coalition']:.3f} | {_ratio(s, best)} | "
            f"{_ratio(s, worst)} | {dear} {cost[dear]:.3f} {dear_ci} |")


def _interaction_row(s: Mapping[str, Any], seeds: bool) -> str:
    pairs = s["interactions"]["pairs"]
    below = sum(p["ci"][1] < -TOLERANCE for p in pairs) / len(pairs)
    above = sum(p["ci"][0] > TOLERANCE for p in pairs) / len(pairs)
    low, high = min(pairs, key=lambda p: p["mean"]), max(pairs, key=lambda p: p["mean"])
    return f"| {_where(s, seeds)} | {len(pairs)} | {below:.0%} | {above:.0%} | {_pair(low)} | {_pair(high)} |"


def _ratio(s: Mapping[str, Any], key: str | None) -> str:
    if key is None:
        return "n/a"
    v = s["value_per_1k"][key]
    lo, hi = v["ci"]
    ci = "" if lo is None or hi is None else " " + interval((lo, hi), v["mean"], lambda x: f"{x:+.2f}",
                                                               zero_width=SAME_ON_EVERY_QUESTION)
    return f"{key} {v['mean']:+.2f}{ci}"


def _pair(p: Mapping[str, Any]) -> str:
    return (f"{p['pair'][0]} + {p['pair'][1]} {p['mean']:+.3f} "
            f"{interval(p['ci'], p['mean'], lambda x: f'{x:+.3f}', zero_width=SAME_ON_EVERY_QUESTION)}")
