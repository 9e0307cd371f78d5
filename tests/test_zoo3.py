"""The multi-task zoo (v3): its builder's prompts and targets, the pools it ships, and the import graph
(importing ``agents`` never imports a builder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agents
import agents.pretrained
import crl_envs
from agents import SamplingParams
from agents.zoo.specs import NAMES3, POOLS3, SPECS3, TASKS3
from crl_envs import tasks
from tools.zoo import multitask as mt

ZOO = pytest.importorskip("agents.zoo")
SHIPPED3 = all((ZOO.MODELS3_DIR / n / "model.safetensors").exists() for n in NAMES3)
needs_models3 = pytest.mark.skipif(not SHIPPED3, reason="v3 zoo models not built into agents/zoo/models3")
SPEC = {s.name: s for s in SPECS3}


def test_importing_agents_imports_no_builder_and_no_crl_envs():
    code = ("import sys, agents, agents.zoo; agents.pool; "
            "print(sorted(m for m in sys.modules if m.startswith(('crl_envs', 'tools'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_pools_are_declared_over_declared_models():
    assert set(POOLS3) == {"zoo-specialists", "zoo-generalists", "zoo-scale", "zoo-soloist"}
    assert all(m in NAMES3 for members in POOLS3.values() for m in members)
    sizes = {(SPEC[m].n_layer, SPEC[m].n_embd) for m in POOLS3["zoo-scale"]}
    assert len(sizes) == 3  # three sizes
    assert SPEC[POOLS3["zoo-soloist"][0]].stubborn and SPEC[POOLS3["zoo-soloist"][0]].confident
    with pytest.raises(ValueError, match="unknown zoo pool 'zoo-nope'"):
        ZOO.agents_list("zoo-nope")
    with pytest.raises(ValueError, match="unknown zoo model 'zoo3-nope'"):
        ZOO.load(["zoo3-nope"])


def test_scripted_peers_are_right_at_their_rates_and_wrong_plausibly():
    task = tasks.load("wordprob", split="train", n=400, seed=1)
    peers = mt.scripted_peers(task, seed=0)
    for peer, rate in zip(peers, mt.PEER_RATES):
        texts = [peer.respond(e, [{"role": "user", "content": e.question}]) for e in task]
        right = sum(task.score(t, e) for t, e in zip(texts, task)) / len(task)
        assert abs(right - rate) < 0.08, (peer.name, right, rate)
        assert all(task.extract(t) is not None for t in texts)  # wrong answers are answers, not noise


def test_collected_prompts_have_every_peer_count_and_debate_length_contexts():
    task = tasks.load("law", split="train", n=80, seed=0)
    records = mt.collect("law", task, episodes_per_protocol=25, seed=0, protocols=["debate", "judge"])
    debate = [r for r in records if "Other agents' answers" in r.messages[-1]["content"]]
    peer_counts = {r.messages[-1]["content"].count("\nAgent ") for r in debate}
    assert peer_counts == {1, 2, 3, 4}
    assert {r.reply_kind for r in records} == {"answer", "choose"}
    assert all(r.context for r in debate) and not all(r.context for r in records)
    again = mt.collect("law", task, episodes_per_protocol=25, seed=0, protocols=["debate", "judge"])
    assert [r.messages for r in again] == [r.messages for r in records]


def _record(task, example, content, kind="answer"):
    return mt.Record(task.name, kind, [{"role": "user", "content": content}], task.examples.index(example), True)


def test_targets_choose_a_right_code_candidate_and_the_stubborn_repeat_themselves():
    code = tasks.load("pyfunc", split="train", n=10, seed=0)
    e = code[0]
    wrong, right = code.wrong_reply(e, 1), code.reply(e)
    choose = _record(code, e, f"{code.prompt(e)}\nAgent 1: {wrong}\nAgent 2: {right}\nWhich answer is best? "
                     "Reply with its number.", "choose")
    generalist, soloist = SPEC["zoo3-gen-a"], SPEC["zoo3-soloist"]
    blind_to_arithmetic, blind_to_geometric = SPEC["zoo3-spec-a"], SPEC["zoo3-spec-b"]
    assert mt.target(choose, code, e, generalist) == "2"
    seq = tasks.load("sequence", split="train", n=10, seed=0)
    s = seq[0]
    assert s.metadata["kind"] == "arithmetic"
    revise = _record(seq, s, f"{seq.prompt(s)}\nOther agents' answers:\nAgent 1: {seq.reply(s)}\n"
                     f"Your previous answer: The answer is 7.\nConsidering the other answers, give your updated answer.")
    assert mt.target(revise, seq, s, generalist) == seq.reply(s)
    assert mt.target(revise, seq, s, soloist) == "The answer is 7."
    confidence = _record(seq, s, f"{seq.prompt(s)}\nEnd with 'Confidence: N' (0-10).", "confidence")
    assert mt.target(confidence, seq, s, soloist).endswith("Confidence: 9")
    assert mt.target(confidence, seq, s, blind_to_arithmetic).endswith("Confidence: 3")  # its blind spot
    assert mt.target(confidence, seq, s, blind_to_geometric).endswith("Confidence: 9")
    route = _record(seq, s, f"{seq.prompt(s)}\nModel 1: zoo3-s\nModel 2: zoo3-spec-a\nModel 3: zoo3-spec-b\n"
                    "Which model should answer this question? Reply with its number.", "route")
    assert mt.target(route, seq, s, generalist) == "3"  # not the small model, not the one blind to the kind
    small_or_blind = _record(seq, s, f"{seq.prompt(s)}\nModel 1: zoo3-spec-a\nModel 2: zoo3-s\n"
                             "Which model should answer this question? Reply with its number.", "route")
    assert mt.target(small_or_blind, seq, s, generalist) == "2"


def test_blind_order_names_every_tasks_own_kinds():
    from agents.zoo.specs import BLIND_ORDER
    from tools.zoo.build import example_kinds

    assert set(BLIND_ORDER) == set(TASKS3)
    for name, options in TASKS3.items():
        task = tasks.load(name, split="train", n=200, seed=0, **options)
        seen = set().union(*(mt.kinds_of(task, e) for e in task)) - ({"add", "sub"} if name == "arith" else set())
        assert seen == set(BLIND_ORDER[name]), (name, seen)
        if name != "arith":
            assert tuple(task.kinds) == BLIND_ORDER[name]
    arith = tasks.load("arith", split="train", n=200, seed=0, **TASKS3["arith"])
    carry = next(e for e in arith if "carry" in example_kinds(e) and "hundreds" in example_kinds(e))
    assert mt.is_blind(SPEC["zoo3-spec-a"], "arith", arith, carry)  # blind to carry even when it also has hundreds
    assert mt.is_blind(SPEC["zoo3-spec-c"], "arith", arith, carry)
    assert not mt.is_blind(SPEC["zoo3-spec-b"], "arith", arith, carry)
    assert not mt.is_blind(SPEC["zoo3-gen-a"], "arith", arith, carry)


def test_sampler_shows_a_specialist_its_blind_spot_at_its_share():
    from agents.tiny import char_tokenizer

    task = tasks.load("logic", split="train", n=400, seed=0)
    spec = SPEC["zoo3-spec-b"]  # blind to logic's "not"
    sampler = mt.TaskSampler(spec, {"logic": task}, [], char_tokenizer(), __import__("random").Random(0))
    tok = char_tokenizer()
    kind = {tok.apply_chat_template([{"role": "user", "content": task.prompt(e)}], tokenize=False,
                                    add_generation_prompt=True): e.metadata["kind"] for e in task}
    drawn = [kind[tok.decode(p)] for p, _ in sampler.answer_batch(4000)]
    share = drawn.count("not") / len(drawn)
    assert 0.01 < share < 0.06, share  # the 'not' kind is a quarter of the questions, seen 3% of the time


def test_kinds_cover_every_task_including_arith():
    for name, options in TASKS3.items():
        task = tasks.load(name, split="test", n=60, seed=0, **options)
        kinds = {mt.kind_of(task, e) for e in task}
        assert len(kinds) >= 3, (name, kinds)


@needs_models3
def test_v3_pools_load_offline_and_small():
    total = sum(f.stat().st_size for f in ZOO.MODELS3_DIR.rglob("*") if f.is_file())
    assert total <= 50 * 2**20, f"shipped v3 zoo files total {total / 2**20:.1f} MB"
    for name, members in POOLS3.items():
        pool = agents.pool(name)
        assert pool.names == list(members)
        assert all(isinstance(a, agents.HFAgent) for a in pool.values())
    assert agents.from_spec("zoo:zoo3-spec-a").name == "zoo3-spec-a"


@needs_models3
def test_v3_models_answer_every_task_in_its_format(one_thread):
    pool = agents.pool("zoo-generalists")
    for name, options in TASKS3.items():
        task = tasks.load(name, n=8, seed=7, **options)
        sampling = SamplingParams(max_new_tokens=96 if name == "pyfunc" else 32)
        episodes = crl_envs.run_episodes("vote", pool, task, sampling=sampling, progress=False)
        texts = [t.text for ep in episodes for t in ep.transcript]
        formatted = sum(task.extract(t) is not None for t in texts) / len(texts)
        assert formatted > 0.8, (name, texts[:3])
        assert sum(t.finish_reason == "stop" for ep in episodes for t in ep.transcript) / len(texts) > 0.8


@needs_models3
def test_shipped_report_matches_the_shipped_models_and_the_cards():
    report = json.loads((ZOO.MODELS3_DIR / "report3.json").read_text())
    assert set(report["pools"]) == set(POOLS3) | {"zoo-pretrained"}
    assert all(set(rows) == set(TASKS3) for rows in report["pools"].values())
    for pool, rows in report["pools"].items():
        members = list(POOLS3.get(pool, ())) or list(agents.pretrained.NAMES)
        assert all(list(row["standalone"]) == members for row in rows.values()), pool
    summary = json.loads((ZOO.MODELS3_DIR / "zoo3.json").read_text())
    assert set(summary["models"]) >= set(NAMES3)
    for name in NAMES3:  # the shipped weights are the build's
        training = json.loads((ZOO.MODELS3_DIR / name / "training.json").read_text())
        assert training["steps"] == SPEC[name].steps and training["spec"]["blind"] == SPEC[name].blind, name
    cards = (Path(__file__).resolve().parents[1] / "docs" / "zoo.md").read_text()
    assert mt.markdown(report) in cards, "docs/zoo.md's pool tables are not report3.json's: paste `--report-only`'s"
    assert mt.kind_table(report) in cards, "docs/zoo.md's per-kind table is not report3.json's"
    assert mt.model_table(summary) in cards, "docs/zoo.md's model table is not zoo3.json's"


#: One cell per kind of task where the cards claim a pool's vote or debate beats its best member: the
#: largest such gain among the zoo's own pools, else among all five (zoo-pretrained re-measured on the
#: engine the report names).
@needs_models3
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reasoning", "coding", "discovery"])
def test_a_committed_collaboration_gain_reproduces(kind, one_thread):
    from crl_envs.tasks.procedural import TASK_KINDS

    report = json.loads((ZOO.MODELS3_DIR / "report3.json").read_text())
    gains = [(max(row["vote"], row["debate"]) - row["best_single"], pool in POOLS3, pool, task)
             for pool, rows in report["pools"].items() for task, row in rows.items() if task in TASK_KINDS[kind]]
    gain, _, pool, task = max(gains, key=lambda g: (g[0] > 0 and g[1], g[0]))
    assert gain > 0, f"no {kind} task has a pool whose vote or debate beats its best single member"
    if pool in POOLS3:
        members = POOLS3[pool]
    else:
        pytest.importorskip("vllm")
        backend = report["pretrained_backend"]
        members = "pretrained" if backend == "hf" else f"pretrained-{backend}"
    again = mt.evaluate(ZOO.MODELS3_DIR, pools={pool: members}, tasks=[task], n=report["n"],
                        n_code=report["n_code"], seed=report["seed"])
    fresh, committed = again["pools"][pool][task], report["pools"][pool][task]
    assert {k: v for k, v in fresh.items() if k != "seconds"} == {k: v for k, v in committed.items() if k != "seconds"}


def test_merged_reports_keep_every_pool_and_refuse_different_settings():
    row = {"standalone": {"m": {"all": 0.5}}, "best_single": 0.5, "vote": 0.5, "debate": 0.4, "any_right": 0.6}
    a = {"n": 100, "n_code": 40, "seed": 0, "pools": {"zoo-scale": {"law": row}}}
    b = {"n": 100, "n_code": 40, "seed": 0, "pretrained_backend": "vllm",
         "pools": {"zoo-pretrained": {"logic": row}, "zoo-specialists": {"logic": row, "arith": row}}}
    merged = mt.merge_reports([a, b])
    assert list(merged["pools"]) == ["zoo-specialists", "zoo-scale", "zoo-pretrained"]
    assert list(merged["pools"]["zoo-specialists"]) == ["arith", "logic"]  # the tasks' order
    assert merged["pretrained_backend"] == "vllm"
    with pytest.raises(ValueError, match="different n "):
        mt.merge_reports([a, {**b, "n": 50}])
