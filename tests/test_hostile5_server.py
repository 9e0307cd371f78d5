"""Issue #57, the OpenEnv server and TRL's tool environment (crl_envs/integrations): a client's mistake gets a
4xx and one line over HTTP and one line over WebSocket, never a 500 or a raw Python message; idle sessions
expire and free their slots; the final observation carries the system's score, answer and question (OpenEnv's
serializer drops ``metadata``); and the tool environment scores the model's final answer even when its
``say`` calls used every turn.

Real openenv-core servers (uvicorn on localhost) played by OpenEnv's own client and by httpx; partners are
scripted (one always right, one always wrong), so each expected score is known and checked against the
library's own play (:func:`crl_envs.run_episodes` through :meth:`SeatGame.play`).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

import pytest
from servers import serving_in_thread as serving

import agents
from crl_envs import tasks
from crl_envs.integrations.seat import SeatGame, replay

LEARNER = "model_2"


def right(example) -> str:
    return f"The answer is {example.answer}."


def wrong(example) -> str:
    return f"The answer is {example.answer}1."  # another number


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", n=4, seed=0)


@pytest.fixture(scope="module")
def pool():
    """model_0 always wrong, model_1 always right, model_2 the learner's seat (its script is never used): a
    plurality with ties to the first in pool order, so the learner's answer decides the system's."""
    return agents.pool([agents.ScriptedAgent("wrong", lambda ex, msgs: wrong(ex)),
                        agents.ScriptedAgent("right", lambda ex, msgs: right(ex)),
                        agents.ScriptedAgent("seat", lambda ex, msgs: "unused")])


@pytest.fixture(scope="module")
def debate_url(pool, task):
    """The learner's seat of a 2-round debate with LOO credit."""
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import create_collaboration_app

    with serving(create_collaboration_app("debate", pool, task, LEARNER, options={"rounds": 2}, reward="loo")) as url:
        yield url


def client(url):
    from openenv.core import GenericEnvClient

    return GenericEnvClient(base_url=url).sync()


