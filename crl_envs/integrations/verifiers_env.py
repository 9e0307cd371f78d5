"""verifiers: the learner's seat as a verifiers v1 environment (a ``Taskset`` and its ``Env``).

One task per question of the task; an episode is one :class:`~crl_envs.integrations.seat.LearnerSeat`
episode. :class:`SeatEnv` plays the partners (the pool's models, in this process, through the library's
runner) and relays the learner's turns through a verifiers ``Interaction``: each context the learner
sees (:func:`~crl_envs.integrations.seat.render`) is one user turn of the learner's run, its reply is
the learner's message. The policy under training or evaluation is verifiers' model (the run's client:
an OpenAI-compatible endpoint; ``vf-eval``, prime-rl); its chat keeps the earlier turns, as TRL's tool
environment does. The learner's trace gets the seat's reward (``seat_reward``: system score, LOO or
Shapley credit) and the system's ``score`` as a metric.

verifiers finds a taskset by a top-level module name: the id is ``crl-envs-seat`` (the module
``crl_envs_seat`` re-exports these classes)::

    import verifiers.v1 as vf
    config = SeatEnvConfig(taskset=SeatTasksetConfig(protocol="debate", pool="zoo", task_name="arith",
                                                     learner="model_4"))
    env = vf.load_environment(config)          # a SeatEnv over a SeatTaskset

A learner's run that ends before the episode does (its ``max_turns``, a failed model call) fails the
episode (verifiers records the error); it is never scored.

Needs ``verifiers`` (``pip install 'crl-envs[verifiers]'``; tested with verifiers 0.4.0).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from crl_envs.integrations.seat import REWARDS, LearnerSeat, SeatGame, render
from crl_kit.errors import ConfigError, MissingDependencyError

try:
    import verifiers.v1 as vf
except ImportError as e:  # pragma: no cover - the extra is missing
    raise MissingDependencyError("crl_envs.integrations.verifiers_env needs verifiers: "
                                 "pip install 'crl-envs[verifiers]'") from e

#: the taskset id verifiers imports (``crl_envs_seat``)
TASKSET_ID = "crl-envs-seat"


class SeatTasksetConfig(vf.TasksetConfig):
    """The game: what :class:`~crl_envs.integrations.seat.SeatGame` takes, as verifiers config
    (``--env.taskset.protocol debate`` on verifiers' command line). The defaults are the zoo's rookie
    (``model_4``) in a debate on arith: verifiers' command line builds the config from the id alone first."""

    id: str = TASKSET_ID
    protocol: str = Field("debate", description="a protocol name (crl_envs.protocols)")
    pool: str = Field("zoo", description="a pool spec (agents.pool)")
    task_name: str = Field("arith", description="a task name (crl_envs.tasks.load; verifiers' own `task` field "
                           "is the per-task config)")
    learner: str = Field("model_4", description="the pool member whose seat the policy takes")
    task_options: dict[str, Any] = Field(default_factory=dict, description="keyword options of tasks.load")
    protocol_options: dict[str, Any] = Field(default_factory=dict, description="the protocol's options")
    reward: str = Field("system", description=f"the learner's reward: one of {REWARDS}")
    seed: int = Field(0, description="the runner's seed (a question's episode is the same whoever asks)")


class SeatTaskData(vf.TaskData):
    """One question: ``id`` is the task's example id. ``prompt`` stays unset: the partners speak first and
    the environment opens the learner's conversation with what it sees."""


class SeatTask(vf.Task[SeatTaskData, vf.State, vf.TaskConfig]):
    """A question of the game (scored by :class:`SeatEnv`, which records the seat's reward)."""

    @property
    def key(self) -> str:
        return str(self.data.id)


class SeatTaskset(vf.Taskset[SeatTask, SeatTasksetConfig]):
    """The game's questions, one task each; bad config (an unknown protocol, a learner not in the pool,
    an unknown reward) fails here, when the taskset is built."""

    def __init__(self, config: SeatTasksetConfig) -> None:
        super().__init__(config)
        self.game  # noqa: B018 - build and check the game now, before any rollout

    @functools.cached_property
    def game(self) -> SeatGame:
        from crl_envs import tasks

        c = self.config
        return SeatGame(c.protocol, c.pool, tasks.load(c.task_name, **c.task_options), c.learner, reward=c.reward,
                        options=c.protocol_options, seed=c.seed)

    def load(self) -> Iterator[SeatTask]:
        for example in self.game.task:
            yield SeatTask(SeatTaskData(id=example.id, name=example.id, description=example.question),
                           self.config.task)


class SeatEnvConfig(vf.EnvConfig):
    """The seat's verifiers environment: one role, ``learner`` (verifiers' tool-less ``null`` chat
    harness by default; its runtime and model are the run's)."""

    taskset: SeatTasksetConfig
    learner: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class SeatEnv(vf.Env[SeatEnvConfig]):
    """One seat episode per task: the partners play here, the learner is verifiers' agent."""

    async def run(self, task: SeatTask, agents: vf.Agents) -> None:
        game: SeatGame = self.taskset.game
        seat = LearnerSeat(game)
        try:
            context = await asyncio.to_thread(seat.reset, game.task.by_id(task.data.id))
            async with agents.learner.interaction(task) as interaction:
                while context is not None:
                    segment = await interaction.turn(render(context))
                    if segment.terminated:
                        raise ConfigError(f"the learner's run ended at turn {seat.turns + 1} before the episode "
                                          f"did (its max_turns or a failed model call); see the trace's error")
                    context = await asyncio.to_thread(seat.say, segment.last_reply)
        finally:
            seat.close()
        trace = interaction.trace
        trace.record_reward("seat_reward", float(seat.reward), 1.0)
        trace.record_metric("score", float(seat.episode.score))
        trace.info["crl_envs"] = {"protocol": game.name, "example_id": seat.episode.example_id,
                                  "answer": seat.episode.answer, "learner_turns": seat.turns}


__all__ = ["SeatEnv", "SeatEnvConfig", "SeatTask", "SeatTaskData", "SeatTaskset", "SeatTasksetConfig", "TASKSET_ID"]
