"""Protocol semantics by hand: for every protocol, scripted members whose answers depend on what they
are shown, and the system's answer for EVERY coalition of a 3-member pool worked out by hand (in the
comments next to each table). Plus: no observation ever contains a masked member's text or name."""

from __future__ import annotations

import itertools
import re

import pytest
from gymnasium import spaces

import agents
import crl_envs
from agents import Request, ScriptedAgent
from crl_envs.protocols import PROTOCOLS
from crl_envs.tasks import Example, NumericTask

A, B, C = "model_0", "model_1", "model_2"
COALITIONS = [frozenset(c) for r in (1, 2, 3) for c in itertools.combinations((A, B, C), r)]
REFERENCE = "30"


def task():
    return NumericTask([Example(id="q0", question="Question zero?", answer=REFERENCE)], name="fixed")


def user(msgs) -> str:
    return msgs[-1]["content"]


def lines(msgs, label="Agent") -> list[int]:
    """The last integer on each "Agent k: ..." line of the prompt, in order."""
    return [int(re.findall(r"-?\d+", rest)[-1]) for rest in re.findall(rf"^{label} \d+: (.*)$", user(msgs), re.M)
            if re.search(r"\d", rest)]


def answer(n) -> str:
    return f"The answer is {n}."


def pool_of(*scripts):
    return agents.pool([ScriptedAgent(name, fn) for name, fn in zip(("alpha", "beta", "gamma"), scripts)])


def outcomes(protocol, pool, options=None) -> dict[frozenset, str | None]:
    out = {}
    for coalition in COALITIONS:
        (ep,) = crl_envs.run_episodes(protocol, pool, task(), coalition=sorted(coalition), options=options,
                                      progress=False)
        assert ep.score == float(ep.answer == REFERENCE)
        out[coalition] = ep.answer
    return out


def table(a, b, c, ab, ac, bc, abc) -> dict[frozenset, str]:
    """Expected system answers, by coalition."""
    keys = [{A}, {B}, {C}, {A, B}, {A, C}, {B, C}, {A, B, C}]
    return {frozenset(k): None if v is None else str(v) for k, v in zip(keys, (a, b, c, ab, ac, bc, abc))}


# ---------------------------------------------------------------- vote and debate (the spine's two)
def test_vote_by_hand():
    pool = pool_of(lambda e, m: answer(10), lambda e, m: answer(20), lambda e, m: answer(20))
    # plurality, ties to pool order: AB 10/20 -> 10; AC 10/20 -> 10; ABC 10,20,20 -> 20
    assert outcomes("vote", pool) == table(10, 20, 20, 10, 10, 20, 20)


def test_debate_by_hand():
    def peers(m):
        return lines(m) if "Other agents' answers" in user(m) else []

    a = lambda e, m: answer(10)  # noqa: E731
    b = lambda e, m: answer(peers(m)[0] if peers(m) else 20)  # noqa: E731  round 2: copies Agent 1
    c = lambda e, m: answer(peers(m)[-1] if peers(m) else 30)  # noqa: E731  round 2: copies the last peer
    # AB: A 10, B copies A -> 10.  AC: C copies A -> 10.  BC: B copies C 30, C copies B 20 -> tie -> 30.
    # ABC: A 10, B copies A 10, C copies B 20 -> 10
    assert outcomes("debate", pool_of(a, b, c)) == table(10, 20, 30, 10, 10, 30, 10)


# ---------------------------------------------------------------- moa
def moa_pool():
    a = lambda e, m: answer(max(lines(m)) if lines(m) else 10)  # noqa: E731
    b = lambda e, m: answer(min(lines(m)) if lines(m) else 20)  # noqa: E731
    c = lambda e, m: answer(lines(m)[min(1, len(lines(m)) - 1)] if lines(m) else 30)  # noqa: E731  the 2nd shown
    return pool_of(a, b, c)


