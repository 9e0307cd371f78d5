"""What the cells of a training setting share (baseline, learning-rate sweep, training, crossplay): the
trainer a spec builds, the study options a trainer declares it takes, its episode cost, and the results an
evaluation gives. The trainers are read by what their classes declare, never by name:

- :func:`trainer_credit` — the trainer's credit under a spec's options (:meth:`trainers.PolicyGradientTrainer.credit_for`):
  its episodes per question and whether they play the system (:mod:`crl_envs.valuation.credit`);
- :data:`TRAINER_OPTIONS` — a study option reaches the trainers whose config class has its field
  (``training.shapley_coalitions`` -> ``coalitions_per_question``: the Shapley-credit trainer's);
- :func:`untrained_evaluation` — the untrained learner's evaluation (no trainer built: nothing trains);
- :func:`evaluation_with_rates` — scores and the learner's parse/verdict rates from one greedy play.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from crl_envs.study.cells.base import Cell, CellContext, StudyTracking, scores_problem
from crl_envs.study.cells.build import build_pool, build_task, calls_per_episode, member_names
from crl_envs.study.cells.specs import SettingSpec, TrainerSpec
from crl_kit.errors import RunError

if TYPE_CHECKING:  # pragma: no cover
    from crl_envs.study.config import StudyConfig
    from crl_envs.valuation.credit import Credit

#: ``study spec key -> trainer config field``: the option is given to every trainer whose config class has
#: the field (and is ``None`` in the spec of the others' cells, so their fingerprints do not depend on it).
TRAINER_OPTIONS = {"shapley_coalitions": "coalitions_per_question"}


def trainer_credit(name: str, options: Mapping[str, Any] | None = None) -> Credit:
    """Trainer ``name``'s credit (:meth:`trainers.PolicyGradientTrainer.credit_for`) under the study ``options``
    (``{"shapley_coalitions": 3}``; a spec's: :func:`study_options`) that its config class takes
    (:data:`TRAINER_OPTIONS`), its config's defaults otherwise."""
    import trainers

    cls = trainers.TRAINERS[name]
    chosen = {field: options[key] for key, field in TRAINER_OPTIONS.items()
              if options and options.get(key) is not None and takes_option(name, key)}
    return cls.credit_for(cls.config_class(**chosen))


def alone_fields(common: SettingSpec) -> dict[str, Any]:
    """The fields that move a setting's spec to the learner alone (``vote`` of its first learner, no setup options):
    where a trainer that does not play the system (GRPO) fits, so that every setting of that learner shares the
    cells (lr sweep, pilot)."""
    return {"setup_label": "alone", "protocol": "vote", "options": {},
            "learner": (common.learners or [common.learner])[0], "learners": None, "schedule": None}


def study_options(spec: SettingSpec) -> dict[str, Any]:
    """The study options of :data:`TRAINER_OPTIONS` a spec sets (``None`` each for a spec without a trainer)."""
    return {key: getattr(spec, key) if isinstance(spec, TrainerSpec) else None for key in TRAINER_OPTIONS}


def takes_option(name: str, key: str) -> bool:
    """Whether trainer ``name``'s config class has the field study option ``key`` sets (:data:`TRAINER_OPTIONS`)."""
    import trainers

    return TRAINER_OPTIONS[key] in {f.name for f in fields(trainers.TRAINERS[name].config_class)}


def untrained_evaluation(spec: SettingSpec) -> tuple[Any, dict[str, float | None]]:
    """The spec's untrained learner(s) on its held-out questions, greedy, as a trainer's ``evaluate()`` (with the
    system without the learners) and :func:`rates` would give them, without building a trainer: the pool's own
    models play (a trainer's untouched copies of them give the same numbers), seed 0."""
    from trainers.controls import without_learner

    pool = build_pool(spec.pool)
    held_out = build_task(spec.task, split=spec.eval_split, n=spec.n_eval)
    learners = list(spec.learners or [spec.learner])
    policies = {j: pool[j] for j in learners}
    settings = dict(max_new_tokens=spec.max_new_tokens, protocol_options=spec.options, seed=0)
    result, rates = evaluation_with_rates(spec.protocol, pool, held_out, policies, learners[0], **settings)
    return replace(result, without_learner=without_learner(spec.protocol, pool, held_out, learners, **settings)), rates


def build_trainer(spec: SettingSpec, trainer_name: str, seed: int, output_dir: Path | None,
                  tracking: StudyTracking | None = None):
    """The trainer a cell's spec describes, built (its pool loaded), not trained."""
    import trainers

    pool = build_pool(spec.pool)
    train = build_task(spec.task, split=spec.train_split, n=spec.n_train)
    held_out = build_task(spec.task, split=spec.eval_split, n=spec.n_eval)
    # a baseline cell has no budget: it only evaluates, with the config's defaults otherwise
    budget = {k: getattr(spec, k) for k in ("steps", "questions_per_step", "num_generations", "learning_rate")} \
        if isinstance(spec, TrainerSpec) else {}
    common = dict(**budget, max_new_tokens=spec.max_new_tokens, seed=seed, progress=False,
                  protocol_options=spec.options, output_dir=None if output_dir is None else str(output_dir))
    if tracking:  # the study's trackers (crl_envs.tracking), under the study's name
        common.update(trackers=tuple(tracking.trackers), tracking_project=tracking.project,
                      tracking_dir=tracking.dir)
    if isinstance(spec, TrainerSpec) and spec.lora:
        common["lora"] = trainers.LoraSettings(**spec.lora)
    for key, value in study_options(spec).items():
        if takes_option(trainer_name, key):
            common[TRAINER_OPTIONS[key]] = value
    if spec.schedule is not None:
        common["schedule"] = spec.schedule
    config = trainers.TRAINERS[trainer_name].config_class(**common)
    who = {"learners": spec.learners} if spec.learners is not None else {"learner": spec.learner}
    return trainers.TRAINERS[trainer_name](spec.protocol, pool, train, config=config, eval_task=held_out, **who)


def resolve_learning_rate(spec: SettingSpec, out: Path) -> SettingSpec:
    """``spec`` with a rule's ``learning_rate`` (``{"rule", "tolerance", "sweep": lr -> sweep cell fingerprint}``)
    replaced by the rate the rule picks from the finished sweep cells (:func:`crl_envs.study.gates.
    choose_learning_rate`), with ``learning_rate_choice`` set to its choice; a number (or a spec without a
    trainer) stays as it is. Each sweep file is read as the scheduler reads a cell's
    (:func:`~crl_envs.study.cells.base.read_result`: a regular file, this sweep cell's kind and fingerprint,
    accuracies in [0, 1]), never trusted because of its path.

    Raises:
        RunError: a sweep cell has not finished, or its file is not a valid result of it (the study runs sweep
            cells first and runs again a cell whose file is not valid: rerun it)."""
    if not isinstance(spec, TrainerSpec) or not isinstance(spec.learning_rate, Mapping):
        return spec
    rule = spec.learning_rate
    from crl_envs.study.gates import choose_learning_rate

    sweep = {float(lr): read_earlier_cell("lr_sweep", fingerprint, f"the learning-rate sweep cell file for lr {lr}", out)
             for lr, fingerprint in rule["sweep"].items()}
    chosen = choose_learning_rate(sweep, rule["rule"], rule["tolerance"])
    return replace(spec, learning_rate=chosen["learning_rate"], learning_rate_choice=chosen)


def resolve_pilot(spec: SettingSpec, out: Path) -> SettingSpec:
    """``spec`` with a pilot (``spec.pilot``: its rule and cells, :class:`~crl_envs.study.cells.specs.TrainerSpec`)
    replaced by the steps, learning rate and adapter its rule picks from the finished pilot cells
    (:func:`crl_envs.study.pilot.choose_pilot` on :func:`crl_envs.study.pilot.pilot_curve` of the spec's setting),
    with ``pilot_choice`` set to the choice; a spec without a pilot stays as it is. Each pilot file is read as the
    scheduler reads a cell's (:func:`~crl_envs.study.cells.base.read_result`), never trusted because of its path.

    Raises:
        RunError: a pilot cell has not finished, or its file is not a valid result of it (the study runs pilot
            cells first and runs again a cell whose file is not valid: rerun it)."""
    if not isinstance(spec, TrainerSpec) or spec.pilot is None or spec.pilot_choice is not None:
        return spec
    from crl_envs.study.pilot import choose_pilot, pilot_curve

    rule = spec.pilot
    chosen = choose_pilot(pilot_curve(read_pilot_cells(rule["cells"], out), rule["setup_label"]),
                          tolerance=rule["tolerance"], margin=rule["margin"], select=rule["select"])
    lora = rule["lora"] if chosen["adapter"] == "lora" else None
    return replace(spec, steps=chosen["steps"], learning_rate=chosen["learning_rate"], lora=lora, pilot_choice=chosen)


def read_pilot_cells(cells: list[Mapping[str, Any]], out: Path) -> list[dict[str, Any]]:
    """The results of the pilot cells ``cells`` (each ``{learning_rate, adapter, seed, fingerprint}``) in ``out``.

    Raises:
        RunError: one has not finished or its file is not a valid result of it."""
    return [read_earlier_cell("pilot", c["fingerprint"], f"the pilot cell for lr {c['learning_rate']:g}, "
                              f"{c['adapter']}, seed {c['seed']}", out) for c in cells]


def read_earlier_cell(kind: str, fingerprint: str, what: str, out: Path) -> dict[str, Any]:
    """The result of an earlier stage's cell a training cell reads (an lr sweep's, a pilot's), known by its
    fingerprint and read as the scheduler reads a cell's (:func:`~crl_envs.study.cells.base.read_result`: a regular
    file, this kind and fingerprint, its scores checked; the check reads no spec), never trusted because of its path.

    Raises:
        RunError: it has not finished, or its file is not a valid result of it (``what`` names it)."""
    from crl_envs.study.cells.base import cell_kind, read_result

    noun = {"lr_sweep": "sweep"}.get(kind, kind)
    path = out / "cells" / f"{fingerprint}.json"
    if not os.path.lexists(path):
        raise RunError(f"{what} ({path}) has not finished; rerun the study ({noun} cells run before training cells)")
    result, problem = read_result(path, cell_kind(kind)(f"{kind}/{fingerprint}", None, fingerprint))
    if problem is not None:
        raise RunError(f"{what} ({path}) is not a valid result: {problem}; rerun the study (the {noun} cell runs "
                       f"again before the training cells)")
    return result


def alone_scores(trainer: Any, task: Any) -> np.ndarray:
    """The trainer's (first) learner's greedy scores alone on ``task`` (vote with itself as the only member): what
    the lr rule and the pilot call the learner's own accuracy."""
    from trainers.rollout import rollout_episodes

    j = trainer.learners[0]
    episodes = rollout_episodes("vote", trainer.pool, task, j, trainer.policies[j], coalition=[j],
                                examples=[ex.id for ex in task], samples=1, seed=trainer.config.seed,
                                learner_sampling=trainer.eval_sampling, partner_sampling=trainer.eval_sampling)
    return np.array([ep.score for ep in episodes], dtype=float)


def scores(result: Any) -> dict[str, Any]:
    """An evaluation as a cell's result: per question ``system``, ``standalone`` (several learners: their
    mean) and, with several learners, each one's own under ``learners``."""
    out = {"example_ids": list(result.example_ids), "system": result.system.tolist(),
           "standalone": result.standalone.tolist()}
    if len(result.learners) > 1:
        out["learners"] = {j: np.asarray(v).tolist() for j, v in result.learners.items()}
    return out


def rates(trainer: Any, task: Any) -> dict[str, float | None]:
    """The trained learner's parse rate and, as a judge, verdict rate on ``task`` (:func:`learner_rates`)."""
    return learner_rates(trainer.protocol, trainer.pool, task, trainer.policies, trainer.learners[0],
                         max_new_tokens=trainer.config.max_new_tokens,
                         protocol_options=trainer.config.protocol_options, seed=trainer.config.seed)


def trained_evaluation(trainer: Any) -> tuple[Any, dict[str, float | None]]:
    """The trained learner(s) on the trainer's held-out questions: ``trainer.evaluate(controls=False)`` and
    :func:`learner_rates`, from one greedy play (the scores and the rates read the same episodes)."""
    return evaluation_with_rates(trainer.protocol, trainer.pool, trainer.eval_task, trainer.policies,
                                 trainer.learners[0], max_new_tokens=trainer.config.max_new_tokens,
                                 protocol_options=trainer.config.protocol_options, seed=trainer.config.seed)


def evaluation_with_rates(protocol: Any, pool: Any, task: Any, policies: dict[str, Any], learner: str, *,
                          max_new_tokens: int, protocol_options: dict[str, Any], seed: int
                          ) -> tuple[Any, dict[str, float | None]]:
    """:func:`trainers.evaluation.evaluate_policy` of ``policies`` on ``task`` and :func:`learner_rates` of
    ``learner``, from one greedy play (:func:`trainers.evaluation.greedy_episodes`: both read the same episodes,
    which they played twice before #55)."""
    from trainers.controls import answer_rates
    from trainers.evaluation import evaluate_policy, greedy_episodes

    settings = dict(max_new_tokens=max_new_tokens, protocol_options=protocol_options, seed=seed)
    episodes = greedy_episodes(protocol, pool, task, policies, **settings)
    return evaluate_policy(protocol, pool, task, policies, episodes=episodes, **settings), \
        answer_rates(episodes, learner)


def learner_rates(protocol: Any, pool: Any, task: Any, policies: dict[str, Any], learner: str, *, max_new_tokens: int,
                  protocol_options: dict[str, Any], seed: int) -> dict[str, float | None]:
    """``learner``'s parse rate and, as a judge, verdict rate on ``task`` (greedy, the whole system with
    ``policies`` playing the learners)."""
    from trainers.controls import answer_rates
    from trainers.evaluation import greedy_episodes

    episodes = greedy_episodes(protocol, pool, task, policies, max_new_tokens=max_new_tokens,
                               protocol_options=protocol_options, seed=seed)
    return answer_rates(episodes, learner)


@dataclass(frozen=True)
class TrainerCell(Cell):
    """A cell of a training setting: it builds a trainer from its spec, on ``spec.threads`` torch threads (the
    same reductions on every executor), with a learning-rate rule resolved from the finished sweep cells and a
    pilot from the finished pilot cells."""

    def run(self, context: CellContext) -> dict[str, Any]:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(self.spec.threads)
        try:
            out = Path(context.out)
            return self.run_trainer(resolve_pilot(resolve_learning_rate(self.spec, out), out), context)
        finally:
            torch.set_num_threads(threads)

    @classmethod
    def estimate_costs(cls, config: StudyConfig, cells: list[Cell], *, distinct: bool = True) -> list[dict[str, float]]:
        """Each cell's own :meth:`cost_estimate` (a trainer fit shares no work with another)."""
        return [c.cost_estimate(config) for c in cells]  # type: ignore[attr-defined]

    @abc.abstractmethod
    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """This cell's ``runs``, ``episodes``, ``calls`` and ``tokens`` before anything runs."""

    @abc.abstractmethod
    def run_trainer(self, spec: SettingSpec, context: CellContext) -> dict[str, Any]:
        """The work, with ``spec``'s learning rate (and pilot: steps, rate, adapter) resolved."""

    def problem(self, result: dict[str, Any]) -> str | None:
        ids = result.get("example_ids")
        if not isinstance(ids, list):
            return "no example_ids"
        return self.check_scores(result, len(ids))

    def check_scores(self, result: dict[str, Any], questions: int) -> str | None:
        """What is wrong with the result's scores on its ``questions`` questions (``None``: nothing)."""
        return scores_problem("system", result.get("system"), questions) or \
            scores_problem("standalone", result.get("standalone"), questions)

    @property
    def setting_key(self) -> tuple[str, str]:
        """``(setup label, task label)``: the training setting the cell belongs to."""
        return self.spec.setup_label, self.spec.task_label

    # ------------------------------------------------------------------ cost helpers
    def names(self) -> list[str]:
        """The pool's member names, as the cost estimate plays them (:func:`~crl_envs.study.cells.build.member_names`)."""
        return member_names(self.spec.pool)

    def calls(self, names: list[str], members: list[int]) -> float:
        """Model calls per episode of the setting's protocol played by ``members`` (indices into ``names``)."""
        return calls_per_episode(self.spec.protocol, self.spec.options, names, members)

    def training_episodes(self, per_episode: float) -> tuple[float, float]:
        """``(episodes, calls per episode)`` of the fit: steps x questions x the episodes per question its
        credit plays (:meth:`~crl_envs.valuation.credit.Credit.episodes_per_question`: G, plus LOO's
        counterfactuals, x Shapley's coalitions); a system episode costs the whole protocol's calls
        (``per_episode``), the learner alone one."""
        s = self.spec
        credit = trainer_credit(s.trainer, study_options(s))
        learners = len(s.learners or [s.learner])
        per_question = credit.episodes_per_question(s.num_generations, len(self.names()), learners)
        return float(s.steps * s.questions_per_step * per_question), (per_episode if credit.plays_system else 1.0)
