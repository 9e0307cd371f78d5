"""A study: pools x protocols x tasks valued, and trainers compared, from one config; resumable, on one
process, local worker processes or Ray, with the paper's statistics computed from the cells' results.

    >>> from crl_envs import study
    >>> result = study.run("studies/paper-small.toml")  # every cell: long; tests/test_study.py  # doctest: +SKIP
    >>> result["valuation"]["summary"]["counts"], result["training"]["summary"]["crl_vs"]  # doctest: +SKIP

- :func:`load_config` — read and validate a config (one-line errors naming the key and the fix);
- :func:`plan` — its cells with their fingerprints and cost, before anything runs (``--dry-run``);
- :func:`run` — run what is not finished, then write ``study.json``, ``study.md`` and the plots.

``study.json`` holds ``valuation.settings`` (one entry per pool x protocol x task x seed: ``pool``,
``family``, ``protocol``, ``task``, ``n``, per-model ``individual`` / ``loo`` / ``shapley``, ``kendall_tau``
with ``tau_ci``, ``p_value``, ``min_p_value`` and ``verdict``, and the same per measure under
``measures``; from the report's stored coalition table and cost measures, per :mod:`crl_envs.study.costs`:
``cost`` (the cost game's Shapley or LOO per model, 1k tokens per question, with ``ci`` and
``grand_coalition``), ``value_per_1k`` (per model ``mean`` and ``ci``) and ``interactions`` (every pair's SII
with ``ci``, or ``skipped`` with the reason)), ``valuation.summary`` (``counts`` per verdict, ``alpha``, ``delta``, per family under
``families`` and per (pool, family) under ``pool_families`` a pooled verdict), ``valuation.design`` (what
the design can show, as the dry run printed it: per pool and question count the smallest attainable p and the
power of the verdict to call coupled at tau 0.5 and decoupled at tau 0, per planted spacing, with Monte Carlo SEs),
with ``[valuation.sequential]`` per setting ``sequential`` (the design's verdict, the look it came at, questions
used, how it stopped, question x coalition evaluations and the fixed design's) and their totals under
``valuation.summary.sequential``, ``training.design`` (the summary's power for a +2-point C-RL - placebo difference), ``training.settings``
(one per setup x task: ``protocol``, ``task``, ``seeds``, ``budget``,
per-trainer ``delta`` with ``ci`` and ``per_seed``/``per_seed_ci``, ``learner_alone`` (the learner's own
accuracy ``before`` and ``after`` per trainer and seed, and its ``delta``; with several learners
``learners_alone`` holds each one's, and with ``training.crossplay`` ``crossplay`` per trainer the gain with
training partners, with unseen partners and their ``gap``), ``learner_collapse``,
``strongest`` (ties list several), ``crl_vs`` per baseline: ``outcome`` win/tie/loss or "not comparable",
``p_value``, ``significant``; the controls (:mod:`crl_envs.study.gates`): ``without_learner`` (the system
without the learner on the same questions) and ``delta_vs_without_learner`` per trainer, ``vs_placebo`` per
trainer, ``gates``, ``comparable`` and ``not_comparable`` (the reason), ``signals`` (zero-variance share, parse
and verdict rates before and after)), ``training.lr_sweep`` (with ``[training.lr_rule]``: the rule, each swept
rate's learner-alone score and the rate chosen per setting), ``training.pilot`` (with ``[training.pilot]``: the rule,
per setting its curve over rate x adapter x checkpoint and the steps, rate and adapter chosen) and ``training.summary`` (``crl_vs`` per baseline,
over the comparable settings: ``not_comparable``, ``wins``, ``ties``, ``losses``,
``significant_wins`` (Holm across baselines), the ``across`` test over setting means (unit: the setting), the gain
``ratio`` with ``ci`` or why it is ``undefined``; per-trainer ``mean_gain`` and ``mean_learner_gain`` over the
comparable settings, ``largest_gain``). Fractions, not points.

Guarantees:

- **Content in fingerprints.** A cell's fingerprint covers its task's content: a task read from a
  ``path=`` file is hashed whole (every row), so a rewritten file reruns its cells on resume. A
  procedural task is its description; a hub dataset named only by id is keyed by its description.
- **Validated config.** Labels are 1 to 64 letters, digits, ``-``, ``_`` or ``.`` (so cell ids are
  injective and file names fit); task options are checked by loading the task when the config
  loads. A dry-run that passes means the run will not fail on its config.
- **Bounded plans.** A plan of more than :data:`~crl_envs.study.config.MAX_CELLS` cells, or a valuation
  cell of more than :data:`~crl_envs.study.config.MAX_COALITION_RUNS` coalition runs (or permutations),
  is refused before it is built, naming the figure and the key to change; large coalition counts are
  estimated per coalition size, never listed.
- **Validated reads.** A cell file that is not a valid result of its cell (not JSON, another cell's,
  scores missing, not finite, outside [0, 1] or of the wrong length) is recomputed, with a warning
  naming the file.
- **Locks.** Every cell (valuation, baseline, training, on every executor) is run under an exclusive
  ``flock`` on ``cells/<fingerprint>.lock``: the kernel releases it when its driver exits, however it
  exits, so a lock never outlives its holder; a driver waiting on a cell prints who holds it (pid,
  host, since) and takes it over the moment it is released.
- **No writes through links.** ``study.json``, ``study.md``, the plots and cell files are written to a
  temporary file then ``os.replace``-d (a symbolic link there is replaced, never followed); logs are
  opened with ``O_NOFOLLOW``. Names in ``study.md`` have bidi and control characters escaped
  (:func:`printable`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crl_envs.study.cells import TableInputs, cell_kinds
from crl_envs.study.config import StudyConfig, StudyConfigError, load_config
from crl_envs.study.costs import add_to_settings
from crl_envs.study.plan import CELL_VERSION, Cell, cells, design, estimate, sequential_plan, training_design
from crl_envs.study.scheduler import environment, load_result, run_cells
from crl_envs.study.stats import training_tables, valuation_tables
from crl_envs.study.tables import design_markdown, markdown, plots
from crl_envs.tracking import open_trackers
from crl_kit.safe_io import atomic_write_json, atomic_write_text
from crl_kit.serial import jsonable


def plan(config: StudyConfig | str | os.PathLike | Mapping[str, Any], *, out: str | os.PathLike | None = None
         ) -> list[Cell]:
    """Every cell of the study, with its fingerprint and estimated cost; nothing runs."""
    config = config if isinstance(config, StudyConfig) else load_config(config, out=out)
    return estimate(config, cells(config))


def describe_plan(config: StudyConfig, planned: list[Cell], *, probe: bool = False) -> str:
    """The ``--dry-run`` text: cells by kind (pending / done), coalition runs, episodes, model calls, tokens;
    then what the design can show (:func:`crl_envs.study.tables.design_markdown`: per valuation pool the smallest
    attainable p and the power of the verdict to call coupled at tau 0.5 and decoupled at tau 0; the training
    summary's power for a +2-point C-RL - placebo difference). With
    ``probe``, per training setting the probe's numbers and choice (:func:`crl_envs.study.probe.setting_probe`:
    seconds per setting on the zoo); and the estimated wall time (:func:`crl_envs.study.walltime.wall_estimate`);
    with ``[valuation.sequential]``, per pool the most question x coalition evaluations and the saving measured
    for its design (:func:`crl_envs.study.plan.sequential_plan`)."""
    rows = defaultdict(lambda: {"cells": 0, "done": 0, "runs": 0.0, "episodes": 0.0, "calls": 0.0, "tokens": 0.0})
    for c in planned:
        r = rows[c.kind]
        r["cells"] += 1
        if load_result(config.out, c) is not None:
            r["done"] += 1
            continue
        for k in ("runs", "episodes", "calls", "tokens"):
            r[k] += c.cost.get(k, 0.0)
    lines = [f"study {config.name}: {len(planned)} cells, output in {config.out}",
             "| cells | count | done | runs to play | episodes | model calls | generated tokens (at most) |",
             "|---|---|---|---|---|---|---|"]
    total = {"cells": 0, "done": 0, "runs": 0.0, "episodes": 0.0, "calls": 0.0, "tokens": 0.0}
    for cls in cell_kinds():
        if cls.kind in rows:
            r, what = rows[cls.kind], cls.runs_unit
            lines.append(f"| {cls.kind} | {r['cells']} | {r['done']} | {r['runs']:,.0f} {what} | {r['episodes']:,.0f} | "
                         f"{r['calls']:,.0f} | {r['tokens']:,.0f} |")
            for k in total:
                total[k] += r[k]
    lines.append(f"| all | {total['cells']} | {total['done']} | | {total['episodes']:,.0f} | {total['calls']:,.0f} | "
                 f"{total['tokens']:,.0f} |")
    lines.append("(valuation coalitions shared by several cells are counted once; tokens = calls x max_new_tokens)")
    t = config.training
    if t is not None:
        rate = (lambda s: f"lr by [training.lr_rule] ({t.lr_rule.trainer} sweep over "
                          f"{', '.join(f'{x:g}' for x in t.lr_rule.candidates)}, {t.lr_rule.select})") \
            if t.lr_rule is not None else (lambda s: "lr and adapter fixed by [training.pilot]") \
            if t.pilot is not None else (lambda s: f"lr {s.learning_rate:g}")
        steps = (lambda s: f"{s.steps} steps") if t.pilot is None else \
            (lambda s: f"steps fixed by [training.pilot] (cost planned at its largest, {t.pilot.steps[-1]})")
        budgets = "; ".join(f"{k}: {steps(s)} x {t.questions_per_step} questions x {t.num_generations} generations, "
                            f"{rate(s)}" for k, s in t.setups.items())
        lines.append(f"training: {', '.join(t.trainers)} x seeds {t.seeds}, every trainer with its setup's budget "
                     f"({budgets})" + ("" if len(t.seeds) >= 3 else "; fewer than 3 seeds: little power per setting"))
        several = {k: s for k, s in t.setups.items() if len(s.learners) > 1}
        if several:
            lines.append("several learners: " + "; ".join(f"{k}: {', '.join(s.learners)} ({s.schedule})"
                                                          for k, s in several.items()))
        cross = [c for c in planned if c.kind == "crossplay"]
        if cross:
            per = {c.spec.setup_label: c.cost for c in cross}
            lines.append("crossplay: per cell (each setting once on n_eval questions) " + "; ".join(
                f"{k}: {c['episodes'] / t.n_eval:.0f} settings, {c['calls']:,.0f} model calls" for k, c in per.items()))
        if t.pilot is not None:
            lines += _pilot_lines(config, planned)
        if probe:
            from crl_envs.study.probe import probe_markdown, setting_probe

            lines += probe_markdown(setting_probe(config))
    from crl_envs.study.walltime import format_wall, wall_estimate

    lines.append(format_wall(wall_estimate(config, planned)))
    lines += _sequential_lines(sequential_plan(config, planned))
    trained = training_design(config)
    power = design_markdown(design(config), trained) + _setting_sd_sensitivity(config, trained)
    return "\n".join(lines + ([""] + power if power else []))


def _sequential_lines(pools: list[dict[str, Any]]) -> list[str]:
    """The dry run's lines for ``[valuation.sequential]``: per pool the most evaluations and the measured saving."""
    if not pools:
        return []
    lines = [f"sequential design ([valuation.sequential], looks at {'/'.join(map(str, pools[0]['looks']))} questions): "
             f"the costs and wall time above are its maximum (every setting to its last look)"]
    for p in pools:
        head = (f"  {p['pool']} ({p['n']} models, {p['settings']} settings): at most {p['max_evaluations']:,.0f} "
                f"question x coalition evaluations")
        s = p["saving"]
        if s is None:
            lines.append(f"{head}; no saving measured for this design at {p['n']} models (measure it: python "
                         f"benchmarks/sequential_verdicts.py --sizes {p['n']}, with this design in its DESIGNS)")
            continue
        lines.append(f"{head}; measured saving for this design at {p['n']} models (benchmarks/sequential_verdicts.py, "
                     f"1,000 planted graded settings per tau): " + ", ".join(
                         f"{x:.2f}x at tau {t:g} (~{p['max_evaluations'] / x:,.0f})" for t, x in sorted(s.items())))
    return lines