MOA_DEFAULT = table(
    10, 20, 30,
    20,  # L1 [10,20]; L2 A max 20, B min 10; A aggregates max(20,10)
    30,  # L1 [10,30]; L2 A 30, C 2nd 30; A aggregates 30
    20,  # L1 [20,30]; L2 B 20, C 30; B aggregates min 20
    30,  # L1 [10,20,30]; L2 A 30, B 10, C 20; A aggregates max 30
)
MOA_C_AGGREGATES = table(10, 20, 30, 20, 30, 30, 10)  # C masked -> A; AC: C takes 2nd of [30,30]; BC: 2nd of [20,30]; ABC: 2nd of [30,10,20]
MOA_OUTSIDE_MIN = table(10, 20, 30, 10, 30, 20, 10)  # outside aggregator = min of the last layer


@pytest.mark.parametrize("options, expected", [
    ({}, MOA_DEFAULT),
    ({"aggregator": "model_2"}, MOA_C_AGGREGATES),
    ({"aggregator": ScriptedAgent("agg", lambda e, m: answer(min(lines(m))))}, MOA_OUTSIDE_MIN),
])
def test_moa_by_hand(options, expected):
    assert outcomes("moa", moa_pool(), options) == expected


def test_moa_outside_aggregator_is_never_masked():
    env = crl_envs.moa_v0(moa_pool(), task(), aggregator=ScriptedAgent("agg", lambda e, m: "1"), layers=3)
    obs, infos = env.reset(options={"coalition": [B]})
    assert env.agents == [B, "aggregator_0"]
    phases = []
    while env.agents:
        phases.append(sorted(a for a, i in infos.items() if i["active"]))
        obs, _, _, _, infos = env.step({B: "x", "aggregator_0": "y"})
    assert phases == [[B], [B], [B], ["aggregator_0"]]


# ---------------------------------------------------------------- routing
def router(e, m):
    names = re.findall(r"^Model (\d+): (\w+)$", user(m), re.M)
    beta = [k for k, name in names if name == "beta"]
    return f"Model {beta[0]}" if beta else ("Model 2" if len(names) >= 2 else "Model 7")


def members_pool():
    return pool_of(lambda e, m: answer(10), lambda e, m: answer(20), lambda e, m: answer(30))


def test_routing_llm_router_by_hand():
    options = {"router_agent": ScriptedAgent("router", router)}
    # picks beta when listed, else "Model 2" (the 2nd present member), else 7 (invalid -> first member)
    # A: invalid -> A 10.  C: invalid -> C 30.  AB: beta.  AC: 2nd = C.  BC, ABC: beta
    assert outcomes("routing", members_pool(), options) == table(10, 20, 30, 20, 30, 20, 20)


def test_routing_discrete_router_by_hand():
    options = {"router": "discrete", "router_agent": ScriptedAgent("index", lambda e, m: "2")}
    # always pool index 2 (C); C masked -> first present member
    assert outcomes("routing", members_pool(), options) == table(10, 20, 30, 10, 30, 30, 30)


def test_routing_masked_choice_never_answers():
    env = crl_envs.routing_v0(members_pool(), task(), router="discrete")
    for choice in (0, 1, 2, 5):
        obs, infos = env.reset(options={"coalition": [A, C]})
        obs, _, _, _, infos = env.step({"router_0": choice})
        active = [a for a, i in infos.items() if i["active"]]
        assert active == ([C] if choice == 2 else [A])
        assert env.agents == [A, C, "router_0"]
        env.step({active[0]: answer(1)})
        assert env.outcome.details["valid_choice"] == (choice in (0, 2))


# ---------------------------------------------------------------- cascade
def cascade_pool():
    a = lambda e, m: "I should defer." if "defer" in user(m) else answer(10)  # noqa: E731
    b = lambda e, m: "I think 20 Confidence: 8"  # noqa: E731  confident; "8" must not be read as the answer
    c = lambda e, m: "The answer is 30. Confidence: 3"  # noqa: E731  below the threshold 5
    return pool_of(a, b, c)


