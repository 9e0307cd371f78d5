"""Cost-quality fronts: over every coalition x protocol a run valued, which systems no other beats on
both accuracy and cost (the Pareto front of accuracy vs tokens, or vs seconds), how sure that is
(question-bootstrap intervals, and how often each point stays on the front when questions are
resampled), and the cheapest coalition within ``x`` points of the best.

Points come from the :class:`~crl_envs.valuation.spend.CoalitionCosts` of one or more valuation
reports on the same questions (:func:`front_of`). Tokens are prompt plus generated tokens per
question as deployed (see :mod:`crl_envs.valuation.spend`); seconds are measured wall time, so a
seconds front is shown, never compared bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from crl_envs.stats import bootstrap_cis, check_ci_options, interval
from crl_envs.valuation.spend import CoalitionCosts
from crl_kit.errors import ConfigError

COSTS = ("tokens", "seconds", "calls", "generated_tokens")


def pareto(accuracy: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the points on the front (no other point at most as costly and strictly more
    accurate, or strictly cheaper and as accurate), cheapest first. Twins (equal accuracy and cost)
    dominate neither each other, so all of them are on it or none.

    >>> pareto(np.array([0.5, 0.5, 0.9, 0.4]), np.array([1.0, 1.0, 3.0, 2.0])).tolist()
    [0, 1, 2]
    """
    order = np.lexsort((-accuracy, cost))  # by cost, then best accuracy first among equal costs
    out: list[int] = []
    for k in order:
        last = out[-1] if out else None
        if last is None or accuracy[k] > accuracy[last] or (accuracy[k] == accuracy[last] and cost[k] == cost[last]):
            out.append(int(k))
    return np.array(out, dtype=int)


