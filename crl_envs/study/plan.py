"""A study's plan: its cells, each keyed by a fingerprint of everything that changes its result, and
what they cost (episodes, model calls, an estimate of generated tokens) before anything runs.

Cells:

- ``valuation`` — one :func:`crl_envs.valuation.evaluate` call: a pool x protocol x task x seed;
- ``baseline`` — the untrained learner's greedy evaluation in one training setup x task (every
  trainer's Δ is measured from it);
- ``training`` — one trainer's ``fit()`` with one seed in one setup x task, then its evaluation;
- ``crossplay`` — with ``training.crossplay = true``, one per training cell: its learners, restored from
  the training cell's final checkpoint, played with partners they never trained with
  (:func:`trainers.crossplay`).

A cell's payload is plain data (specs, options, sizes), so it runs the same in this process, in a
worker process or on a Ray worker; its fingerprint hashes the payload with :data:`CELL_VERSION`.
Two configs that share a cell share its result. Models are named by spec: a model whose weights
change under the same spec is a new model only to the coalition cache below (keyed by agent
fingerprints); rerun its cells with ``--fresh`` or bump ``CELL_VERSION``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crl_envs.study.config import MAX_COALITION_RUNS, StudyConfig, StudyConfigError
from crl_kit.serial import digest

CELL_VERSION = 1
KINDS = ("valuation", "lr_sweep", "baseline", "training", "crossplay")
#: The order kinds run in: sweeps first (training cells read the rate they chose), crossplay last (it reads
#: training checkpoints); the rest together.
STAGE = {"lr_sweep": 0, "crossplay": 2}


def trainer_episodes(name: str) -> tuple[float, bool]:
    """Episodes per question and step (a multiple of G) and whether they play the system, as the trainer
    declares them (:attr:`trainers.PolicyGradientTrainer.episodes_per_question`, ``plays_system``)."""
    import trainers

    cls = trainers.TRAINERS[name]
    return cls.episodes_per_question, cls.plays_system


@dataclass(frozen=True)
class Cell:
    """One unit of work: its ``kind``, a readable ``id``, its payload ``spec`` and ``fingerprint``."""

    kind: str
    id: str
    spec: dict[str, Any]
    fingerprint: str
    cost: dict[str, float] = field(default_factory=dict, compare=False)


def _cell(kind: str, cell_id: str, spec: dict[str, Any]) -> Cell:
    return Cell(kind, cell_id, spec, digest({"version": CELL_VERSION, "kind": kind, **spec}))


def _substitute(options: Mapping[str, Any], learner: str) -> dict[str, Any]:
    return {k: v.format(learner=learner) if isinstance(v, str) else v for k, v in options.items()}


def _several(setup: Any) -> dict[str, Any]:
    """``learners`` (and a ``schedule`` other than ``"joint"``) for a setup that trains several; nothing for
    one learner, so the cells of single-learner setups keep their fingerprints."""
    if len(setup.learners) < 2:
        return {}
    return {"learners": list(setup.learners), **({"schedule": setup.schedule} if setup.schedule != "joint" else {})}


def cells(config: StudyConfig) -> list[Cell]:
    """Every cell of the study, valuation first, in a stable order."""
    out: list[Cell] = []
    v = config.valuation
    if v is not None:
        for pool in v.pools:
            for proto in v.protocols:
                for task in v.tasks_of(pool):
                    for seed in v.seeds:
                        spec = {
                            "pool": config.pools[pool].describe(), "pool_label": pool,
                            "protocol": config.protocols[proto].describe(), "protocol_label": proto,
                            "task": config.tasks[task].describe(), "task_label": task,
                            "estimator": v.estimator, "samples": v.samples, "seed": seed, "budget": v.budget,
                            "sampling": config.sampling_for(task), "ci_level": v.ci_level,
                            "bootstrap_resamples": v.bootstrap_resamples,
                        }
                        out.append(_cell("valuation", f"valuation/{pool}/{proto}/{task}/seed{seed}", spec))
    t = config.training
    seen_sweeps: dict[str, Cell] = {}
    if t is not None:
        for label, setup in t.setups.items():
            for task in t.tasks:
                learner = setup.learners[0] if setup.learners else t.learner
                common = {
                    "pool": config.pools[t.pool].describe(), "pool_label": t.pool, "learner": learner,
                    "setup_label": label, "protocol": setup.protocol,
                    "options": _substitute(setup.options, learner),
                    "task": config.tasks[task].describe(), "task_label": task,
                    "train_split": t.train_split, "eval_split": t.eval_split, "n_train": t.n_train,
                    "n_eval": t.n_eval, "max_new_tokens": config.sampling_for(task)["max_new_tokens"],
                    "threads": t.threads,
                    **_several(setup),
                }
                # the baseline also plays the system without the learner and reads parse/verdict rates (a result
                # written before it did is run again: runner.result_problem)
                out.append(_cell("baseline", f"baseline/{label}/{task}", common))
                learning_rate: Any = setup.learning_rate
                if t.lr_rule is not None:
                    sweep = _sweep_cells(config, common, setup.steps, seen_sweeps)
                    out.extend(c for c in sweep if c.id not in {o.id for o in out})
                    learning_rate = {"rule": t.lr_rule.select, "tolerance": t.lr_rule.tolerance,
                                     "sweep": {str(c.spec["learning_rate"]): c.fingerprint for c in sweep}}
                for trainer in t.trainers:
                    for seed in t.seeds:
                        spec = {**common, "trainer": trainer, "seed": seed, "steps": setup.steps,
                                "learning_rate": learning_rate, "questions_per_step": t.questions_per_step,
                                "num_generations": t.num_generations,
                                "shapley_coalitions": t.shapley_coalitions if trainer == "shapley_credit" else None,
                                "lora": t.lora}
                        out.append(_cell("training", f"training/{label}/{task}/{trainer}/seed{seed}", spec))
                        if t.crossplay:  # its own cell, after the training cell, from its final checkpoint
                            out.append(_cell("crossplay", f"crossplay/{label}/{task}/{trainer}/seed{seed}",
                                             {**spec, "training_fingerprint": out[-1].fingerprint}))
    ids = [c.id for c in out]
    if len(ids) != len(set(ids)):  # labels hold no '/' (config._check_label): ids are injective
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise StudyConfigError(f"study config: two cells share the id {twice[0]!r}; rename one of their labels")
    return out


def _sweep_cells(config: StudyConfig, common: dict[str, Any], steps: int, seen: dict[str, Cell]) -> list[Cell]:
    """The ``lr_sweep`` cells of one setting: ``lr_rule.trainer`` at each candidate rate, on the rule's seed,
    scored on its selection questions. A trainer that does not play the system (GRPO: the learner alone) sweeps
    the same way in every setup, so settings that share a learner and task share its cells."""

    rule = config.training.lr_rule
    _, system = trainer_episodes(rule.trainer)
    where = {"setup_label": common["setup_label"], "protocol": common["protocol"], "options": common["options"]} \
        if system else {"setup_label": "alone", "protocol": "vote", "options": {}}
    learners = common.get("learners", [common["learner"]])
    out = []
    for lr in rule.candidates:
        spec = {**common, **where, "trainer": rule.trainer, "seed": rule.seed, "steps": rule.steps or steps,
                "learning_rate": lr, "questions_per_step": config.training.questions_per_step,
                "num_generations": config.training.num_generations, "shapley_coalitions": None,
                "lora": config.training.lora, "selection": {"split": rule.split, "seed": rule.task_seed, "n": rule.n},
                "selection_n": rule.n}
        if not system:
            spec.pop("learners", None)
            spec.pop("schedule", None)
            spec["learner"] = learners[0]
        cell_id = f"lr_sweep/{where['setup_label']}/{'+'.join(learners[:1] if not system else learners)}/" \
                  f"{common['task_label']}/{spec['steps']}steps/lr{lr:g}"  # setups of other budgets: other cells
        cell = seen.setdefault(cell_id, _cell("lr_sweep", cell_id, spec))
        out.append(cell)
    return out


# ---------------------------------------------------------------------- cost
def _pool_size(pool: Any) -> int:
    if isinstance(pool, str):
        if pool == "zoo":
            import agents.zoo

            return len(agents.zoo.NAMES)
        import agents

        return len(agents.pool(pool))
    return len(pool)


def _names(pool: Any) -> list[str]:
    n = _pool_size(pool)
    if isinstance(pool, list):
        return [m if isinstance(m, str) else m.get("name", f"expert-{m['expert']}") for m in pool]
    return [f"{pool}-{i}" for i in range(n)]


def _calls(protocol: str, options: Mapping[str, Any], names: list[str], members: list[int]) -> float:
    """Model calls per episode of a coalition, played by scripted stand-ins on one arith question
    (a protocol's call count does not depend on the task)."""
    from crl_envs import protocols, tasks
    from crl_envs.valuation.cost import calls_per_episode

    return calls_per_episode(protocols.get(protocol), names, tasks.load("arith", n=1),
                             [f"model_{i}" for i in members], options)


def _crossplay_settings(names: list[str], learners: list[str]) -> list[list[str]]:
    """The coalitions of the distinct settings a crossplay cell plays (:func:`trainers.crossplay_settings`)."""
    from trainers.crossplay import crossplay_settings

    plan = crossplay_settings([f"model_{i}" for i in range(len(names))], learners)
    distinct = {(tuple(c), tuple(t)): list(c) for home, pairs in plan.values() for pair in (home, *pairs)
                for c, t in pair}
    return list(distinct.values())


def _masks(estimator: str, n: int, budget: int | None, seed: int) -> list[int]:
    from crl_envs.valuation.estimators import exact_masks, loo_masks, permutation_weights, sample_permutations

    if estimator == "exact":
        return [m for m in exact_masks(n) if m]
    if estimator == "loo":
        return loo_masks(n)
    perms = sample_permutations(n, budget, seed=seed, antithetic=estimator == "antithetic")
    return list(dict.fromkeys(loo_masks(n) + [m for m in permutation_weights(perms)[0] if m]))


#: Up to this many coalitions per cell the plan lists them (exact counts, coalitions shared between cells
#: counted once); above, it counts them per coalition size without listing them (an expectation for the
#: sampled estimators), so a plan costs the same whatever the budget.
LISTED_COALITIONS = 1_000


def _coalitions_per_size(estimator: str, n: int, budget: int | None) -> dict[int, float]:
    """Size -> the (expected) number of distinct non-empty coalitions ``estimator`` plays, unlisted: exact
    all ``C(n, k)``; LOO ``N`` and its ``n`` subsets of size ``n - 1``; a sampled estimator's ``budget``
    permutations give a uniform size-``k`` prefix each, ``C(n, k) (1 - (1 - 1 / C(n, k))^budget)`` distinct
    in expectation (the LOO coalitions always)."""
    if estimator == "exact":
        return {k: float(math.comb(n, k)) for k in range(1, n + 1)}
    loo = {n: 1.0, n - 1: float(n)} if n > 1 else {1: 1.0}
    if estimator == "loo":
        return loo
    out = {}
    for k in range(1, n + 1):
        c = math.comb(n, k)
        expected = 1.0 if c == 1 else -c * math.expm1(budget * math.log1p(-1.0 / c))
        out[k] = max(expected, loo.get(k, 0.0))
    return out


def _refuse_large(cell: Cell, estimator: str, runs: float) -> None:
    if runs > MAX_COALITION_RUNS:
        key = "valuation.budget" if estimator in ("permutation", "antithetic") else \
            'valuation.estimator (e.g. {exact_up_to = 10, larger = "permutation"} with budget = 200)'
        raise StudyConfigError(f"study config: {cell.id} plans about {runs:,.0f} coalition runs, more than the "
                               f"{MAX_COALITION_RUNS:,} a cell runs; lower {key}")


def design(config: StudyConfig) -> dict[str, Any] | None:
    """What the valuation design can show before anything runs: per pool its size, the smallest attainable
    p and the power at tau = 0.5 (:func:`crl_envs.study.stats.valuation_design`); ``None`` without a
    valuation."""
    from crl_envs.study.stats import valuation_design

    v = config.valuation
    if v is None:
        return None
    return valuation_design([(pool, _pool_size(config.pools[pool].describe())) for pool in v.pools
                             for _ in range(len(v.protocols) * len(v.tasks_of(pool)) * len(v.seeds))],
                            alpha=v.alpha, delta=v.delta)


def estimate(config: StudyConfig, plan: list[Cell], *, distinct: bool = True) -> list[Cell]:
    """The cells with ``cost`` filled: ``runs`` (coalition runs, or trainer fits), ``episodes``, ``calls``
    (model calls that will run: distinct requests, :func:`crl_envs.valuation.cost.distinct_calls_in_turn`:
    with the local executor one memo serves every valuation cell of a pool, task and sampling, so a cell
    counts only the requests earlier cells did not make) and ``tokens`` (an upper bound on generated
    tokens: calls x max_new_tokens).
    Valuation coalitions shared between cells (the same members at the same positions, protocol, task and
    seed) are counted once, where they first appear, as the coalition cache will play them once.
    ``distinct=False`` counts every request of a valuation cell instead (an upper bound, without playing
    the plan with stand-ins: seconds less on a study like paper-small's; for a run without a progress bar,
    which needs only the checks: a cell planning too many coalition runs is refused either way)."""
    from crl_envs.valuation.cost import distinct_calls_in_turn, memoised_models

    seen: set[str] = set()
    shared_memo: dict[str, list[tuple]] = {}  # valuation cells whose requests one memo serves, in plan order
    calls_memo: dict[tuple, float] = {}  # calls per episode of (protocol, options, pool size, coalition size)
    out = []
    for cell in plan:
        s = cell.spec
        if cell.kind == "valuation":
            names = _names(s["pool"])
            n = len(names)
            estimator = s["estimator"] if isinstance(s["estimator"], str) else \
                ("exact" if n <= s["estimator"]["exact_up_to"] else s["estimator"]["larger"])
            questions = s["task"]["n"] or 100
            per_size = _coalitions_per_size(estimator, n, s["budget"])
            _refuse_large(cell, estimator, sum(per_size.values()))
            runs = episodes = calls = 0.0
            if not distinct or sum(per_size.values()) > LISTED_COALITIONS or (s["budget"] or 0) > LISTED_COALITIONS:
                # too many coalitions to list (or to play through the distinct-request estimate): every
                # request counted, an upper bound on what the request memo will generate
                played = [(s["protocol"]["protocol"], s["protocol"]["options"], k, c) for k, c in per_size.items()]
                for proto, opts, k, count in [*played, ("vote", {}, 1, float(n))]:  # then the models alone
                    memo = (proto, digest(opts), n, k)
                    if memo not in calls_memo:
                        calls_memo[memo] = _calls(proto, opts, names, list(range(k)))
                    runs += count
                    episodes += count * questions * s["samples"]
                    calls += count * calls_memo[memo] * questions * s["samples"]
                out.append(Cell(cell.kind, cell.id, cell.spec, cell.fingerprint, {
                    "runs": runs, "episodes": episodes, "calls": calls,
                    "tokens": calls * s["sampling"]["max_new_tokens"]}))
                continue
            masks = _masks(estimator, n, s["budget"], s["seed"])
            common = [s["protocol"], s["task"], s["samples"], s["seed"], s["sampling"]]
            jobs = [("protocol", m) for m in masks] + [("alone", 1 << i) for i in range(n)]
            played_runs = []
            for what, m in jobs:
                members = [i for i in range(n) if m >> i & 1]
                pool_desc = s["pool"] if isinstance(s["pool"], str) else None
                who = [[i, pool_desc or s["pool"][i]] for i in members]
                played = {"protocol": "vote", "options": {}} if what == "alone" else s["protocol"]
                key = digest([played, who, *common[1:]])  # vote's one-member coalitions are the models alone
                if key in seen:
                    continue
                seen.add(key)
                proto, opts = ("vote", {}) if what == "alone" else (s["protocol"]["protocol"], s["protocol"]["options"])
                played_runs.append((proto, opts, m))
                runs += 1
                episodes += questions * s["samples"]
            # the request memo generates each distinct request once: counted below, over the cells that
            # share it (the local executor plays every valuation cell in this process, one memo for all)
            memo_key = digest([s["pool"], s["task"], s["samples"], s["seed"], s["sampling"]]) \
                if config.executor.kind == "local" else cell.id
            shared_memo.setdefault(memo_key, []).append((len(out), played_runs, names, questions, s))
            calls = tokens = 0.0
        else:
            names = _names(s["pool"])
            per_episode = _calls(s["protocol"], s["options"], names, list(range(len(names))))
            evals = s["n_eval"]
            # evaluations play the system twice (scores, then the learner's parse/verdict rates)
            if cell.kind == "baseline":  # and, with controls, the system without the learner
                without = _calls(s["protocol"], s["options"], names, list(range(len(names) - 1))) \
                    if len(names) > 1 else 0.0
                runs, episodes = 0.0, float(evals * (2 + bool(without)))
                calls = (2 * per_episode + without) * evals
            elif cell.kind == "crossplay":  # every distinct setting once on the held-out questions
                settings = _crossplay_settings(names, s.get("learners", [s["learner"]]))
                runs, episodes = 0.0, float(evals * len(settings))
                calls = sum(_calls(s["protocol"], s["options"], names, [int(a.split("_")[1]) for a in c]) * evals
                            for c in settings)
            else:
                per_question, system_episodes = trainer_episodes(s["trainer"])
                factor = per_question * (s["shapley_coalitions"] or 1)  # set for Shapley credit only
                train_episodes = s["steps"] * s["questions_per_step"] * s["num_generations"] * factor
                per_train = per_episode if system_episodes else 1.0
                runs = 1.0
                episodes = train_episodes + 2 * evals
                calls = train_episodes * per_train + 2 * per_episode * evals
                if cell.kind == "lr_sweep":  # its learner alone on the selection questions, before and after
                    episodes = train_episodes + 2.0 * s["selection_n"]
                    calls = train_episodes * per_train + 2.0 * s["selection_n"]
            tokens = calls * s["max_new_tokens"]
        out.append(Cell(cell.kind, cell.id, cell.spec, cell.fingerprint,
                        {"runs": runs, "episodes": episodes, "calls": calls, "tokens": tokens}))
    for cells_in_turn in shared_memo.values():  # in plan order, each cell's count is what it adds
        _, _, names, questions, s = cells_in_turn[0]
        counts = distinct_calls_in_turn([played for _, played, *_ in cells_in_turn], names, questions, s["samples"],
                                        memoised=memoised_models(s["pool"], len(names)))
        for (index, _, _, _, s), calls in zip(cells_in_turn, counts):
            out[index].cost.update(calls=calls, tokens=calls * s["sampling"]["max_new_tokens"])
    return out
