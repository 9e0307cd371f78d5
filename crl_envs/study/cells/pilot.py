"""``pilot`` cells (with ``[training.pilot]``, :class:`crl_envs.study.pilot.PilotConfig`): one (rate, adapter,
seed) of the pilot, its trainer fitted ONCE to the largest checkpoint and evaluated at each checkpoint on the way
(a :class:`trainers.TrainerCallback` at ``on_step_end``) on the pilot's validation questions (a train split, never
the eval split): the learner alone and the system of every setting the fit serves. They run first: a training
cell's steps, rate and adapter are what the rule picks from them
(:func:`crl_envs.study.cells.trained.resolve_pilot`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from crl_envs.study.cells.base import Cell, CellContext
from crl_envs.study.cells.build import build_task, calls_per_episode
from crl_envs.study.cells.setting import Setting, training_settings
from crl_envs.study.cells.specs import PilotSpec
from crl_envs.study.cells.trained import (
    TrainerCell,
    alone_fields,
    alone_scores,
    build_trainer,
    trainer_credit,
)
from crl_envs.study.config import StudyConfig
from crl_kit.validation import finite_number


def pilot_lora(config: StudyConfig) -> dict[str, Any]:
    """The LoRA settings of the pilot's ``"lora"`` adapter: ``[training] lora``'s, else
    :class:`trainers.LoraSettings`' defaults (a spec holds them whole: its fingerprint names them)."""
    import trainers

    return dataclasses.asdict(trainers.LoraSettings(**(config.training.lora or {})))


def fit_group(config: StudyConfig, setting: Setting) -> tuple[str, list[Setting]]:
    """The label of the pilot fits serving ``setting`` and every setting they serve: a trainer that plays the
    system fits per setting; one that plays the learner alone (GRPO) fits once per learner and task, and its
    fits are scored in each of those settings' systems."""
    if trainer_credit(config.training.pilot.trainer).plays_system:
        return setting.label, [setting]
    learner = setting.common.learner
    return f"alone/{learner}", [s for s in training_settings(config)
                                if s.common.learner == learner and s.task == setting.task]


