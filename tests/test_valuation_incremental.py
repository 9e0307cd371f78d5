"""Incremental valuation: a coalition's cached result is keyed by what plays it (its members, not the
whole pool), so adding a model costs only the coalitions that contain it, and a reused result equals a
fresh one bit for bit (transcripts and scores)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

import agents
from agents import ScriptedAgent
from crl_envs import protocols, tasks, valuation
from crl_envs.valuation.coalition import CoalitionRun, coalition_episodes
from crl_envs.valuation.game import CoalitionGame, mask_of


class Echo(ScriptedAgent):
    """Answers from a hash of (its name, the request's sampling seed, the whole prompt): anything in a run
    that depended on the rest of the pool (a seed, a peer's text, a graph edge) would change its text."""

    def _respond(self, request):
        ex = request.metadata["example"]
        text = "\n".join(m["content"] for m in request.messages)
        h = int(hashlib.sha256(f"{self.name}|{request.sampling.seed}|{text}".encode()).hexdigest(), 16)
        answer = ex.answer if h % 3 else str(h % 17)
        return f"The answer is {answer}. Confidence: {h % 10}"


def members(k: int):
    return [Echo(f"echo{i}", lambda ex, msgs: "") for i in range(k)]


def episodes_of(protocol: str, pool, task, coalition: list[str], options: dict, sampling) -> list:
    factory = protocols.get(protocol)
    run = CoalitionRun(factory, pool, task, 2, 7, sampling, options, [e.id for e in task.examples])
    return coalition_episodes(run, mask_of(pool.ids.index(a) for a in coalition))


def transcript(eps) -> list:
    return [(e.example_id, e.sample, e.score, e.answer, [(t.phase, t.agent, t.model, t.messages, t.text)
                                                          for t in e.transcript]) for e in eps]


@pytest.mark.parametrize("protocol", sorted(protocols.PROTOCOLS))
def test_reused_coalition_equals_fresh_bit_for_bit(protocol, tmp_path):
    """For every protocol: coalition {model_0, model_2} of a 4-pool and of the same pool plus a newcomer has
    one cache key, and playing it in either pool gives the same transcripts and scores (sampled)."""
    task = tasks.load("arith", n=4, seed=3)
    small, large = agents.pool(members(4)), agents.pool(members(5))
    sampling = agents.SamplingParams(temperature=1.0, max_new_tokens=8)
    coalition = ["model_0", "model_2"]
    a = episodes_of(protocol, small, task, coalition, {}, sampling)
    b = episodes_of(protocol, large, task, coalition, {}, sampling)
    assert transcript(a) == transcript(b)
    ga = CoalitionGame(protocol, small, task, samples=2, seed=7, sampling=sampling, cache_dir=tmp_path)
    gb = CoalitionGame(protocol, large, task, samples=2, seed=7, sampling=sampling, cache_dir=tmp_path)
    assert ga.key != gb.key  # different games (pools) ...
    assert ga.coalition_key(0b101) == gb.coalition_key(0b101)  # ... sharing this coalition's result
    fresh = ga.value(0b101)
    assert gb.cached(0b101) and gb.evaluations == 0
    np.testing.assert_array_equal(gb.value(0b101), fresh)


def test_pool_dependent_runs_are_keyed_apart(tmp_path):
    """A ring's closing edge depends on the pool's size: members {0, 3} are linked in a ring of 4, not of 5.
    Their runs differ, and so do their cache keys."""
    task = tasks.load("arith", n=4, seed=3)
    small, large = agents.pool(members(4)), agents.pool(members(5))
    options = {"graph": "ring", "rounds": 2}
    a = episodes_of("topology", small, task, ["model_0", "model_3"], options, None)
    b = episodes_of("topology", large, task, ["model_0", "model_3"], options, None)
    assert transcript(a) != transcript(b)
    key = lambda pool: CoalitionGame("topology", pool, task, options=options, cache_dir=tmp_path).coalition_key(0b1001)  # noqa: E731
    assert key(small) != key(large)
    chain = lambda pool: CoalitionGame("topology", pool, task, options={"graph": "chain"},  # noqa: E731
                                       cache_dir=tmp_path).coalition_key(0b1001)
    assert chain(small) == chain(large)  # a chain's edges among 0..3 do not depend on a fifth node


def test_adding_a_model_costs_two_to_the_n_coalitions(tmp_path):
    task = tasks.load("arith", n=12, seed=1)
    experts = [ScriptedAgent.expert(f"e{a}", a, seed=2) for a in (0.9, 0.7, 0.6, 0.4, 0.55)]
    evaluate = valuation.evaluate
    first = evaluate("debate", agents.pool(experts[:4]), task, cache_dir=tmp_path, progress=False)
    assert (first.system_evaluations, first.individual_evaluations) == (15, 4)
    grown = evaluate("debate", agents.pool(experts), task, cache_dir=tmp_path, progress=False)
    assert (grown.system_evaluations, grown.individual_evaluations) == (2 ** 4, 1)  # only coalitions with e0.55
    assert grown.cached_evaluations == 15 + 4
    fresh = evaluate("debate", agents.pool(experts), task, cache_dir=False, progress=False)
    for name, m in fresh.measures.items():
        np.testing.assert_array_equal(grown.measures[name].per_question, m.per_question, err_msg=name)
    # LOO: the grown pool's N and N minus each old member are new; N minus the newcomer is the old N
    loo_dir = tmp_path / "loo"
    evaluate("vote", agents.pool(experts[:4]), task, estimator="loo", cache_dir=loo_dir, progress=False)
    loo = evaluate("vote", agents.pool(experts), task, estimator="loo", cache_dir=loo_dir, progress=False)
    assert (loo.system_evaluations, loo.individual_evaluations) == (0, 1)  # vote: computed from the models alone


def test_pools_sharing_members_share_their_coalitions(tmp_path):
    task = tasks.load("arith", n=10, seed=5)
    a, b, c, d = (ScriptedAgent.expert(f"x{k}", acc, seed=1) for k, acc in enumerate((0.8, 0.6, 0.5, 0.7)))
    valuation.evaluate("vote", agents.pool([a, b, c]), task, cache_dir=tmp_path, progress=False)
    other = valuation.evaluate("vote", agents.pool([a, b, d]), task, cache_dir=tmp_path, progress=False)
    # {a}, {b} are the same games in both pools (same members at the same positions); vote's one-member
    # coalitions are its individual runs and its others are computed from them, so only {d} is played
    assert (other.system_evaluations, other.individual_evaluations, other.cached_evaluations) == (0, 1, 2)


def test_cache_files_name_what_played_and_nothing_else(tmp_path):
    import json

    from crl_envs.valuation.game import CACHE_VERSION

    task = tasks.load("arith", n=3)
    pool = agents.pool([ScriptedAgent.expert(f"y{k}", 0.5) for k in range(3)])
    CoalitionGame("debate", pool, task, cache_dir=tmp_path, progress=False).value(0b011)
    (path,) = (tmp_path / "debate_v0").glob("*.json")
    record = json.loads(path.read_text())
    assert record["version"] == CACHE_VERSION == 3 and record["coalition"] == ["model_0", "model_1"]
    assert [m[0] for m in record["describe"]["members"]] == ["model_0", "model_1"]
    assert "y2" not in json.dumps(record)  # the member left out is nowhere in what keys the result


def test_ray_address_and_argument_errors_are_ours():
    from crl_envs.valuation import RayExecutor
    from crl_envs.valuation.executors import check_reachable

    with pytest.raises(TypeError, match=r"unexpected argument 'num_cpu' \(did you mean 'num_cpus'\?\)"):
        RayExecutor(num_cpu=2)
    for address, why in (("http://head:6379", "unknown scheme 'http'"), ("head:63x9", "port '63x9'"),
                         ("he ad:6379", "not a host name"), (":6379", "no host")):
        with pytest.raises(ValueError, match=f"malformed Ray address .*{why}") as e:
            RayExecutor(address)
        assert "\n" not in str(e.value) and "Name or service" not in str(e.value)
    with pytest.raises(ConnectionError, match="does not resolve") as e:
        check_reachable("no-such-host.invalid:6379", timeout=1.0)
    assert "Name or service not known" not in str(e.value)


def test_no_import_circle_through_valuation_or_study():
    """Imports read with ast, lazy ones (inside functions, under TYPE_CHECKING) counted: no module of
    crl_envs.valuation or crl_envs.study lies on a circle (executors no longer imports game)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    modules = {}
    for path in (root / "crl_envs").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # "from pkg import submodule" depends on the submodule; "from pkg import name" on pkg
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs + ([node.module] if len(subs) < len(node.names) else [])
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            m = stack.pop()
            for d in graph.get(m, ()):
                if d == goal:
                    return True
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
        return False

    ours = [m for m in graph if m.startswith(("crl_envs.valuation.", "crl_envs.study."))]
    assert "crl_envs.valuation.executors" in ours and "crl_envs.study.runner" in ours
    circles = [m for m in ours if reaches(m, m)]
    for m in circles:  # name one circle in the failure
        print(m, sorted(graph[m]))
    assert circles == [], f"import circles through {circles}"


def test_progress_bar_says_what_runs_and_weighs_each_run_by_its_calls(tmp_path, capfd):
    """One bar over the debate's coalitions and the models alone, advanced by model calls per question
    (a 3-member 2-round debate weighs 6, a model alone 1), so cheap runs do not make the ETA jump."""
    task = tasks.load("arith", n=3)
    pool = agents.pool([ScriptedAgent.expert(f"z{k}", 0.5) for k in range(3)])
    game = CoalitionGame("debate", pool, task, cache_dir=False, options={"rounds": 2})
    assert [game.cost(m) for m in (0b001, 0b011, 0b111)] == [2.0, 4.0, 6.0]
    valuation.evaluate("debate", pool, task, cache_dir=tmp_path, options={"rounds": 2})
    err = capfd.readouterr().err
    assert "debate_v0: 7 coalitions + 3 models alone" in err and "vote_v0+debate_v0" not in err
    assert "10/10 runs" in err and "100%" in err
