"""The embedded zoo: shipped models load offline and fast, play the protocols, and the builder trains
a model that clearly beats chance in under a minute."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import agents
import crl_envs
from agents import SamplingParams
from tools.zoo import build as zoo_build

ZOO = pytest.importorskip("agents.zoo")
SHIPPED = all((ZOO.MODELS_DIR / n / "model.safetensors").exists() for n in ZOO.NAMES)
needs_models = pytest.mark.skipif(not SHIPPED, reason="zoo models not built into agents/zoo/models")


def test_question_kinds_match_the_arithmetic():
    assert zoo_build.question_kinds(47, "+", 85) == {"add", "carry", "hundreds"}
    assert zoo_build.question_kinds(23, "+", 45) == {"add", "core"}
    assert zoo_build.question_kinds(52, "-", 17) == {"sub", "borrow"}
    assert zoo_build.question_kinds(23, "-", 61) == {"sub", "negative"}
    assert zoo_build.question_kinds(60, "-", 61) == {"sub", "borrow", "negative"}
    assert zoo_build.question_kinds(60, "+", 40) == {"add", "hundreds"}
    with pytest.raises(ValueError, match="operation"):
        zoo_build.question_kinds(2, "*", 3)


def test_reply_kind_reads_what_the_prompt_asks():
    ask = lambda text: zoo_build.reply_kind("p", "x", [{"role": "user", "content": text}])  # noqa: E731
    assert ask("What is 1 + 2?") == "answer"
    assert ask("Q\nAgent 1: 3\nWhich answer is best? Reply with its number.") == "choose"
    assert ask("Q\nAgent 1: 3\nAgent 2: 4\nWhich answer is better? Reply 1 or 2.") == "choose"
    assert ask("Q\nModel 1: zoo-mini\nWhich model should answer this question? Reply with its number.") == "route"
    assert ask("Q\nEnd with 'Confidence: N' (0-10).") == "confidence"


def test_targets_pick_a_correct_candidate_and_a_non_blind_model():
    from crl_envs.tasks import Example

    ex = Example("e", "What is 47 + 85?", "132", {"a": 47, "b": 85, "op": "+"})
    spec = zoo_build.SPECS[0]
    choose = zoo_build.PromptRecord("choose", [{"role": "user", "content": "What is 47 + 85?\nAgent 1: The answer is "
                                                "122.\nAgent 2: The answer is 132.\nWhich answer is best?"}], 0,
                                    zoo_build.question_kinds(47, "+", 85))
    assert zoo_build.target_text(choose, ex, spec, zoo_build.SPECS) == "2"
    names = [s.name for s in zoo_build.SPECS]
    carry_blind = next(s.name for s in zoo_build.SPECS if s.blind == "carry")
    hundreds_blind = next(s.name for s in zoo_build.SPECS if s.blind == "hundreds")
    other = next(s.name for s in zoo_build.SPECS if s.blind in ("borrow", "negative"))
    route = zoo_build.PromptRecord("route", [{"role": "user", "content": f"What is 47 + 85?\nModel 1: {carry_blind}\n"
                                              f"Model 2: {hundreds_blind}\nModel 3: {other}\nWhich model?"}], 0,
                                   zoo_build.question_kinds(47, "+", 85))
    assert zoo_build.target_text(route, ex, spec, names) == "3"
    answer = zoo_build.PromptRecord("answer", [{"role": "user", "content": "What is 47 + 85?"}], 0)
    assert zoo_build.target_text(answer, ex, spec, names) == "The answer is 132."


def test_training_prompts_come_from_the_envs_with_varied_peer_counts(arith_task):
    from crl_envs.tasks import load

    train = load("arith", split="train", n=60, seed=3, **zoo_build.TASK_OPTIONS)
    names = [s.name for s in zoo_build.SPECS]
    records = zoo_build.collect_prompts(train, names, episodes_per_protocol=len(names) * 4, seed=0,
                                        protocols=["debate"])
    peer_counts = {r.messages[-1]["content"].count("\nAgent ") for r in records}
    assert peer_counts == set(range(len(names)))  # 0 peers (round 1 / refine) .. all others
    assert all(r.messages[-1]["content"].startswith(train[r.example_index].question) for r in records)
    again = zoo_build.collect_prompts(train, names, episodes_per_protocol=len(names) * 4, seed=0,
                                      protocols=["debate"])
    assert [r.messages for r in again] == [r.messages for r in records]


def test_load_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown zoo model 'zoo-nope'"):
        ZOO.load(["zoo-nope"])
    with pytest.raises(ValueError, match="empty zoo"):
        ZOO.load([])


@needs_models
def test_zoo_loads_offline_and_small():
    """Load time is a benchmark (benchmarks/zoo_load.py), not a timed assertion."""
    zoo = agents.pool("zoo")
    assert len(zoo) >= 4 and zoo.names == list(ZOO.NAMES)
    assert all(isinstance(a, agents.HFAgent) for a in zoo.values())
    total = sum(f.stat().st_size for f in ZOO.MODELS_DIR.rglob("*") if f.is_file())
    assert total <= 20 * 2**20, f"shipped zoo files total {total / 2**20:.1f} MB"
    assert agents.from_spec(f"zoo:{ZOO.NAMES[0]}").name == ZOO.NAMES[0]


@needs_models
def test_shipped_zoo_answers_arith_and_vote_reads_several_models():
    zoo = ZOO.load()
    task = crl_envs.tasks.load("arith", n=60, seed=11, **ZOO.TASK_OPTIONS)
    sampling = SamplingParams(max_new_tokens=24)
    alone = [
        sum(ep.score for ep in crl_envs.run_episodes("vote", zoo, task, coalition=[a], sampling=sampling,
                                                        progress=False)) / len(task)
        for a in zoo.ids
    ]
    assert min(alone) > 0.1 and max(alone) > 0.3, alone  # chance is about 1/300
    vote = crl_envs.run_episodes("vote", zoo, task, sampling=sampling, progress=False)
    assert all(t.finish_reason == "stop" for ep in vote for t in ep.transcript)  # answers end at <eos>
    assert len({ep.answer for ep in vote}) > 20  # real answers, not one memorised string
    assert sum(ep.score for ep in vote) / len(task) > min(alone)


def test_zoo_training_split_covers_every_digit_pair_of_the_test_split():
    """The zoo learns from arith's train split: every (units digit, op, units digit) of a test question
    must occur in train, or the test would ask for digit sums the models never saw."""
    from crl_envs.tasks import load

    def pairs(split):
        task = load("arith", split=split, n=2000, seed=0, **zoo_build.TASK_OPTIONS)
        return {(e.metadata["a"] % 10, e.metadata["op"], e.metadata["b"] % 10) for e in task}

    assert pairs("test") <= pairs("train")


@pytest.mark.slow
def test_quick_build_beats_chance_and_is_deterministic(tmp_path: Path):
    t0 = time.perf_counter()
    summary = zoo_build.build(tmp_path / "a", seed=0, quick=True)
    print(f"quick build: {time.perf_counter() - t0:.0f}s")  # about 30-60 s on 2 cores
    model = tmp_path / "a" / zoo_build.QUICK_SPEC.name
    assert (model / "model.safetensors").exists() and (model / "tokenizer.json").exists()
    accuracy = summary["standalone"][zoo_build.QUICK_SPEC.name]["all"]
    # one-digit +/-: 28 possible answers (-9..18), so guessing scores about 0.036
    assert accuracy >= 0.2, summary
    agent = agents.HFAgent(model)
    text = agent.generate([agents.Request([{"role": "user", "content": "What is 3 + 4?"}],
                                          SamplingParams(max_new_tokens=24))])[0].text
    assert text.startswith("The answer is"), text
    # same seed, same weights
    from safetensors.torch import load_file

    zoo_build.build(tmp_path / "b", seed=0, quick=True, evaluate=False)
    first = load_file(model / "model.safetensors")
    second = load_file(tmp_path / "b" / zoo_build.QUICK_SPEC.name / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(bool((first[k] == second[k]).all()) for k in first)