@dataclass(frozen=True)
class PilotCell(TrainerCell):
    """One (rate, adapter, seed) of the pilot of one fit group (settings that share a learner alone share it)."""

    kind = "pilot"
    spec_class = PilotSpec
    spec: PilotSpec
    order = 15
    stage = 0
    setting_order = 1
    shared = True

    @classmethod
    def plan_setting(cls, config: StudyConfig, setting: Setting) -> list[Cell]:
        """``pilot.trainer`` at each rate x adapter x pilot seed, to the largest checkpoint, scored at each on the
        validation questions (the same ids for every setting of a fit group: planned once)."""
        t = config.training
        pilot = t.pilot
        if pilot is None:
            return []
        group, served = fit_group(config, setting)
        system = trainer_credit(pilot.trainer).plays_system
        common = setting.common
        where = {} if system else alone_fields(common)
        systems = [{"setup_label": s.label, "protocol": s.common.protocol, "options": s.common.options} for s in served]
        out = []
        for adapter in pilot.adapters:
            for lr in pilot.rates:
                for seed in pilot.seeds:
                    spec = PilotSpec.extending(
                        common, **where, trainer=pilot.trainer, seed=seed, steps=pilot.steps[-1], learning_rate=lr,
                        questions_per_step=t.questions_per_step, num_generations=t.num_generations,
                        shapley_coalitions=None, lora=pilot_lora(config) if adapter == "lora" else None,
                        adapter=adapter, checkpoints=list(pilot.steps), systems=systems,
                        validation={"split": pilot.split, "seed": pilot.task_seed, "n": pilot.n})
                    out.append(cls.make(f"pilot/{group}/{common.task_label}/{adapter}/lr{lr:g}/seed{seed}", spec))
        return out

    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """One fit to the largest checkpoint, then before it and at each checkpoint the learner alone and every
        served system on the validation questions."""
        names = self.names()
        members = list(range(len(names)))
        train_episodes, per_train = self.training_episodes(self.calls(names, members))
        n, points = self.spec.validation["n"], len(self.spec.checkpoints) + 1
        per_point = n * (1.0 + sum(calls_per_episode(s["protocol"], s["options"], names, members)
                                   for s in self.spec.systems))
        calls = train_episodes * per_train + points * per_point
        return {"runs": 1.0, "episodes": train_episodes + points * n * (1 + len(self.spec.systems)), "calls": calls,
                "tokens": calls * self.spec.max_new_tokens}

    def run_trainer(self, spec: PilotSpec, context: CellContext) -> dict[str, Any]:
        """The fit, once, to ``spec.steps``; before it and at each checkpoint the learner alone and each system
        on the validation questions (never the eval split)."""

        from trainers.controls import zero_variance_share

        v = spec.validation
        questions = build_task({**spec.task, "seed": v["seed"]}, split=v["split"], n=v["n"])
        trainer = build_trainer(spec, spec.trainer, spec.seed, None)
        before = _scored(trainer, spec, questions)
        curve: list[dict[str, Any]] = []
        hook = checkpoint_scorer(spec, questions, curve)
        trainer.callbacks.append(hook)
        trainer.fit()
        lora = "lora" if spec.lora else "full"
        last = curve[-1]
        return {"learning_rate": spec.learning_rate, "adapter": spec.adapter, "seed": spec.seed, "before": before,
                "curve": curve, "fits": hook.fits, "steps_trained": trainer.state.step,
                "example_ids": [ex.id for ex in questions], "zero_variance": zero_variance_share(trainer.history),
                "summary": f"lr {spec.learning_rate:g} {lora}: learner alone on the validation questions "
                           f"{before['alone']:.3f} -> {last['alone']:.3f} at {last['steps']} steps, one fit scored at "
                           f"{len(curve)} checkpoints"}

    def check_scores(self, result: dict[str, Any], questions: int) -> str | None:
        curve, before = result.get("curve"), result.get("before")
        labels = [s["setup_label"] for s in self.spec.systems] if self.spec is not None else None
        if not isinstance(curve, list) or not curve or not isinstance(before, dict):
            return "no curve"
        for point in [before, *curve]:
            systems = point.get("systems") if isinstance(point, dict) else None
            if not isinstance(systems, dict) or (labels is not None and sorted(systems) != sorted(labels)):
                return "a checkpoint without its systems' scores"
            if not all((x := finite_number(y)) is not None and 0 <= x <= 1 for y in [point.get("alone"), *systems.values()]):
                return "a checkpoint's scores are not accuracies in [0, 1]"
        return None


def checkpoint_scorer(spec: PilotSpec, questions: Any, curve: list[dict[str, Any]]) -> Any:
    """A :class:`trainers.TrainerCallback` that appends ``{"steps", "alone", "systems"}`` to ``curve`` at each of
    ``spec.checkpoints`` (greedy play on ``questions``, torch's generator forked) and counts the fits (one). The fit
    goes on as an unscored fit would: tests/test_study_pilot.py checks its weights bit for bit."""
    import torch

    import trainers

    checkpoints = set(spec.checkpoints)

    class CheckpointScores(trainers.TrainerCallback):
        def __init__(self) -> None:
            self.fits = 0

        def on_train_begin(self, trainer: Any, steps: int) -> None:
            self.fits += 1

        def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
            if trainer.state.step in checkpoints:
                with torch.random.fork_rng(devices=[]):
                    curve.append({"steps": trainer.state.step, **_scored(trainer, spec, questions)})

    return CheckpointScores()


def _scored(trainer: Any, spec: PilotSpec, questions: Any) -> dict[str, Any]:
    """The learner's own accuracy and each served system's on ``questions`` (greedy), with the trainer's policies
    now: ``{"alone", "systems": {setup_label: score}}``."""
    from trainers.evaluation import evaluate_policy

    systems = {}
    for s in spec.systems:
        result = evaluate_policy(s["protocol"], trainer.pool, questions, dict(trainer.policies),
                                 max_new_tokens=trainer.config.max_new_tokens, protocol_options=s["options"],
                                 seed=trainer.config.seed)
        systems[s["setup_label"]] = float(result.system.mean())
    return {"alone": float(alone_scores(trainer, questions).mean()), "systems": systems}
