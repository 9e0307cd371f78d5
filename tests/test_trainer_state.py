"""Trainer state and control (issue #52, item 5): a callback stops training or asks for a checkpoint through
``trainer.control``; checkpoints read and write ``trainer.state``; a resume reproduces the uninterrupted run; an
old two-argument ``collect`` is found once, at construction. Zoo pool, vote, tiny steps."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import agents
import agents.zoo
import trainers.base
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, TrainerCallback, TrainerControl, TrainerState

SMALL = dict(questions_per_step=2, num_generations=2, max_new_tokens=8, learning_rate=1e-4, progress=False, seed=5,
             tensorboard=False)
#: the metrics that measure wall time, not what was computed
TIMINGS = {"seconds", "rollout_seconds", "tokens_per_second"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pool():
    return agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])


@pytest.fixture(scope="module")
def train():
    return tasks.load("arith", split="train", n=8, **agents.zoo.TASK_OPTIONS)


def computed(history):
    return [{k: v for k, v in m.items() if k not in TIMINGS} for m in history]


class StopAt(TrainerCallback):
    """Stops the fit once ``step`` steps are done; records the statuses fit() ends with."""

    def __init__(self, step):
        self.step, self.ends = step, []

    def on_step_end(self, trainer, metrics):
        if trainer.state.step >= self.step:
            trainer.control.should_stop = True

    def on_train_end(self, trainer, status):
        self.ends.append(status)


class SaveAt(TrainerCallback):
    """Asks for a checkpoint after step ``step``; records the checkpoints written."""

    def __init__(self, step):
        self.step, self.saved = step, []

    def on_step_end(self, trainer, metrics):
        if trainer.state.step == self.step:
            trainer.control.should_save = True

    def on_save(self, trainer, path):
        self.saved.append(path.name)


def test_a_callback_stops_training_after_step_k(pool, train, tmp_path):
    stop = StopAt(2)
    trainer = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[stop],
                         config=CRLConfig(**SMALL, steps=5, save_steps=100, output_dir=str(tmp_path)))
    history = trainer.fit()
    assert [m["step"] for m in history] == [1, 2] and trainer.state.step == 2 and stop.ends == ["FINISHED"]
    # the stopped fit's last step is checkpointed, as a fit's last step is; nothing else (save_steps=100)
    assert [p.name for p in trainer.checkpoints()] == ["checkpoint-000002"]
    saved = json.loads((tmp_path / "checkpoint-000002" / "state.json").read_text())
    assert {k: saved[k] for k in ("step", "rollouts")} == trainer.state.to_dict() == {"step": 2, "rollouts": 8}
    # a new fit gets a new control: it resumes and trains on (the callback stops it after its first step)
    assert [m["step"] for m in trainer.fit(3)] == [1, 2, 3]


def test_a_callback_asks_for_a_save_and_a_checkpoint_appears(pool, train, tmp_path):
    save = SaveAt(1)
    trainer = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[save],
                         config=CRLConfig(**SMALL, steps=3, save_steps=100, output_dir=str(tmp_path)))
    trainer.fit()
    # step 1 on the callback's request, step 3 as the fit's last; step 2 nowhere (the request was not carried)
    assert save.saved == ["checkpoint-000001", "checkpoint-000003"]
    assert [p.name for p in trainer.checkpoints()] == save.saved
    assert trainer.checkpoint_problem(tmp_path / "checkpoint-000001") == ""
    assert json.loads((tmp_path / "checkpoint-000001" / "state.json").read_text())["step"] == 1


def test_a_save_asked_for_without_an_output_dir_fails_in_one_line(pool, train):
    stop = StopAt(99)  # records the status
    trainer = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[SaveAt(1), stop],
                         config=CRLConfig(**SMALL, steps=2))
    with pytest.raises(ValueError, match="control.should_save at step 1 but config.output_dir is unset") as e:
        trainer.fit()
    assert "\n" not in str(e.value) and stop.ends == ["FAILED"]


def test_a_callback_can_cancel_a_scheduled_save(pool, train, tmp_path):
    class NoSaves(TrainerCallback):
        def on_step_end(self, trainer, metrics):
            trainer.control.should_save = False

    trainer = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[NoSaves()],
                         config=CRLConfig(**SMALL, steps=2, save_steps=1, output_dir=str(tmp_path)))
    trainer.fit()
    assert trainer.checkpoints() == [] and trainer.state.step == 2


def test_resume_from_a_stopped_run_reproduces_the_uninterrupted_history(pool, train, tmp_path):
    config = dict(**SMALL, steps=3, save_steps=100)
    whole = CRLTrainer("vote", pool, train, learner="model_1",
                       config=CRLConfig(**config, output_dir=str(tmp_path / "whole")))
    uninterrupted = whole.fit()
    first = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[StopAt(2)],
                       config=CRLConfig(**config, output_dir=str(tmp_path / "parts")))
    assert len(first.fit()) == 2
    torch.manual_seed(1234)  # the resume restores torch's RNG from the checkpoint: this must not matter
    second = CRLTrainer("vote", pool, train, learner="model_1",
                        config=CRLConfig(**config, output_dir=str(tmp_path / "parts")))
    resumed = second.fit()
    assert computed(resumed) == computed(uninterrupted) and second.state.rollouts == whole.state.rollouts
    for name, tensor in whole.trainable_state().items():
        assert torch.equal(tensor, second.trainable_state()[name]), name


def test_an_old_two_argument_collect_is_found_once_at_construction(pool, train, monkeypatch):
    class TwoArguments(CRLTrainer):
        def collect(self, examples, seed):
            return super().collect(examples, seed)

    with pytest.warns(DeprecationWarning, match=r"TwoArguments.collect without a training parameter"):
        old = TwoArguments("vote", pool, train, learner="model_1", config=CRLConfig(**SMALL, steps=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the built-in trainers take training=: no warning
        new = CRLTrainer("vote", pool, train, learner="model_1", config=CRLConfig(**SMALL, steps=1))

    def sniffed(*args):
        raise AssertionError("a signature was inspected during a step")

    monkeypatch.setattr(trainers.base, "_takes_training", sniffed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert computed([old.train_step()]) == computed([new.train_step()])


def test_evaluation_controls_are_cached_in_a_declared_place(pool, train, monkeypatch):
    import trainers.controls

    trainer = CRLTrainer("vote", pool, train, learner="model_1", config=CRLConfig(**SMALL, steps=1), eval_task=train)
    first = trainer.evaluate()
    assert list(trainer.without_learner_scores) == [(train.name, tuple(ex.id for ex in train))]
    assert "_without_learner" not in vars(trainer)

    def played_again(*args, **kwargs):
        raise AssertionError("the system without the learner was played again")

    monkeypatch.setattr(trainers.controls, "without_learner", played_again)
    assert trainer.evaluate().without_learner.tolist() == first.without_learner.tolist()


def test_state_and_control_are_checked_and_reset():
    with pytest.raises(ValueError, match=r"TrainerState.step must be >= 0, got -1"):
        TrainerState(step=-1)
    with pytest.raises(TypeError, match=r"TrainerState.rollouts must be an int, got 1.5"):
        TrainerState(rollouts=1.5)
    state = TrainerState()
    state.restore({"step": 4, "rollouts": 32, "config": {}})
    assert state.to_dict() == {"step": 4, "rollouts": 32}
    control = TrainerControl(should_stop=True, should_save=True)
    control.new_step()
    assert (control.should_stop, control.should_save) == (True, False)


def test_the_baseline_cell_evaluates_without_a_trainer_as_a_trainer_would(tmp_path):
    """crl_envs.study's baseline cell builds no trainer (nothing trains): its scores, the system without the
    learner and the learner's rates (one play for scores and rates, #55) equal an untrained trainer's evaluate()
    and rates (two plays), one learner and two."""
    from dataclasses import replace
    from pathlib import Path

    import numpy as np

    from crl_envs import study
    from crl_envs.study.cells.trained import (
        build_trainer,
        rates,
        scores,
        trained_evaluation,
        untrained_evaluation,
    )

    committed = json.loads((Path(__file__).resolve().parents[1] / "docs" / "study.json").read_text())
    config = study.load_config(committed["config_source"], out=tmp_path)
    cell = min((c for c in study.plan(config) if c.kind == "baseline"), key=lambda c: (c.spec.n_eval, c.id))
    one = replace(cell.spec, n_eval=16)
    partner = next(a for a in build_trainer(one, "crl", 0, None).pool.ids if a != one.learner)
    two = replace(one, learners=[one.learner, partner])
    for spec in (one, two):
        trainer = build_trainer(spec, "crl", 0, None)
        before = trainer.evaluate()
        result, learner_rates = untrained_evaluation(spec)
        assert scores(result) == scores(before)
        assert np.array_equal(result.without_learner, before.without_learner)
        assert learner_rates == rates(trainer, trainer.eval_task)
        # a training cell's evaluation: the scores and rates of one play, as evaluate() and rates() give them apart
        one_play, one_play_rates = trained_evaluation(trainer)
        assert scores(one_play) == scores(before) and one_play_rates == learner_rates
