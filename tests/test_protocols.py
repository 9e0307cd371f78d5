"""Every protocol in ``crl_envs.protocols.PROTOCOLS`` against PettingZoo's API and seed tests, plus
multi-phase determinism, the docstring contract and prompt overrides. A protocol added to
``PROTOCOLS`` is tested here without touching this file."""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test
from pettingzoo.utils.conversions import parallel_to_aec

import agents
import crl_envs
from agents import ScriptedAgent
from crl_envs.protocols import PROTOCOLS
from crl_envs.wrappers import Coalition

ROLE = ScriptedAgent("role", lambda ex, msgs: "1")
#: (protocol, options): every protocol with its defaults, plus the option variants that change its spaces or roles.
CASES = [(name, {}) for name in PROTOCOLS] + [
    ("routing", {"router": "discrete"}),
    ("moa", {"aggregator": ROLE, "layers": 3}),
    ("feedback", {"summariser": "model_2"}),
    ("topology", {"graph": [[0, 1, 0], [0, 0, 1], [1, 0, 0]], "rounds": 3}),
    ("blender", {"top_k": 1, "ranker": ROLE, "fuser": ROLE}),
    ("judge", {"judge": ROLE}),
    ("cascade", {"order": [2, 0, 1]}),
    ("relay", {"passes": 2}),
    ("refine", {"drafter": ROLE}),
]
IDS = [name + ("" if not opts else "-" + "-".join(sorted(opts))) for name, opts in CASES]


@pytest.fixture(params=CASES, ids=IDS)
def make_env(request, scripted_pool, arith_task):
    name, options = request.param

    def make():
        return PROTOCOLS[name](scripted_pool, arith_task, **options)

    return make


def sampled_actions(env, obs, infos):
    """Actions for every live agent, sampled from its (seeded) action space, respecting any mask."""
    out = {}
    for a in env.agents:
        mask = obs[a].get("action_mask") if isinstance(obs[a], dict) else None
        out[a] = env.action_space(a).sample(mask) if mask is not None else env.action_space(a).sample()
    return out


