"""``baseline`` cells: the untrained learner's greedy evaluation in one training setting (every trainer's Δ
is measured from it), with the controls: the system without the learner, and the learner's parse and
verdict rates. A result written before baselines carried the controls is run again (:meth:`problem`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from crl_envs.study.cells.base import Cell, CellContext, TableInputs, scores_problem
from crl_envs.study.cells.setting import Setting
from crl_envs.study.cells.specs import SettingSpec
from crl_envs.study.cells.trained import TrainerCell, scores, untrained_evaluation
from crl_envs.study.config import StudyConfig


@dataclass(frozen=True)
class BaselineCell(TrainerCell):
    """The untrained learner evaluated in one setup x task."""

    kind = "baseline"
    spec_class = SettingSpec
    order = 20
    setting_order = 0

    @classmethod
    def plan_setting(cls, config: StudyConfig, setting: Setting) -> list[Cell]:
        return [cls.make(f"baseline/{setting.label}/{setting.task}", setting.common)]

    def cost_estimate(self, config: StudyConfig) -> dict[str, float]:
        """The evaluation plays the system once (its scores and the learner's parse/verdict rates read the same
        episodes: :func:`~crl_envs.study.cells.trained.evaluation_with_rates`) and the system without the learner
        once."""
        s, names = self.spec, self.names()
        n = len(names)
        per_episode = self.calls(names, list(range(n)))
        without = self.calls(names, list(range(n - 1))) if n > 1 else 0.0
        evals = s.n_eval
        calls = (per_episode + without) * evals
        return {"runs": 0.0, "episodes": float(evals * (1 + bool(without))), "calls": calls,
                "tokens": calls * s.max_new_tokens}

    def run_trainer(self, spec: SettingSpec, context: CellContext) -> dict[str, Any]:
        result, rates = untrained_evaluation(spec)  # nothing trains: no trainer is built
        return {**scores(result), "without_learner": np.asarray(result.without_learner).tolist(),
                "rates": rates,
                "summary": f"system {result.system_accuracy:.3f}, learner alone {result.standalone_accuracy:.3f}, "
                           f"without the learner {np.mean(result.without_learner):.3f}"}

    def add_to_tables(self, tables: TableInputs, results: Mapping[str, dict[str, Any]]) -> None:
        tables.baselines[self.setting_key] = results[self.id]

    def check_scores(self, result: dict[str, Any], questions: int) -> str | None:
        # written before baselines carried the controls (#46): run again
        return super().check_scores(result, questions) or \
            scores_problem("without_learner", result.get("without_learner"), questions)
