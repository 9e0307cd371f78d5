"""Experiment trackers (crl_envs.tracking): names checked before any work, and a C-RL run on the zoo inside a
tiny study logged offline to MLflow and trackio, read back from their own stores and compared with the
trainer's metrics.jsonl."""

from __future__ import annotations

import json
import sys
import time
import uuid

import pytest

from crl_envs import study
from crl_envs.study import StudyConfigError
from crl_envs.tracking import check_trackers, open_trackers
from trainers import CRLConfig


def test_tracker_names_are_checked_at_once_with_one_line():
    with pytest.raises(ValueError, match=r"^trackers: unknown tracker 'mlfow' \(did you mean 'mlflow'\?\); trackers: "
                                         r"tensorboard, mlflow, trackio, wandb$"):
        check_trackers(["mlfow"])
    with pytest.raises(TypeError, match="must be a list of tracker names"):
        check_trackers("mlflow")
    with pytest.raises(ValueError, match="names a tracker twice"):
        check_trackers(["tensorboard", "tensorboard"])
    with pytest.raises(ValueError, match=r"CRLConfig.trackers=\['tensorboard'\] needs output_dir="):
        CRLConfig(trackers=["tensorboard"])
    with pytest.raises(StudyConfigError, match=r"^study config: study.trackers: unknown tracker 'trackoi' \(did you "
                                               r"mean 'trackio'\?\)"):
        study.load_config({"study": {"trackers": ["trackoi"]}, "pools": {"p": [{"expert": 0.8}]},
                           "tasks": {"arith": {"n": 2}}, "protocols": {"vote": {}}})


def test_a_missing_tracker_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"tracker 'wandb' needs the 'wandb' package.*pip install 'crl-envs\[trackers\]'"):
        check_trackers(["wandb"])


def test_tensorboard_through_the_interface_reads_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = open_trackers(["tensorboard"], tmp_path, project="p", run="r", config={"lr": 0.1})
    trackers.log_metrics({"train/loss": 0.5, "train/nan": float("nan"), "train/flag": True, "note": "x"}, 3)
    trackers.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["train/loss"]  # NaN, bools and strings are not sent
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(3, 0.5)]


@pytest.mark.slow
def test_a_crl_run_in_a_study_logs_to_mlflow_and_trackio_offline(tmp_path, monkeypatch):
    """One training cell (C-RL on the zoo, 2 steps) and the study's tables: every step's metrics are read back
    from MLflow's sqlite store and trackio's database equal to the trainer's metrics.jsonl."""
    pytest.importorskip("mlflow")
    pytest.importorskip("agents.zoo")
    if "trackio" not in sys.modules:
        monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is first imported
    pytest.importorskip("trackio")
    from mlflow.tracking import MlflowClient
    from trackio.sqlite_storage import SQLiteStorage

    name = f"trk-{uuid.uuid4().hex[:8]}"  # trackio's store may be shared: a project of our own
    out = tmp_path / "study"
    config = {
        "study": {"name": name, "out": str(out), "trackers": ["mlflow", "trackio"]},
        "pools": {"zoo": "zoo"},
        "tasks": {"arith": {"n": 12, "seed": 2, "max_new_tokens": 8, "options": {"digits": 2, "operations": ["+", "-"]}}},
        "training": {"pool": "zoo", "learner": "model_4", "trainers": ["crl"], "seeds": [0], "questions_per_step": 2,
                     "num_generations": 2, "n_train": 8, "n_eval": 4,
                     "setups": {"vote": {"steps": 2, "learning_rate": 1e-3}}, "bootstrap_resamples": 50},
    }
    result = study.run(config, progress=False)
    [run_dir] = [p for p in (out / "train").iterdir() if p.is_dir()]
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2]

    # MLflow: one store for the study (out/mlflow.db): the training run, and the study's (config, figures, tables)
    assert not (run_dir / "mlflow.db").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name(name).experiment_id])}
    assert set(runs) == {run_dir.name, "study"}
    run = runs[run_dir.name]
    assert run.info.status == "FINISHED"
    for key in ("reward_mean", "loss"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, f"train/{key}"))
        assert [step for step, _ in history] == [m["step"] for m in logged]  # approx takes no nested data (pytest 9)
        assert [value for _, value in history] == pytest.approx([m[key] for m in logged])
    assert run.data.params["config.learning_rate"] == "0.001" and run.data.params["trainer"] == "CRLTrainer"
    run = runs["study"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"study.json", "study.md"}
    assert run.data.metrics["study/cells"] == result["run"]["cells"] == 2  # the baseline and the training cell
    assert json.loads(run.data.params["training.trainers"].replace("'", '"')) == ["crl"]

    # trackio: both runs in the project named after the study
    steps = SQLiteStorage.get_logs(name, run_dir.name)
    assert [s["step"] for s in steps] == [m["step"] for m in logged]
    assert [s["train/reward_mean"] for s in steps] == pytest.approx([m["reward_mean"] for m in logged])
    assert [s["study/executed"] for s in SQLiteStorage.get_logs(name, "study")] == [2]


@pytest.mark.slow
def test_wandb_runs_offline(tmp_path, monkeypatch):
    """W&B's offline mode without network: the run's record file holds the metrics and the config (this
    wandb has no Python reader of its own files; ``wandb sync`` would upload them), the table is saved."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    table = tmp_path / "study.md"
    table.write_text("| a |\n")
    trackers = open_trackers(["wandb"], tmp_path / "run", project="p", run="r", config={"config": {"seed": 1234567}})
    trackers.log_metrics({"train/reward_mean": 0.625}, 1)
    trackers.log_artifact(table)
    trackers.close()
    [record] = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while b"train/reward_mean" not in (data := record.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)  # wandb's service writes the records after finish() returns
    assert b"train/reward_mean" in data and b"0.625" in data and b"1234567" in data
    assert (record.parent / "files" / "study.md").read_text() == "| a |\n"
