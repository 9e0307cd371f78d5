"""``valuation`` cells: one :func:`crl_envs.valuation.evaluate` call per pool x protocol x task x seed of
``[valuation]``. They run in the driver, one after another, their coalitions on the study's executor and in
the coalition cache every valuation cell shares (``out/coalitions``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_envs.study.cells.base import Cell, CellContext, TableInputs
from crl_envs.study.cells.build import (
    build_pool,
    build_task,
    calls_per_episode,
    member_names,
    sampling_params,
)
from crl_envs.study.cells.specs import ValuationSpec
from crl_envs.study.config import MAX_COALITION_RUNS, StudyConfig, StudyConfigError
from crl_envs.valuation.estimators import ESTIMATORS, Estimator, estimator_class, estimator_for
from crl_kit.serial import digest
from crl_kit.validation import numbers_problem

#: Up to this many coalitions per cell the plan lists them (exact counts, coalitions shared between cells
#: counted once); above, it counts them per coalition size without listing them (an expectation for the
#: sampled estimators), so a plan costs the same whatever the budget.
LISTED_COALITIONS = 1_000


@dataclass(frozen=True)
class ValuationCell(Cell):
    """One pool x protocol x task x seed valued (:func:`crl_envs.valuation.evaluate`)."""

    kind = "valuation"
    spec_class = ValuationSpec
    spec: ValuationSpec
    order = 0
    in_driver = True
    runs_unit = "coalition runs"

    @classmethod
    def plan_study(cls, config: StudyConfig) -> list[Cell]:
        v = config.valuation
        if v is None:
            return []
        out: list[Cell] = []
        for pool in v.pools:
            for proto in v.protocols:
                for task in v.tasks_of(pool):
                    for seed in v.seeds:
                        spec = ValuationSpec(
                            pool=config.pools[pool].describe(), pool_label=pool,
                            protocol=config.protocols[proto].describe(), protocol_label=proto,
                            task=config.tasks[task].describe(), task_label=task,
                            estimator=v.estimator, samples=v.samples, seed=seed, budget=v.budget,
                            sampling=config.sampling_for(task), ci_level=v.ci_level,
                            bootstrap_resamples=v.bootstrap_resamples, sequential=None if v.sequential is None else
                            sequential_fields(v.sequential.design(alpha=v.alpha, delta=v.delta,
                                                                  resamples=v.bootstrap_resamples, seed=seed)))
                        out.append(cls.make(f"valuation/{pool}/{proto}/{task}/seed{seed}", spec))
        return out

    # ------------------------------------------------------------------ cost
    @classmethod
    def estimate_costs(cls, config: StudyConfig, cells: list[Cell], *, distinct: bool = True) -> list[dict[str, float]]:
        """Per cell ``runs`` (coalition runs), ``episodes``, ``calls`` and ``tokens`` (calls x max_new_tokens).
        Coalitions shared between cells (the same members at the same positions, protocol, task and seed) are
        counted once, where they first appear, as the coalition cache plays them once; ``calls`` are distinct
        requests (:func:`crl_envs.valuation.cost.distinct_calls_in_turn`: with the local executor one request
        memo serves every valuation cell of a pool, task and sampling, so a cell counts only the requests
        earlier cells did not make). ``distinct=False``, or a cell of more than :data:`LISTED_COALITIONS`
        coalitions, counts every request instead (an upper bound, without playing the plan with stand-ins)."""
        from crl_envs.valuation.cost import distinct_calls_in_turn, memoised_models

        seen: set[str] = set()  # coalitions counted by an earlier cell
        calls_memo: dict[tuple, float] = {}  # calls per episode of (protocol, options, pool size, coalition size)
        turns: dict[str, list[tuple[int, list[tuple]]]] = {}  # cells whose requests one memo serves, in plan order
        costs: list[dict[str, float]] = []
        for cell in cells:
            s = cell.spec
            names = member_names(s.pool)
            kind, budget = cell.estimator_kind(len(names))
            # a protocol that computes its coalitions from answers plays only its one-member coalitions
            per_size = {1: float(len(names))} if cell.computed else kind.coalitions_per_size(len(names), budget)
            cell._refuse_large(kind, sum(per_size.values()))
            if not distinct or sum(per_size.values()) > LISTED_COALITIONS or (s.budget or 0) > LISTED_COALITIONS:
                costs.append(cell._every_request(names, per_size, calls_memo))
                continue
            est = kind(len(names), budget=budget, seed=s.seed, computed=cell.computed)
            played, runs, episodes = cell._distinct_runs(est, names, seen)
            memo_key = digest([s.pool, s.task, s.samples, s.seed, s.sampling]) \
                if config.executor.kind == "local" else cell.id
            turns.setdefault(memo_key, []).append((len(costs), played))
            costs.append({"runs": runs, "episodes": episodes, "calls": 0.0, "tokens": 0.0})
        for in_turn in turns.values():  # in plan order, each cell's count is what it adds
            s = cells[in_turn[0][0]].spec
            names = member_names(s.pool)
            counts = distinct_calls_in_turn([played for _, played in in_turn], names, s.task["n"] or 100,
                                            s.samples, memoised=memoised_models(s.pool, len(names)))
            for (index, _), calls in zip(in_turn, counts):
                costs[index].update(calls=calls, tokens=calls * cells[index].spec.sampling["max_new_tokens"])
        return costs

    def estimator_kind(self, n: int) -> tuple[type[Estimator], int | None]:
        """The estimator that values this cell's pool of ``n`` models, and the budget it takes (``None``
        for one that takes none)."""
        kind = estimator_class(estimator_for(n, self.spec.estimator, computed=self.computed))
        return kind, self.spec.budget if kind.budget_unit is not None else None

    @property
    def computed(self) -> bool:
        """Whether the protocol computes its coalitions from its members' one-member runs (an ``aggregate``
        rule, as vote): then only those are played (:attr:`crl_envs.valuation.CoalitionGame.computed`)."""
        from crl_envs import protocols

        made = protocols.env_class(protocols.get(self.spec.protocol["protocol"]))
        return made is not None and made.aggregate is not None

    def _refuse_large(self, kind: type[Estimator], runs: float) -> None:
        if runs > MAX_COALITION_RUNS:
            key = "valuation.budget" if kind.budget_unit is not None else \
                'valuation.estimator (e.g. {exact_up_to = 10, larger = "permutation"} with budget = 200)'
            raise StudyConfigError(f"study config: {self.id} plans about {runs:,.0f} coalition runs, more than the "
                                   f"{MAX_COALITION_RUNS:,} a cell runs; lower {key}")

    def _every_request(self, names: list[str], per_size: dict[int, float], calls_memo: dict[tuple, float]
                       ) -> dict[str, float]:
        """Every request of the cell counted, per coalition size (an upper bound on what the memo generates)."""
        s = self.spec
        n, questions = len(names), s.task["n"] or 100
        runs = episodes = calls = 0.0
        played = [(s.protocol["protocol"], s.protocol["options"], k, c) for k, c in per_size.items()]
        # then the models alone (one-member vote), less those the protocol's one-member coalitions already are
        plain_vote = s.protocol["protocol"] == "vote" and not s.protocol["options"]
        alone = float(n) - (per_size.get(1, 0.0) if plain_vote else 0.0)
        for proto, opts, k, count in [*played, ("vote", {}, 1, alone)]:
            memo = (proto, digest(opts), n, k)
            if memo not in calls_memo:
                calls_memo[memo] = calls_per_episode(proto, opts, names, list(range(k)))
            runs += count
            episodes += count * questions * s.samples
            calls += count * calls_memo[memo] * questions * s.samples
        return {"runs": runs, "episodes": episodes, "calls": calls, "tokens": calls * s.sampling["max_new_tokens"]}

    def _distinct_runs(self, est: Estimator, names: list[str], seen: set[str]) -> tuple[list[tuple], float, float]:
        """The coalitions ``est`` plays for this cell that no earlier cell played (``seen``, updated):
        ``(protocol, options, mask)`` each, with their count and episodes."""
        s = self.spec
        n, questions = len(names), s.task["n"] or 100
        common = [s.protocol, s.task, s.samples, s.seed, s.sampling]
        jobs = [("protocol", m) for m in est.coalitions() if m and (not self.computed or not m & (m - 1))] + \
            [("alone", 1 << i) for i in range(n)]
        played_runs: list[tuple] = []
        runs = episodes = 0.0
        for what, m in jobs:
            members = [i for i in range(n) if m >> i & 1]
            pool_desc = s.pool if isinstance(s.pool, str) else None
            who = [[i, pool_desc or s.pool[i]] for i in members]
            played = {"protocol": "vote", "options": {}} if what == "alone" else s.protocol
            key = digest([played, who, *common[1:]])  # vote's one-member coalitions are the models alone
            if key in seen:
                continue
            seen.add(key)
            proto, opts = ("vote", {}) if what == "alone" else (s.protocol["protocol"], s.protocol["options"])
            played_runs.append((proto, opts, m))
            runs += 1
            episodes += questions * s.samples
        return played_runs, runs, episodes

    # ------------------------------------------------------------------ run
    def run(self, context: CellContext) -> dict[str, Any]:
        pool = build_pool(self.spec.pool)
        if self.spec.sequential is not None:
            return self._run_sequential(pool, context)
        return self._result(pool, self._evaluate(pool, build_task(self.spec.task), context))

    def _evaluate(self, pool: Any, task: Any, context: CellContext) -> Any:
        """:func:`crl_envs.valuation.evaluate` of ``pool`` on ``task`` as the spec says (coalitions cached in
        ``out/coalitions``, on the study's executor)."""
        from crl_envs import valuation

        spec = self.spec
        kind, budget = self.estimator_kind(len(pool))
        return valuation.evaluate(
            spec.protocol["protocol"], pool, task, estimator=kind.name, samples=spec.samples, seed=spec.seed,
            budget=budget,
            cache_dir=Path(context.out) / "coalitions", progress=False, sampling=sampling_params(spec.sampling),
            options=spec.protocol["options"], ci_level=spec.ci_level,
            bootstrap_resamples=spec.bootstrap_resamples, executor=context.coalition_executor or "local")

    def _result(self, pool: Any, report: Any, more: str = "") -> dict[str, Any]:
        from crl_envs import protocols

        d = report.to_dict()
        d["family"] = protocols.family(self.spec.protocol["protocol"])
        d["fingerprints"] = {a: pool[a].fingerprint for a in pool.ids}
        comp = "shapley" if report.shapley is not None else "loo"
        kt = report.correlation[comp]["kendall"]
        summary = (f"v(N) {report.system.mean():.3f}, {comp} vs individual Kendall tau-b {kt.value:+.3f} "
                   f"(p {kt.p_value:.3f}); {report.system_evaluations + report.individual_evaluations} runs, "
                   f"{report.cached_evaluations} from cache{more}")
        return {"report": d, "summary": summary}

    def _run_sequential(self, pool: Any, context: CellContext) -> dict[str, Any]:
        """Play the questions look by look (:mod:`crl_envs.sequential`): each look values the next batch of the
        task's questions (:func:`crl_envs.valuation.evaluate`, its coalitions kept in the coalition cache, so a
        run that dies between looks replays none of the finished ones), reads the verdict on the questions so far
        (:func:`crl_envs.sequential.read_look`) and stops when the design's rule says
        (:func:`crl_envs.sequential.stop`). The result's report covers the questions used
        (:func:`crl_envs.valuation.concatenate`); ``sequential`` records the looks."""
        from crl_envs import sequential, valuation
        from crl_kit.serial import jsonable

        design = self.spec.design()
        task = build_task(self.spec.task)
        ids = [e.id for e in task.examples]
        if len(ids) < design.looks[-1]:
            raise StudyConfigError(f"study config: {self.id}: the task has {len(ids)} questions, the last look needs "
                                   f"{design.looks[-1]}; end valuation.sequential.looks at {len(ids)}")
        batches, trace, result, start = [], [], None, 0
        while result is None:
            k = len(trace)
            batch = self._evaluate(pool, task.subset(ids[start:design.looks[k]]), context)
            batches.append(batch)
            start = design.looks[k]
            report = valuation.concatenate(batches)
            measure, table = next(iter(report.crossfit_tables().items()))  # the headline: the study's verdict's
            look = sequential.read_look(report.individual.per_question, table, report.example_ids, design, k)
            trace.append({**look, "played": batch.system_evaluations + batch.individual_evaluations,
                          "from_cache": batch.cached_evaluations})
            result = sequential.stop(trace, design)
        record = {"verdict": result.verdict, "look": result.look, "questions": result.questions,
                  "stopped": result.stopped, "looks": list(design.looks), "measure": measure,
                  "coalitions": report.coalitions, "evaluations": result.questions * report.coalitions,
                  "fixed_evaluations": design.looks[-1] * report.coalitions, "trace": jsonable(result.trace)}
        out = self._result(pool, report, f"; sequential: {result.verdict} at look {result.look + 1} of "
                                         f"{len(design.looks)} ({result.questions} questions, {result.stopped})")
        return {**out, "sequential": record}

    def problem(self, result: dict[str, Any]) -> str | None:
        """What is wrong with ``result`` as this cell's report, read back from its file: every table the study's
        tables and fronts read is checked here (:func:`report_problem`), so an edited file runs the cell again."""
        problem = report_problem(result.get("report"))
        if problem is None and self.spec.sequential is not None:
            return sequential_problem(result.get("sequential"), self.spec.sequential["looks"],
                                      len(result["report"]["example_ids"]))
        return problem

    def add_to_tables(self, tables: TableInputs, results: Mapping[str, dict[str, Any]]) -> None:
        found = results[self.id]
        tables.valuation.append({"report": found["report"], "labels": self.labels(),
                                 **({"sequential": found["sequential"]} if "sequential" in found else {})})

    def labels(self) -> dict[str, str]:
        """The config labels of the setting it values (``pool``, ``protocol``, ``task``)."""
        return {"pool": self.spec.pool_label, "protocol": self.spec.protocol_label, "task": self.spec.task_label}


def sequential_fields(design: Any) -> dict[str, Any]:
    """A :class:`crl_envs.sequential.SequentialDesign` as a spec carries it: its fields, as plain data."""
    from dataclasses import asdict

    return {**asdict(design), "looks": list(design.looks)}


def sequential_problem(record: Any, looks: list[int], questions: int) -> str | None:
    """What is wrong with ``record`` as a sequential cell's ``sequential`` (``None``: nothing): its verdict, the
    look it stopped at (one of the design's), the questions used (that look's, and the report's) and its trace."""
    from crl_envs.stats import VERDICTS

    if not isinstance(record, dict) or not all(k in record for k in ("verdict", "look", "questions", "stopped",
                                                                      "trace", "evaluations", "fixed_evaluations")):
        return "no sequential record (verdict, look, questions, stopped, trace, evaluations)"
    look = record["look"]
    if record["verdict"] not in VERDICTS or not isinstance(look, int) or not 0 <= look < len(looks):
        return f"sequential: verdict {record['verdict']!r} at look {look!r} is not a verdict at one of {len(looks)} looks"
    if record["questions"] != looks[look] or questions != looks[look]:
        return (f"sequential: look {look} is {looks[look]} questions, the record says {record['questions']!r} and the "
                f"report holds {questions}")
    if not isinstance(record["trace"], list) or len(record["trace"]) != look + 1:
        return f"sequential: the trace does not hold the {look + 1} looks read"
    return None


#: The range of each measure's per-question values in a game of values in [0, 1] (the cost-aware measures and
#: interactions: finite numbers only, a cost-Shapley share may be negative).
#: A compositional measure is a weighted sum of coalition values: a question whose whole credit is one model's reads
#: 1.0000000000000004 in floating point, which is not a wrong table (found by tests/test_study_sequential.py).
ROUNDING = 1e-9
MEASURE_RANGES: dict[str, tuple[float | None, float | None]] = {
    "individual": (0.0, 1.0), "loo": (-1.0 - ROUNDING, 1.0 + ROUNDING), "shapley": (-1.0 - ROUNDING, 1.0 + ROUNDING),
    "banzhaf": (-1.0 - ROUNDING, 1.0 + ROUNDING)}
#: What :meth:`crl_envs.valuation.report.ValuationReport.from_dict` reads besides the tables.
REPORT_KEYS = ("protocol", "task", "names", "estimator", "empty_value", "system_evaluations", "coalitions",
               "samples", "seed", "budget", "ci_level", "bootstrap_resamples")


def report_problem(report: Any) -> str | None:
    """What is wrong with ``report`` (a :meth:`~crl_envs.valuation.report.ValuationReport.to_dict` read back from a
    cell file) as a valuation report (``None``: nothing): its keys, the system's and every measure's per-question
    table (models x questions, finite, in the measure's range), their draws, the coalition costs
    (:meth:`~crl_envs.valuation.spend.CoalitionCosts.problem`: values in [0, 1], no negative cost, known masks;
    the grand coalition's values are the system's), the cost measures and the interactions."""
    from crl_envs.valuation.spend import CoalitionCosts

    if not isinstance(report, dict) or not isinstance(report.get("ids"), list) \
            or not isinstance(report.get("example_ids"), list) or not isinstance(report.get("measures"), dict):
        return "no valuation report (ids, example_ids, measures)"
    missing = [k for k in REPORT_KEYS if k not in report]
    if missing:
        return f"the report lacks {', '.join(missing)}"
    n, q = len(report["ids"]), len(report["example_ids"])
    if not isinstance(report["names"], list) or len(report["names"]) != n:
        return f"report.names is not {n} names"
    problem = numbers_problem("report.system", report.get("system"), (q,), low=0, high=1)
    if problem:
        return problem
    if report.get("estimator") in ESTIMATORS and not isinstance(report["measures"].get("individual"), dict):
        return "no individual scores"
    for where, measures in (("measures", report["measures"]), ("cost_measures", report.get("cost_measures", {}))):
        if not isinstance(measures, dict):
            return f"report.{where} is not a table of measures"
        for name, m in measures.items():
            low, high = MEASURE_RANGES.get(name, (None, None)) if where == "measures" else (None, None)
            if not isinstance(m, dict):
                return f"report.{where}.{name} is not a measure"
            problem = numbers_problem(f"report.{where}.{name}.per_question", m.get("per_question"), (n, q),
                                      low=low, high=high)
            if problem:
                return problem
            draws = m.get("draws")
            if draws is not None and (not isinstance(draws, list) or not draws or not isinstance(draws[0], list)
                                      or numbers_problem("draws", draws, (n, len(draws[0])))):
                return f"report.{where}.{name}.draws is not {n} rows of finite numbers (models x draws)"
    costs = report.get("coalition_costs")
    if costs is not None:
        problem = CoalitionCosts.problem(costs, q)
        if problem:
            return f"report.coalition_costs: {problem}"
        full = (1 << n) - 1
        if full in costs["masks"] and costs["values"][costs["masks"].index(full)] != report["system"]:
            return "report.coalition_costs: the grand coalition's values are not the system's"
    interactions = report.get("interactions")
    if interactions is not None:
        pairs = interactions.get("interactions") if isinstance(interactions, dict) else None
        if not isinstance(pairs, list) or numbers_problem("report.interactions.per_question",
                                                          interactions.get("per_question"), (len(pairs), q)):
            return "report.interactions is not one row of finite numbers per interaction and question"
    return None