@pytest.mark.parametrize("options, expected", [
    # order A,B,C: AB A defers -> B 20; AC A defers -> C (last) 30; BC B 20; ABC A defers -> B 20
    ({}, table(10, 20, 30, 20, 30, 20, 20)),
    # order C,B,A: AB B 20; AC C defers -> A (last) 10; BC C defers -> B 20; ABC C defers -> B 20
    ({"order": [C, B, A]}, table(10, 20, 30, 20, 10, 20, 20)),
    # threshold 2: C's confidence 3 now suffices. order C,B,A: AC 30; BC 30; ABC 30
    ({"order": [2, 1, 0], "threshold": 2}, table(10, 20, 30, 20, 30, 30, 30)),
])
def test_cascade_by_hand(options, expected):
    assert outcomes("cascade", cascade_pool(), options) == expected


def test_cascade_stops_at_the_first_confident_member():
    (ep,) = crl_envs.run_episodes("cascade", cascade_pool(), task(), options={"order": [C, B, A]}, progress=False)
    assert [t.agent for t in ep.transcript] == [C, B]  # A is never asked
    assert ep.answers == {C: "30", B: "20"} and ep.answer == "20"


# ---------------------------------------------------------------- feedback
def uses(m) -> list[int]:
    return [int(n) for n in re.findall(r"use (\d+)", user(m))]


def own(m) -> int:
    return int(re.search(r"Your answer: .*?(-?\d+)", user(m)).group(1))


def feedback_script(first, critique, revise):
    def respond(e, m):
        text = user(m)
        if "Summarise" in text:
            return answer(max(lines(m)))
        if "Point out any errors" in text:
            return critique(lines(m))
        if "Feedback:" in text:
            return answer(revise(uses(m), own(m)))
        return answer(first)
    return respond


def feedback_pool():
    return pool_of(
        feedback_script(10, lambda shown: f"Critique: use {max(shown)}", lambda u, o: o),
        feedback_script(20, lambda shown: "Critique: fine", lambda u, o: u[0] if u else o),
        feedback_script(30, lambda shown: f"Critique: use {min(shown)}", lambda u, o: u[-1] if u else o),
    )


# A critiques "use max", B "fine", C "use min"; A keeps, B adopts the first "use", C the last.
# C alone: critiques itself "use 30" -> 30.  AB: B gets "use 20" -> [10,20] -> 10.
# AC: C gets "use 30" -> [10,30] -> 10.  BC: B gets "use 20", C gets "fine" -> [20,30] -> 20.
# ABC: A says "use 30", C says "use 10"; B gets [use 30, use 10] -> 30; C gets [use 30, fine] -> 30 -> [10,30,30] -> 30
FEEDBACK_PLURALITY = table(10, 20, 30, 10, 10, 20, 30)


@pytest.mark.parametrize("options, expected", [
    ({}, FEEDBACK_PLURALITY),
    # an outside summariser answers the max of the revised answers: AB 20, AC 30, BC 30, ABC 30
    ({"summariser": ScriptedAgent("sum", lambda e, m: answer(max(lines(m))))}, table(10, 20, 30, 20, 30, 30, 30)),
    # member B summarises (max, as every script does); masked -> A summarises: same maxima
    ({"summariser": "model_1"}, table(10, 20, 30, 20, 30, 30, 30)),
])
def test_feedback_by_hand(options, expected):
    assert outcomes("feedback", feedback_pool(), options) == expected


# ---------------------------------------------------------------- topology
def previous(m) -> int:
    return int(re.search(r"Your previous answer: .*?(-?\d+)", user(m)).group(1))


def topology_pool():
    a = lambda e, m: answer(lines(m)[0] if lines(m) else 10)  # noqa: E731  copies its first neighbour
    b = lambda e, m: answer(max(lines(m) + [previous(m)]) if "previous" in user(m) else 20)  # noqa: E731
    c = lambda e, m: answer(min(lines(m) + [previous(m)]) if "previous" in user(m) else 30)  # noqa: E731
    return pool_of(a, b, c)