def test_parallel_api(make_env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PettingZoo reports most API problems as warnings
        parallel_api_test(make_env(), num_cycles=100)


def test_parallel_api_single_member_coalition(make_env):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # masked members are not live, by design (DESIGN.md), so they never "terminate"
        warnings.filterwarnings("ignore", "No agents present but not all possible_agents")
        parallel_api_test(Coalition(make_env(), ["model_1"]), num_cycles=100)


def test_parallel_seed(make_env):
    parallel_seed_test(make_env, num_cycles=100)


def test_aec_api(make_env):
    api_test(parallel_to_aec(make_env()), num_cycles=100)


def test_every_phase_is_deterministic_under_a_seed(make_env):
    """parallel_seed_test stops after the first step; here every phase is compared."""
    runs = []
    for _ in range(2):
        env = make_env()
        obs, infos = env.reset(seed=11)
        for i, a in enumerate(env.possible_agents):
            env.action_space(a).seed(100 + i)
        trace = [(obs, {a: {k: v for k, v in i.items()} for a, i in infos.items()})]
        while env.agents:
            out = env.step(sampled_actions(env, obs, infos))
            obs, infos = out[0], out[4]
            trace.append(out)
        runs.append(repr(trace))
    assert runs[0] == runs[1]
    assert runs[0].count("'phase':") >= 2  # at least one phase and the end


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_run_episodes_is_deterministic(case, scripted_pool, arith_task):
    name, options = case
    if options.get("router") == "discrete":
        options = {**options, "router_agent": ScriptedAgent("index", lambda ex, msgs: "2")}
    a, b = (crl_envs.run_episodes(name, scripted_pool, arith_task, options=options, examples=range(4), progress=False)
            for _ in range(2))
    for e in a + b:  # wall-clock seconds are the only thing allowed to differ
        for u in e.usage.values():
            u.seconds = 0.0
    assert [e.to_dict() for e in a] == [e.to_dict() for e in b]
    assert all(e.protocol == f"{name}_v0" for e in a)


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_docstring_contract(name):
    """The PettingZoo-style table and the coalition semantics table, with v(∅) matching ``empty_value``."""
    module = inspect.getmodule(PROTOCOLS[name])
    doc = module.__doc__
    for row in ("Import", "Agents", "Phases", "Observation", "Action", "Reward", "System answer", "Final infos",
                "Arguments"):
        assert re.search(rf"^\| {row} \|", doc, re.M), f"{name}: docstring table lacks the {row!r} row"
    assert f"crl_envs.{name}_v0(" in doc
    assert "Coalition semantics" in doc and "| 1 member |" in doc and "| 0 members |" in doc
    assert "Version history" in doc
    env_cls = type(PROTOCOLS[name](agents.pool([ROLE]), "arith"))
    (stated,) = re.findall(r"v\(∅\) = ([0-9.]+)", doc)
    assert float(stated) == env_cls.empty_value
    assert env_cls.metadata["name"] == f"{name}_v0"


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_prompts_put_the_question_first_and_are_overridable(name, scripted_pool, arith_task):
    env = PROTOCOLS[name](scripted_pool, arith_task)
    assert env.PROMPTS, f"{name} has no prompt templates"
    for key, template in env.PROMPTS.items():
        assert template.startswith("{question}"), f"{name}.PROMPTS[{key!r}] must start with the question"
    key = next(iter(env.PROMPTS))
    custom = PROTOCOLS[name](scripted_pool, arith_task, prompts={key: "{question} <<OVERRIDDEN>>"})
    assert custom.prompts[key].endswith("<<OVERRIDDEN>>") and env.prompts[key] == env.PROMPTS[key]
    seen = []
    obs, infos = custom.reset(seed=0)
    while custom.agents:
        seen += [o["prompt"] for o in obs.values()]
        obs, *_, infos = custom.step(dict.fromkeys(custom.agents, "The answer is 1."))
    assert any("<<OVERRIDDEN>>" in p for p in seen), f"{name}: the overridden template {key!r} was never used"
    with pytest.raises(ValueError, match="unknown prompt template"):
        PROTOCOLS[name](scripted_pool, arith_task, prompts={"no_such_template": "{question}"})


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_agent_ids_follow_pettingzoo_naming(case, scripted_pool, arith_task):
    name, options = case
    env = PROTOCOLS[name](scripted_pool, arith_task, **options)
    assert env.possible_agents[:3] == scripted_pool.ids
    assert all(re.fullmatch(r"[a-z]+_[0-9]+", a) for a in env.possible_agents)
    assert set(env.role_agents) == set(env.possible_agents[3:])


def test_factories_are_exported_and_registered():
    import pettingzoo

    for name, factory in PROTOCOLS.items():
        assert getattr(crl_envs, f"{name}_v0") is factory
        env = pettingzoo.make("parallel", f"crl_envs/{name}-v0", pool=agents.pool([ROLE]), task="arith")
        assert env.unwrapped.metadata["name"] == f"{name}_v0"


def test_discrete_router_mask_and_space(scripted_pool, arith_task):
    env = crl_envs.routing_v0(scripted_pool, arith_task, router="discrete")
    obs, infos = env.reset(seed=0, options={"coalition": ["model_0", "model_2"]})
    assert obs["router_0"]["action_mask"].dtype == np.int8
    assert obs["router_0"]["action_mask"].tolist() == [1, 0, 1]
    assert env.observation_space("router_0").contains(obs["router_0"])
    assert env.action_space("router_0").n == 3
    for _ in range(20):  # PettingZoo's masked sampling only ever picks members
        assert env.action_space("router_0").sample(obs["router_0"]["action_mask"]) in (0, 2)
    obs, rewards, terms, truncs, infos = env.step({"router_0": np.int64(2)})
    assert [a for a, i in infos.items() if i["active"]] == ["model_2"]
    obs, rewards, terms, truncs, infos = env.step({"model_2": "The answer is 0."})
    assert all(terms.values()) and env.observation_space("router_0").contains(obs["router_0"])
    with pytest.raises(ValueError, match="router must be 'llm' or 'discrete'"):
        crl_envs.routing_v0(scripted_pool, arith_task, router="bandit")


def test_discrete_router_without_a_model_fails_clearly(scripted_pool, arith_task):
    with pytest.raises(RuntimeError, match="has no router model: pass router_agent="):
        crl_envs.run_episodes("routing", scripted_pool, arith_task, options={"router": "discrete"}, examples=[0],
                              progress=False)


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("moa", {"layers": 0}, "layers must be an int >= 1"),
        ("moa", {"aggregator": "model_9"}, "neither a pool member"),
        ("moa", {"aggregator": 7}, "out of range for a pool of 3"),
        ("judge", {"judge": 1.5}, "judge must be None, a pool agent id"),
        ("cascade", {"order": ["model_0", "model_1"]}, "must list every pool agent exactly once"),
        ("cascade", {"order": ["model_0", "model_1", "model_5"]}, "unknown agent 'model_5'"),
        ("cascade", {"threshold": 11}, "threshold must be a number in"),
        ("relay", {"passes": 0}, "passes must be an int >= 1"),
        ("topology", {"graph": "hypercube"}, "unknown topology graph 'hypercube'"),
        ("topology", {"graph": [[0, 1], [1, 0]]}, "must be an 3 x 3 matrix"),
        ("blender", {"top_k": 0}, "top_k must be an int >= 1"),
        ("routing", {"descriptions": ["a", "b"]}, "sequence of 3 strings"),
        ("routing", {"descriptions": {"model_0": "a"}}, "missing"),
    ],
)
def test_bad_options_raise_clear_errors(name, options, match, scripted_pool, arith_task):
    with pytest.raises((ValueError, TypeError), match=match):
        PROTOCOLS[name](scripted_pool, arith_task, **options)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_protocol_runs_on_real_models(name, tiny_model_dir, arith_task):
    """The real generation path: HF models (a tiny random GPT-2) through the batched runner."""
    from agents import HFAgent, SamplingParams

    model = HFAgent(tiny_model_dir, name="tiny")
    pool = agents.pool([model, model, model])
    eps = crl_envs.run_episodes(name, pool, arith_task, examples=range(3), progress=False,
                                sampling=SamplingParams(max_new_tokens=8))
    assert len(eps) == 3 and all(0.0 <= e.score <= 1.0 for e in eps)
    usage = crl_envs.total_usage(eps)
    assert sum(u.calls for u in usage.values()) == sum(len(e.transcript) for e in eps) > 0
    assert all(u.prompt_tokens > 0 and u.completion_tokens > 0 for u in usage.values())


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_unknown_option_lists_the_documented_options(name, scripted_pool, arith_task):
    """A typo in an option names the closest valid one and lists every option the docstring documents."""
    doc = inspect.getmodule(PROTOCOLS[name]).__doc__
    (row,) = re.findall(r"^\| Arguments \|(.*)\|$", doc, re.M)
    documented = re.findall(r"``([a-z_]+)``", row)  # option names; quoted values (``"llm"``) do not match
    typo = documented[0][:-1]
    with pytest.raises(ValueError) as caught:
        PROTOCOLS[name](scripted_pool, arith_task, **{typo: 1})
    message = str(caught.value)
    assert message.startswith(f"{name}_v0: unknown option {typo!r} (did you mean {documented[0]!r}?)")
    listed = message.split("valid options: ")[1].split(", ")
    assert sorted(listed) == sorted(documented)
    assert crl_envs.protocols.valid_options(name) == listed


