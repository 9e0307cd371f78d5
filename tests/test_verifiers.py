"""The learner's seat as a verifiers v1 environment (crl_envs.integrations.verifiers_env), run by the real library.

verifiers runs the learner as its own agent: its tool-less ``null`` chat harness, a program verifiers
prepares with uv and runs in a subprocess, whose model calls go through verifiers' interception server to
the run's OpenAI-compatible endpoint. The endpoint here is a scripted policy on localhost (a stand-in
model, like the suite's scripted agents): it answers each request from its last user message and records
what it was asked. The episodes, their rewards and what the learner saw must be the library's own: the
same replies said by a scripted learner through :class:`~crl_envs.integrations.seat.LearnerSeat`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1", reason="needs verifiers: pip install 'crl-envs[verifiers]'")

import agents  # noqa: E402
import agents.zoo  # noqa: E402
from crl_envs import tasks  # noqa: E402
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render, replay  # noqa: E402
from crl_envs.integrations.verifiers_env import (  # noqa: E402
    TASKSET_ID,
    SeatEnv,
    SeatEnvConfig,
    SeatTaskset,
    SeatTasksetConfig,
)
from crl_kit.errors import ConfigError  # noqa: E402

LEARNER = "model_4"
TASK_OPTIONS = {"split": "train", "n": 4, **agents.zoo.TASK_OPTIONS}


def policy(context: str) -> str:
    """The scripted learner: right on some questions, wrong on others, a function of what it sees."""
    a, op, b = re.findall(r"What is (\d+) ([+-]) (\d+)\?", context)[-1]
    right = int(a) + int(b) if op == "+" else int(a) - int(b)
    return f"The answer is {right if len(context) % 3 else right + 1}."


class ScriptedModel:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 (streamed or not) answering with
    :func:`policy`; ``asked`` lists the last user message of every request."""

    def __init__(self):
        self.asked: list[str] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
                last = last if isinstance(last, str) else "".join(part.get("text", "") for part in last)
                model.asked.append(last)
                text = policy(last)
                base = {"id": f"chatcmpl-{len(model.asked)}", "created": int(time.time()), "model": body["model"]}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                if not body.get("stream"):
                    self._json({**base, "object": "chat.completion", "usage": usage, "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
                    return
                chunk = {**base, "object": "chat.completion.chunk"}
                events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                                                 "finish_reason": None}]},
                          {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                          {**chunk, "choices": [], "usage": usage}]
                payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(payload.encode())))
                self.end_headers()
                self.wfile.write(payload.encode())

            def _json(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", **TASK_OPTIONS)


def seat_config(**overrides) -> SeatEnvConfig:
    taskset = {"id": TASKSET_ID, "protocol": "debate", "pool": "zoo", "task_name": "arith", "learner": LEARNER,
               "task_options": TASK_OPTIONS, "protocol_options": {"rounds": 2}, **overrides}
    return SeatEnvConfig(taskset=taskset, learner={"harness": {"id": "null"}, "runtime": {"type": "subprocess"}})


def test_verifiers_loads_the_seat_by_its_taskset_id(task):
    env = vf.load_environment(seat_config())
    assert type(env) is SeatEnv and type(env.taskset) is SeatTaskset
    assert isinstance(env.config.taskset, SeatTasksetConfig)
    assert [(t.data.id, t.key, t.data.description) for t in env.taskset] == \
        [(ex.id, ex.id, ex.question) for ex in task]
    assert all(t.data.prompt is None for t in env.taskset)  # the partners speak first: the env opens the chat


def test_bad_games_fail_when_the_taskset_is_built():
    for bad, message in ((dict(protocol="chess"), "chess"), (dict(learner="model_9"), "model_9"),
                         (dict(reward="best"), "reward must be one of")):
        with pytest.raises(ConfigError, match=message):
            vf.load_environment(seat_config(**bad))


@pytest.mark.slow
def test_a_verifiers_rollout_is_the_libraries_episode_and_reward(task, monkeypatch):
    """Two tasks through verifiers' own machinery (harness program, interception, client)."""
    # verifiers runs its chat harness with the uv on PATH (else it tries `pip install --user uv`): this
    # environment's own, which the extra installs, also when the environment is not activated
    here = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{here}{os.pathsep}{os.environ.get('PATH', '')}")
    assert shutil.which("uv"), "no uv on PATH: pip install 'crl-envs[verifiers]' installs it"
    model = ScriptedModel()
    env = vf.load_environment(seat_config())
    ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(base_url=model.url, api_key_var="CRL_NO_KEY"))
    chosen = [t for t in env.taskset][:2]

    async def run():
        async with env.serving():
            return [await env.run_episode(t, ctx) for t in chosen]

    try:
        episodes = asyncio.run(run())
    finally:
        model.close()
    game = SeatGame("debate", agents.pool("zoo"), task, LEARNER, options={"rounds": 2})
    asked = iter(model.asked)
    for t, episode in zip(chosen, episodes):
        assert episode.ok, episode.errors
        (trace,) = episode.traces
        example = task.by_id(t.data.id)
        seat, contexts, said = LearnerSeat(game), [], []
        context = seat.reset(example)
        while context is not None:
            contexts.append(render(context))
            said.append(policy(contexts[-1]))
            context = seat.say(said[-1])
        assert [next(asked) for _ in contexts] == contexts  # the learner saw the seat's contexts, in order
        assert trace.rewards["seat_reward"].score == seat.reward == game.play(example, replay(LEARNER, said)).score
        assert trace.metrics["score"] == seat.episode.score
        assert trace.info["crl_envs"]["learner_turns"] == len(said) == 2
    assert next(asked, None) is None
