"""The trainer's parts (issue #44): callbacks around fit() (the progress bar, metrics.jsonl and the trackers
are callbacks too; ``callbacks=[...]`` adds yours), who trains a step passed to ``collect`` as ``training``,
and the names that moved out of trainers.base still importable from it. Zoo pool, vote, two tiny steps."""

from __future__ import annotations

import json

import pytest
import torch

import agents
import agents.zoo
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, TrainerCallback
from trainers.callbacks import MetricsFileCallback, ProgressCallback, TrackersCallback

SMALL = dict(steps=2, questions_per_step=2, num_generations=2, max_new_tokens=8, learning_rate=1e-4, progress=False,
             seed=1)
ROOKIES = ["model_1", "model_2"]


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


class Recorder(TrainerCallback):
    """Every hook call, with the trainer's step when it came."""

    def __init__(self):
        self.calls = []

    def on_train_begin(self, trainer, steps):
        self.calls.append(("begin", trainer.step, steps))

    def on_log(self, trainer, metrics):
        self.calls.append(("log", metrics["step"], trainer.history[-1] is metrics))

    def on_step_end(self, trainer, metrics):
        self.calls.append(("step_end", trainer.step))

    def on_save(self, trainer, path):
        self.calls.append(("save", path.name))

    def on_train_end(self, trainer, status):
        self.calls.append(("end", status))


def test_callbacks_are_called_around_fit_in_order_after_the_defaults(pool, train, tmp_path):
    recorder = Recorder()
    trainer = CRLTrainer("vote", pool, train, learner="model_1", callbacks=[recorder],
                         config=CRLConfig(**SMALL, save_steps=1, output_dir=str(tmp_path), tensorboard=False))
    assert [type(c) for c in trainer.callbacks] == [ProgressCallback, MetricsFileCallback, TrackersCallback, Recorder]
    history = trainer.fit()
    assert recorder.calls == [("begin", 0, 2),
                              ("log", 1, True), ("step_end", 1), ("save", "checkpoint-000001"),
                              ("log", 2, True), ("step_end", 2), ("save", "checkpoint-000002"),
                              ("end", "FINISHED")]
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == json.loads(json.dumps(history))  # the default metrics file, unchanged


def test_a_fit_that_raises_ends_its_callbacks_as_failed(pool, train):
    recorder = Recorder()
    trainer = CRLTrainer("vote", pool, train, learner="model_1", config=CRLConfig(**SMALL), callbacks=[recorder])
    step = trainer.train_step

    def fails_at_step_2():
        if trainer.step == 1:
            raise RuntimeError("boom")
        return step()

    trainer.train_step = fails_at_step_2
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert recorder.calls[-2:] == [("step_end", 1), ("end", "FAILED")]


def test_callbacks_must_be_instances_checked_before_any_model_loads():
    specs = ["zoo:zoo-nocarry", "zoo:zoo-rookie"]
    with pytest.raises(TypeError, match=r"pass an instance, e.g. MyCallback\(\)") as e:
        CRLTrainer("vote", specs, "arith", learner="model_1", callbacks=[Recorder])
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="must be a list of trainers.TrainerCallback instances"):
        CRLTrainer("vote", specs, "arith", learner="model_1", callbacks=Recorder())


def test_who_trains_a_step_reaches_collect_as_an_argument(pool, train):
    """Round robin: each step's learner is passed to collect(); a collect written with two parameters still
    runs (with one deprecation warning when the trainer is built), reading trainer.training, and both give the
    same step."""

    class Passed(CRLTrainer):
        seen: list

        def collect(self, examples, seed, training=None):
            self.seen.append(list(training))
            return super().collect(examples, seed, training)

    class TwoArguments(CRLTrainer):
        def collect(self, examples, seed):
            return super().collect(examples, seed)

    config = CRLConfig(**SMALL, schedule="round_robin")
    passed = Passed("vote", pool, train, learners=ROOKIES, config=config)
    passed.seen = []
    new_steps = [passed.train_step() for _ in range(2)]
    with pytest.warns(DeprecationWarning, match="TwoArguments.collect without a training parameter is deprecated"):
        old_style = TwoArguments("vote", pool, train, learners=ROOKIES, config=config)  # found once, here
    old_steps = [old_style.train_step() for _ in range(2)]
    for a, b in zip(new_steps, old_steps):
        assert a["training"] == b["training"] and a["loss/" + a["training"][0]] == b["loss/" + b["training"][0]]
    assert passed.seen == [["model_1"], ["model_2"]] and old_style.training == ["model_2"]


def test_the_names_that_moved_out_of_trainers_base_still_import_from_it():
    import trainers.base as base
    from trainers import checkpoints, evaluation, learners

    assert base.merged_weights is learners.merged_weights and base._LearnerState is learners.LearnerState
    assert base._learner_ids is learners.learner_ids and base._check_learner_specs is learners.check_learner_specs
    assert base.EvalResult is evaluation.EvalResult and base.compare is evaluation.compare
    assert base.evaluate_policy is evaluation.evaluate_policy and base.RESUMABLE_FIELDS is checkpoints.RESUMABLE_FIELDS
