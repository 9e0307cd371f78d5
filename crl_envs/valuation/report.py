"""What a valuation produces: per-model measures with bootstrap CIs, rank correlations, table, plot.

Every measure is kept per question (``(models, questions)``), so bootstrap CIs resample questions
with no further LLM call. Rank correlations between individual strength and each compositional
measure are tested with **exact** permutation p-values (all ``n!`` orderings for ``n <= 8``). With
3-4 models no correlation can be significant: the smallest two-sided p-value is ``2/n!`` — 1/3 at
``n = 3``, 1/12 at ``n = 4``, 1/60 at ``n = 5``. Pool settings with
:func:`crl_envs.valuation.pooled_test`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

COMPOSITIONAL = ("loo", "shapley", "banzhaf")
MEASURES = ("individual", *COMPOSITIONAL)
LABELS = {"individual": "individual", "loo": "LOO", "shapley": "Shapley", "banzhaf": "Banzhaf"}
EXACT_PERMUTATION_LIMIT = 8
"""Rank-correlation p-values enumerate all n! orderings up to this many models (8! = 40320)."""


# ---------------------------------------------------------------------- rank correlation
def _sign_matrix(v: np.ndarray) -> np.ndarray:
    return np.sign(v[..., :, None] - v[..., None, :])


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of ``x`` against each row of ``y`` (``(..., n)``); NaN when either is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    sx, sy = _sign_matrix(x), _sign_matrix(y)
    s = (sx * sy).sum(axis=(-1, -2)) / 2
    tx = (sx != 0).sum(axis=(-1, -2)) / 2  # pairs not tied in x
    ty = (sy != 0).sum(axis=(-1, -2)) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return s / np.sqrt(tx * ty)


def spearman_rho(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho (Pearson of average ranks) of ``x`` against each row of ``y``."""
    rx = stats.rankdata(np.asarray(x, float))
    ry = stats.rankdata(np.asarray(y, float), axis=-1)
    rx, ry = rx - rx.mean(), ry - ry.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ry * rx).sum(-1) / np.sqrt((rx**2).sum() * (ry**2).sum(-1))


STATISTICS = {"kendall": kendall_tau_b, "spearman": spearman_rho}


def permutation_null(x: np.ndarray, y: np.ndarray, statistic: str = "kendall", draws: int = 20000,
                     seed: int = 0) -> tuple[np.ndarray, bool]:
    """The statistic over every ordering of ``y`` against ``x`` (``n <= 8``), else over ``draws``
    random orderings. Returns ``(values, exact)``."""
    y = np.asarray(y, float)
    n = len(y)
    if n <= EXACT_PERMUTATION_LIMIT:
        perms = np.array(list(itertools.permutations(range(n))))
        exact = True
    else:
        rng = np.random.default_rng(seed)
        perms = np.stack([rng.permutation(n) for _ in range(draws)])
        exact = False
    return STATISTICS[statistic](x, y[perms]), exact


@dataclass
class Correlation:
    """A rank correlation with its permutation p-value (two-sided: ``P(|T| >= |t|)`` under
    exchangeability of the models' orderings)."""

    statistic: str
    value: float
    p_value: float
    exact: bool
    n: int

    @property
    def min_p_value(self) -> float:
        """The smallest p-value any data could give with ``n`` models (no ties): ``2 / n!``."""
        return min(1.0, 2 / math.factorial(self.n))


def correlation(x: Sequence[float], y: Sequence[float], statistic: str = "kendall", seed: int = 0) -> Correlation:
    """Rank correlation of ``x`` and ``y`` with its exact (``n <= 8``) permutation p-value.

    Example:
        >>> c = correlation([1, 2, 3], [1, 2, 3])
        >>> round(c.value, 3), round(c.p_value, 4)   # n = 3: p can never go below 1/3
        (1.0, 0.3333)
    """
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {sorted(STATISTICS)}")
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"correlation needs two 1-d sequences of equal length, got shapes {x.shape} and {y.shape}")
    observed = float(STATISTICS[statistic](x, y))
    if len(x) < 2 or math.isnan(observed):  # a constant ranking carries no information
        return Correlation(statistic, float("nan"), float("nan"), True, len(x))
    null, exact = permutation_null(x, y, statistic, seed=seed)
    hits = int(np.sum(np.abs(null) >= abs(observed) - 1e-12))
    p = hits / len(null) if exact else (hits + 1) / (len(null) + 1)
    return Correlation(statistic, observed, p, exact, len(x))


