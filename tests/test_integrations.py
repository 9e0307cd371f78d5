"""The protocols inside other trainers (crl_envs.integrations): the learner's seat driven from outside, TRL's
``environment_factory`` with a real ``GRPOTrainer``, and an OpenEnv server with OpenEnv's own client.

Every reward is checked against the library's own play: the same messages said by a scripted learner
through :func:`crl_envs.run_episodes`.
"""

from __future__ import annotations

import itertools
import os

import pytest
from servers import serving_in_thread

import agents
import agents.zoo
from crl_envs import tasks
from crl_envs.integrations.seat import LearnerSeat, SeatGame, render, replay

LEARNER = "model_4"
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def zoo():
    return agents.pool("zoo")


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", split="train", n=8, **agents.zoo.TASK_OPTIONS)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (conftest's ``one_thread``)."""


def drive(seat: LearnerSeat, example, texts) -> list[str]:
    """Play ``example`` saying ``texts`` in turn; returns the contexts the learner saw."""
    seen, said = [], iter(texts)
    context = seat.reset(example)
    while context is not None:
        seen.append(render(context))
        context = seat.say(next(said))
    return seen


# ---------------------------------------------------------------------- the seat
def test_a_seat_episode_is_the_runners_episode_with_the_same_messages(zoo, task):
    game = SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2})
    seat = LearnerSeat(game)
    texts = ["The answer is 7.", "I agree with agent 1. The answer is 48."]
    contexts = drive(seat, task[0], texts)
    assert len(contexts) == 2 and "Other agents' answers" in contexts[1]  # round 2 shows the partners' answers
    reference = game.play(task[0], replay(LEARNER, texts))
    assert [(t.agent, t.text, t.messages) for t in seat.episode.transcript] == \
        [(t.agent, t.text, t.messages) for t in reference.transcript]
    assert seat.episode.score == reference.score and seat.reward == reference.score
    assert [t.text for t in seat.episode.turns_of(LEARNER)] == texts
    # a second episode on the same seat starts afresh, and abandoning one mid-way leaves the next intact
    seat.reset(task[1])
    assert drive(seat, task[1], ["The answer is 1.", "The answer is 1."]) and seat.episode.example_id == task[1].id


def shapley_by_permutations(value, players, learner):
    """The learner's Shapley value as the mean marginal contribution over every order of the players."""
    total, orders = 0.0, 0
    for order in itertools.permutations(players):
        before = frozenset(order[: order.index(learner)])
        total += value(before | {learner}) - value(before)
        orders += 1
    return total / orders


def test_loo_and_shapley_credit_equal_independent_computations(zoo, task):
    texts = [f"The answer is {task[2].answer}."]  # a right answer: the learner's credit is not zero
    credit = {}
    for reward in ("system", "loo", "shapley"):
        seat = LearnerSeat(SeatGame("vote", zoo, task, LEARNER, reward=reward))
        drive(seat, task[2], texts)
        credit[reward] = seat.reward
    game = SeatGame("vote", zoo, task, LEARNER)
    values = {}

    def value(members: frozenset) -> float:
        if members not in values:
            if not members:
                values[members] = 0.0
            else:
                ordered = [a for a in zoo.ids if a in members]
                values[members] = game.play(task[2], replay(LEARNER, texts), coalition=ordered).score
        return values[members]

    everyone = frozenset(zoo.ids)
    assert credit["system"] == value(everyone)
    assert credit["loo"] == pytest.approx(value(everyone) - value(everyone - {LEARNER}))
    assert credit["shapley"] == pytest.approx(shapley_by_permutations(value, zoo.ids, LEARNER))
    assert 0 < credit["shapley"] < credit["system"]  # the right answer's credit, shared with the partners right too


def test_bad_seats_fail_at_once_with_one_line(zoo, task):
    from crl_envs.integrations.trl_environment import EnvironmentFactory

    with pytest.raises(ValueError, match="unknown protocol|no protocol"):
        SeatGame("chess", zoo, task, LEARNER)
    with pytest.raises(ValueError, match="learner 'model_9' is not in the pool"):
        SeatGame("vote", zoo, task, "model_9")
    with pytest.raises(ValueError, match="reward must be one of"):
        SeatGame("vote", zoo, task, LEARNER, reward="banzhaf")
    with pytest.raises(ValueError, match="asks learner 'model_4' for 2 turns.*tools=True"):
        EnvironmentFactory("debate", zoo, task, LEARNER, options={"rounds": 2})
    with pytest.raises(ValueError, match="call reset"):
        LearnerSeat(SeatGame("vote", zoo, task, LEARNER)).say("The answer is 1.")


