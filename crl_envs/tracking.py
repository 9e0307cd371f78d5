"""Experiment trackers: one small interface for what training runs and studies record (metrics per step,
the config, files such as a study's tables), written to any of TensorBoard, MLflow, trackio and W&B.

Every tracker works offline and writes next to the run (``directory``):

- ``"tensorboard"``: event files in ``<tensorboard_dir or directory>/tensorboard`` (``tensorboard --logdir``).
- ``"mlflow"``: the store ``MLFLOW_TRACKING_URI`` names, else ``sqlite:///<directory>/mlflow.db`` (what verl
  uses by default) with artifacts in ``<directory>/mlflow-artifacts`` (``mlflow ui --backend-store-uri ...``).
- ``"trackio"``: trackio's local store (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``; set it
  before trackio is first imported), shown by ``trackio show --project <project>``.
- ``"wandb"``: W&B in offline mode under ``<directory>/wandb`` (``wandb sync`` uploads it later).

MLflow, trackio and W&B come with ``pip install 'crl-envs[trackers]'``; they are imported only when a
tracker of theirs is opened. Metrics that are not finite numbers are not sent (trackers disagree on NaN).

A trainer opens them through its callbacks (``trainers.callbacks.TrackersCallback``: one run per ``fit()``, ended
with its status); a study opens one run for its tables.
"""

from __future__ import annotations

import abc
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from crl_kit.errors import ConfigError, ConfigTypeError, MissingDependencyError
from crl_kit.serial import jsonable
from crl_kit.validation import did_you_mean

#: The trackers :func:`open_trackers` knows, and the module each one needs.
TRACKERS: dict[str, str] = {"tensorboard": "tensorboard", "mlflow": "mlflow", "trackio": "trackio", "wandb": "wandb"}
INSTALL = "pip install 'crl-envs[trackers]'"