def _pilot_lines(config: StudyConfig, planned: list[Cell]) -> list[str]:
    """The dry run's lines on ``[training.pilot]``: its cells, fits and checkpoints, and its estimated time."""
    from crl_envs.study.walltime import wall_estimate

    p = config.training.pilot
    cells = [c for c in planned if c.kind == "pilot"]
    groups = len({c.id.rsplit("/", 3)[0] for c in cells})
    estimate = wall_estimate(config, cells)
    wall = "" if estimate["seconds"] is None else f", about {estimate['seconds'] / 60:,.0f} wall minutes"
    return [f"pilot: {len(cells)} cells = {groups} fit group(s) x {len(p.rates)} rates ({', '.join(f'{x:g}' for x in p.rates)}) "
            f"x {len(p.adapters)} adapters ({', '.join(p.adapters)}) x {len(p.seeds)} seed(s) {list(p.seeds)}; {p.trainer}, "
            f"one fit each to {p.steps[-1]} steps scored at {', '.join(str(k) for k in p.steps)} on {p.n} {p.split} "
            f"questions (task seed {p.task_seed}), never the eval split; rule {p.select} (tolerance {p.tolerance:g}, "
            f"margin {p.margin:g}), fixed before the comparison",
            f"pilot estimated time: {estimate['cell_seconds'] / 60:,.0f} cell-minutes{wall} (stage 0, before every "
            f"training cell; included in the wall time below); training cells' steps, rate and adapter are the "
            f"pilot's choice, their cost planned at {p.steps[-1]} steps"]