def test_bad_openenv_apps_and_steps_fail_at_once(zoo, task):
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import (
        CollaborationEnvironment,
        SeatAction,
        create_collaboration_app,
    )

    with pytest.raises(ValueError, match="learner 'model_9' is not in the pool"):
        create_collaboration_app("vote", zoo, task, "model_9")
    with pytest.raises(ValueError, match="unknown protocol"):
        create_collaboration_app("chess", zoo, task, LEARNER)
    env = CollaborationEnvironment(SeatGame("vote", zoo, task, LEARNER))
    with pytest.raises(ValueError, match="call reset"):
        env.step(SeatAction(message="The answer is 1."))
    observation = env.reset(seed=len(task) + 2)  # seed k: the task's question k mod n
    assert not observation.done and task[2].question in observation.context
    last = env.step(SeatAction(message=f"The answer is {task[2].answer}."))
    assert last.done and last.reward == last.score and last.example_id == env.state.example_id == task[2].id


# ---------------------------------------------------------------------- TRL's environment_factory
def grpo_trainer(zoo, factory, dataset, tmp_path, reward_funcs, steps=2):
    trl = pytest.importorskip("trl")
    from crl_envs.integrations.trl_environment import with_tool_turns
    from trainers.trl import grpo_config, mask_relative_positions

    source = zoo[LEARNER]
    model = __import__("copy").deepcopy(source.model)
    mask_relative_positions(model)
    args = grpo_config(str(tmp_path / "trl"), num_generations=4, questions_per_step=2, max_completion_length=24,
                       learning_rate=1e-3, max_steps=steps, seed=0)
    return trl.GRPOTrainer(model=model, args=args, processing_class=with_tool_turns(source.tokenizer),
                           train_dataset=dataset, environment_factory=factory, reward_funcs=reward_funcs)


def recording(seen):
    """seat_reward, recording (protocol, example, the learner's message, reward) of every rollout it scores."""
    from crl_envs.integrations.trl_environment import final_text, seat_reward

    def seat_reward_recorded(completions, environments=None, **kwargs):
        rewards = seat_reward(completions, environments=environments, **kwargs)
        for c, env, r in zip(completions, environments, rewards):
            seen.append((env._seat.game, env._seat.example, final_text(c), r, env._seat.episode))
        return rewards

    return seat_reward_recorded


def test_grpo_trainer_with_the_environment_factory_gets_the_libraries_c_rl_rewards(zoo, task, tmp_path):
    pytest.importorskip("trl")
    from crl_envs.integrations.trl_environment import EnvironmentFactory

    # refine: the rookie's answer is refined by the others, and the system's score varies with what it says
    factory = EnvironmentFactory("refine", zoo, task, LEARNER, partner_sampling=agents.SamplingParams(max_new_tokens=24))
    seen = []
    trainer = grpo_trainer(zoo, factory, factory.dataset(), tmp_path, recording(seen))
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2 * 2 * 4  # 2 steps x 2 questions x G = 4
    for game, example, text, reward, episode in seen:
        assert [t.text for t in episode.turns_of(LEARNER)] == [text[: 4096]]
        assert reward == game.play(example, replay(LEARNER, [text])).score  # the library's C-RL reward
    assert len({r for *_, r, _ in seen}) > 1, "every reward equal: the test would compare constants"
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert logged == pytest.approx([sum(r for *_, r, _ in seen[:8]) / 8, sum(r for *_, r, _ in seen[8:]) / 8])


def test_a_dict_of_factories_mixes_two_protocols_row_by_row(zoo, task, tmp_path):
    pytest.importorskip("trl")
    from datasets import concatenate_datasets

    from crl_envs.integrations.trl_environment import EnvironmentFactory

    short = agents.SamplingParams(max_new_tokens=24)
    vote = EnvironmentFactory("vote", zoo, task, LEARNER, partner_sampling=short)
    judge = EnvironmentFactory("judge", zoo, task, LEARNER, options={"judge": "model_0"}, partner_sampling=short)
    dataset = concatenate_datasets([vote.dataset(environment=True).select([0]),
                                    judge.dataset(environment=True).select([1])])
    seen = []
    trainer = grpo_trainer(zoo, {vote.name: vote, judge.name: judge}, dataset, tmp_path, recording(seen), steps=1)
    trainer.train()
    assert sorted({(g.name, ex.id) for g, ex, *_ in seen}) == sorted([("vote_v0", task[0].id),
                                                                       ("judge_v0", task[1].id)])
    for game, example, text, reward, episode in seen:
        assert episode.protocol == game.name
        assert reward == game.play(example, replay(LEARNER, [text])).score


# ---------------------------------------------------------------------- OpenEnv
@pytest.fixture(scope="module")
def server(zoo, task):
    """A real OpenEnv server on localhost (uvicorn in a thread) serving the learner's seat of a 2-round debate."""
    pytest.importorskip("openenv")
    from crl_envs.integrations.openenv_server import create_collaboration_app

    app = create_collaboration_app("debate", zoo, task, LEARNER, options={"rounds": 2})
    with serving_in_thread(app) as url:
        yield url