# ---------------------------------------------------------------------- measures
@dataclass(eq=False)
class Measure(Mapping[str, float]):
    """One measure for every model: ``m[agent_id]`` is its mean over questions; ``m.ci[agent_id]``
    its bootstrap CI; ``m.per_question`` the ``(models, questions)`` table behind it.

    ``draws`` (sampled estimators only) is ``(models, draws)``: the estimate's independent Monte Carlo
    draws (one per permutation, or per antithetic pair), as means over questions; their mean is the
    estimate. CIs then add the Monte Carlo error of the sampled permutations to the questions'
    sampling error (see :func:`bootstrap_cis`)."""

    name: str
    ids: list[str]
    per_question: np.ndarray
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    draws: np.ndarray | None = None

    @property
    def means(self) -> np.ndarray:
        """Per-model means over questions, in pool order."""
        return self.per_question.mean(axis=1)

    def __getitem__(self, agent_id: str) -> float:
        try:
            return float(self.means[self.ids.index(agent_id)])
        except ValueError:
            raise KeyError(f"no agent {agent_id!r}; agents are {self.ids}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Measure({self.name}: " + ", ".join(f"{a}={v:.3f}" for a, v in zip(self.ids, self.means)) + ")"


def bootstrap_cis(tables: Mapping[str, np.ndarray], *, resamples: int = 2000, level: float = 0.95,
                  seed: int = 0, draws: Mapping[str, np.ndarray | None] | None = None) -> dict[str, np.ndarray]:
    """Percentile CIs of per-model means, resampling questions (the same resamples for every
    measure, so measures stay paired). Returns ``name -> (models, 2)``.

    A measure with Monte Carlo ``draws[name]`` (``(models, draws)``, see :class:`Measure`) has two
    independent sources of error: the questions and the sampled permutations. Its CI is
    ``estimate ± t(df) * sqrt(var_q + var_mc)``: ``var_q`` the variance of the question-resampled means
    (permutations fixed), ``var_mc = s^2 / draws`` the Monte Carlo variance from the spread of the
    draws, and ``df`` Welch-Satterthwaite's (``questions - 1`` and ``draws - 1`` degrees of freedom),
    so that a budget of a few permutations gets the wide interval it needs."""
    check_ci_options(level, resamples)
    q = next(iter(tables.values())).shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, q, size=(resamples, q))
    alpha = (1 - level) / 2
    out = {}
    for name, table in tables.items():
        means = table[:, idx].mean(axis=-1)  # (models, resamples)
        mc = None if draws is None else draws.get(name)
        if mc is None:
            out[name] = np.quantile(means, [alpha, 1 - alpha], axis=1).T
            continue
        mc = np.asarray(mc, float)
        if mc.ndim != 2 or mc.shape[0] != table.shape[0] or mc.shape[1] < 2:
            raise ValueError(f"{name}: Monte Carlo draws must be (models, >= 2 draws), got shape {mc.shape}")
        var_q = means.var(axis=1, ddof=1)
        var_mc = mc.var(axis=1, ddof=1) / mc.shape[1]
        total = var_q + var_mc
        with np.errstate(invalid="ignore", divide="ignore"):
            df = total**2 / (var_q**2 / max(q - 1, 1) + var_mc**2 / (mc.shape[1] - 1))
        half = np.where(total > 0, stats.t.ppf(1 - alpha, np.where(total > 0, df, 1.0)) * np.sqrt(total), 0.0)
        estimate = table.mean(axis=1)
        out[name] = np.stack([estimate - half, estimate + half], axis=1)
    return out


def check_ci_options(level: Any, resamples: Any) -> None:
    """One-line errors for a CI level outside (0, 1) or a resample count that is not an int >= 1."""
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating)) or not 0 < level < 1:
        hint = f" (a fraction: {level / 100:g} for {level:g}%)" if isinstance(level, (int, float)) and 1 < level < 100 else ""
        raise ValueError(f"ci_level must be a number in (0, 1), e.g. 0.95, got {level!r}{hint}")
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise ValueError(f"bootstrap_resamples must be an int >= 1, e.g. 2000, got {resamples!r}")


