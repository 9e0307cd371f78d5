"""A training setting (one setup x task) as the cells planned in it see it: its labels and the spec every
cell of the setting shares (:attr:`Setting.common`), and what the kinds planned in it so far
(:attr:`Setting.planned`: a training cell reads the learning-rate sweep of its setting there)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from crl_envs.study.cells.base import Setting
from crl_envs.study.cells.specs import SettingSpec

if TYPE_CHECKING:  # pragma: no cover
    from crl_envs.study.config import StudyConfig

__all__ = ["Setting", "substitute", "training_settings"]


def substitute(options: Mapping[str, Any], learner: str) -> dict[str, Any]:
    """Protocol options with ``{learner}`` replaced by the learner's id (``judge = "{learner}"``)."""
    return {k: v.format(learner=learner) if isinstance(v, str) else v for k, v in options.items()}


def _several(setup: Any) -> dict[str, Any]:
    """``learners`` (and a ``schedule`` other than ``"joint"``) for a setup that trains several; ``None`` for
    one learner (absent from the spec's payload), so the cells of single-learner setups keep their fingerprints."""
    if len(setup.learners) < 2:
        return {"learners": None, "schedule": None}
    return {"learners": list(setup.learners), "schedule": setup.schedule if setup.schedule != "joint" else None}


def training_settings(config: StudyConfig) -> list[Setting]:
    """Every setup of ``[training]`` x each task it trains on (``SetupConfig.trained_tasks``; none without
    ``[training]``), setups first, each with its shared spec."""
    t = config.training
    if t is None:
        return []
    out = []
    for label, setup in t.setups.items():
        for task in setup.trained_tasks(t.tasks):
            learner = setup.learners[0] if setup.learners else t.learner
            common = SettingSpec(
                pool=config.pools[t.pool].describe(), pool_label=t.pool, learner=learner,
                setup_label=label, protocol=setup.protocol,
                options=substitute(setup.options, learner),
                task=config.tasks[task].describe(), task_label=task,
                train_split=t.train_split, eval_split=t.eval_split, n_train=t.n_train,
                n_eval=t.n_eval, max_new_tokens=config.sampling_for(task)["max_new_tokens"],
                threads=t.threads, **_several(setup))
            out.append(Setting(label, setup, task, common))
    return out
