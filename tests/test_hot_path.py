"""The runner's typed hot path: a request's context (and its old ``metadata`` spelling), a protocol env's
pending turns (the typed view of its active infos), and ``run_episodes`` given an env as a template."""

from __future__ import annotations

import pytest

import agents
import crl_envs
from agents import Request, RequestContext, ScriptedAgent
from crl_envs.protocols import PROTOCOLS
from crl_envs.runner import phase_requests, run_coalitions
from crl_kit.errors import ConfigError, ConfigTypeError

ASK = [{"role": "user", "content": "2+2?"}]


def comparable(episodes):
    """Episodes as dicts, wall-clock seconds (the only thing allowed to differ) left out."""
    out = []
    for e in episodes:
        d = e.to_dict()
        for u in d["usage"].values():
            u.pop("seconds")
        out.append(d)
    return out


# ---------------------------------------------------------------------- RequestContext and Request.metadata
def test_metadata_dict_becomes_the_context_and_reads_back(arith_task):
    ex = arith_task[0]
    req = Request(ASK, metadata={"example": ex, "phase": "round_1", "x": 1})
    assert req.context == RequestContext(example=ex, phase="round_1", extra={"x": 1})
    assert dict(req.metadata) == {"example": ex, "phase": "round_1", "x": 1}
    assert req.metadata["example"] is ex and req.metadata.get("agent_id") is None
    with pytest.raises(TypeError):
        req.metadata["phase"] = "round_2"  # read-only: the context is the one place it lives
    positional = Request(ASK, req.sampling, {"example": ex})  # the old third positional argument
    assert positional.context.example is ex


def test_context_reads_as_the_old_metadata(arith_task):
    ctx = RequestContext(example=arith_task[1], protocol="vote_v0", phase="vote", phase_index=0,
                         agent_id="model_0", sample=0)
    req = Request(ASK, context=ctx)
    assert list(req.metadata) == ["example", "protocol", "phase", "phase_index", "agent_id", "sample"]
    assert req.metadata["phase_index"] == 0 and req.metadata["sample"] == 0
    assert Request(ASK).metadata == {} and Request(ASK).context == RequestContext()


def test_context_and_metadata_together_or_malformed_fail():
    with pytest.raises(ConfigError, match="not both"):
        Request(ASK, metadata={"phase": "a"}, context=RequestContext(phase="a"))
    with pytest.raises(ConfigTypeError, match="RequestContext"):
        Request(ASK, context={"phase": "a"})
    with pytest.raises(ConfigTypeError, match="metadata must be a dict"):
        Request(ASK, metadata=["phase"])


def test_scripted_expert_answers_the_same_from_either_spelling(arith_task):
    expert = ScriptedAgent.expert("e", 0.5, seed=3)
    for ex in arith_task.examples:
        for phase in ("round_1", "round_2", None):
            old = {"example": ex} if phase is None else {"example": ex, "phase": phase}
            new = RequestContext(example=ex, phase=phase)
            a, b = expert.generate([Request(ASK, metadata=old), Request(ASK, context=new)])
            assert a.text == b.text
    with pytest.raises(ConfigError, match="task example"):
        expert.generate([Request(ASK)])


# ---------------------------------------------------------------------- pending turns
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_pending_turns_are_the_active_infos(name, scripted_pool, arith_task):
    env = PROTOCOLS[name](scripted_pool, arith_task)
    assert env.pending_turns() == []  # before reset
    _, infos = env.reset(seed=0, options={"example": 2})
    while env.agents:
        turns = env.pending_turns()
        assert [(t.agent_id, t.phase, t.phase_index, t.messages) for t in turns] == [
            (a, i["phase"], i["phase_index"], i["messages"]) for a, i in infos.items() if i["active"]]
        actions = {t.agent_id: env.agent_for(t.agent_id).generate(
            [Request(t.messages, context=RequestContext(example=env.example, phase=t.phase))])[0].text for t in turns}
        _, _, _, _, infos = env.step(actions)
    assert env.pending_turns() == []  # after the end


