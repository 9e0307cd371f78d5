"""Sequential valuation verdicts: questions in batches, a setting stops when its verdict is decided.

A **group-sequential design** over looks at ``N_1 < N_2 < ... < N_K`` questions. At look ``k`` the
study's own verdict (:func:`crl_envs.stats.crossfit_tau` on the first ``N_k`` questions, then
:func:`crl_envs.stats.verdict`) is read with

- ``coupled`` at level ``a_k`` (the two-sided exact permutation p of the cross-fit tau at most ``a_k``
  with a positive tau, as :func:`~crl_envs.stats.verdict` reads it), and
- ``decoupled`` at level ``b_k`` (the ``1 - b_k`` interval of tau inside ``(-delta, +delta)``).

The per-look levels are the increments of a **Lan-DeMets alpha-spending function** (Lan & DeMets 1983,
"Discrete sequential boundaries for clinical trials", Biometrika 70: 659-663): ``a_k = A(t_k) - A(t_{k-1})``
with ``t_k = N_k / N_K``, Pocock-type ``A(t) = alpha ln(1 + (e - 1) t)`` or O'Brien-Fleming-type
``A(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``. Each look is then tested at its own increment, and the
overall error is bounded by the **union bound** (Bonferroni over looks): ``P(any look errs) <= sum_k a_k
= alpha``, whatever the correlation between looks. That is what makes it valid here, where the looks'
statistics (rank tests of 8 or 16 models on nested questions) are far from the canonical joint normal
that exact group-sequential boundaries assume; the price is some conservatism. Per error:

- false ``coupled`` (population tau 0, models exchangeable): each look's exact permutation test has
  ``P(p_k <= a_k, tau_k > 0) <= a_k / 2``, so over all looks at most ``alpha / 2``, as the fixed design;
- false ``decoupled`` (the setting's own population tau outside the margin): each look's interval misses
  it with probability at most ``b_k`` (:data:`crl_envs.stats.TAU_INTERVAL`), so over all looks at most
  ``decoupled_alpha``.

A **futility** stop (non-binding: Jennison & Turnbull 2000, "Group Sequential Methods with Applications
to Clinical Trials", sec. 10.6) ends a setting as ``inconclusive`` before the last look when neither
verdict is in reach: its cross-fit tau is below :attr:`SequentialDesign.futility_tau` and the interval
projected to the last look (each pairwise difference's standard error shrunk to ``N_K`` questions, its
mean taken as the truth) is not inside the margin. Stopping for futility only removes chances to
reject, so the error bounds above hold whatever the rule; it costs power, which the benchmark
(``benchmarks/sequential_verdicts.py``) measures on planted truth against the fixed design.

A look whose ``a_k`` is below the smallest p the models can give (``2 / n!`` untied) reads ``untestable``
by the verdict's rule and leaves the setting open: that look can decide nothing.

With one look the design is the fixed design: any spending function gives ``A(1) = alpha``, and
:func:`sequential_verdict` returns :func:`crl_envs.stats.verdict` exactly.

:func:`reallocate` moves questions across settings: each round, every undecided setting below its cap
gets its next batch while a shared budget lasts (fewest questions first), so questions freed by decided
settings go to the undecided ones.

Measured (``benchmarks/sequential_verdicts.py``, 2026-12-07, graded spacing, looks 50/100/150/200, decoupled
spent O'Brien-Fleming-type; load average 2-12 on 2 cores, rates do not depend on it), sequential against fixed
on the same planted tables, ± one Monte Carlo SE:

- 8 models, coupled spent ``power:4``, futility below tau 0.3, 1,000 runs per tau (seed 1): false coupled at tau 0 0.016 ± 0.004 (fixed
  0.019 ± 0.004; stated 0.025); coupled at tau 0.5 0.298 ± 0.014 (fixed 0.333 ± 0.015), at tau 0.9 0.932 ±
  0.008 (fixed 0.952 ± 0.007); no decoupled at all (neither design reaches it with 8 graded models on 200
  questions); verdicts agree in 0.997 / 0.959 / 0.976; evaluations saved 2.59x / 1.36x / 1.43x at tau 0 /
  0.5 / 0.9. Not 2x where settings are coupled: 8 models' coarse p-values rarely pass an early look's level.
- 16 models, ``power:4``, futility below tau 0.15, 1,000 runs per tau on fresh seed 9: false coupled at tau 0
  0.016 ± 0.004 (fixed 0.025 ± 0.005); coupled at tau 0.5 0.762 ± 0.013 against the fixed 0.802 ± 0.013 (agree
  0.954), at tau 0.9 1.0 for both; saved 2.56x / 1.35x / 2.85x. That design was chosen after
  300-run comparisons (one SE ~0.025 at tau 0.5): on seed 5, false coupled at tau 0 0.020 ± 0.008 (fixed 0.030 ± 0.010);
  coupled at tau 0.5 0.753 ± 0.025 against the fixed 0.797 ± 0.023 (agree 0.957), at tau 0.9 1.0 for both;
  saved 2.56x / 1.37x / 2.96x. With ``power:2`` and futility below 0.3 (seed 1): 0.617 against 0.737 at tau
  0.5, saved 3.45x / 1.92x / 3.74x; ``power:4`` below 0.3 (seed 1): 0.647, saved 1.64x at tau 0.5 and 2.78x at
  0.9; ``power:2`` below 0.15 (seed 5): 0.730 against 0.797, saved 2.57x / 1.61x
  / 3.82x. The futility threshold trades power at tau 0.5 for savings; 16 models' early taus run low.
- Whole studies (``--studies``: 15 settings at tau 0 / 0.5 / 0.9 sharing 200 questions each, looks stretched
  to a cap of 400, 8 models, 40 studies): 179 of 600 coupled against the fixed 259, for 2,940 questions a study
  against 3,000. Stretching the looks to the cap moves alpha to looks few settings reach, and 8 models' power
  is bounded by ``n``, not questions: reallocation does not pay there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from crl_envs.stats import DEFAULT_DELTA, OrderBand, crossfit_tau, tau_bounds, verdict
from crl_kit.errors import ConfigError

#: The spending functions :func:`spending` knows: Lan & DeMets (1983)'s Pocock- and O'Brien-Fleming-type, and
#: Kim & DeMets (1987)'s power family ``alpha t**rho`` (``"power:1"`` spends linearly; a larger ``rho`` keeps
#: more for the last look).
SPENDING_FUNCTIONS = ("pocock", "obrien-fleming", "power:RHO")
#: A look decides a setting with one of these verdicts; any other leaves it open until the last look.
DECIDED = ("coupled", "decoupled")
#: What benchmarks/sequential_verdicts.py measured (the module docstring's figures, 2026-12-07, 1,000 planted graded
#: settings per tau): ``(models, looks, coupled_spending, decoupled_spending, futility_tau, alpha, decoupled_alpha,
#: delta)`` -> ``{tau: fixed-design question x coalition evaluations over the sequential design's}``. Only designs
#: that were measured are here; a study's dry run states these and nothing else (:func:`measured_saving`).
MEASURED_SAVINGS: dict[tuple, dict[float, float]] = {
    (8, (50, 100, 150, 200), "power:4", "obrien-fleming", 0.3, 0.05, 0.05, 0.3): {0.0: 2.59, 0.5: 1.36, 0.9: 1.43},
    (16, (50, 100, 150, 200), "power:4", "obrien-fleming", 0.15, 0.05, 0.05, 0.3): {0.0: 2.56, 0.5: 1.35, 0.9: 2.85},
}


def measured_saving(design: SequentialDesign, models: int) -> dict[float, float] | None:
    """The savings :data:`MEASURED_SAVINGS` holds for ``design`` with ``models`` models (``None``: never measured).

    Example:
        >>> measured_saving(SequentialDesign(coupled_spending="power:4", futility_tau=0.15), 16)
        {0.0: 2.56, 0.5: 1.35, 0.9: 2.85}
        >>> measured_saving(SequentialDesign(), 16) is None
        True
    """
    key = (models, design.looks, design.coupled_spending, design.decoupled_spending, design.futility_tau,
           design.alpha, design.decoupled_alpha, design.delta)
    return MEASURED_SAVINGS.get(key)


def spending(alpha: float, fractions: Sequence[float], function: str = "pocock") -> tuple[float, ...]:
    """The alpha each look may spend: increments of the Lan-DeMets spending function ``function`` at the
    information fractions ``fractions`` (increasing, the last 1). They sum to ``alpha`` exactly, so a
    union bound over looks holds the overall error at ``alpha``.

    Example:
        >>> [round(a, 4) for a in spending(0.05, [0.25, 0.5, 1.0])]
        [0.0179, 0.0131, 0.019]
        >>> spending(0.05, [1.0], "obrien-fleming")   # one look: the fixed design
        (0.05,)

    Raises:
        ValueError: ``alpha`` outside (0, 1), an unknown function, or fractions not increasing in (0, 1]
            with the last 1.
    """
    if not 0 < alpha < 1:
        raise ConfigError(f"spending needs alpha in (0, 1), got {alpha!r}")
    rho = _power_exponent(function)
    if function not in SPENDING_FUNCTIONS[:2] and rho is None:
        raise ConfigError(f"unknown spending function {function!r}; choose one of {list(SPENDING_FUNCTIONS)} "
                          f"(e.g. 'power:4')")
    t = [float(f) for f in fractions]
    if not t or t[-1] != 1.0 or any(not 0 <= a < b <= 1 for a, b in zip([0.0, *t], t)):
        raise ConfigError(f"spending needs information fractions increasing in (0, 1] and ending at 1, got {t}")
    if function == "pocock":
        cumulative = [alpha * math.log(1 + (math.e - 1) * f) for f in t]
    elif function == "obrien-fleming":
        z = scipy_stats.norm.ppf(1 - alpha / 2)
        cumulative = [2 - 2 * scipy_stats.norm.cdf(z / math.sqrt(f)) for f in t]
    else:
        cumulative = [alpha * f**rho for f in t]
    cumulative[-1] = alpha  # exactly: the last look spends what is left
    return tuple(float(max(0.0, b - a)) for a, b in zip([0.0, *cumulative], cumulative))


def _power_exponent(function: str) -> float | None:
    """``rho`` of ``"power:rho"`` (a positive number), else None."""
    name, _, value = function.partition(":")
    try:
        rho = float(value) if name == "power" else None
    except ValueError:
        return None
    return rho if rho is not None and 0 < rho < math.inf else None


@dataclass(frozen=True)
class SequentialDesign:
    """When a setting is looked at and what each look may spend (see the module docstring)."""

    looks: tuple[int, ...] = field(default=(50, 100, 150, 200), metadata={
        "help": "cumulative questions at each look, increasing; the last is the most a setting gets"})
    alpha: float = field(default=0.05, metadata={
        "help": "coupled: the two-sided level the fixed design's verdict uses, spent over the looks"})
    decoupled_alpha: float = field(default=0.05, metadata={
        "help": "decoupled: one minus the interval's level, spent over the looks"})
    delta: float = field(default=DEFAULT_DELTA, metadata={"help": "the equivalence margin of decoupled"})
    coupled_spending: str = field(default="pocock", metadata={"help": f"one of {SPENDING_FUNCTIONS}"})
    decoupled_spending: str = field(default="obrien-fleming", metadata={"help": f"one of {SPENDING_FUNCTIONS}"})
    futility_tau: float | None = field(default=None, metadata={
        "help": "stop inconclusive before the last look when the cross-fit tau is below this and the projected "
                "interval misses the margin (non-binding); None: no futility stop"})
    resamples: int = field(default=2000, metadata={"help": "question resamples of the interval, as the study's"})
    seed: int = field(default=0, metadata={"help": "the interval's resampling seed, as the study's"})

    def __post_init__(self) -> None:
        looks = tuple(int(k) for k in self.looks)
        if not looks or looks[0] < 1 or any(b <= a for a, b in zip(looks, looks[1:])):
            raise ConfigError(f"SequentialDesign.looks must be increasing question counts >= 1, got {self.looks!r}")
        object.__setattr__(self, "looks", looks)
        for name in ("alpha", "decoupled_alpha"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"SequentialDesign.{name} must be in (0, 1), e.g. 0.05, got {getattr(self, name)!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"SequentialDesign.delta must be in (0, 1), got {self.delta!r}")
        if self.resamples < 1:
            raise ConfigError(f"SequentialDesign.resamples must be >= 1, got {self.resamples!r}")
        self.coupled_levels, self.decoupled_levels  # noqa: B018 -- bad alpha or spending raise here, not at a look

    @property
    def fractions(self) -> tuple[float, ...]:
        return tuple(k / self.looks[-1] for k in self.looks)

    @property
    def coupled_levels(self) -> tuple[float, ...]:
        """``a_k``: the two-sided p at or below which look ``k`` calls a positive tau coupled."""
        return spending(self.alpha, self.fractions, self.coupled_spending)

    @property
    def decoupled_levels(self) -> tuple[float, ...]:
        """``b_k``: look ``k`` reads the ``1 - b_k`` interval of tau."""
        return spending(self.decoupled_alpha, self.fractions, self.decoupled_spending)


@dataclass(frozen=True)
class SequentialResult:
    """A setting's sequential verdict: ``verdict`` (one of :data:`crl_envs.stats.VERDICTS`), the look it
    stopped at (``look``, 0-based), ``questions`` used, ``stopped`` (``"decided"``, ``"futility"`` or
    ``"last look"``) and ``trace``, one dict per look read (questions, tau, p, interval, levels, verdict)."""

    verdict: str
    look: int
    questions: int
    stopped: str
    trace: list[dict[str, Any]]


def read_look(individual: np.ndarray, compositional: np.ndarray, example_ids: Sequence[str], design: SequentialDesign,
              k: int) -> dict[str, Any]:
    """Look ``k`` of ``design`` on the first ``design.looks[k]`` questions: the study's verdict with
    ``coupled`` at ``a_k`` and the interval at ``1 - b_k``; ``futile`` says whether the futility rule
    holds (always False at the last look or without a rule)."""
    q = design.looks[k]
    a_k, b_k = design.coupled_levels[k], design.decoupled_levels[k]
    level = 1 - b_k if b_k > 0 else 0.5  # b_k = 0: this look cannot call decoupled; its interval is not read
    cf = crossfit_tau(individual[:, :q], compositional[:, :q], list(example_ids[:q]), level=level,
                      resamples=design.resamples, seed=design.seed)
    ci = cf["tau_ci"] if b_k > 0 else None
    got = verdict(cf["kendall_tau"], cf["p_value"], cf["min_p_value"], ci, alpha=a_k, delta=design.delta,
                  questions=cf["questions"])
    out = {"questions": q, "kendall_tau": cf["kendall_tau"], "p_value": cf["p_value"], "tau_ci": ci,
           "coupled_level": a_k, "decoupled_level": b_k, "verdict": got, "futile": False}
    last = k == len(design.looks) - 1
    if not last and got not in DECIDED and design.futility_tau is not None and cf["bands"] is not None:
        tau = cf["kendall_tau"]
        low = tau is None or tau < design.futility_tau
        out["projected_ci"] = _projected_interval(cf["bands"], cf["questions"], design)
        lo, hi = out["projected_ci"]
        out["futile"] = bool(low and not (-design.delta < lo and hi < design.delta))
    return out


def _projected_interval(bands: tuple[OrderBand, OrderBand], halves: Sequence[int], design: SequentialDesign
                        ) -> list[float]:
    """The interval of tau the last look would give if every pairwise difference of means moved one standard
    error away from 0 (the benefit of the doubt) and its standard error shrank to the last look's questions
    (``se * sqrt(now / then)``), at the last look's level: an optimistic reach of ``decoupled``, so that the
    futility stop spares settings that could still get there (its error bounds need nothing of it)."""
    shrink = math.sqrt(sum(halves) / design.looks[-1])
    coverage = math.sqrt(1 - design.decoupled_levels[-1])
    projected = [OrderBand(b.diff + np.sign(b.diff) * b.se, b.se * shrink, b.t_star).signs(coverage) for b in bands]
    return tau_bounds([projected[0]], [projected[1]])


def sequential_verdict(individual: np.ndarray, compositional: np.ndarray, example_ids: Sequence[str],
                       design: SequentialDesign) -> SequentialResult:
    """Walk ``design``'s looks on ``(models, questions)`` tables whose questions arrive in column order,
    stopping at the first look that decides (or is futile); the last look's verdict stands otherwise.

    Raises:
        ValueError: tables of different shapes, or fewer questions than the last look.
    """
    x, y = np.asarray(individual, float), np.asarray(compositional, float)
    if x.shape != y.shape or x.ndim != 2 or x.shape[1] != len(example_ids):
        raise ConfigError(f"sequential_verdict needs two (models, questions) tables of one shape with one id per "
                          f"question, got {x.shape}, {y.shape} and {len(example_ids)} ids")
    if x.shape[1] < design.looks[-1]:
        raise ConfigError(f"sequential_verdict: the design's last look needs {design.looks[-1]} questions, the tables "
                          f"hold {x.shape[1]}; pass more questions or a shorter design")
    trace: list[dict[str, Any]] = []
    for k in range(len(design.looks)):
        look = read_look(x, y, example_ids, design, k)
        trace.append(look)
        result = stop(trace, design)
        if result is not None:
            return result
    raise AssertionError("the last look always stops")  # pragma: no cover


def stop(trace: Sequence[dict[str, Any]], design: SequentialDesign) -> SequentialResult | None:
    """The setting's result if it stops after the last look of ``trace`` (:func:`read_look`'s, in order): decided
    (``coupled`` or ``decoupled``), futile (``inconclusive``) or at the design's last look; ``None``: it goes on.
    The one stopping rule: :func:`sequential_verdict` and a study that plays look by look both ask it."""
    k, look = len(trace) - 1, trace[-1]
    if look["verdict"] in DECIDED:
        return SequentialResult(look["verdict"], k, look["questions"], "decided", list(trace))
    if look["futile"]:
        return SequentialResult("inconclusive", k, look["questions"], "futility", list(trace))
    if k == len(design.looks) - 1:
        return SequentialResult(look["verdict"], k, look["questions"], "last look", list(trace))
    return None


def reallocate(used: Sequence[int], undecided: Sequence[bool], *, budget: int, cap: int, batch: int) -> list[int]:
    """The questions each setting gets next: every open (undecided) setting below ``cap`` its next
    ``batch`` (fewer where ``cap`` is nearer), in order of fewest questions used (ties by position),
    while ``budget`` (questions left to the study, shared) lasts; decided settings get none. A pure
    function: the study calls it after every round, so questions a decided setting no longer needs go to
    the undecided ones, each up to ``cap``.

    Example:
        >>> reallocate([50, 50, 50], [False, True, True], budget=60, cap=200, batch=50)
        [0, 50, 10]

    Raises:
        ValueError: ``used`` and ``undecided`` of different lengths, a negative budget or count, or ``batch`` or
            ``cap`` below 1.
    """
    if len(used) != len(undecided):
        raise ConfigError(f"reallocate: {len(used)} settings' questions but {len(undecided)} undecided flags")
    if budget < 0 or batch < 1 or cap < 1 or any(u < 0 for u in used):
        raise ConfigError(f"reallocate needs budget >= 0, batch and cap >= 1 and used >= 0, got budget={budget}, "
                          f"batch={batch}, cap={cap}, used={list(used)}")
    out = [0] * len(used)
    left = int(budget)
    for i in sorted(range(len(used)), key=lambda i: (used[i], i)):
        if not undecided[i] or left == 0:
            continue
        give = min(batch, max(0, cap - int(used[i])), left)
        out[i], left = give, left - give
    return out