@contextmanager
def server_errors():
    """The ERROR records the running servers log meanwhile (uvicorn logs an exception an app lets out, with its
    traceback, as "Exception in ASGI application"); collected a second after the block, once sockets close."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logger = logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield records
        time.sleep(1.0)
    finally:
        logger.removeHandler(handler)


def one_line(text: str) -> bool:
    return isinstance(text, str) and "\n" not in text and "Traceback" not in text and len(text) < 400


# ---------------------------------------------------------------------- finding 2: client mistakes
def test_http_client_mistakes_are_answered_4xx_with_one_line(debate_url, task):
    import httpx

    mistakes = {  # body -> (status, what the one line names)
        "/reset": [({"example_id": "no-such-id"}, 422, "no question with example_id 'no-such-id'"),
                   ({"example_id": 5}, 422, "example_id must be a string"),
                   ({"exmaple_id": task[1].id}, 422, "unknown arguments ['exmaple_id']")],
        "/step": [({"action": {"message": "The answer is 1."}}, 409, "call reset")],  # stateless: no episode
    }
    with server_errors() as errors:
        for path, cases in mistakes.items():
            for body, status, named in cases:
                response = httpx.post(debate_url + path, json=body, timeout=30)
                assert response.status_code == status, (path, body, response.status_code, response.text[:200])
                detail = response.json()["detail"]
                assert one_line(detail) and named in detail, (path, body, detail)
    assert not errors, [r.getMessage() for r in errors]
    # OpenEnv's own validation (a seed that is not an integer over HTTP) stays a 422, and a good reset still plays
    assert httpx.post(debate_url + "/reset", json={"seed": "abc"}, timeout=30).status_code == 422
    good = httpx.post(debate_url + "/reset", json={"example_id": task[1].id}, timeout=30)
    assert good.status_code == 200 and task[1].question in good.json()["observation"]["context"]


def test_websocket_client_mistakes_get_one_line_errors_and_the_session_goes_on(debate_url, task):
    with server_errors() as errors, client(debate_url) as env:
        for arguments, named in [({"seed": "abc"}, "seed must be a non-negative integer"),
                                 ({"seed": -1}, "seed must be a non-negative integer"),
                                 ({"seed": "abc", "example_id": task[0].id}, "seed must be a non-negative integer"),
                                 ({"example_id": "x" * 10_000}, "no question with example_id 'xxx"),  # shown cut
                                 ({"example_id": ["a"]}, "example_id must be a string"),
                                 ({"example_id": "no-such-id"}, "no question with example_id 'no-such-id'"),
                                 ({"episode_id": 7}, "episode_id must be a string")]:
            with pytest.raises(RuntimeError) as error:
                env.reset(**arguments)
            message = str(error.value)
            assert one_line(message) and named in message, (arguments, message)
        with pytest.raises(RuntimeError, match="step\\(\\) before reset\\(\\)"):
            env.step({"message": "The answer is 1."})
        result = env.reset(example_id=task[2].id)  # the mistakes left the session usable
        while not result.done:
            result = env.step({"message": right(task[2])})
        with pytest.raises(RuntimeError, match="after the episode ended: call reset"):
            env.step({"message": "The answer is 1."})
    assert not errors, [r.getMessage() for r in errors]  # nor a traceback in the server's log, goodbye included


# ---------------------------------------------------------------------- finding 4: the score reaches the client
def test_the_final_observation_carries_the_systems_score_answer_and_question(debate_url, pool, task):
    game = SeatGame("debate", pool, task, LEARNER, options={"rounds": 2})
    without = game.value_without(task[3], ["model_0", "model_1"])
    assert without == 0.0  # a tie between the wrong and the right partner goes to the wrong one (pool order)
    for said, expected_score in [(right(task[3]), 1.0), (wrong(task[3]), 0.0)]:
        texts = [said, said]
        assert game.play(task[3], replay(LEARNER, texts)).score == expected_score  # the library's own play
        with client(debate_url) as env:
            result = env.reset(seed=3 + len(task))  # seed k: question k mod n
            assert result.observation["example_id"] == task[3].id
            for text in texts:
                result = env.step({"message": text})
        observation = result.observation
        assert result.done and observation["example_id"] == task[3].id
        assert observation["score"] == expected_score and result.reward == expected_score - without
        assert observation["answer"] == (task[3].answer if expected_score else f"{task[3].answer}1")


def test_the_score_differs_from_a_loo_reward_and_still_reaches_the_client(pool, task):
    """vote, right partner first: the coalition without the learner is right, so LOO credit is 0 while the
    system's score is 1; only the score field tells the client the system was right."""
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import create_collaboration_app

    swapped = agents.pool([pool["model_1"], pool["model_0"], pool["model_2"]])
    with serving(create_collaboration_app("vote", swapped, task, LEARNER, reward="loo")) as url, client(url) as env:
        env.reset(example_id=task[0].id)
        result = env.step({"message": right(task[0])})
    assert result.done and result.reward == 0.0
    assert result.observation["score"] == 1.0 and result.observation["answer"] == task[0].answer


# ---------------------------------------------------------------------- finding 3: idle sessions expire
def test_idle_sessions_expire_and_free_their_slots(pool, task):
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import create_collaboration_app

    app = create_collaboration_app("debate", pool, task, LEARNER, options={"rounds": 2}, max_concurrent_envs=2,
                                   idle_timeout_s=1.0)
    with serving(app) as url, client(url) as first, client(url) as second:
        for env in (first, second):  # two clients reset and go quiet, holding both slots
            assert not env.reset(example_id=task[0].id).done
        quiet_since = time.monotonic()
        assert at_capacity(url)  # a third is refused at once
        deadline = time.monotonic() + 30  # OpenEnv's reaper looks every max(timeout / 4, 5 s)
        while at_capacity(url) and time.monotonic() < deadline:
            time.sleep(0.5)
        freed_after = time.monotonic() - quiet_since
        assert 1.0 < freed_after < 30, f"no slot was freed within 30 s of idling ({freed_after:.1f} s)"
        with client(url) as third:  # the freed slot plays a whole episode
            result = third.reset(example_id=task[1].id)
            while not result.done:
                result = third.step({"message": right(task[1])})
        assert result.observation["score"] == 1.0
        with pytest.raises(RuntimeError, match="session was closed \\(idle"):  # the expired client is told why
            first.step({"message": right(task[0])})


