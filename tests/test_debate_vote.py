"""debate_v0 and vote_v0: hand-computed outcomes for every coalition, masking, input errors."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

import agents
import crl_envs
from agents import ScriptedAgent
from crl_envs.tasks import Example, NumericTask

IDS = ["model_0", "model_1", "model_2"]
COALITIONS = [list(c) for r in (1, 2, 3) for c in itertools.combinations(IDS, r)]


def fixed_task(refs):
    return NumericTask([Example(id=f"q{i}", question=f"Question {i}?", answer=r) for i, r in enumerate(refs)], name="fixed")


def table_agent(name, table):
    """Answers ``table[example.id]`` ("-" means an unparseable answer)."""
    return ScriptedAgent(name, lambda ex, msgs: "I do not know." if table[ex.id] == "-" else f"The answer is {table[ex.id]}.")


# ---------------------------------------------------------------- vote, by hand
VOTE_TASK_REFS = ["10", "5", "3"]
VOTE_ANSWERS = [  # per agent: q0, q1, q2
    {"q0": "10", "q1": "4", "q2": "3"},
    {"q0": "11", "q1": "5", "q2": "2"},
    {"q0": "11", "q1": "-", "q2": "3"},
]
# expected system score per coalition (by agent index) per question, worked out by hand:
# plurality of parseable answers, ties to the tied answer given first in pool order.
VOTE_EXPECTED = {
    (0,): [1, 0, 1],
    (1,): [0, 1, 0],
    (2,): [0, 0, 1],
    (0, 1): [1, 0, 1],  # q0 tie 10/11 -> model_0's 10; q1 tie 4/5 -> 4; q2 tie 3/2 -> 3
    (0, 2): [1, 0, 1],  # q1: model_2 does not vote -> 4
    (1, 2): [0, 1, 0],  # q0 11; q1 5; q2 tie 2/3 -> model_1's 2
    (0, 1, 2): [0, 0, 1],  # q0 11 (2 votes); q1 tie 4/5 -> 4; q2 3
}


@pytest.mark.parametrize("coalition", list(VOTE_EXPECTED))
def test_vote_every_coalition_by_hand(coalition):
    pool = agents.pool([table_agent(f"t{i}", t) for i, t in enumerate(VOTE_ANSWERS)])
    task = fixed_task(VOTE_TASK_REFS)
    eps = crl_envs.run_episodes("vote", pool, task, coalition=[IDS[i] for i in coalition], progress=False)
    assert [e.score for e in eps] == VOTE_EXPECTED[coalition]
    assert all(e.coalition == [IDS[i] for i in coalition] for e in eps)


# ---------------------------------------------------------------- debate, by hand
def peers_of(messages):
    m = re.search(r"Other agents' answers:\n(.*?)\nYour previous answer", messages[-1]["content"], re.S)
    return re.findall(r"Agent \d+: (.*)", m.group(1)) if m else []


def stubborn(ex, msgs):  # always 8
    return "The answer is 8."


def follower(ex, msgs):  # round 1: 6; later: copies Agent 1's answer; alone: 7
    if "previous answer" not in msgs[-1]["content"]:
        return "The answer is 6."
    peers = peers_of(msgs)
    return peers[0] if peers else "The answer is 7."


def flipper(ex, msgs):  # round 1: 9; later: 6
    return "The answer is 9." if "previous answer" not in msgs[-1]["content"] else "The answer is 6."


DEBATE_EXPECTED = {  # reference 8
    (0,): (1, {"model_0": 1}),
    (1,): (0, {"model_1": 0}),  # self-refinement: 6 -> 7
    (2,): (0, {"model_2": 0}),
    (0, 1): (1, {"model_0": 1, "model_1": 0}),  # B copies A's 8
    (0, 2): (1, {"model_0": 1, "model_2": 0}),  # 8 vs 6 tie -> model_0's 8
    (1, 2): (0, {"model_1": 0, "model_2": 0}),  # B copies C's 9, C says 6: tie -> 9
    (0, 1, 2): (1, {"model_0": 1, "model_1": 0, "model_2": 0}),  # 8, 8, 6
}


@pytest.mark.parametrize("coalition", list(DEBATE_EXPECTED))
def test_debate_every_coalition_by_hand(coalition):
    pool = agents.pool([ScriptedAgent("A", stubborn), ScriptedAgent("B", follower), ScriptedAgent("C", flipper)])
    task = fixed_task(["8"])
    (ep,) = crl_envs.run_episodes("debate", pool, task, coalition=[IDS[i] for i in coalition], progress=False)
    score, standalone = DEBATE_EXPECTED[coalition]
    assert ep.score == score
    assert ep.standalone == standalone
    assert len(ep.transcript) == 2 * len(coalition)


def test_debate_three_rounds_reads_previous_round():
    pool = agents.pool([ScriptedAgent("C", flipper), ScriptedAgent("B", follower)])
    (ep,) = crl_envs.run_episodes("debate", pool, fixed_task(["6"]), options={"rounds": 3}, progress=False)
    # r1: C 9, B 6; r2: C 6, B copies C's 9; r3: C 6, B copies C's r2 answer 6 -> 6, 6
    assert [t.text for t in ep.transcript if t.phase == 2] == ["The answer is 6.", "The answer is 6."]
    assert ep.answer == "6" and ep.score == 1


def test_debate_one_round_equals_vote(arith_task):
    def guesser(k):  # right on questions whose index is divisible by k, else answer + k
        return ScriptedAgent(f"g{k}", lambda ex, m: f"The answer is {int(ex.answer) + (0 if int(ex.id.split('-')[1]) % k == 0 else k)}.")

    pool = agents.pool([guesser(2), guesser(3), guesser(5)])
    d = crl_envs.run_episodes("debate", pool, arith_task, options={"rounds": 1}, progress=False)
    v = crl_envs.run_episodes("vote", pool, arith_task, progress=False)
    assert [e.score for e in d] == [e.score for e in v]
    assert 0 < np.mean([e.score for e in v]) < 1


# ---------------------------------------------------------------- masking
def marker_agent(name):
    return ScriptedAgent(name, lambda ex, msgs: f"MARK-{name}-{len(msgs[-1]['content'])} The answer is 1.")


@pytest.mark.parametrize("factory", [crl_envs.debate_v0, crl_envs.vote_v0])
def test_masked_agents_never_reach_observations(factory, arith_task):
    pool = agents.pool([marker_agent(f"m{i}") for i in range(3)])
    for coalition in COALITIONS:
        env = factory(pool, arith_task, rounds=3) if factory is crl_envs.debate_v0 else factory(pool, arith_task)
        obs, infos = env.reset(seed=1, options={"coalition": coalition})
        masked = [pool[a].name for a in IDS if a not in coalition]
        seen = []
        while env.agents:
            assert set(env.agents) == set(coalition)
            for a in env.agents:
                seen.append(obs[a]["prompt"])
                seen.extend(m["content"] for m in infos[a]["messages"] or [])
            actions = {
                a: pool[a].generate([agents.Request(infos[a]["messages"])])[0].text
                for a in env.agents
                if infos[a]["active"]
            }
            obs, rewards, terms, truncs, infos = env.step(actions)
        blob = "\n".join(seen)
        assert all(f"MARK-{m}-" not in blob for m in masked)
        if len(coalition) > 1 and factory is crl_envs.debate_v0:
            assert "MARK-" in blob  # present members do see each other


# ---------------------------------------------------------------- errors and limits
def test_bad_inputs_give_clear_errors(scripted_pool, arith_task):
    with pytest.raises(ValueError, match="unknown protocol 'chat'"):
        crl_envs.run_episodes("chat", scripted_pool, arith_task, progress=False)
    with pytest.raises(ValueError, match="empty pool"):
        crl_envs.vote_v0([], arith_task)
    env = crl_envs.debate_v0(scripted_pool, arith_task)
    with pytest.raises(ValueError, match="unknown agent 'model_7'"):
        env.reset(options={"coalition": ["model_0", "model_7"]})
    with pytest.raises(ValueError, match="empty coalition.*empty_value = 0.0"):
        env.reset(options={"coalition": []})
    with pytest.raises(ValueError, match="malformed agent spec 'gpt4'"):
        agents.pool("gpt4")
    with pytest.raises(ValueError, match="unknown agent backend 'foo'"):
        agents.pool("foo:bar")
    with pytest.raises(ValueError, match="rounds"):
        crl_envs.debate_v0(scripted_pool, arith_task, rounds=0)
    with pytest.raises(ValueError, match="unknown prompt template"):
        crl_envs.vote_v0(scripted_pool, arith_task, prompts={"nope": "{question}"})
    env.reset(seed=0)
    with pytest.raises(TypeError, match="model_0's action must be a str"):
        env.step({"model_0": 42, "model_1": "1", "model_2": "1"})


def test_oversized_action_is_truncated_not_an_error(scripted_pool, arith_task):
    # A truncated action counts as cut off: only a complete final marker before the cut is read.
    ref = arith_task[0].answer
    marked = f"The answer is {ref}. "
    env = crl_envs.vote_v0(scripted_pool, arith_task, max_action_chars=len(marked) + 5)
    env.reset(seed=0, options={"example": 0})
    obs, rewards, terms, *_ = env.step({a: marked + "x" * 10_000 for a in env.agents})
    assert all(terms.values()) and all(len(t.text) <= len(marked) + 5 for t in env.transcript)
    assert set(rewards.values()) == {1.0}
    env.reset(seed=0, options={"example": 0})   # a bare number cut mid-answer is not an answer
    obs, rewards, *_ = env.step({a: ref + " " + "x" * 10_000 for a in env.agents})
    assert set(rewards.values()) == {0.0}


def test_coalition_wrapper_matches_reset_option(scripted_pool, arith_task):
    from crl_envs.wrappers import Coalition

    wrapped = Coalition(crl_envs.vote_v0(scripted_pool, arith_task), ["model_2", "model_1"])
    obs, infos = wrapped.reset(seed=3)
    assert wrapped.agents == ["model_1", "model_2"] and set(obs) == {"model_1", "model_2"}
    with pytest.raises(ValueError, match="unknown agent"):
        Coalition(crl_envs.vote_v0(scripted_pool, arith_task), ["model_9"])


def test_rewards_are_the_system_score_for_every_member(scripted_pool, arith_task):
    env = crl_envs.debate_v0(scripted_pool, arith_task)
    obs, infos = env.reset(seed=0, options={"example": 2})
    total = dict.fromkeys(env.agents, 0.0)
    while env.agents:
        acts = {a: scripted_pool[a].generate([agents.Request(infos[a]["messages"], metadata={"example": arith_task[2], "phase": infos[a]["phase"]})])[0].text
                for a in env.agents if infos[a]["active"]}
        obs, rew, terms, truncs, infos = env.step(acts)
        for a, r in rew.items():
            total[a] += r
    final = next(iter(infos.values()))
    assert set(total.values()) == {final["score"]}
    assert final["reference"] == arith_task[2].answer
    assert np.isclose(final["score"], float(final["answer"] == arith_task[2].answer))