@dataclass(eq=False)
class Front:
    """Points (``labels[k]`` = protocol and members) with per-question accuracy and cost tables."""

    labels: list[tuple[str, tuple[str, ...]]]
    accuracy: np.ndarray  # (points, questions)
    costs: dict[str, np.ndarray]  # cost name -> (points, questions)
    ci_level: float = 0.95
    bootstrap_resamples: int = 2000
    seed: int = 0
    accuracy_ci: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    cost_ci: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.accuracy = np.asarray(self.accuracy, dtype=float)
        self.costs = {k: np.asarray(v, dtype=float) for k, v in self.costs.items()}
        check_ci_options(self.ci_level, self.bootstrap_resamples)
        cis = bootstrap_cis({"accuracy": self.accuracy, **self.costs}, resamples=self.bootstrap_resamples,
                            level=self.ci_level, seed=self.seed)
        self.accuracy_ci = cis.pop("accuracy")
        self.cost_ci = cis

    def _cost(self, cost: str) -> np.ndarray:
        if cost not in self.costs:
            raise ConfigError(f"no cost {cost!r} in this front; it has {', '.join(self.costs)}")
        return self.costs[cost]

    def front(self, cost: str = "tokens") -> np.ndarray:
        """The points on the accuracy-vs-``cost`` front, cheapest first."""
        return pareto(self.accuracy.mean(axis=1), self._cost(cost).mean(axis=1))

    def front_share(self, cost: str = "tokens") -> np.ndarray:
        """Per point, the share of question resamples (those of the CIs) in which it is on the front."""
        table = self._cost(cost)
        q = self.accuracy.shape[1]
        idx = np.random.default_rng(self.seed).integers(0, q, size=(self.bootstrap_resamples, q))
        acc, cst = self.accuracy[:, idx].mean(axis=-1), table[:, idx].mean(axis=-1)
        hits = np.zeros(len(self.labels))
        for b in range(self.bootstrap_resamples):
            hits[pareto(acc[:, b], cst[:, b])] += 1
        return hits / self.bootstrap_resamples

    def cheapest_within(self, points: float, cost: str = "tokens") -> dict[str, Any]:
        """The cheapest point whose accuracy is within ``points`` (a fraction, 0.02 = 2 points) of the
        most accurate, with the paired bootstrap CI of its accuracy minus the best's."""
        if not isinstance(points, (int, float)) or not 0 <= points <= 1:
            raise ConfigError(f"within must be a fraction of accuracy in [0, 1] (0.02 = 2 points), got {points!r}")
        acc, cst = self.accuracy.mean(axis=1), self._cost(cost).mean(axis=1)
        best = int(np.lexsort((cst, -acc))[0])
        ok = np.flatnonzero(acc >= acc[best] - points - 1e-12)
        pick = int(ok[np.lexsort((-acc[ok], cst[ok]))[0]])
        gap = (self.accuracy[pick] - self.accuracy[best])[None, :]
        lo, hi = bootstrap_cis({"gap": gap}, resamples=self.bootstrap_resamples, level=self.ci_level,
                               seed=self.seed)["gap"][0]
        return {"point": pick, "best": best, "within": points, "cost": cost, "label": self.labels[pick],
                "best_label": self.labels[best], "accuracy": float(acc[pick]), "best_accuracy": float(acc[best]),
                "cost_value": float(cst[pick]), "best_cost": float(cst[best]),
                "gap": float(gap.mean()), "gap_ci": [float(lo), float(hi)]}

    def describe(self, k: int) -> str:
        protocol, members = self.labels[k]
        return f"{protocol}: {'+'.join(members)}"

    def table(self, cost: str = "tokens", within: float | None = None) -> str:
        """The front, cheapest first, with CIs and how often each point stays on it."""
        pct = round(self.ci_level * 100)
        share = self.front_share(cost)
        out = [f"cost-quality front, accuracy vs {cost} per question ({len(self.labels)} systems, "
               f"{self.accuracy.shape[1]} questions; {pct}% CIs; 'on front' = share of question resamples):"]
        f = ".4f" if cost == "seconds" else ".1f"
        for k in self.front(cost):
            lo, hi = self.accuracy_ci[k]
            clo, chi = self.cost_ci[cost][k]
            out.append(f"  {self.describe(k)[:52]:52s} acc {self.accuracy[k].mean():.3f} [{lo:.3f}, {hi:.3f}]  "
                       f"{cost} {self._cost(cost)[k].mean():9{f}} [{clo:{f}}, {chi:{f}}]  on front {share[k]:.2f}")
        if within is not None:
            c = self.cheapest_within(within, cost)
            out.append(f"  cheapest within {within * 100:g} points of the best ({self.describe(c['best'])}, "
                       f"{c['best_accuracy']:.3f} at {c['best_cost']:{f}} {cost}): {self.describe(c['point'])}, "
                       f"{c['accuracy']:.3f} at {c['cost_value']:{f}} {cost} (difference {c['gap']:+.3f} "
                       f"{_gap_interval(c)})")
        return "\n".join(out)

    def to_dict(self, within: float | None = None) -> dict[str, Any]:
        """Means, CIs and the fronts (tokens and, where measured, seconds); per-question tables of the
        deterministic quantities only (accuracy and token counts), so a reproduction compares them."""
        out: dict[str, Any] = {
            "labels": [[p, list(m)] for p, m in self.labels], "ci_level": self.ci_level,
            "bootstrap_resamples": self.bootstrap_resamples, "seed": self.seed,
            "accuracy": self.accuracy.mean(axis=1).tolist(), "accuracy_ci": self.accuracy_ci.tolist(),
            "cost": {k: v.mean(axis=1).tolist() for k, v in self.costs.items()},
            "cost_ci": {k: v.tolist() for k, v in self.cost_ci.items()},
            "front": {k: self.front(k).tolist() for k in self.costs},
            "front_share": {k: self.front_share(k).tolist() for k in self.costs},
        }
        if within is not None:
            out["cheapest_within"] = {k: self.cheapest_within(within, k) for k in self.costs}
        return out

    def figure(self, cost: str = "tokens", title: str = ""):
        """Accuracy vs cost: every system a dot (colour: protocol; size: coalition size), the front a
        step line with its points' CIs and labels."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        acc, cst = self.accuracy.mean(axis=1), self._cost(cost).mean(axis=1)
        protocols = list(dict.fromkeys(p for p, _ in self.labels))
        colours = plt.get_cmap("tab10")
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        for j, p in enumerate(protocols):
            ks = [k for k, (q, _) in enumerate(self.labels) if q == p]
            ax.scatter(cst[ks], acc[ks], s=[10 + 6 * len(self.labels[k][1]) for k in ks], alpha=0.45,
                       color=colours(j % 10), label=p, linewidths=0)
        f = self.front(cost)
        ax.step(cst[f], acc[f], where="post", color="black", lw=1.2, label="front")
        lo, hi = self.accuracy_ci[f].T
        ax.errorbar(cst[f], acc[f], yerr=[acc[f] - lo, hi - acc[f]], fmt="o", color="black", ms=4, capsize=2)
        for k in f:
            ax.annotate("+".join(self.labels[k][1]) if len(self.labels[k][1]) <= 2
                        else f"{len(self.labels[k][1])} models", (cst[k], acc[k]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7)
        if np.all(cst > 0) and cst.max() / max(cst.min(), 1e-12) > 20:
            ax.set_xscale("log")
        ax.set_xlabel(f"{cost} per question (as deployed)")
        ax.set_ylabel("accuracy")
        ax.set_title(title or f"accuracy vs {cost}", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig

    def plot(self, path: str | os.PathLike, cost: str = "tokens", title: str = "") -> Path:
        from crl_envs.valuation.plots import save_figure

        return save_figure(self.figure(cost, title), path, dpi=110, metadata={"Software": None})


def front_of(tables: Sequence[CoalitionCosts], *, names: Mapping[str, str] | None = None,
             costs: Sequence[str] = ("tokens", "seconds"), ci_level: float = 0.95,
             bootstrap_resamples: int = 2000, seed: int = 0) -> Front:
    """The :class:`Front` over every coalition of every table (one per protocol, same questions);
    ``names`` maps agent ids to the labels shown (e.g. model names)."""
    if not tables:
        raise ConfigError("a front needs at least one valuation's coalition costs")
    q = {t.values.shape[1] for t in tables}
    if len(q) != 1:
        raise ConfigError(f"the tables cover different numbers of questions ({sorted(q)}): value them on one task")
    for c in costs:
        if c not in COSTS:
            raise ConfigError(f"unknown cost {c!r}; choose from {', '.join(COSTS)}")
    names = dict(names or {})
    labels, rows, cost_rows = [], [], {c: [] for c in costs}
    for t in tables:
        for k, m in enumerate(t.masks):
            labels.append((t.protocol, tuple(names.get(a, a) for a in t.members(m))))
            rows.append(t.values[k])
            for c in costs:
                cost_rows[c].append(t.spends[k].field(c))
    return Front(labels, np.stack(rows), {c: np.stack(v) for c, v in cost_rows.items()}, ci_level=ci_level,
                 bootstrap_resamples=bootstrap_resamples, seed=seed)


#: How close to the best a study's "cheapest within" looks (accuracy points as a fraction).
STUDY_WITHIN = 0.02


def study_fronts(cells: Sequence[Mapping[str, Any]], *, within: float = STUDY_WITHIN, resamples: int = 2000,
                 ci_level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Per pool and task, the accuracy-vs-tokens :class:`Front` over every coalition of every protocol
    valued in a study (``cell["report"]`` a valuation report's dict, ``cell["labels"]`` its pool,
    protocol and task labels). Cells whose reports carry no costs (written before costs were kept) are
    left out and counted. Tokens only: seconds are not deterministic, and study.json is compared."""
    groups: dict[tuple[str, str], list[tuple[str, CoalitionCosts, dict[str, str]]]] = {}
    skipped = 0
    for cell in cells:
        d, labels = cell["report"], cell["labels"]
        if d.get("coalition_costs") is None:
            skipped += 1
            continue
        groups.setdefault((labels["pool"], labels["task"]), []).append(
            (labels["protocol"], CoalitionCosts.from_dict(d["coalition_costs"]), dict(zip(d["ids"], d["names"]))))
    out: dict[str, Any] = {"within": within, "cells_without_costs": skipped, "pools": {}}
    for (pool, task), entries in sorted(groups.items()):
        tables = []
        for protocol, table, _ in entries:
            table.protocol = protocol  # the study's label, which tells two settings of one protocol apart
            tables.append(table)
        front = front_of(tables, names=entries[0][2], costs=("tokens",), ci_level=ci_level,
                         bootstrap_resamples=resamples, seed=seed)
        out["pools"].setdefault(pool, {})[task] = front.to_dict(within=within)
    return out