#: The settings' SDs (fractions) at which the dry run restates the training power: the one planting figure no
#: run has measured (paper-small has one comparable setting).
SENSITIVITY_SETTING_SDS = (0.0, 0.01, 0.02)


def _setting_sd_sensitivity(config: StudyConfig, trained: dict[str, Any] | None) -> list[str]:
    """The training power restated at each of :data:`SENSITIVITY_SETTING_SDS` (the same design otherwise)."""
    from crl_envs.study.stats import training_power

    if trained is None or trained["settings"] < 2:
        return []
    t = config.training
    powers = [training_power(trained["settings"], trained["seeds"], trained["questions"],
                             [b for b in t.trainers if b != "crl"], difference=trained["difference"],
                             against=trained["against"], alpha=t.alpha, setting_sd=sd)
              for sd in SENSITIVITY_SETTING_SDS]
    return ["Training power if the settings' true differences spread with SD " + " / ".join(
        f"{100 * sd:g}" for sd in SENSITIVITY_SETTING_SDS) + " points: " + " / ".join(
        f"{p['value']:.2f}" for p in powers) + f" (± at most {max(p['se'] for p in powers):.3f})."]


def run(config: StudyConfig | str | os.PathLike | Mapping[str, Any], *, out: str | os.PathLike | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run every unfinished cell, then compute and write the tables; returns ``study.json``'s content."""
    config = config if isinstance(config, StudyConfig) else load_config(config, out=out)
    t0 = time.perf_counter()
    # the distinct-request estimate only weighs the progress bar's cells: without a bar, every request is
    # counted (the coalition checks still refuse an oversized cell before any work)
    planned = plan(config) if progress else estimate(config, cells(config), distinct=False)
    ran: list[str] = []  # the cells this driver ran (another driver on the same out may run others)
    results = run_cells(config, planned, progress=progress, on_result=lambda cell, _: ran.append(cell.id))
    wall = time.perf_counter() - t0
    study = write(config, planned, results, run_info={
        "cells": len(planned), "cached": len(planned) - len(ran), "executed": len(ran), "wall_seconds": wall,
        "executor": config.executor.kind, "environment": environment()})
    if config.trackers:  # the config, the run's figures and the tables, as one "study" run
        trackers = open_trackers(config.trackers, config.out, project=config.name, run="study",
                                 config=jsonable(_config_dict(config)))
        trackers.log_metrics({f"study/{k}": v for k, v in study["run"].items()}, 0)
        for name in ("study.json", "study.md"):
            trackers.log_artifact(config.out / name)
        trackers.close()
    return study


def report(config: StudyConfig | str | os.PathLike | Mapping[str, Any], *, out: str | os.PathLike | None = None
           ) -> dict[str, Any]:
    """Write the tables from the cells finished so far (run nothing): a look at a running or stopped
    study. ``run.missing`` lists the cells not finished; the tables cover the finished ones only."""
    config = config if isinstance(config, StudyConfig) else load_config(config, out=out)
    planned = plan(config)
    results = {c.id: r for c in planned if (r := load_result(config.out, c)) is not None}
    finished = [c for c in planned if c.id in results]
    # a training setting needs its baseline: leave out runs whose baseline has not finished
    bases = {c.setting_key for c in finished if c.kind == "baseline"}
    finished = [c for c in finished if c.kind != "training" or c.setting_key in bases]
    return write(config, finished, results, run_info={
        "cells": len(planned), "cached": len(finished), "executed": 0, "wall_seconds": 0.0,
        "missing": [c.id for c in planned if c.id not in {f.id for f in finished}],
        "executor": config.executor.kind, "environment": environment()})


def tables(config: StudyConfig, planned: list[Cell], results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The valuation and training tables from the cells' results."""
    out: dict[str, Any] = {}
    inputs = TableInputs()
    for c in planned:  # each kind adds its results (crl_envs.study.cells: add_to_tables)
        c.add_to_tables(inputs, results)
    vcells = inputs.valuation
    if config.valuation is not None and vcells:
        v = config.valuation
        out["valuation"] = valuation_tables(vcells, alpha=v.alpha, delta=v.delta, families=v.families,
                                            resamples=v.bootstrap_resamples)
        out["valuation"]["design"] = design(config)  # what the dry run printed before anything ran
        add_to_settings(vcells, out["valuation"]["settings"], resamples=v.bootstrap_resamples)
        if any(c["report"].get("coalition_costs") for c in vcells):
            from crl_envs.valuation.fronts import study_fronts

            out["fronts"] = study_fronts(vcells, resamples=v.bootstrap_resamples)
    baselines, runs, crossplay = inputs.baselines, inputs.runs, inputs.crossplay
    if config.training is not None and runs:
        t = config.training
        chosen = {key[0]: r["learning_rate"] for key, by in runs.items() for seeds in by.values() for r in seeds.values()
                  if "learning_rate" in r}  # under [training.lr_rule]: the rate the sweep chose
        piloted = {key[0]: r for key, by in runs.items() for seeds in by.values() for r in seeds.values()
                   if "pilot_choice" in r}  # under [training.pilot]: the steps and adapter it chose
        budgets = {k: {"steps": piloted[k]["steps"] if k in piloted else s.steps,
                       **({"adapter": piloted[k]["adapter"]} if k in piloted else {}),
                       "learning_rate": chosen.get(k, s.learning_rate),
                       "questions_per_step": t.questions_per_step, "num_generations": t.num_generations}
                   for k, s in t.setups.items()}
        out["training"] = training_tables(baselines, runs, t.trainers, ci_level=t.ci_level, alpha=t.alpha,
                                          resamples=t.bootstrap_resamples,
                                          protocols={k: s.protocol for k, s in t.setups.items()}, budgets=budgets,
                                          crossplay=crossplay)
        out["training"]["design"] = training_design(config)
        if t.lr_rule is not None:  # the sweep and the choice, per setting (before any comparison)
            out["training"]["lr_sweep"] = lr_sweep_record(config, planned, results)
        if t.pilot is not None:  # the pilot's curve and choice, per setting (before any comparison)
            out["training"]["pilot"] = pilot_record(config, planned, results)
    return out


def pilot_record(config: StudyConfig, planned: list[Cell], results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """``[training.pilot]`` and, per setting, its curve (:func:`crl_envs.study.pilot.pilot_curve`: per rate x
    adapter x checkpoint the learner's own and the system's validation scores) and the choice (the rule applied
    to the curve, as every training cell of the setting resolved it), from the pilot cells that finished."""
    from dataclasses import asdict

    from crl_envs.study.gates import learner_kept
    from crl_envs.study.pilot import choose_pilot, pilot_curve

    p = config.training.pilot
    by_fp = {c.fingerprint: results.get(c.id) for c in planned if c.kind == "pilot"}
    settings = {}
    for c in planned:
        if c.kind != "training" or c.spec.pilot is None:
            continue
        key = f"{c.spec.setup_label}/{c.spec.task_label}"
        if key in settings:
            continue
        done = [by_fp[x["fingerprint"]] for x in c.spec.pilot["cells"] if by_fp.get(x["fingerprint"])]
        curve = [{**row, "kept": learner_kept(row["before"], row["after"], p.tolerance)}
                 for row in (pilot_curve(done, c.spec.setup_label) if done else [])]
        complete = len(done) == len(c.spec.pilot["cells"])
        settings[key] = {"curve": curve, "fits": sum(r["fits"] for r in done), "cells": len(c.spec.pilot["cells"]),
                         **(choose_pilot(curve, tolerance=p.tolerance, margin=p.margin, select=p.select)
                            if curve and complete else {})}
    return {"rule": {k: list(x) if isinstance(x, tuple) else x for k, x in asdict(p).items()}, "settings": settings}


def lr_sweep_record(config: StudyConfig, planned: list[Cell], results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """``[training.lr_rule]`` and, per setting, each swept rate's learner-alone accuracy before and after on the
    selection questions and the rate the rule chose."""
    from dataclasses import asdict

    from crl_envs.study.gates import choose_learning_rate

    rule = config.training.lr_rule
    by_fp = {c.fingerprint: results.get(c.id) for c in planned if c.kind == "lr_sweep"}
    settings = {}
    for c in planned:
        if c.kind != "training" or not isinstance(c.spec.learning_rate, dict):
            continue
        key = f"{c.spec.setup_label}/{c.spec.task_label}"
        if key in settings:
            continue
        sweep = {float(lr): by_fp[fp] for lr, fp in c.spec.learning_rate["sweep"].items() if by_fp.get(fp)}
        settings[key] = {"sweep": {f"{lr:g}": {k: r[k] for k in ("before", "after", "zero_variance")}
                                   for lr, r in sorted(sweep.items())},
                         **(choose_learning_rate(sweep, rule.select, rule.tolerance) if sweep else {})}
    return {"rule": {**asdict(rule), "candidates": list(rule.candidates)}, "settings": settings}


def write(config: StudyConfig, planned: list[Cell], results: Mapping[str, dict[str, Any]],
          run_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``study.json``, ``study.md`` and the plots into ``config.out``; return the JSON's content."""
    study = {"name": config.name, "cell_version": CELL_VERSION, "config": jsonable(_config_dict(config)),
             "config_source": jsonable(config.raw),
             **jsonable(tables(config, planned, results)),
             "cells": {c.id: {"fingerprint": c.fingerprint, "seconds": results[c.id].get("seconds"),
                              "summary": results[c.id].get("summary")} for c in planned},
             "run": jsonable(dict(run_info or {}))}
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "study.json", study)
    atomic_write_text(out / "study.md", printable(markdown(study)))
    with tempfile.TemporaryDirectory(dir=out, prefix=".plots.") as tmp:  # then moved in, replacing any link
        for path in plots(study, Path(tmp)):
            os.replace(path, out / path.name)
    return json.loads(json.dumps(study))


#: Characters that reorder or hide text where it is shown (bidi controls, zero-width marks, C0/C1 controls
#: but newline and tab): a model or label name cannot rearrange a report.
_HIDDEN = {c: f"\\u{c:04x}" for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0), 0x061c,
                                        *range(0x200b, 0x2010), *range(0x202a, 0x202f), *range(0x2066, 0x206a),
                                        0xfeff]}


def printable(text: str) -> str:
    """``text`` with bidi controls (U+202E ...), zero-width marks and control characters escaped as
    ``\\uXXXX``: the one place the study's report escapes names."""
    return text.translate(_HIDDEN)


def _config_dict(config: StudyConfig) -> dict[str, Any]:
    from dataclasses import asdict

    d = {"pools": {k: p.describe() for k, p in config.pools.items()},
         "tasks": {k: t.describe() for k, t in config.tasks.items()},
         "protocols": {k: p.describe() for k, p in config.protocols.items()},
         "sampling": config.sampling, "executor": asdict(config.executor)}
    if config.valuation is not None:
        d["valuation"] = asdict(config.valuation)
        if d["valuation"]["sequential"] is None:  # a config without the table: study.json as before it existed
            del d["valuation"]["sequential"]
    if config.training is not None:
        d["training"] = asdict(config.training)
        if config.training.pilot is None:  # a study without a pilot records the config it recorded before it
            del d["training"]["pilot"]
    return d


__all__ = ["load_config", "StudyConfig", "StudyConfigError", "plan", "describe_plan", "run", "report", "tables", "write",
           "Cell", "cells"]