# ---------------------------------------------------------------------- the report
@dataclass(eq=False)
class ValuationReport:
    """Individual vs compositional strength of every model of a pool under one protocol and task.

    Attributes:
        individual, loo, shapley, banzhaf: :class:`Measure` (``shapley`` is ``None`` for
            ``estimator="loo"``; ``banzhaf`` only for ``estimator="exact"``).
        system: per-question ``v(N)``; ``empty_value``: ``v(∅)``.
        system_evaluations: the protocol's coalition runs executed by the call that built the
            report (cache hits excluded); ``individual_evaluations`` likewise for the one-model runs;
            ``coalitions`` the number of non-empty coalitions the estimator used;
            ``cached_evaluations`` the distinct runs it needed that came from the cache instead.
        correlation: ``measure -> {"kendall": Correlation, "spearman": Correlation}`` between
            individual strength and each compositional measure.
    """

    protocol: str
    task: str
    ids: list[str]
    names: list[str]
    estimator: str
    example_ids: list[str]
    individual: Measure
    loo: Measure
    shapley: Measure | None
    banzhaf: Measure | None
    system: np.ndarray
    empty_value: float
    system_evaluations: int = 0
    individual_evaluations: int = 0
    coalitions: int = 0
    cached_evaluations: int = 0
    samples: int = 1
    seed: int = 0
    budget: int | None = None
    ci_level: float = 0.95
    bootstrap_resamples: int = 2000
    correlation: dict[str, dict[str, Correlation]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.system = np.asarray(self.system, float)
        self._fill_cis()
        self._fill_correlations()

    # ------------------------------------------------------------------ derived
    @property
    def measures(self) -> dict[str, Measure]:
        """The measures present, in the order individual, LOO, Shapley, Banzhaf."""
        return {m: getattr(self, m) for m in MEASURES if getattr(self, m) is not None}

    @property
    def n_questions(self) -> int:
        return len(self.example_ids)

    @property
    def compositional(self) -> Measure:
        """Shapley where computed, else LOO: what the plot shows against individual strength."""
        return self.shapley if self.shapley is not None else self.loo

    def _fill_cis(self) -> None:
        measures = self.measures
        cis = bootstrap_cis({k: m.per_question for k, m in measures.items()}, resamples=self.bootstrap_resamples,
                            level=self.ci_level, seed=self.seed, draws={k: m.draws for k, m in measures.items()})
        for k, m in measures.items():
            m.ci = {a: (float(lo), float(hi)) for a, (lo, hi) in zip(m.ids, cis[k])}

    def _fill_correlations(self) -> None:
        x = self.individual.means
        self.correlation = {
            k: {s: correlation(x, m.means, s) for s in STATISTICS}
            for k, m in self.measures.items() if k != "individual"
        }

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol, "task": self.task, "ids": self.ids, "names": self.names,
            "estimator": self.estimator, "example_ids": self.example_ids, "samples": self.samples,
            "seed": self.seed, "budget": self.budget, "empty_value": self.empty_value,
            "system_value": float(self.system.mean()), "system": self.system.tolist(),
            "system_evaluations": self.system_evaluations, "individual_evaluations": self.individual_evaluations,
            "coalitions": self.coalitions, "cached_evaluations": self.cached_evaluations,
            "ci_level": self.ci_level, "bootstrap_resamples": self.bootstrap_resamples,
            "measures": {
                k: {
                    "mean": {a: m[a] for a in m.ids},
                    "ci": {a: list(m.ci[a]) for a in m.ids},
                    "per_question": m.per_question.tolist(),
                    **({} if m.draws is None else {"draws": m.draws.tolist()}),
                }
                for k, m in self.measures.items()
            },
            "correlation": {
                k: {s: {"value": _nan_none(c.value), "p_value": _nan_none(c.p_value), "exact": c.exact, "n": c.n,
                        "min_p_value": c.min_p_value} for s, c in d.items()}
                for k, d in self.correlation.items()
            },
        }

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the report (with the per-question tables, so :meth:`from_json` restores it)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> ValuationReport:
        """The report :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValuationReport:
        """The report :meth:`to_dict` described (CIs and correlations recomputed from the tables)."""
        ids = d["ids"]

        def measure(k: str) -> Measure | None:
            m = d["measures"].get(k)
            if m is None:
                return None
            draws = None if m.get("draws") is None else np.asarray(m["draws"], float)
            return Measure(k, ids, np.asarray(m["per_question"], float), draws=draws)

        return cls(
            protocol=d["protocol"], task=d["task"], ids=ids, names=d["names"], estimator=d["estimator"],
            example_ids=d["example_ids"], individual=measure("individual"), loo=measure("loo"),
            shapley=measure("shapley"), banzhaf=measure("banzhaf"), system=np.asarray(d["system"]),
            empty_value=d["empty_value"], system_evaluations=d["system_evaluations"],
            individual_evaluations=d.get("individual_evaluations", 0), coalitions=d["coalitions"],
            cached_evaluations=d.get("cached_evaluations", 0),
            samples=d["samples"], seed=d["seed"], budget=d["budget"], ci_level=d["ci_level"],
            bootstrap_resamples=d["bootstrap_resamples"],
        )

    def table(self) -> str:
        """The readable table ``str(report)`` prints."""
        pct = round(self.ci_level * 100)
        measures = self.measures
        headers = ["agent", "model"] + [f"{LABELS[k]} [{pct}% CI]" for k in measures]
        rows = []
        for i, a in enumerate(self.ids):
            row = [a, self.names[i]]
            for m in measures.values():
                lo, hi = m.ci[a]
                row.append(f"{m[a]:+.3f} [{lo:+.3f}, {hi:+.3f}]" if m.name != "individual"
                           else f"{m[a]:.3f} [{lo:.3f}, {hi:.3f}]")
            rows.append(row)
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        est = self.estimator + (f", {self.budget} permutations" if self.budget else "")
        out = [
            f"{self.protocol} on {self.task}: {len(self.ids)} models, {self.n_questions} questions x {self.samples} "
            f"sample(s), estimator {est}",
            f"v(N) = {self.system.mean():.3f}   v(empty) = {self.empty_value:g}   "
            f"runs executed: {self.system_evaluations} of {self.coalitions} coalitions + {self.individual_evaluations} of "
            f"{len(self.ids)} individual{self._cached_note()}",
            "",
            line(headers),
            line(["-" * w for w in widths]),
            *(line(r) for r in rows),
            "",
            "rank correlation with individual strength (exact permutation p-values):",
        ]
        for k, d in self.correlation.items():
            kt, sp = d["kendall"], d["spearman"]
            out.append(f"  {LABELS[k]:8s} Kendall tau-b {_fmt(kt.value)} (p = {_fmt(kt.p_value, '.3f')})   "
                       f"Spearman rho {_fmt(sp.value)} (p = {_fmt(sp.p_value, '.3f')})")
        n = len(self.ids)
        out.append(f"  with {n} models the smallest possible two-sided p-value is {min(1.0, 2 / math.factorial(n)):.3g}"
                   + ("; no single setting can be significant — pool settings with pooled_test()" if n <= 4 else ""))
        return "\n".join(out)

    def _cached_note(self) -> str:
        """Where the runs not executed came from, said only when there were any."""
        return f" ({self.cached_evaluations} from cache)" if self.cached_evaluations else ""

    def __str__(self) -> str:
        return self.table()

    def figure(self):
        """The figure :meth:`plot` saves: individual strength (x) vs each compositional measure (y), one
        panel per measure, a point per model with its CIs as error bars, labelled by model name.
        The title wraps to the figure's width, the legend sits below the panels, and each label takes
        the first free spot around its point, so nothing is cropped and no two labels overlap."""
        import textwrap

        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        comps = {k: m for k, m in self.measures.items() if k != "individual"}
        width = max(6.4, 5.4 * len(comps))
        fig, axes = plt.subplots(1, len(comps), figsize=(width, 5.6), squeeze=False, layout="constrained")
        x, xci = self.individual.means, self.individual.ci
        colors = plt.get_cmap("tab10")
        handles = []
        for ax, (k, m) in zip(axes[0], comps.items()):
            handles = []
            for i, a in enumerate(self.ids):
                xerr = [[x[i] - xci[a][0]], [xci[a][1] - x[i]]]
                yerr = [[m[a] - m.ci[a][0]], [m.ci[a][1] - m[a]]]
                handles.append(ax.errorbar(x[i], m[a], xerr=xerr, yerr=yerr, fmt="o", ms=8, capsize=4,
                                           color=colors(i % 10), label=self.names[i], zorder=3))
            ax.axhline(0, color="0.7", lw=0.8, zorder=0)
            kt = self.correlation[k]["kendall"]
            ax.set_title(f"{LABELS[k]}: Kendall tau-b {_fmt(kt.value, '.2f')}, exact p = {_fmt(kt.p_value, '.2f')}",
                         fontsize=11)
            ax.set_xlabel("individual strength (accuracy alone)", fontsize=11)
            ax.set_ylabel(f"compositional strength ({LABELS[k]})", fontsize=11)
            ax.grid(alpha=0.3)
            ax.margins(0.18)
        fig.legend(handles=handles, labels=self.names, loc="outside lower center", fontsize=10, frameon=False,
                   ncol=max(1, min(len(self.ids), int(width / 1.9))))  # ~1.9 in per entry: rows, not overflow
        title = (f"{self.protocol} on {self.task} — {self.n_questions} questions, v(N) = {self.system.mean():.3f}, "
                 f"{round(self.ci_level * 100)}% CIs")
        fig.suptitle("\n".join(textwrap.wrap(title, width=int(width * 9))), fontsize=12)
        fig.canvas.draw()  # settle the layout, then place labels in the final geometry
        fig.set_layout_engine("none")
        for ax, m in zip(axes[0], comps.values()):
            _place_labels(ax, [(x[i], m[a]) for i, a in enumerate(self.ids)], self.names,
                          [colors(i % 10) for i in range(len(self.ids))])
        return fig

    def plot(self, path: str | os.PathLike) -> Path:
        """Save :meth:`figure` as a PNG (or any format matplotlib infers from ``path``)."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight", pad_inches=0.15)
        plt.close(fig)
        return path