def play_over_http(url, example_id, texts):
    """One episode through OpenEnv's own client: the contexts seen, and the final step's reward and done."""
    from openenv.core import GenericEnvClient

    contexts = []
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(example_id=example_id)
        for text in texts:
            assert not result.done
            contexts.append(result.observation["context"])
            result = env.step({"message": text})
        state = env.state()
    return contexts, result, state


def test_an_openenv_client_plays_the_same_episode_as_in_process(server, zoo, task):
    texts = ["The answer is 7.", "The answer is 48."]
    contexts, result, state = play_over_http(server, task[0].id, texts)
    game = SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2})
    seat = LearnerSeat(game)
    assert contexts == drive(seat, task[0], texts)
    assert result.done and result.reward == seat.reward == game.play(task[0], replay(LEARNER, texts)).score
    assert state["example_id"] == task[0].id and state["turns"] == 2 and state["protocol"] == "debate_v0"


def test_two_concurrent_openenv_sessions_are_kept_apart(server, zoo, task):
    from concurrent.futures import ThreadPoolExecutor

    plays = {task[1].id: ["The answer is 1.", "The answer is 2."],
             task[2].id: [f"The answer is {task[2].answer}."] * 2}
    with ThreadPoolExecutor(2) as workers:
        results = dict(zip(plays, workers.map(lambda item: play_over_http(server, *item), plays.items())))
    game = SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2})
    for example_id, texts in plays.items():
        contexts, result, state = results[example_id]
        example = task.by_id(example_id)
        assert contexts == drive(LearnerSeat(game), example, texts)  # each session saw its own question only
        assert result.reward == game.play(example, replay(LEARNER, texts)).score
        assert state["example_id"] == example_id


def test_the_say_tool_carries_each_turn_and_the_reward_is_the_libraries(zoo, task):
    pytest.importorskip("trl")
    from transformers.utils import get_json_schema

    from crl_envs.integrations.trl_environment import EPISODE_OVER, EnvironmentFactory, seat_reward

    factory = EnvironmentFactory("debate", zoo, task, LEARNER, options={"rounds": 2}, tools=True, reward="loo")
    env = factory()
    schema = get_json_schema(env.say)  # what TRL shows the model: the tool's name, doc and typed argument
    assert schema["function"]["name"] == "say" and schema["function"]["parameters"]["required"] == ["message"]
    first = env.reset(example_id=task[3].id, question=task[3].question)
    second = env.say("The answer is 5.")
    assert task[3].question in first and "Other agents' answers" in second
    completion = [{"role": "assistant", "content": "The answer is 6."}]  # the final answer: the learner's last turn
    [reward] = seat_reward([completion], environments=[env])
    assert env.say("more?") == EPISODE_OVER
    game = SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2})
    texts = ["The answer is 5.", "The answer is 6."]
    without = game.value_without(task[3], [a for a in zoo.ids if a != LEARNER])
    assert reward == pytest.approx(game.play(task[3], replay(LEARNER, texts)).score - without)


def test_tools_need_a_template_that_renders_them(zoo, task):
    pytest.importorskip("trl")
    from crl_envs.integrations.trl_environment import EnvironmentFactory, with_tool_turns

    with pytest.raises(ValueError, match="does not render tool calls"):
        EnvironmentFactory("debate", zoo, task, LEARNER, tools=True, tokenizer=zoo[LEARNER].tokenizer)
    EnvironmentFactory("debate", zoo, task, LEARNER, tools=True, tokenizer=with_tool_turns(zoo[LEARNER].tokenizer))


def test_the_request_memo_reuses_partner_answers_and_changes_nothing(zoo, task):
    from crl_envs.runner import RequestMemo

    texts = ["The answer is 7.", "The answer is 48."]
    plain = LearnerSeat(SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2}))
    memo_game = SeatGame("debate", zoo, task, LEARNER, options={"rounds": 2}, memo=RequestMemo())
    first, second = LearnerSeat(memo_game), LearnerSeat(memo_game)
    for seat in (plain, first, second):
        drive(seat, task[4], texts)
    assert [t.text for t in first.episode.transcript] == [t.text for t in plain.episode.transcript]
    assert [t.text for t in second.episode.transcript] == [t.text for t in plain.episode.transcript]
    partners = [a for a in zoo.ids if a != LEARNER]
    assert sum(first.episode.usage[a].generated_calls for a in partners) == 2 * len(partners)  # 2 rounds each
    assert sum(second.episode.usage[a].generated_calls for a in partners) == 0  # all reused
