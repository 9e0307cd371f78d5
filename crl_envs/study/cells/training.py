"""``training`` cells: one trainer's ``fit()`` with one seed in one setup x task, then its evaluation on the
held-out questions (the system without the learner is evaluated once, in the setting's baseline cell)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_envs.study.cells.base import Cell, CellContext, TableInputs
from crl_envs.study.cells.setting import Setting
from crl_envs.study.cells.specs import TrainingSpec
from crl_envs.study.cells.trained import TrainerCell, build_trainer, scores, takes_option, trained_evaluation
from crl_envs.study.config import StudyConfig


def pilot_rule(config: StudyConfig, setting: Setting) -> dict[str, Any]:
    """A training spec's ``pilot``: ``[training.pilot]``'s rule, the setting whose system score it reads, the
    LoRA settings of its ``"lora"`` adapter and the setting's pilot cells (their fingerprints: a training cell's
    fingerprint names what its steps, rate and adapter will be chosen from)."""
    from crl_envs.study.cells.pilot import pilot_lora

    p = config.training.pilot
    cells = [{"learning_rate": c.spec.learning_rate, "adapter": c.spec.adapter, "seed": c.spec.seed,
              "fingerprint": c.fingerprint} for c in setting.planned.get("pilot", [])]
    return {"select": p.select, "tolerance": p.tolerance, "margin": p.margin, "setup_label": setting.label,
            "lora": pilot_lora(config), "cells": cells}


@dataclass(frozen=True)
class TrainingCell(TrainerCell):
    """One trainer x seed of one setup x task, with the setup's budget and learning rate (or the lr rule's; or
    the steps, rate and adapter the pilot fixes)."""

    kind = "training"
    spec_class = TrainingSpec
    spec: TrainingSpec
    order = 30
    setting_order = 2

    @classmethod
    def plan_setting(cls, config: StudyConfig, setting: Setting) -> list[Cell]:
        t = config.training
        learning_rate: Any = setting.setup.learning_rate
        if t.lr_rule is not None:  # the rate the rule picks from the setting's sweep cells, when they finish
            sweep = setting.planned.get("lr_sweep", [])
            learning_rate = {"rule": t.lr_rule.select, "tolerance": t.lr_rule.tolerance,
                             "sweep": {str(c.spec.learning_rate): c.fingerprint for c in sweep}}
        steps, lora, pilot = setting.setup.steps, t.lora, None
        if t.pilot is not None:  # what the pilot picks from the setting's pilot cells, when they finish
            steps, learning_rate, lora, pilot = t.pilot.steps[-1], t.pilot.rates[0], None, pilot_rule(config, setting)
        out = []
        for trainer in t.trainers:
            for seed in t.seeds:
                spec = TrainingSpec.extending(
                    setting.common, trainer=trainer, seed=seed, steps=steps, learning_rate=learning_rate,
                    questions_per_step=t.questions_per_step, num_generations=t.num_generations,
                    shapley_coalitions=t.shapley_coalitions if takes_option(trainer, "shapley_coalitions") else None,
                    lora=lora, pilot=pilot)
                out.append(cls.make(f"training/{setting.label}/{setting.task}/{trainer}/seed{seed}", spec))
        return out

    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """The fit (with a pilot: at its largest checkpoint, the most it may choose), then the evaluation: the system once on the held-out questions (scores and rates, one play)."""
        names = self.names()
        per_episode = self.calls(names, list(range(len(names))))
        train_episodes, per_train = self.training_episodes(per_episode)
        evals = self.spec.n_eval
        calls = train_episodes * per_train + per_episode * evals
        return {"runs": 1.0, "episodes": train_episodes + evals, "calls": calls,
                "tokens": calls * self.spec.max_new_tokens}

    def add_to_tables(self, tables: TableInputs, results: Mapping[str, dict[str, Any]]) -> None:
        tables.runs[self.setting_key][self.spec.trainer][self.spec.seed] = results[self.id]

    def run_trainer(self, spec: TrainingSpec, context: CellContext) -> dict[str, Any]:
        from trainers.controls import zero_variance_share

        trainer = build_trainer(spec, spec.trainer, spec.seed, Path(context.out) / "train" / self.fingerprint,
                                context.tracking)
        trainer.fit()
        # the system without the learner: once, in the baseline cell; the scores and rates: one play
        result, learner_rates = trained_evaluation(trainer)
        zero = zero_variance_share(trainer.history)
        chosen = {"learning_rate": spec.learning_rate, **({"learning_rate_choice": spec.learning_rate_choice}
                                                           if spec.learning_rate_choice is not None else {}),
                  **({"steps": spec.steps, "adapter": "lora" if spec.lora else "full", "pilot_choice": spec.pilot_choice}
                     if spec.pilot_choice is not None else {})}
        return {**scores(result), "rollouts": trainer.rollouts, "zero_variance": zero,
                "rates": learner_rates, **chosen,
                "summary": f"after training: system {result.system_accuracy:.3f}, learner alone "
                           f"{result.standalone_accuracy:.3f}, {trainer.rollouts} rollouts, zero-variance groups "
                           f"{zero if zero is None else round(zero, 2)}, lr {spec.learning_rate:g}"}
