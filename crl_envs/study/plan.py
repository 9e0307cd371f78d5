"""A study's plan: its cells, each keyed by a fingerprint of everything that changes its result, and
what they cost (episodes, model calls, an estimate of generated tokens) before anything runs.

The kinds are :mod:`crl_envs.study.cells` (one module each): ``valuation`` (a pool x protocol x task x
seed), ``lr_sweep`` (a candidate learning rate of ``[training.lr_rule]``), ``pilot`` (a rate x adapter x seed of
``[training.pilot]``, one fit scored at each checkpoint), ``baseline`` (the untrained
learner in a setup x task), ``training`` (a trainer's fit with one seed, then its evaluation) and
``crossplay`` (a training cell's learners with unseen partners). The plan asks each kind for its cells:

- once for the study (:meth:`~crl_envs.study.cells.Cell.plan_study`: valuation first);
- then per training setting (setup x task), the kinds in their ``setting_order``
  (:meth:`~crl_envs.study.cells.Cell.plan_setting`: baseline, sweep, training); a ``shared`` kind's cell
  that several settings plan with one id is planned once;
- and right after each cell of the kind another kind ``follows``
  (:meth:`~crl_envs.study.cells.Cell.plan_after`: a crossplay cell after its training cell).

A cell's payload is plain data (specs, options, sizes), so it runs the same in this process, in a
worker process or on a Ray worker; its fingerprint hashes the payload with :data:`CELL_VERSION`.
Two configs that share a cell share its result. Models are named by spec: a model whose weights
change under the same spec is a new model only to the coalition cache (keyed by agent fingerprints);
rerun its cells with ``--fresh`` or bump ``CELL_VERSION``.
"""

from __future__ import annotations

from typing import Any

from crl_envs.study.cells import CELL_VERSION, Cell, cell_kind, cell_kinds
from crl_envs.study.cells.build import pool_size
from crl_envs.study.cells.setting import Setting, substitute, training_settings
from crl_envs.study.cells.trained import trainer_credit
from crl_envs.study.config import StudyConfig, StudyConfigError

#: The kinds, in the order the dry run lists them (each kind's module declares its place).
KINDS = tuple(k.kind for k in cell_kinds())
#: The stage each kind runs in (sweeps and pilots first: training cells read what they chose; crossplay last: it reads
#: training checkpoints); kinds not named here run in stage 1.
STAGE = {k.kind: k.stage for k in cell_kinds() if k.stage != 1}

# names other modules and tests import from here
_substitute = substitute
__all__ = ["CELL_VERSION", "KINDS", "STAGE", "Cell", "cells", "design", "estimate", "sequential_plan",
           "trainer_credit", "training_design"]


class _Planner:
    """Builds the plan: every kind asked in turn (see the module docstring), cells appended in order."""

    def __init__(self, config: StudyConfig):
        self.config = config
        self.kinds = cell_kinds()
        self.cells: list[Cell] = []
        self.shared: dict[str, Cell] = {}  # id -> the cell a shared kind planned first under it

    def add(self, cell: Cell) -> None:
        """Append ``cell``, then the cells of the kinds that follow its kind."""
        self.cells.append(cell)
        for kind in self.kinds:
            if kind.follows == cell.kind:
                for follower in kind.plan_after(self.config, cell):
                    self.add(follower)

    def plan_setting(self, setting: Setting) -> None:
        for kind in sorted(self.kinds, key=lambda k: k.setting_order):
            planned = setting.planned.setdefault(kind.kind, [])
            for cell in kind.plan_setting(self.config, setting):
                if kind.shared:
                    first = self.shared.setdefault(cell.id, cell)
                    planned.append(first)
                    if first is not cell:
                        continue
                else:
                    planned.append(cell)
                self.add(cell)

    def plan(self) -> list[Cell]:
        for kind in self.kinds:
            for cell in kind.plan_study(self.config):
                self.add(cell)
        for setting in training_settings(self.config):
            self.plan_setting(setting)
        return self.cells


def cells(config: StudyConfig) -> list[Cell]:
    """Every cell of the study, valuation first, in a stable order."""
    out = _Planner(config).plan()
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):  # labels hold no '/' (config._check_label): ids are injective
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise StudyConfigError(f"study config: two cells share the id {twice[0]!r}; rename one of their labels")
    return out