@pytest.mark.parametrize("options, expected", [
    # chain A-B-C. AB: A copies B 20, B max 20 -> 20.  AC: no edge left -> [10,30] -> 10.
    # BC: B max 30, C min 20 -> tie -> 30.  ABC: A copies B 20, B max(10,30,20)=30, C min(20,30)=20 -> 20
    ({"graph": "chain"}, table(10, 20, 30, 20, 10, 30, 20)),
    # ring on 3 = all pairs. AC: A copies C 30, C min 10 -> tie -> 30.  ABC: A 20, B 30, C 10 -> 20
    ({"graph": "ring"}, table(10, 20, 30, 20, 30, 30, 20)),
    # star with hub A. BC: no edge without the hub -> [20,30] -> 20.  ABC: A copies B 20, B 20, C min(10,30) 10 -> 20
    ({"graph": "star"}, table(10, 20, 30, 20, 30, 20, 20)),
    # directed A->C, B->C, C->B. AB: none -> [10,20] -> 10.  AC: C min(10,30) -> [10,10].
    # BC: B max(30,20) 30, C min(20,30) 20 -> 30.  ABC: A 10, B 30, C min(10,20,30) 10 -> 10
    ({"graph": [[0, 0, 1], [0, 0, 1], [0, 1, 0]]}, table(10, 20, 30, 10, 10, 30, 10)),
])
def test_topology_by_hand(options, expected):
    assert outcomes("topology", topology_pool(), options) == expected


def test_topology_three_rounds_chain():
    # chain ABC, round 3: A copies B's r2 30; B max(20, 20, 30)=30; C min(30, 20)=20 -> [30,30,20] -> 30
    eps = crl_envs.run_episodes("topology", topology_pool(), task(), options={"rounds": 3}, progress=False)
    assert eps[0].answers == {A: "30", B: "30", C: "20"} and eps[0].answer == "30"


# ---------------------------------------------------------------- blender
def blender_script(first, prefers_larger, fuse_pick):
    def respond(e, m):
        text = user(m)
        if "Which answer is better" in text:
            x, y = lines(m)
            return "2" if (y > x) == prefers_larger else "1"
        if "Fuse these" in text:
            return answer(fuse_pick(lines(m)))
        return answer(first)
    return respond


def blender_pool():
    return pool_of(blender_script(10, True, lambda s: s[0]), blender_script(20, False, lambda s: s[-1]),
                   blender_script(30, True, lambda s: s[0]))


@pytest.mark.parametrize("options, expected", [
    # top 2: pairs only with 3 candidates. AB/AC: A fuses, takes the first -> 10; BC: B takes the last -> 30.
    # ABC: ranker A prefers larger: wins C 2, B 1, A 0 -> top [C, B] -> A takes the first -> 30
    ({}, table(10, 20, 30, 10, 10, 30, 30)),
    # top 1: AB: A ranks B > A -> [B] -> 20. AC: -> [C] 30. BC: ranker B prefers smaller -> [B] 20. ABC: [C] 30
    ({"top_k": 1}, table(10, 20, 30, 20, 30, 20, 30)),
    # ranker B (prefers smaller) for ABC: wins A 2, B 1 -> top [A, B] -> A fuses -> 10
    ({"ranker": "model_1"}, table(10, 20, 30, 10, 10, 30, 10)),
])
def test_blender_by_hand(options, expected):
    assert outcomes("blender", blender_pool(), options) == expected


def test_blender_compares_every_pair_once():
    (ep,) = crl_envs.run_episodes("blender", blender_pool(), task(), progress=False)
    assert [t.phase_name for t in ep.transcript] == ["answer"] * 3 + ["compare_1", "compare_2", "compare_3", "fuse"]