def test_phase_requests_narrowed_by_infos(scripted_pool, arith_task):
    env = crl_envs.vote_v0(scripted_pool, arith_task)
    _, infos = env.reset(seed=0, options={"example": 1})
    everyone = phase_requests(env, infos, env.example, seed=5)
    assert [a for a, _, _ in everyone] == ["model_0", "model_1", "model_2"]
    assert [a for a, _, _ in phase_requests(env, seed=5)] == ["model_0", "model_1", "model_2"]
    others = phase_requests(env, {a: i for a, i in infos.items() if a != "model_1"}, env.example, seed=5)
    assert [a for a, _, _ in others] == ["model_0", "model_2"]
    _, _, request = others[1]
    assert request.context == RequestContext(example=env.example, protocol="vote_v0", phase=infos["model_2"]["phase"],
                                             phase_index=0, agent_id="model_2", sample=0)
    assert request.sampling == everyone[2][2].sampling  # the same seed, whoever else is asked


# ---------------------------------------------------------------------- an env as the template
def test_env_options_are_what_the_env_was_made_with(scripted_pool, arith_task):
    assert crl_envs.debate_v0(scripted_pool, arith_task, rounds=3).env_options == {"rounds": 3}
    assert crl_envs.vote_v0(pool=scripted_pool, task=arith_task).env_options == {}


@pytest.mark.parametrize("name, options", [("debate", {"rounds": 3}), ("vote", {}), ("cascade", {"order": [2, 0, 1]}),
                                           ("judge", {"judge": ScriptedAgent("j", lambda ex, m: "1")})])
def test_an_env_plays_as_its_factory_pool_task_and_options(name, options, scripted_pool, arith_task):
    template = PROTOCOLS[name](scripted_pool, arith_task, **options)
    kw = dict(seed=4, samples=2, examples=[0, 3], progress=False)
    expected = crl_envs.run_episodes(name, scripted_pool, arith_task, options=options, **kw)
    assert comparable(crl_envs.run_episodes(template, **kw)) == comparable(expected)
    # the env's own pool, task and options may be repeated
    same = crl_envs.run_episodes(template, scripted_pool, arith_task, options=options, **kw)
    assert comparable(same) == comparable(expected)
    both = run_coalitions(template, None, None, [None, [0]], **kw)
    assert comparable(both[0]) == comparable(expected)


def test_a_template_refuses_other_pool_task_or_options(scripted_pool, arith_task):
    from crl_envs import tasks

    template = crl_envs.debate_v0(scripted_pool, arith_task, rounds=3)
    other_pool = agents.pool([ScriptedAgent.expert("x", 0.5)])
    same_agents = agents.pool(list(scripted_pool.values()))  # another Pool object of the same agents: the same pool
    assert len(crl_envs.run_episodes(template, same_agents, examples=[0], progress=False)) == 1
    with pytest.raises(ConfigError, match=r"debate_v0 env.*differ from the env's: pool\. Pass the env alone"):
        crl_envs.run_episodes(template, other_pool, progress=False)
    with pytest.raises(ConfigError, match=r"differ from the env's: pool, task\."):
        crl_envs.run_episodes(template, other_pool, tasks.load("arith", n=3), progress=False)
    with pytest.raises(ConfigError, match=r"differ from the env's: options \['rounds'\]"):
        crl_envs.run_episodes(template, options={"rounds": 2}, progress=False)
    with pytest.raises(ConfigError, match=r"differ from the env's: options \['prompts'\]"):
        crl_envs.run_episodes(template, options={"rounds": 3, "prompts": {}}, progress=False)
    with pytest.raises(ConfigTypeError, match="options must be a dict"):
        crl_envs.run_episodes(template, options=[("rounds", 3)], progress=False)


def test_a_factory_still_needs_pool_and_task(scripted_pool):
    with pytest.raises(ConfigTypeError, match="needs a pool and a task"):
        crl_envs.run_episodes("debate", scripted_pool, progress=False)
    with pytest.raises(ConfigTypeError, match="needs a pool and a task"):
        crl_envs.run_episodes(crl_envs.vote_v0, progress=False)
