"""``crossplay`` cells (``training.crossplay = true``): one per training cell, planned right after it: its
learners, restored from the training cell's final checkpoint, played with the partners they trained with
and with partners they never trained with (:func:`trainers.trainer_crossplay`). They run last."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crl_envs.study.cells.base import Cell, CellContext, TableInputs
from crl_envs.study.cells.specs import CrossplaySpec
from crl_envs.study.cells.trained import TrainerCell, build_trainer
from crl_envs.study.config import StudyConfig
from crl_kit.errors import RunError
from crl_kit.validation import numbers_problem


@dataclass(frozen=True)
class CrossplayCell(TrainerCell):
    """A training cell's learners with unseen partners."""

    kind = "crossplay"
    spec_class = CrossplaySpec
    spec: CrossplaySpec
    order = 40
    stage = 2
    follows = "training"
    runs_unit = "trainer fits (restored from checkpoints)"

    @classmethod
    def plan_after(cls, config: StudyConfig, cell: Cell) -> list[Cell]:
        if not config.training.crossplay:
            return []
        s = cell.spec
        return [cls.make(f"crossplay/{s.setup_label}/{s.task_label}/{s.trainer}/seed{s.seed}",
                         CrossplaySpec.extending(s, training_fingerprint=cell.fingerprint))]

    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """Every distinct setting once on the held-out questions."""
        s, evals = self.spec, self.spec.n_eval
        names = self.names()
        settings = _crossplay_settings(names, s.learners or [s.learner])
        calls = sum(self.calls(names, [int(a.split("_")[1]) for a in c]) * evals for c in settings)
        return {"runs": 0.0, "episodes": float(evals * len(settings)), "calls": calls,
                "tokens": calls * s.max_new_tokens}

    def add_to_tables(self, tables: TableInputs, results: Mapping[str, dict[str, Any]]) -> None:
        tables.crossplay[self.setting_key][self.spec.trainer][self.spec.seed] = results[self.id]

    def run_trainer(self, spec: CrossplaySpec, context: CellContext) -> dict[str, Any]:
        """The training cell's learners, restored from its final checkpoint, played with the partners they
        trained with and with partners they never trained with (:func:`trainers.trainer_crossplay`).

        Raises:
            RunError: no final checkpoint (rerun the training cell with ``--fresh``)."""
        import trainers

        train_dir = Path(context.out) / "train" / spec.training_fingerprint
        trainer = build_trainer(spec, spec.trainer, spec.seed, train_dir)
        final = train_dir / f"checkpoint-{spec.steps:06d}"
        if not (final / "state.json").exists():
            raise RunError(f"crossplay needs the training cell's final checkpoint {final}, which is missing; rerun "
                           f"the study with --fresh for {spec.setup_label}/{spec.trainer}/seed{spec.seed}")
        trainer.load_checkpoint(final)
        cross = trainers.trainer_crossplay(trainer)
        learners = {j: {**r.to_dict(), **{k: np.asarray(v).tolist() for k, v in r.per_question.items()}}
                    for j, r in cross.learners.items()}
        gap = np.mean([r.gap.delta for r in cross.learners.values()])
        return {"example_ids": list(cross.example_ids), "learners": learners,
                "settings": {k: float(np.mean(v)) for k, v in cross.settings.items()},
                "summary": f"cross-play gap (trained-with minus unseen partners' gain) {100 * gap:+.1f} points, "
                           f"{len(cross.settings)} settings"}

    def check_scores(self, result: dict[str, Any], questions: int) -> str | None:
        learners = result.get("learners")
        if not isinstance(learners, dict) or not learners:
            return "no learners"
        for j, r in learners.items():
            for k in ("trained_with_gain", "unseen_gain"):
                v = r.get(k) if isinstance(r, dict) else None
                if numbers_problem(k, v, (questions,), low=-1, high=1):
                    return f"learners.{j}.{k} is not {questions} gains in [-1, 1]"
        return None


def _crossplay_settings(names: list[str], learners: list[str]) -> list[list[str]]:
    """The coalitions of the distinct settings a crossplay cell plays (:func:`trainers.crossplay_settings`)."""
    from trainers.crossplay import crossplay_settings

    plan = crossplay_settings([f"model_{i}" for i in range(len(names))], learners)
    distinct = {(tuple(c), tuple(t)): list(c) for home, pairs in plan.values() for pair in (home, *pairs)
                for c, t in pair}
    return list(distinct.values())
