"""``lr_sweep`` cells (with ``[training.lr_rule]``): one candidate learning rate of the sweep, the rule's
trainer trained at it on the rule's seed and scored alone on its selection questions (never the eval
split). They run first: a training cell's rate is the one the rule picks from them
(:func:`crl_envs.study.cells.trained.resolve_learning_rate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crl_envs.study.cells.base import Cell, CellContext
from crl_envs.study.cells.build import build_task
from crl_envs.study.cells.setting import Setting
from crl_envs.study.cells.specs import SweepSpec
from crl_envs.study.cells.trained import (
    TrainerCell,
    alone_fields,
    alone_scores,
    build_trainer,
    trainer_credit,
)
from crl_envs.study.config import StudyConfig
from crl_kit.validation import finite_number


@dataclass(frozen=True)
class SweepCell(TrainerCell):
    """One learning rate of the sweep of one setting (settings that share a learner and task share the cells of
    a trainer that does not play the system)."""

    kind = "lr_sweep"
    spec_class = SweepSpec
    spec: SweepSpec
    order = 10
    stage = 0
    setting_order = 1
    shared = True

    @classmethod
    def plan_setting(cls, config: StudyConfig, setting: Setting) -> list[Cell]:
        """``lr_rule.trainer`` at each candidate rate, on the rule's seed, scored on its selection questions. A
        trainer that does not play the system (GRPO: the learner alone) sweeps the same way in every setup, so
        settings that share a learner and task share its cells (the same ids: planned once)."""
        t = config.training
        rule = t.lr_rule
        if rule is None:
            return []
        common = setting.common
        system = trainer_credit(rule.trainer).plays_system
        learners = common.learners or [common.learner]
        where = {} if system else alone_fields(common)  # a trainer that plays alone: its first learner alone
        out = []
        for lr in rule.candidates:
            spec = SweepSpec.extending(
                common, **where, trainer=rule.trainer, seed=rule.seed, steps=rule.steps or setting.setup.steps,
                learning_rate=lr, questions_per_step=t.questions_per_step, num_generations=t.num_generations,
                shapley_coalitions=None, lora=t.lora,
                selection={"split": rule.split, "seed": rule.task_seed, "n": rule.n}, selection_n=rule.n)
            cell_id = f"lr_sweep/{spec.setup_label}/{'+'.join(learners[:1] if not system else learners)}/" \
                      f"{common.task_label}/{spec.steps}steps/lr{lr:g}"  # setups of other budgets: other cells
            out.append(cls.make(cell_id, spec))
        return out

    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """The fit, then its learner alone on the selection questions, before and after."""
        names = self.names()
        train_episodes, per_train = self.training_episodes(self.calls(names, list(range(len(names)))))
        selection = self.spec.selection_n
        calls = train_episodes * per_train + 2.0 * selection
        return {"runs": 1.0, "episodes": train_episodes + 2.0 * selection, "calls": calls,
                "tokens": calls * self.spec.max_new_tokens}

    def run_trainer(self, spec: SweepSpec, context: CellContext) -> dict[str, Any]:
        """The learner alone on the selection questions before and after ``spec.trainer`` trains at the rate
        (on the sweep's seed); never the eval split."""
        from trainers.controls import zero_variance_share

        sel = spec.selection
        questions = build_task({**spec.task, "seed": sel["seed"]}, split=sel["split"], n=sel["n"])
        trainer = build_trainer(spec, spec.trainer, spec.seed, None)
        before = alone_scores(trainer, questions)
        trainer.fit()
        after = alone_scores(trainer, questions)
        return {"learning_rate": spec.learning_rate, "before": float(before.mean()), "after": float(after.mean()),
                "example_ids": [ex.id for ex in questions], "zero_variance": zero_variance_share(trainer.history),
                "summary": f"lr {spec.learning_rate:g}: learner alone on the selection questions "
                           f"{before.mean():.3f} -> {after.mean():.3f}"}

    def check_scores(self, result: dict[str, Any], questions: int) -> str | None:
        ok = all((x := finite_number(result.get(k))) is not None and 0 <= x <= 1 for k in ("before", "after"))
        return None if ok else "before/after are not accuracies in [0, 1]"