#: Offsets (points) tried for a label around its point, nearest first.
_LABEL_OFFSETS = [(dx * r, dy * r) for r in (1, 2, 3, 4, 5) for dx, dy in
                  ((1, 1), (1, -1), (-1, 1), (-1, -1), (0, 1.4), (0, -1.4), (1.4, 0), (-1.4, 0))]


def _place_labels(ax: Any, points: Sequence[tuple[float, float]], names: Sequence[str], colors: Sequence[Any]) -> None:
    """Annotate each point with its name at the first offset where the label overlaps no other label
    and no marker and stays inside the axes (greedy, in display coordinates; the least-overlapping
    offset when none is free)."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    markers = [ax.transData.transform(p) for p in points]
    radius = 6 * fig.dpi / 72  # a marker of ms=8 has a radius of 4 points; keep 2 more clear
    placed: list[Any] = []
    for (px, py), name, color in zip(points, names, colors):
        best, best_cost = None, None
        for dx, dy in _LABEL_OFFSETS:
            text = ax.annotate(name, (px, py), textcoords="offset points", xytext=(8 * dx, 8 * dy),
                               ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               va="bottom" if dy > 0 else "top" if dy < 0 else "center", fontsize=10,
                               color=color, zorder=4,
                               bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})
            box = text.get_window_extent(renderer).expanded(1.04, 1.1)
            cost = sum(_overlap(box, other) for other in placed)
            cost += sum(_overlap(box, _marker_box(mx, my, radius)) for mx, my in markers)
            outside = box.width * box.height - _overlap(box, frame)
            cost += 10 * outside
            if best_cost is None or cost < best_cost:
                if best is not None:
                    best[0].remove()
                best, best_cost = (text, box), cost
            else:
                text.remove()
            if cost == 0:
                break
        placed.append(best[1])


def _marker_box(x: float, y: float, r: float) -> Any:
    from matplotlib.transforms import Bbox

    return Bbox([[x - r, y - r], [x + r, y + r]])


def _overlap(a: Any, b: Any) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _fmt(v: float, spec: str = "+.3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _nan_none(v: float) -> float | None:
    return None if math.isnan(v) else v
