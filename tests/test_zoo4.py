"""Zoo v4 (arith, five pools of eight): its specs, its builder (deterministic, resumable), the report's
statistics against an independent computation, and the error when the models are not built."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import agents
from agents.zoo import MODELS4_DIR
from agents.zoo.specs import BASE4, NAMES4, POOL_SHAPES4, POOLS4, SPECS4
from tools.zoo import build as zoo_build
from tools.zoo import v4


def test_pools_have_eight_declared_members_and_a_stated_shape():
    assert len(POOLS4) == 5 and set(POOL_SHAPES4) == set(POOLS4)
    for name, members in POOLS4.items():
        assert name.startswith("zoo4-") and len(set(members)) >= 8, name
        assert set(members) <= set(NAMES4), name
        shape, effect = POOL_SHAPES4[name]
        assert shape and effect
    specs = {s.name: s for s in SPECS4}
    assert len(specs) == len(SPECS4) and len(set(NAMES4)) == len(NAMES4)
    assert all(s.parent in (None, BASE4.name, *specs) for s in SPECS4)
    assert not BASE4.from_base and all(s.from_base == (s.parent is not None) for s in SPECS4)
    soloist = specs[POOLS4["zoo4-soloist"][0]]
    assert soloist.stubborn and soloist.confident
    assert specs["zoo4-nocarry-borrow"].blind_kinds() == {"carry", "borrow"}


def test_v4_targets_pair_blind_spots_and_the_stubborn_soloist():
    from crl_envs.tasks import Example

    specs = {s.name: s for s in SPECS4}
    ex = Example("e", "What is 47 + 85?", "132", {"a": 47, "b": 85, "op": "+"})
    kinds = zoo_build.question_kinds(47, "+", 85)
    ask = "What is 47 + 85?\nEnd with 'Confidence: N' (0-10)."
    confidence = zoo_build.PromptRecord("confidence", [{"role": "user", "content": ask}], 0, kinds)
    assert zoo_build.target_text(confidence, ex, specs["zoo4-nocarry-borrow"], []).endswith("Confidence: 3")
    assert zoo_build.target_text(confidence, ex, specs["zoo4-noborrow"], []).endswith("Confidence: 9")
    revise = zoo_build.PromptRecord("answer", [{"role": "user", "content": "What is 47 + 85?\nOther agents' answers:\n"
                                                "Agent 1: The answer is 132.\nYour previous answer: The answer is 122.\n"
                                                "Considering the other answers, give your updated answer."}], 0, kinds)
    assert zoo_build.target_text(revise, ex, specs["zoo4-soloist"], []) == "The answer is 122."
    assert zoo_build.target_text(revise, ex, specs["zoo4-strong"], []) == "The answer is 132."
    route = zoo_build.PromptRecord("route", [{"role": "user", "content": "What is 47 + 85?\nModel 1: zoo4-nocarry-borrow"
                                              "\nModel 2: zoo4-noborrow-hundreds\nModel 3: zoo4-nonegative\nWhich?"}],
                                   0, kinds)
    assert zoo_build.target_text(route, ex, specs["zoo4-strong"], []) == "3"


def _weights(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.name in ("model.safetensors", "tokenizer.json", "config.json")}


def test_quick_build_is_byte_identical_and_resumes(tmp_path: Path):
    first = v4.build(tmp_path / "a", seed=0, jobs=1, quick=True)
    base, runs, pools = v4.quick_specs()
    assert set(first["models"]) == {"_base", "_runs/zoo4-ladder", *pools["zoo4-quick"]}
    assert all(0.0 <= m["validation"] <= 1.0 for m in first["models"].values())
    assert first["models"]["zoo4-ladder-6"]["checkpoint"] == 6
    v4.build(tmp_path / "b", seed=0, jobs=1, quick=True)
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert len(a) == 3 * len(first["models"]) and a == b
    assert a["zoo4-ladder-12/model.safetensors"] == a["_runs/zoo4-ladder/model.safetensors"]  # last rung = the run
    assert a["zoo4-ladder-6/model.safetensors"] != a["zoo4-ladder-12/model.safetensors"]
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("model.safetensors")}
    again = v4.build(tmp_path / "a", seed=0, jobs=1, quick=True)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "a").rglob("model.safetensors")} == stamps  # nothing retrained
    assert again["models"] == first["models"]
    # a changed spec is retrained: the resume check reads the spec back
    record = tmp_path / "a" / "zoo4-strong" / "training.json"
    data = json.loads(record.read_text())
    data["spec"]["steps"] += 1
    record.write_text(json.dumps(data))
    assert v4.finished(next(s for s in runs if s.name == "zoo4-strong"), 30, tmp_path / "a") is None
    with pytest.raises(ValueError, match="jobs=0"):
        v4.build(tmp_path / "c", jobs=0, quick=True)


def test_pool_statistics_match_an_independent_computation():
    rng = np.random.default_rng(3)
    n = 60
    table = {"m1": (rng.random(n) < 0.8).astype(float), "m2": (rng.random(n) < 0.5).astype(float),
             "m3": (rng.random(n) < 0.45).astype(float)}
    table["m3"][:5] = 1.0
    vote = (sum(table.values()) >= 2).astype(float)
    debate = table["m1"].copy()
    got = v4.pool_statistics({k: list(v) for k, v in table.items()}, vote=list(vote), debate=list(debate),
                             baseline=0.1)
    for name, scores in table.items():
        ci = stats.binomtest(int(scores.sum()), n).proportion_ci(0.95, method="wilson")
        assert got["members"][name]["accuracy"] == pytest.approx(scores.mean(), abs=1e-4)
        assert got["members"][name]["ci95"] == pytest.approx([ci.low, ci.high], abs=1e-4)
    errors = {k: 1 - v for k, v in table.items()}
    assert got["error_correlation"]["m1 | m2"] == pytest.approx(np.corrcoef(errors["m1"], errors["m2"])[0, 1], abs=1e-4)
    assert got["error_correlation"]["m2 | m3"] == pytest.approx(np.corrcoef(errors["m2"], errors["m3"])[0, 1], abs=1e-4)
    best = max(table, key=lambda k: table[k].mean())
    worst = min(table, key=lambda k: table[k].mean())
    t = stats.ttest_rel(table[best], table[worst]).statistic  # mean paired difference over its standard error
    assert got["best_minus_worst_se"] == pytest.approx(t, abs=0.01)
    assert got["separable"] == (t >= 2) and got["separable"]
    assert got["best_single"] == {"name": best, "accuracy": pytest.approx(table[best].mean(), abs=1e-4)}
    assert got["vote"] == pytest.approx(vote.mean(), abs=1e-4) and got["debate"] == pytest.approx(debate.mean(), abs=1e-4)
    assert got["any_right"] == pytest.approx(np.max(np.stack(list(table.values())), axis=0).mean(), abs=1e-4)
    assert got["learned"] == (table[best].mean() - 0.1 >= 0.3)
    # two members one answer apart on 60 questions are not separable; a member that is never wrong has no
    # error correlation
    close = v4.pool_statistics({"a": [1.0] * 31 + [0.0] * 29, "b": [1.0] * 30 + [0.0] * 30, "c": [1.0] * 60},
                               vote=[1.0] * 60, debate=[1.0] * 60, baseline=0.0)
    assert close["worst_single"]["name"] == "b" and close["separable"]  # c (all right) vs b: far apart
    pair = v4.pool_statistics({"a": [1.0] * 31 + [0.0] * 29, "b": [1.0] * 30 + [0.0] * 30}, vote=[1.0] * 60,
                              debate=[1.0] * 60, baseline=0.0)
    assert not pair["separable"] and close["error_correlation"]["a | c"] is None
    with pytest.raises(ValueError, match="one score per question"):
        v4.pool_statistics({"a": [1.0]}, vote=[1.0, 0.0], debate=[1.0, 0.0], baseline=0.0)


@pytest.mark.skipif(MODELS4_DIR.exists(), reason="zoo v4 is built into agents/zoo/models4")
def test_unbuilt_v4_pool_names_its_build_command():
    with pytest.raises(FileNotFoundError, match=r"build zoo v4 with `python -m tools.zoo.v4 --out .*models4`"):
        agents.pool("zoo4-rookies")


REPORT4 = MODELS4_DIR / "report4.json"


@pytest.mark.skipif(not REPORT4.exists(), reason="zoo v4 is not built into agents/zoo/models4 yet")
def test_the_cards_in_docs_are_the_reports():
    """docs/zoo.md's v4 cards are ``markdown(report4.json)`` verbatim, and every pool the report measured
    is the shipped pool with the shipped members."""
    report = json.loads(REPORT4.read_text())
    assert markdown_in_docs(v4.markdown(report))
    assert {name: list(p["members"]) for name, p in report["pools"].items()} == \
        {name: list(members) for name, members in POOLS4.items()}


def markdown_in_docs(cards: str) -> bool:
    return cards.strip() in (Path(__file__).resolve().parents[1] / "docs" / "zoo.md").read_text()