def _gap_interval(c: Mapping[str, Any]) -> str:
    """The cheapest system's accuracy gap to the best, with its CI; zero width when it is the best itself."""
    return interval(c["gap_ci"], c["gap"], lambda v: f"{v:+.3f}", zero_width="zero width: the two systems score alike on every question")


def fronts_markdown(fronts: Mapping[str, Any]) -> str:
    """The study's fronts as Markdown: per pool and task, the systems on the accuracy-vs-tokens front."""
    lines = []
    for pool, by_task in fronts["pools"].items():
        for task, f in by_task.items():
            lines += [f"**{pool}, {task}** ({len(f['labels'])} coalition x protocol systems; {f['ci_level']:.0%} "
                      f"CIs over questions; on front: share of question resamples)", "",
                      "| system | accuracy | tokens / question | on front |", "|---|---|---|---|"]
            for k in f["front"]["tokens"]:
                protocol, members = f["labels"][k]
                lo, hi = f["accuracy_ci"][k]
                lines.append(f"| {protocol}: {'+'.join(members)} | {f['accuracy'][k]:.3f} [{lo:.3f}, {hi:.3f}] | "
                             f"{f['cost']['tokens'][k]:.1f} | {f['front_share']['tokens'][k]:.2f} |")
            c = f["cheapest_within"]["tokens"]
            lines += ["", f"Cheapest within {100 * fronts['within']:g} points of the best "
                          f"({c['best_label'][0]}: {'+'.join(c['best_label'][1])}, {c['best_accuracy']:.3f}): "
                          f"{c['label'][0]}: {'+'.join(c['label'][1])}, {c['accuracy']:.3f} at {c['cost_value']:.1f} "
                          f"tokens vs {c['best_cost']:.1f} (difference {c['gap']:+.3f} {_gap_interval(c)}).", ""]
    if fronts.get("cells_without_costs"):
        lines.append(f"{fronts['cells_without_costs']} valuation cells carry no costs (run before costs were kept).")
    return "\n".join(lines)