def at_capacity(url: str) -> bool:
    """Whether a new WebSocket session is refused: OpenEnv sends CAPACITY_REACHED as soon as it connects (and
    closes), and nothing to a session it accepts."""
    import json

    from websockets.sync.client import connect

    with connect(url.replace("http://", "ws://") + "/ws") as ws:
        try:
            reply = json.loads(ws.recv(timeout=2.0))
        except TimeoutError:
            return False
    assert reply["type"] == "error", reply
    return reply["data"]["code"] == "CAPACITY_REACHED"


def test_a_bad_idle_timeout_fails_before_serving(pool, task):
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import create_collaboration_app

    for bad in (0, -5.0, "600", float("nan")):
        with pytest.raises(ValueError, match="idle_timeout_s must be a positive number of seconds or None"):
            create_collaboration_app("vote", pool, task, LEARNER, idle_timeout_s=bad)
    with pytest.raises(ValueError, match="max_concurrent_envs must be a positive integer"):
        create_collaboration_app("vote", pool, task, LEARNER, max_concurrent_envs=0)


# ---------------------------------------------------------------------- finding 7: the tool env's final answer
def call_say(env, message: str) -> list[dict]:
    """One ``say`` tool call as TRL's tool loop makes it (``tool(**arguments)``), and the messages it adds to
    the completion: the assistant's call and the tool's result."""
    call = {"type": "function", "function": {"name": "say", "arguments": {"message": message}}}
    result = getattr(env, call["function"]["name"])(**call["function"]["arguments"])
    return [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "say",
                                                                          "content": str(result)}]


def test_the_final_answer_counts_after_say_used_every_turn(pool, task):
    pytest.importorskip("trl")
    from crl_envs.integrations.trl_environment import EPISODE_OVER, EnvironmentFactory, seat_reward

    factory = EnvironmentFactory("debate", pool, task, LEARNER, options={"rounds": 2}, tools=True)
    game = SeatGame("debate", pool, task, LEARNER, options={"rounds": 2})
    example = task[1]
    final = {"role": "assistant", "content": right(example)}
    expected = game.play(example, replay(LEARNER, [wrong(example), right(example)])).score
    assert expected == 1.0 and game.play(example, replay(LEARNER, [wrong(example)] * 2)).score == 0.0

    one_say = factory()  # one say(), then the final answer: the final answer is the second turn
    one_say.reset(example_id=example.id)
    completion_one = [*call_say(one_say, wrong(example)), final]

    two_says = factory()  # two say() calls used both turns; the environment asks for a final answer ...
    two_says.reset(example_id=example.id)
    completion_two = call_say(two_says, wrong(example)) + call_say(two_says, wrong(example))
    assert completion_two[-1]["content"] == EPISODE_OVER
    completion_two.append(final)  # ... and the model gives it

    assert seat_reward([completion_one, completion_two], environments=[one_say, two_says]) == [expected, expected]
    for env in (one_say, two_says):
        assert [t.text for t in env._seat.episode.turns_of(LEARNER)] == [wrong(example), right(example)]


def test_a_final_answer_equal_to_the_last_say_or_missing_keeps_the_episode(pool, task):
    pytest.importorskip("trl")
    from crl_envs.integrations.trl_environment import EnvironmentFactory, seat_reward

    factory = EnvironmentFactory("debate", pool, task, LEARNER, options={"rounds": 2}, tools=True)
    example = task[2]
    same, cut_off = factory(), factory()
    for env in (same, cut_off):
        env.reset(example_id=example.id)
    completion_same = call_say(same, wrong(example)) + call_say(same, right(example))
    completion_same.append({"role": "assistant", "content": right(example)})
    completion_cut = call_say(cut_off, wrong(example)) + call_say(cut_off, right(example))  # the tool loop's end
    assert seat_reward([completion_same, completion_cut], environments=[same, cut_off]) == [1.0, 1.0]
    for env in (same, cut_off):
        assert [t.text for t in env._seat.episode.turns_of(LEARNER)] == [wrong(example), right(example)]
