"""What a valuation produces: per-model measures with bootstrap CIs, rank correlations, table, JSON
(the plot: :mod:`crl_envs.valuation.plots`).

Every measure is kept per question (``(models, questions)``), so bootstrap CIs resample questions
with no further LLM call. Rank correlations between individual strength and each compositional
measure are tested with **exact** permutation p-values (all ``n!`` orderings for ``n <= 8``). With
3-4 models no correlation can be significant: the smallest two-sided p-value is ``2/n!`` — 1/3 at
``n = 3``, 1/12 at ``n = 4``, 1/60 at ``n = 5``. Pool settings with
:func:`crl_envs.valuation.pooled_test`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

# the statistics live in crl_envs.stats; their names stay importable from here
from crl_envs.stats import (  # noqa: F401
    DEFAULT_DELTA,
    EXACT_PERMUTATION_LIMIT,
    STATISTICS,
    Correlation,
    bootstrap_cis,
    check_ci_options,
    correlation,
    crossfit_tau,
    judge,
    kendall_tau_b,
    min_p_value,
    permutation_null,
    spearman_rho,
)
from crl_envs.valuation.fronts import Front, front_of
from crl_envs.valuation.interactions import Interactions
from crl_envs.valuation.spend import CoalitionCosts, ratio_cis
from crl_kit.errors import ConfigError

COMPOSITIONAL = ("loo", "shapley", "banzhaf")
MEASURES = ("individual", *COMPOSITIONAL)
LABELS = {"individual": "individual", "loo": "LOO", "shapley": "Shapley", "banzhaf": "Banzhaf",
          "shapley_minus_singleton": "Shapley - individual/n"}

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
    draws: np.ndarray | None = None
    _ci: dict[str, tuple[float, float]] | None = field(default=None, init=False, repr=False)
    _fill: Callable[[], None] | None = field(default=None, init=False, repr=False)

    @property
    def ci(self) -> dict[str, tuple[float, float]]:
        """``agent_id -> (low, high)``, bootstrapped when first asked (by the report that holds the measure,
        with its other measures on the same resamples; alone: 95%, 2,000 resamples, seed 0)."""
        if self._ci is None:
            if self._fill is not None:
                self._fill()
            else:
                cis = bootstrap_cis({"m": self.per_question}, draws={"m": self.draws})["m"]
                self._ci = {a: (float(lo), float(hi)) for a, (lo, hi) in zip(self.ids, cis)}
        return self._ci

    @ci.setter
    def ci(self, value: dict[str, tuple[float, float]]) -> None:
        self._ci = value

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
        coalition_costs: every coalition's per-question value and cost as deployed
            (:class:`~crl_envs.valuation.spend.CoalitionCosts`; fronts: :meth:`front`).
        cost: the cost game ``c(S)`` (1k tokens per question) valued by the estimator (Shapley, or LOO):
            who costs what; :meth:`value_per_1k` divides the compositional value by it.
        tradeoff, cost_lambda: the game ``v(S) - cost_lambda * c(S)`` valued by the estimator (when asked).
        interactions: :class:`~crl_envs.valuation.interactions.Interactions` (when asked).
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
    coalition_costs: CoalitionCosts | None = None
    cost: Measure | None = None
    tradeoff: Measure | None = None
    cost_lambda: float | None = None
    interactions: Interactions | None = None
    _crossfits: dict[tuple, dict[str, Any]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        """Nothing is computed here: CIs, correlations and cross-fits are computed when first asked, then kept."""
        self.system = np.asarray(self.system, float)
        for m in self.measures.values():
            m._fill = self._fill_cis
        for m in self.cost_measures.values():
            m._fill = self._fill_cost_cis

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

    @property
    def cost_measures(self) -> dict[str, Measure]:
        """The cost game's and the trade-off game's measures, where computed."""
        return {k: m for k in ("cost", "tradeoff") if (m := getattr(self, k)) is not None}

    def _fill_cost_cis(self) -> None:
        """CIs of the cost-aware measures: the same question resamples as the other measures' (same
        seed), filled in a separate call so that those stay exactly as without costs."""
        measures = self.cost_measures
        if not measures:
            return
        cis = bootstrap_cis({k: m.per_question for k, m in measures.items()}, resamples=self.bootstrap_resamples,
                            level=self.ci_level, seed=self.seed, draws={k: m.draws for k, m in measures.items()})
        for k, m in measures.items():
            m.ci = {a: (float(lo), float(hi)) for a, (lo, hi) in zip(m.ids, cis[k])}

    def value_per_1k(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ratio, (models, 2) CIs)``: each model's compositional value (Shapley, else LOO) per 1k
        tokens of its cost value, a ratio of means with a paired question-bootstrap CI (NaN where the
        cost value is 0)."""
        if self.cost is None:
            raise ConfigError("this report carries no costs (written before costs were kept): value the pool again")
        return ratio_cis(self.compositional.per_question, self.cost.per_question,
                         resamples=self.bootstrap_resamples, level=self.ci_level, seed=self.seed)

    def front(self, costs: tuple[str, ...] = ("tokens", "seconds")) -> Front:
        """The cost-quality :class:`~crl_envs.valuation.fronts.Front` over this report's coalitions."""
        if self.coalition_costs is None:
            raise ConfigError("this report carries no costs (written before costs were kept): value the pool again")
        return front_of([self.coalition_costs], names=dict(zip(self.ids, self.names)), costs=costs,
                        ci_level=self.ci_level, bootstrap_resamples=self.bootstrap_resamples, seed=self.seed)

    def cost_table(self) -> str:
        """Cost per coalition and the cost-aware values, as ``crl-envs value --costs`` prints them."""
        if self.coalition_costs is None or self.cost is None:
            raise ConfigError("this report carries no costs (written before costs were kept): value the pool again")
        pct = round(self.ci_level * 100)
        out = [self.coalition_costs.summary(self.names), ""]
        label = LABELS.get(self.compositional.name, self.compositional.name)
        ratio, rci = self.value_per_1k()
        headers = ["agent", "model", f"cost {label} (1k tok) [{pct}% CI]", f"{label} per 1k tok [{pct}% CI]"]
        if self.tradeoff is not None:
            headers.append(f"{label} of v - {self.cost_lambda:g}*c [{pct}% CI]")
        rows = []
        for i, a in enumerate(self.ids):
            lo, hi = self.cost.ci[a]
            row = [a, self.names[i], f"{self.cost[a]:.3f} [{lo:.3f}, {hi:.3f}]",
                   f"{_fmt(float(ratio[i]))} [{_fmt(float(rci[i, 0]))}, {_fmt(float(rci[i, 1]))}]"]
            if self.tradeoff is not None:
                lo, hi = self.tradeoff.ci[a]
                row.append(f"{self.tradeoff[a]:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            rows.append(row)
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        out += ["cost-aware values (cost game c(S) = 1k tokens per question as deployed):", line(headers),
                line(["-" * w for w in widths]), *(line(r) for r in rows)]
        return "\n".join(out)

    @cached_property
    def correlation(self) -> dict[str, dict[str, Correlation]]:
        """``measure -> {"kendall", "spearman"}``: each compositional measure's rank correlation with individual
        strength on the same questions (the paper's way of measuring; never the verdict: :meth:`verdict`)."""
        x = self.individual.means
        return {k: {s: correlation(x, m.means, s) for s in STATISTICS}
                for k, m in self.measures.items() if k != "individual"}

    # ------------------------------------------------------------------ cross-fit and verdict
    def crossfit_tables(self) -> dict[str, np.ndarray]:
        """``measure -> (models, questions)`` of the compositional measures the cross-fit correlates with
        individual strength, headline first: Shapley, LOO, and Shapley minus its singleton term
        (``Shapley_i - individual_i / n``: what is left once the model's own accuracy, ``v({i}) / n``, is out)."""
        out = {}
        if self.shapley is not None:
            out["shapley"] = self.shapley.per_question
        out["loo"] = self.loo.per_question
        if self.shapley is not None:
            out["shapley_minus_singleton"] = self.shapley.per_question - self.individual.per_question / len(self.ids)
        return out

    def crossfit(self, measure: str | None = None, *, level: float | None = None) -> dict[str, Any]:
        """The cross-fit Kendall tau-b of ``measure`` (default: the headline, Shapley where computed, else LOO)
        against individual strength (:func:`crl_envs.stats.crossfit_tau`) with its ``level`` interval (default
        the report's ``ci_level``): computed when first asked, then kept.

        Raises:
            ValueError: a measure this report has no table for.
        """
        tables = self.crossfit_tables()
        measure = measure or next(iter(tables))
        if measure not in tables:
            raise ConfigError(f"no cross-fit for {measure!r}: this report has {list(tables)}")
        level = self.ci_level if level is None else level
        key = (measure, level)
        if key not in self._crossfits:
            self._crossfits[key] = crossfit_tau(self.individual.per_question, tables[measure], self.example_ids,
                                                level=level, resamples=self.bootstrap_resamples, seed=self.seed)
        return self._crossfits[key]

    def verdict(self, measure: str | None = None, *, alpha: float | None = None,
                delta: float = DEFAULT_DELTA) -> dict[str, Any]:
        """Does individual strength predict ``measure``? The verdict of :func:`crl_envs.stats.verdict` on the
        cross-fit tau, as :func:`crl_envs.stats.judge` writes it (the study's verdict: the same function).
        One level: the tests at ``alpha`` (default ``1 - ci_level``), the interval of tau at ``1 - alpha``."""
        alpha = round(1 - self.ci_level, 12) if alpha is None else alpha
        cf = self.crossfit(measure, level=1 - alpha)
        return {**judge(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], cf["tau_ci"], alpha=alpha, delta=delta,
                        level=1 - alpha, questions=cf["questions"], undefined=cf["undefined"]),
                "alpha": alpha, "delta": delta, "crossfit_questions": cf["questions"],
                "nan_resamples": cf["nan_resamples"]}

    def verdicts(self, *, alpha: float | None = None, delta: float = DEFAULT_DELTA) -> dict[str, dict[str, Any]]:
        """:meth:`verdict` for every measure of :meth:`crossfit_tables`, headline first."""
        return {m: self.verdict(m, alpha=alpha, delta=delta) for m in self.crossfit_tables()}

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
            "crossfit": self.verdicts(),  # the verdict per measure (recomputed on read, like the CIs)
            **self._cost_dict(),
        }

    def _cost_dict(self) -> dict[str, Any]:
        """The costs, cost-aware measures and interactions, where the report carries them."""
        out: dict[str, Any] = {}
        if self.coalition_costs is not None:
            out["coalition_costs"] = self.coalition_costs.to_dict()
        measures = self.cost_measures
        if measures:
            out["cost_measures"] = {
                k: {"mean": {a: m[a] for a in m.ids}, "ci": {a: list(m.ci[a]) for a in m.ids},
                    "per_question": m.per_question.tolist(),
                    **({} if m.draws is None else {"draws": m.draws.tolist()})}
                for k, m in measures.items()}
            out["cost_lambda"] = self.cost_lambda
        if self.cost is not None:
            ratio, cis = self.value_per_1k()
            out["value_per_1k"] = {a: {"mean": _nan_none(float(ratio[i])),
                                       "ci": [_nan_none(float(x)) for x in cis[i]]} for i, a in enumerate(self.ids)}
        if self.interactions is not None:
            out["interactions"] = self.interactions.to_dict()
        return out

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

        def measure(k: str, table: Mapping[str, Any] = d["measures"]) -> Measure | None:
            m = table.get(k)
            if m is None:
                return None
            draws = None if m.get("draws") is None else np.asarray(m["draws"], float)
            return Measure(k, ids, np.asarray(m["per_question"], float), draws=draws)

        def cost_measure(k: str) -> Measure | None:
            return measure(k, d.get("cost_measures", {}))

        return cls(
            protocol=d["protocol"], task=d["task"], ids=ids, names=d["names"], estimator=d["estimator"],
            example_ids=d["example_ids"], individual=measure("individual"), loo=measure("loo"),
            shapley=measure("shapley"), banzhaf=measure("banzhaf"), system=np.asarray(d["system"]),
            coalition_costs=None if d.get("coalition_costs") is None else CoalitionCosts.from_dict(d["coalition_costs"]),
            cost=cost_measure("cost"), tradeoff=cost_measure("tradeoff"), cost_lambda=d.get("cost_lambda"),
            interactions=None if d.get("interactions") is None else Interactions.from_dict(d["interactions"]),
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
        ]
        out += self._crossfit_lines()
        out.append("same questions (the paper's way of measuring: a model's lucky questions raise both measures, "
                   "so copies of one model read as correlated; not a verdict):")
        for k, d in self.correlation.items():
            kt, sp = d["kendall"], d["spearman"]
            out.append(f"  {LABELS[k]:8s} Kendall tau-b {_fmt(kt.value)} (p = {_fmt(kt.p_value, '.3f')})   "
                       f"Spearman rho {_fmt(sp.value)} (p = {_fmt(sp.p_value, '.3f')})")
        n = len(self.ids)
        out.append(f"  with {n} models the smallest possible two-sided p-value is {min_p_value(n):.3g}"
                   + ("; no single setting can be significant — pool settings with pooled_test()" if n <= 4 else ""))
        return "\n".join(out)

    def _crossfit_lines(self) -> list[str]:
        """The cross-fit verdicts (:meth:`verdict`): individual strength on one half of the questions, each
        compositional measure on the other (what the study's verdicts use)."""
        lines = []
        for k, v in self.verdicts().items():
            if not lines:
                q = v["crossfit_questions"]
                lines.append(f"does individual strength predict compositional strength? cross-fit Kendall tau-b "
                             f"(individual on {q[0]} questions, compositional on the other {q[1]}; exact permutation "
                             f"p; tests at alpha = {v['alpha']:g}, decoupled: the {v['tau_ci_level']:.0%} interval "
                             f"of tau inside +/-{v['delta']:g}):")
            ci = (f"undefined ({v['undefined']})" if v["tau_ci"] is None else
                  f"[{v['tau_ci'][0]:+.3f}, {v['tau_ci'][1]:+.3f}]")
            note = f"; {v['note']}" if v.get("note") else ""
            lines.append(f"  {LABELS.get(k, k.replace('_', ' ')):8s} tau-b {_fmt(v['kendall_tau'])} "
                         f"{v['tau_ci_level']:.0%} interval {ci} (p = {_fmt(v['p_value'], '.3f')}): "
                         f"{v['verdict']}{note}")
        return lines

    def _cached_note(self) -> str:
        """Where the runs not executed came from, said only when there were any."""
        return f" ({self.cached_evaluations} from cache)" if self.cached_evaluations else ""

    def __str__(self) -> str:
        return self.table()

    def figure(self):
        """The figure :meth:`plot` saves (:func:`crl_envs.valuation.plots.figure`): individual strength (x)
        vs each compositional measure (y), a point per model with its CIs, labels that overlap nothing."""
        from crl_envs.valuation.plots import figure

        return figure(self, LABELS)

    def plot(self, path: str | os.PathLike) -> Path:
        """Save :meth:`figure` as a PNG (or any format matplotlib infers from ``path``)."""
        from crl_envs.valuation.plots import plot

        return plot(self, LABELS, path)


def _fmt(v: float, spec: str = "+.3f") -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _nan_none(v: float) -> float | None:
    return None if math.isnan(v) else v