class Tracker(abc.ABC):
    """Where one run's records go. Subclasses implement the four methods; :class:`Trackers` fans out."""

    name = "tracker"

    @abc.abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (finite numbers, already filtered) at ``step``."""

    @abc.abstractmethod
    def log_artifact(self, path: Path) -> None:
        """Keep a copy of the file ``path`` with the run (a study's tables, a report)."""

    def flush(self) -> None:
        """Make what was logged so far readable by the tracker's own tools (default: already readable)."""
        return None

    def close(self, status: str = "FINISHED") -> None:
        """End the run (after this, nothing more is logged; default: nothing to release). ``status``:
        ``"FINISHED"``, or ``"FAILED"``/``"KILLED"`` when the run ended on an exception or an interrupt
        (so a dead run is not left RUNNING)."""
        return None


def check_trackers(names: Any, key: str = "trackers") -> tuple[str, ...]:
    """``names`` as a tuple of known tracker names, each installed.

    Raises:
        TypeError: ``names`` is not a list of strings.
        ValueError: an unknown name (the valid ones and the closest are named).
        ImportError: a tracker whose package is missing (the extra to install is named).
    """
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ConfigTypeError(f"{key} must be a list of tracker names (e.g. ['mlflow', 'trackio']), got {names!r}")
    names = tuple(names)
    import importlib.util

    for name in names:
        if name not in TRACKERS:
            hint = did_you_mean(str(name), list(TRACKERS))
            raise ConfigError(f"{key}: unknown tracker {name!r}{hint}; trackers: {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise MissingDependencyError(f"{key}: tracker {name!r} needs the {TRACKERS[name]!r} package, which is not installed: "
                              f"{INSTALL}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{key}: {list(names)!r} names a tracker twice; name each once")
    return names


def open_trackers(names: Sequence[str], directory: str | Path, *, project: str, run: str,
                  config: Mapping[str, Any] | None = None, tensorboard_dir: str | Path | None = None) -> Trackers:
    """Open one run named ``run`` of ``project`` on each tracker of ``names``, with ``config`` recorded.

    Runs that share ``directory`` share its stores (one MLflow database for a study's training runs);
    TensorBoard's events go to ``tensorboard_dir`` (default ``directory``), one directory per run. A run
    of the same name already in ``directory``'s stores (a resumed training cell) is continued, not opened
    a second time (MLflow, trackio).

    Raises:
        ValueError, TypeError, ImportError: see :func:`check_trackers`.
    """
    names = check_trackers(names)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = jsonable(dict(config or {}))
    opened: list[Tracker] = []
    try:
        for name in names:
            where = Path(tensorboard_dir) if name == "tensorboard" and tensorboard_dir is not None else directory
            opened.append(_OPEN[name](where, project, run, config))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return Trackers(opened)


class Trackers(Tracker):
    """Several trackers as one: each call goes to every tracker, metrics filtered once."""

    name = "trackers"

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        finite = {k: float(v) for k, v in metrics.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if finite:
            for tracker in self.trackers:
                tracker.log_metrics(finite, int(step))

    def log_artifact(self, path: str | Path) -> None:
        for tracker in self.trackers:
            tracker.log_artifact(Path(path))

    def flush(self) -> None:
        for tracker in self.trackers:
            tracker.flush()

    def close(self, status: str = "FINISHED") -> None:
        for tracker in self.trackers:
            tracker.close(status)

    def __bool__(self) -> bool:
        return bool(self.trackers)


# ---------------------------------------------------------------------- the four trackers
class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, directory: Path, project: str, run: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(directory / "tensorboard"))
        if config:
            self.writer.add_text("config", f"```\n{json.dumps(config, indent=1, sort_keys=True)}\n```")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_artifact(self, path: Path) -> None:
        if path.suffix in (".md", ".txt", ".json"):
            self.writer.add_text(path.name, path.read_text())

    def flush(self) -> None:
        self.writer.flush()

    def close(self, status: str = "FINISHED") -> None:
        self.writer.close()


class MLflowTracker(Tracker):
    """One MLflow run. Its experiment is the project, with artifacts in ``<directory>/mlflow-artifacts``;
    when ``MLFLOW_TRACKING_URI`` is shared by several directories (two studies of one name) and the
    project's experiment keeps its artifacts in another directory, this directory's runs go to the
    experiment ``"<project> (<directory>)"`` instead, so no study's files land in another's. A run of the
    same name made from the same directory (tag ``crl_envs.directory``) is continued (a resumed cell)."""

    name = "mlflow"
    DIRECTORY_TAG = "crl_envs.directory"

    def __init__(self, directory: Path, project: str, run: str, config: dict[str, Any]):
        import os

        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        directory = directory.resolve()
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{directory / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        artifacts = (directory / "mlflow-artifacts").as_uri()
        experiment_id = self._experiment(project, artifacts)
        if experiment_id is None:
            experiment_id = self._experiment(f"{project} ({directory})", artifacts)
        if experiment_id is None:
            raise ConfigError(f"MLflow at {self.uri}: the experiments {project!r} and '{project} ({directory})' keep "
                              "their artifacts elsewhere; rename the study or set another MLFLOW_TRACKING_URI")
        same = [r for r in self.client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{_quoted(run)}'")
                if r.data.tags.get(self.DIRECTORY_TAG) == str(directory)]
        if same:  # a resumed cell: the same run, running again
            self.run_id = same[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        self.run_id = self.client.create_run(experiment_id, run_name=run).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in _flatten(config).items()]
        self.client.log_batch(self.run_id, tags=[RunTag(self.DIRECTORY_TAG, str(directory))])
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i: i + 100])

    def _experiment(self, name: str, artifacts: str) -> str | None:
        """The id of experiment ``name`` (made with ``artifacts`` when new), or None when it keeps its
        artifacts somewhere else."""
        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            return self.client.create_experiment(name, artifact_location=artifacts)
        return experiment.experiment_id if experiment.artifact_location == artifacts else None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _quoted(text: str) -> str:
    """``text`` inside an MLflow filter's single quotes."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, directory: Path, project: str, run: str, config: dict[str, Any]):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=project, name=run, config=config, embed=False, auto_log_cpu=False,
                                auto_log_gpu=False, resume="allow")  # a resumed cell continues its run

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: Path) -> None:
        self.trackio.log_artifact(str(path), name=path.name.replace(".", "-"), overwrite=True)

    def close(self, status: str = "FINISHED") -> None:
        self.run.finish()


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, directory: Path, project: str, run: str, config: dict[str, Any]):
        import wandb

        (directory / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(project=project, name=run, config=config, dir=str(directory), mode="offline",
                              reinit="create_new")

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_artifact(self, path: Path) -> None:
        self.run.save(str(path), base_path=str(path.parent), policy="now")

    def close(self, status: str = "FINISHED") -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


_OPEN = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "trackio": TrackioTracker, "wandb": WandbTracker}


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow's params are flat)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out



__all__ = ["TRACKERS", "Tracker", "Trackers", "check_trackers", "open_trackers"]