def estimate(config: StudyConfig, plan: list[Cell], *, distinct: bool = True) -> list[Cell]:
    """The cells with ``cost`` filled: ``runs`` (coalition runs, or trainer fits), ``episodes``, ``calls``
    (model calls that will run) and ``tokens`` (an upper bound on generated tokens: calls x max_new_tokens),
    each kind pricing its own cells (:meth:`~crl_envs.study.cells.Cell.estimate_costs`; valuation
    coalitions and requests shared between cells are counted once). ``distinct=False`` counts every request
    of a valuation cell instead (an upper bound, without playing the plan with stand-ins: seconds less on a
    study like paper-small's; for a run without a progress bar, which needs only the checks: a cell planning
    too many coalition runs is refused either way)."""
    costs: dict[int, dict[str, float]] = {}
    for kind in dict.fromkeys(c.kind for c in plan):
        index = [i for i, c in enumerate(plan) if c.kind == kind]
        priced = cell_kind(kind).estimate_costs(config, [plan[i] for i in index], distinct=distinct)
        costs.update(zip(index, priced))
    return [c.with_cost(costs[i]) for i, c in enumerate(plan)]


def design(config: StudyConfig) -> dict[str, Any] | None:
    """What the valuation design can show before anything runs: per pool and question count its size, the
    smallest attainable p and the power of the study's verdict to call "coupled" at tau 0.5 and "decoupled"
    at tau 0 (:func:`crl_envs.study.stats.valuation_design`, the report's too); ``None`` without a valuation."""
    from crl_envs.study.stats import valuation_design

    v = config.valuation
    if v is None:
        return None
    sizes = {pool: pool_size(config.pools[pool].describe()) for pool in v.pools}  # builds the pool: once each
    return valuation_design([(pool, sizes[pool], config.tasks[task].n) for pool in v.pools for task in v.tasks_of(pool)
                             for _ in range(len(v.protocols) * len(v.seeds))],
                            alpha=v.alpha, delta=v.delta, resamples=v.bootstrap_resamples)


def sequential_plan(config: StudyConfig, planned: list[Cell]) -> list[dict[str, Any]]:
    """Per valued pool under ``[valuation.sequential]``: its settings, the question x coalition evaluations they
    may use at most (every setting to its last look) and the saving :func:`crl_envs.sequential.measured_saving`
    holds for its design and size (``None``: never measured). Empty without the table."""
    from crl_envs.sequential import measured_saving

    v = config.valuation
    if v is None or v.sequential is None:
        return []
    pools: dict[str, dict[str, Any]] = {}
    for cell in planned:
        if cell.kind != "valuation":
            continue
        n = pool_size(cell.spec.pool)
        kind, budget = cell.estimator_kind(n)
        coalitions = sum(kind.coalitions_per_size(n, budget).values())
        design_ = cell.spec.design()
        entry = pools.setdefault(cell.spec.pool_label, {"pool": cell.spec.pool_label, "n": n, "settings": 0,
                                                        "looks": list(design_.looks), "max_evaluations": 0.0,
                                                        "saving": measured_saving(design_, n)})
        entry["settings"] += 1
        entry["max_evaluations"] += design_.looks[-1] * coalitions
    return list(pools.values())


#: The C-RL - placebo difference whose power the training design states (fractions: +2 points).
TRAINING_POWER_DIFFERENCE = 0.02


def training_design(config: StudyConfig) -> dict[str, Any] | None:
    """The power of the training summary's test across settings (:func:`crl_envs.study.stats.training_power`)
    for a C-RL - placebo difference of :data:`TRAINING_POWER_DIFFERENCE`, if every planned setting passes its
    gates; ``None`` without a training half, C-RL or the placebo."""
    from crl_envs.study.stats import training_power

    t = config.training
    if t is None or "crl" not in t.trainers or "placebo" not in t.trainers:
        return None
    return training_power(len(training_settings(config)), len(t.seeds), t.n_eval,
                          [b for b in t.trainers if b != "crl"], difference=TRAINING_POWER_DIFFERENCE, alpha=t.alpha)