def test_reset_options_passed_to_the_factory_point_to_reset(scripted_pool, arith_task):
    with pytest.raises(ValueError, match=r"unknown option 'coalition' \(a reset option.*coalition=\[\.\.\.\]"):
        crl_envs.debate_v0(scripted_pool, arith_task, coalition=["model_0"])
    with pytest.raises(ValueError, match=r"unknown options 'example' \(a reset option.*'roundz' \(did you mean 'rounds'"):
        crl_envs.debate_v0(scripted_pool, arith_task, example=0, roundz=2)


@pytest.mark.parametrize("value, error", [("100", TypeError), (100.0, TypeError), (True, TypeError), (0, ValueError)])
def test_max_action_chars_must_be_a_positive_int(value, error, scripted_pool, arith_task):
    with pytest.raises(error, match="max_action_chars must be an int >= 1"):
        crl_envs.vote_v0(scripted_pool, arith_task, max_action_chars=value)


def test_protocol_roster_is_known_without_importing_the_protocols():
    """``crl_envs.PROTOCOL_MODULES`` (what ``import crl_envs`` registers with PettingZoo, lazily) lists
    exactly the protocols of ``crl_envs.protocols.PROTOCOLS``."""
    assert list(crl_envs.PROTOCOL_MODULES) == list(PROTOCOLS)
    for name, module in crl_envs.PROTOCOL_MODULES.items():
        assert inspect.getmodule(PROTOCOLS[name]).__name__ == module
