"""Issue #47, training runs: a checkpoint records each pool member's content fingerprint and refuses a
resume onto other weights under the same name; a damaged checkpoint is found before anything loads (one
line naming the file) and the previous one is used; metrics.jsonl never repeats steps after a resume and is
never written through a link; trackers continue a resumed run, mark a killed one, and keep two studies
that share one MLFLOW_TRACKING_URI apart."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid

import pytest
import torch

import agents
import agents.zoo
from agents.hf import HFAgent
from crl_envs.tracking import open_trackers
from crl_kit.errors import ConfigError, CrlEnvsError
from trainers import CRLConfig, CRLTrainer

SMALL = dict(steps=2, questions_per_step=2, num_generations=2, max_new_tokens=8, learning_rate=1e-2, progress=False,
             seed=1, save_steps=1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trainer(out, pool=None, learners=("model_1",), **changes) -> CRLTrainer:
    pool = pool if pool is not None else agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])
    return CRLTrainer("vote", pool, "arith", learners=list(learners),
                      config=CRLConfig(**{**SMALL, "output_dir": str(out), **changes}))


def steps_logged(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_onto_other_weights_under_the_same_name_is_refused(tmp_path):
    model = tmp_path / "learner"
    shutil.copytree(agents.zoo.model_dir("zoo-rookie"), model)

    def pool():
        return agents.pool([HFAgent(agents.zoo.model_dir("zoo-nocarry")), HFAgent(model, name="learner")])

    trainer(tmp_path / "run", pool(), steps=1).fit()
    shutil.copy(agents.zoo.model_dir("zoo-nocarry") / "model.safetensors", model / "model.safetensors")
    again = trainer(tmp_path / "run", pool(), steps=2)
    with pytest.raises(ConfigError, match="bases") as e:
        again.fit()
    assert "\n" not in str(e.value) and again.step == 0


def test_a_damaged_checkpoint_is_found_before_loading_and_the_previous_one_used(tmp_path, capsys):
    out = tmp_path / "run"
    first = trainer(out, learners=("model_1", "model_2"))
    first.fit()
    one_step = trainer(tmp_path / "one", learners=("model_1", "model_2"), steps=1)
    one_step.fit()
    latest = out / "checkpoint-000002"
    (latest / "model_2" / "trainable.pt").unlink()

    fresh = trainer(out, learners=("model_1", "model_2"))
    before = {k: v.clone() for k, v in fresh.trainable_state("model_1").items()}
    with pytest.raises(CrlEnvsError, match="model_2/trainable.pt is missing") as e:
        fresh.load_checkpoint(latest)
    assert "\n" not in str(e.value)
    after = fresh.trainable_state("model_1")
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing loaded: model_1 untouched

    assert fresh.load_checkpoint() is True
    assert "skipping a damaged checkpoint" in capsys.readouterr().out
    assert fresh.step == 1
    expected = one_step.trainable_state("model_2")
    assert all(torch.equal(expected[k], v) for k, v in fresh.trainable_state("model_2").items())

    optimizer = out / "checkpoint-000001" / "model_1" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:-200])  # truncated
    with pytest.raises(CrlEnvsError, match="optimizer.pt is damaged"):
        trainer(out, learners=("model_1", "model_2")).load_checkpoint(out / "checkpoint-000001")


def test_metrics_never_repeat_steps_after_a_run_stopped_before_its_first_checkpoint(tmp_path):
    out = tmp_path / "run"
    trainer(out).fit()
    for checkpoint in out.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)  # stopped before its checkpoint was written
    assert steps_logged(out) == [1, 2]
    again = trainer(out, steps=3)
    again.fit()
    assert steps_logged(out) == [1, 2, 3] and [m["step"] for m in again.history] == [1, 2, 3]


def test_metrics_are_never_written_through_a_link(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    os.symlink(target, out / "metrics.jsonl")
    with pytest.raises(OSError):
        trainer(out).fit()
    assert target.read_text() == "precious\n"


@pytest.fixture
def mlflow_client():
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    return MlflowClient


def test_a_resumed_run_continues_its_mlflow_and_trackio_runs(tmp_path, monkeypatch, mlflow_client):
    if "trackio" not in sys.modules:
        monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    pytest.importorskip("trackio")
    from trackio.sqlite_storage import SQLiteStorage

    project = f"p-{uuid.uuid4().hex[:8]}"
    for step in (1, 2):  # the same cell, opened again when it resumes
        trackers = open_trackers(["mlflow", "trackio"], tmp_path, project=project, run="cell")
        trackers.log_metrics({"train/reward_mean": step / 4}, step)
        trackers.close()
    client = mlflow_client(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name(project).experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/reward_mean")) == [1, 2]
    assert run.info.status == "FINISHED"
    assert SQLiteStorage.get_runs(project) == ["cell"]
    assert [s["step"] for s in SQLiteStorage.get_logs(project, "cell")] == [1, 2]


def test_a_killed_training_run_is_not_left_running(tmp_path, mlflow_client):
    run = trainer(tmp_path / "run", trackers=("mlflow",), tracking_project="killed")
    step = run.train_step

    def killed_at_step_2():
        if run.step == 1:
            raise KeyboardInterrupt
        return step()

    run.train_step = killed_at_step_2
    with pytest.raises(KeyboardInterrupt):
        run.fit()
    client = mlflow_client(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    [record] = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert record.info.status == "KILLED"


def test_two_studies_on_one_tracking_uri_keep_their_artifacts_apart(tmp_path, monkeypatch, mlflow_client):
    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ids = {}
    for study in ("a", "b"):
        out = tmp_path / study
        out.mkdir()
        (out / "study.md").write_text(f"study {study}\n")
        trackers = open_trackers(["mlflow"], out, project="small", run="study")
        trackers.log_artifact(out / "study.md")
        ids[study] = trackers.trackers[0].run_id
        trackers.close()
    client = mlflow_client(tracking_uri=uri)
    assert ids["a"] != ids["b"]
    for study in ("a", "b"):
        where = client.get_run(ids[study]).info.artifact_uri
        assert where.startswith((tmp_path / study).as_uri() + "/"), where
    assert [p.read_text() for p in (tmp_path / "a").rglob("study.md")] == ["study a\n"] * 2  # its own, and its copy