# ---------------------------------------------------------------- knowledge
def knowledge_script(hint, combine):
    def respond(e, m):
        if "short note" in user(m):
            return f"hint {hint}"
        return answer(combine([int(h) for h in re.findall(r"hint (\d+)", user(m))]))
    return respond


def knowledge_pool():
    return pool_of(knowledge_script(5, sum), knowledge_script(7, sum), knowledge_script(100, max))


@pytest.mark.parametrize("options, expected", [
    # first present member answers; A and B sum the hints, C takes the max
    ({}, table(5, 7, 100, 12, 105, 107, 112)),
    # C answers (max) when present; otherwise A
    ({"answerer": "model_2"}, table(5, 7, 100, 12, 100, 100, 100)),
    # outside answerer doubles the largest hint
    ({"answerer": ScriptedAgent("ans", lambda e, m: answer(2 * max(int(h) for h in re.findall(r"hint (\d+)", user(m)))))},
     table(10, 14, 200, 14, 200, 200, 200)),
])
def test_knowledge_by_hand(options, expected):
    assert outcomes("knowledge", knowledge_pool(), options) == expected


# ---------------------------------------------------------------- judge
def judge_script(first, pick):
    def respond(e, m):
        if "Which answer is best" in user(m):
            shown = lines(m)
            return "None of them." if pick is None else f"Agent {shown.index(pick(shown)) + 1} is best."
        return answer(first)
    return respond


def judge_pool():
    return pool_of(judge_script(10, max), judge_script(20, min), judge_script(30, None))


@pytest.mark.parametrize("options, expected", [
    # A judges (largest): AB 20, AC 30, ABC 30; BC: B judges (smallest) 20
    ({}, table(10, 20, 30, 20, 30, 20, 30)),
    # C judges but names nobody -> plurality (ties to pool order): AC 10, BC 20, ABC 10; AB: A judges -> 20
    ({"judge": "model_2"}, table(10, 20, 30, 20, 10, 20, 10)),
    # ... with fallback="none" the coalitions C judges have no answer; AB: A judges -> 20
    ({"judge": "model_2", "fallback": "none"}, table(10, 20, 30, 20, None, None, None)),
    # outside judge always says 2
    ({"judge": ScriptedAgent("j", lambda e, m: "2")}, table(10, 20, 30, 20, 30, 30, 20)),
])
def test_judge_by_hand(options, expected):
    assert outcomes("judge", judge_pool(), options) == expected


def test_judge_rejects_unknown_fallback():
    with pytest.raises(ValueError, match="unknown fallback 'vote'"):
        crl_envs.judge_v0(judge_pool(), task(), fallback="vote")


# ---------------------------------------------------------------- relay
def draft(m) -> int | None:
    found = re.search(r"Draft: .*?(-?\d+)", user(m))
    return int(found.group(1)) if found else None


def relay_pool():
    return pool_of(lambda e, m: answer(3 if draft(m) is None else draft(m) + 1),
                   lambda e, m: answer(20 if draft(m) is None else draft(m) * 2),
                   lambda e, m: answer(30 if draft(m) is None else draft(m) + 100))


@pytest.mark.parametrize("options, expected", [
    ({}, table(3, 20, 30, 6, 103, 120, 106)),  # AB 3->6; AC 3->103; BC 20->120; ABC 3->6->106
    ({"order": [C, B, A]}, table(3, 20, 30, 21, 31, 60, 61)),  # AB 20->21; AC 30->31; BC 30->60; ABC 30->60->61
    # passes 2: A 3->4; B 20->40; C 30->130; AB 3,6,7,14; AC 3,103,104,204; BC 20,120,240,340;
    # ABC 3,6,106,107,214,314
    ({"passes": 2}, table(4, 40, 130, 14, 204, 340, 314)),
])
def test_relay_by_hand(options, expected):
    assert outcomes("relay", relay_pool(), options) == expected


# ---------------------------------------------------------------- refine
def refine_script(first, review):
    def respond(e, m):
        text = user(m)
        if "Give your final answer" in text:
            base = int(re.search(r"Your draft: .*?(-?\d+)", text).group(1))
            return answer(base + sum(int(n) for n in re.findall(r"add (\d+)", text)))
        if "Review this draft" in text:
            return review("Earlier reviews" in text)
        return answer(first)
    return respond


def refine_pool():
    return pool_of(refine_script(10, lambda earlier: "add 1"), refine_script(20, lambda earlier: "add 5"),
                   refine_script(30, lambda earlier: "add 500" if earlier else "add 50"))


@pytest.mark.parametrize("options, expected", [
    # first present member drafts: AB 10+5; AC 10+50; BC 20+50; ABC 10+5+500 (C sees B's review)
    ({}, table(10, 20, 30, 15, 60, 70, 515)),
    # C drafts when present: AC 30+1; BC 30+5; ABC 30+1+5 (B sees A's review, still "add 5")
    ({"drafter": "model_2"}, table(10, 20, 30, 15, 31, 35, 36)),
])
def test_refine_by_hand(options, expected):
    assert outcomes("refine", refine_pool(), options) == expected


# ---------------------------------------------------------------- masking, for every protocol
ROLE_VARIANTS = {
    "moa": [{"aggregator": "model_2"}],
    "routing": [{"router": "discrete"}],
    "feedback": [{"summariser": "model_1"}],
    "topology": [{"graph": "complete", "rounds": 3}],
    "blender": [{"top_k": 1, "ranker": "model_2"}],
    "judge": [{"judge": "model_2"}],
    "refine": [{"drafter": "model_2"}],
    "relay": [{"passes": 2}],
    "knowledge": [{"answerer": "model_1"}],
}
MASK_CASES = [(n, {}) for n in PROTOCOLS] + [(n, o) for n, opts in ROLE_VARIANTS.items() for o in opts]
NAMES = ("nameqa", "nameqb", "nameqc")


def marker_pool():
    """Every member's text carries its own marker; the text changes with what it is shown."""
    def script(name):
        return lambda e, m: f"MARK-{name}-{len(user(m))} The answer is {len(name)}. Agent 1 is best."
    return agents.pool([ScriptedAgent(n, script(n)) for n in NAMES])


@pytest.mark.parametrize("name, options", MASK_CASES, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in MASK_CASES])
def test_masked_members_never_reach_any_observation(name, options):
    pool = marker_pool()
    env = PROTOCOLS[name](pool, task(), **options)
    for coalition in [[A, B, C]] + [sorted(c) for c in COALITIONS]:  # one env reused: no stale text either
        obs, infos = env.reset(seed=0, options={"coalition": coalition})
        masked = [pool.name_of(a) for a in pool.ids if a not in coalition]
        seen = []
        while env.agents:
            actions = {}
            for a in env.agents:
                seen.append(obs[a]["prompt"])
                seen.extend(m["content"] for m in infos[a]["messages"] or [])
                if infos[a]["active"]:
                    if isinstance(env.action_space(a), spaces.Discrete):  # a discrete router: the last member
                        actions[a] = pool.ids.index(coalition[-1])
                    else:
                        req = Request(infos[a]["messages"], metadata={"example": env.example})
                        actions[a] = env.agent_for(a).generate([req])[0].text
            obs, _, _, _, infos = env.step(actions)
        blob = "\n".join(seen)
        for m in masked:
            assert f"MARK-{m}" not in blob and m not in blob, f"{name}: masked {m} leaked into {coalition}"
        if len(coalition) > 1 and name not in ("routing", "cascade", "vote"):
            assert "MARK-" in blob, f"{name}: present members never saw each other"


def test_every_protocol_has_hand_computed_semantics():
    tested = {n.removeprefix("test_").removesuffix("_by_hand").split("_")[0] for n in globals() if n.endswith("_by_hand")}
    assert set(PROTOCOLS) <= tested, f"protocols without a by-hand test: {sorted(set(PROTOCOLS) - tested)}"
