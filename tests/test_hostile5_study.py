"""Issue #57, findings 9 and 12-17: caches and study cell files validated on read (a 400-digit integer, edited
valuation reports, out-of-range coalition values: "not a valid result, the cell runs again", never a raw
error or a served value), eval questions kept out of training and learning-rate selection by content, the
deletion gate on evidence, one definition per cell kind, and the learning-rate sweep's files read as the
scheduler reads a cell's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from agents import pool
from agents.scripted import ScriptedAgent
from crl_envs import study, tasks
from crl_envs.study import StudyConfigError, load_config
from crl_envs.study.cells.trained import resolve_learning_rate
from crl_envs.study.gates import setting_gates
from crl_envs.study.scheduler import cell_path, load_result
from crl_envs.study.stats import training_tables
from crl_envs.valuation import CoalitionGame, evaluate
from crl_envs.valuation.report import ValuationReport
from crl_kit.errors import ConfigError, RunError
from crl_kit.validation import finite_number, numbers_problem

REPO = Path(__file__).resolve().parents[1]
HUGE = 10 ** 400  # a JSON integer too large for a float


def in_thread(fn, timeout: float = 20.0):
    """``(hung, result or exception)`` of ``fn()`` run in a daemon thread for up to ``timeout`` seconds."""
    box: dict = {}

    def target():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001  the caller inspects it
            box["out"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return thread.is_alive(), box.get("out")


def release_fifo(path: Path) -> None:
    """Unblock a reader stuck on the FIFO (old code): open it for writing once."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


# ---------------------------------------------------------------------- the shared check
def test_numbers_read_back_are_checked_without_overflow():
    assert finite_number(HUGE) is None and finite_number(True) is None and finite_number(float("inf")) is None
    assert finite_number(2) == 2.0
    assert numbers_problem("s", [0.5, HUGE], (2,)).startswith("s holds 1000000000")
    assert numbers_problem("s", [[0.1, 0.2]], (1, 3)) == "s is not 1 x 3 numbers"
    assert numbers_problem("s", [-0.5], (1,), low=0) == "s holds -0.5, below 0"


# ---------------------------------------------------------------------- 9: a 400-digit integer in the coalition cache
def test_a_huge_integer_in_a_coalition_cache_entry_is_ignored_and_played_again(tmp_path):
    members = pool([ScriptedAgent.expert("a", 0.9), ScriptedAgent.expert("b", 0.4)])
    task = tasks.load("arith", n=6, seed=1)
    first = evaluate("debate", members, task, cache_dir=tmp_path, progress=False)
    path = CoalitionGame("debate", members, task, cache_dir=tmp_path)._path(3)
    record = json.loads(path.read_text())
    record["scores"][0] = HUGE
    path.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match=r"holds 1000.*not a finite number; ignoring it, the coalition is played"):
        again = evaluate("debate", members, task, cache_dir=tmp_path, progress=False)
    assert dict(again.shapley) == dict(first.shapley) and again.system_evaluations == 1
    assert json.loads(path.read_text())["scores"] == first.system.tolist()  # the entry was rewritten


def test_a_huge_integer_in_a_coalition_cost_is_ignored_and_played_again(tmp_path):
    members = pool([ScriptedAgent.expert("a", 0.9), ScriptedAgent.expert("b", 0.4)])
    task = tasks.load("arith", n=6, seed=1)
    first = evaluate("debate", members, task, cache_dir=tmp_path, progress=False)
    path = CoalitionGame("debate", members, task, cache_dir=tmp_path)._path(3)
    record = json.loads(path.read_text())
    record["spend"]["calls"][0] = HUGE
    path.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="its cost 'calls' has a negative or non-finite entry"):
        again = evaluate("debate", members, task, cache_dir=tmp_path, progress=False)
    assert dict(again.shapley) == dict(first.shapley)


# ---------------------------------------------------------------------- 9, 12, 13: valuation cell files
def small_config(out: Path) -> dict:
    return {"study": {"name": "small", "out": str(out)},
            "pools": {"three": [{"expert": 0.8}, {"expert": 0.5}, {"expert": 0.6}]},
            "tasks": {"arith": {"n": 6}}, "protocols": {"vote": {}},
            "valuation": {"bootstrap_resamples": 20}}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-cell valuation study: its config, its result and the cell's file text."""
    out = tmp_path_factory.mktemp("study")
    config = small_config(out / "out")
    first = study.run(config, progress=False)
    (cell,) = study.plan(config)
    return config, first, cell, cell_path(out / "out", cell).read_text()


def _grand(report: dict) -> int:
    return report["coalition_costs"]["masks"].index((1 << len(report["ids"])) - 1)


EDITS = {
    "system-huge-int": lambda r: r["system"].__setitem__(0, HUGE),
    "individual-huge-int": lambda r: r["measures"]["individual"]["per_question"][0].__setitem__(0, HUGE),
    "per-question-row-x": lambda r: r["measures"]["shapley"]["per_question"].__setitem__(0, "x"),
    "per-question-nan-row": lambda r: r["measures"]["loo"]["per_question"].__setitem__(
        0, [math.nan] * len(r["example_ids"])),
    "coalition-cost-row-of-strings": lambda r: r["coalition_costs"]["spends"][0].__setitem__(
        "calls", ["x"] * len(r["example_ids"])),
    "coalition-values-row-of-strings": lambda r: r["coalition_costs"]["values"].__setitem__(
        0, ["x"] * len(r["example_ids"])),
    "unknown-mask": lambda r: r["coalition_costs"]["masks"].__setitem__(0, 99),
    "cost-measures-x": lambda r: r.__setitem__("cost_measures", "x"),
    "negative-cost": lambda r: r["coalition_costs"]["spends"][0]["prompt_tokens"].__setitem__(0, -5.0),
    "grand-coalition-7": lambda r: r["coalition_costs"]["values"][_grand(r)].__setitem__(0, 7.0),
    "grand-coalition-not-the-system": lambda r: r["coalition_costs"]["values"].__setitem__(
        _grand(r), [1.0 - x for x in r["system"]]),
    "shapley-out-of-range": lambda r: r["measures"]["shapley"]["per_question"][0].__setitem__(0, 3.0),
    "missing-key": lambda r: r.pop("estimator"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_valuation_cell_file_runs_again_with_a_warning(edit, finished):
    config, first, cell, text = finished
    path = cell_path(Path(config["study"]["out"]), cell)
    result = json.loads(text)
    assert "coalition_costs" in result["report"]  # the edits below have something to edit
    EDITS[edit](result["report"])
    path.write_text(json.dumps(result))
    with pytest.warns(UserWarning, match=rf"study cell file {path} is not a valid result of {cell.id}: .*"
                                         r"the cell runs again"):
        again = study.run(config, progress=False)
    assert again["run"]["executed"] == 1 and again["valuation"] == first["valuation"]
    assert load_result(Path(config["study"]["out"]), cell) is not None  # the file was replaced by a valid result


def test_a_cell_file_with_an_integer_beyond_pythons_digit_limit_runs_again(finished):
    config, first, cell, text = finished
    path = cell_path(Path(config["study"]["out"]), cell)
    path.write_text(text.replace('"system": [', '"system": [' + "9" * 5000 + ", ", 1))
    with pytest.warns(UserWarning, match="unreadable .*the cell runs again"):
        again = study.run(config, progress=False)
    assert again["run"]["executed"] == 1 and again["valuation"] == first["valuation"]


def test_a_report_whose_grand_coalition_was_edited_out_of_range_does_not_load(finished):
    """13: the 7.0 is refused when the report is read, never put on a front or picked as the cheapest."""
    _, _, _, text = finished
    report = json.loads(text)["report"]
    report["coalition_costs"]["values"][_grand(report)][0] = 7.0
    with pytest.raises(ConfigError, match=r"coalition values holds 7.0, outside \[0, 1\]") as e:
        ValuationReport.from_dict(report)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------- 14: eval questions kept out by content
def write_rows(path: Path, rows: list[tuple[str, int]]) -> None:
    """gsm8k rows: ``(split or "", i)`` -> a question about ``i`` (with a ``split`` field when one is named)."""
    lines = []
    for split, i in rows:
        row = {"question": f"Ann has {i} pens and gets {i + 2} more. How many?", "answer": f"#### {2 * i + 2}"}
        lines.append(json.dumps({**row, **({"split": split} if split else {})}))
    path.write_text("\n".join(lines) + "\n")


def file_training_config(out: Path, data: Path, **training) -> dict:
    return {"study": {"out": str(out)}, "pools": {"zoo": "zoo"},
            "tasks": {"g": {"name": "gsm8k", "options": {"path": str(data)}}},
            "training": {"pool": "zoo", "learner": "model_4", "tasks": ["g"], "setups": {"vote": {}},
                         "trainers": ["crl", "placebo"], "seeds": [0], "n_train": 20, "n_eval": 20, **training}}


def test_a_file_task_whose_splits_are_the_whole_file_is_refused_for_training(tmp_path):
    data = tmp_path / "g.jsonl"
    write_rows(data, [("", i) for i in range(20)])
    with pytest.raises(StudyConfigError, match=r"^study config: training\.train_split: 20 of the 20 eval questions of "
                                               r"tasks\.g \(split 'test'\) are questions the study trains on \(split "
                                               r"'train'\); the task is read from a file") as e:
        load_config(file_training_config(tmp_path / "out", data))
    assert "\n" not in str(e.value)


def test_the_lr_rules_guard_compares_questions_not_split_names(tmp_path):
    """The selection split has another name than the eval split but holds the same questions: refused."""
    data = tmp_path / "g.jsonl"
    write_rows(data, [("train", i) for i in range(20)] + [("test", i) for i in range(100, 120)]
               + [("validation", i) for i in range(100, 113)])
    with pytest.raises(StudyConfigError, match=r"training\.lr_rule\.split: 13 of the 20 eval questions of tasks\.g "
                                               r"\(split 'test'\) are questions the study chooses the learning rate on"):
        load_config(file_training_config(tmp_path / "out", data,
                                         lr_rule={"candidates": [1e-3, 1e-4], "split": "validation", "n": 13}))


def test_a_file_whose_rows_name_their_split_gives_each_split_its_own_rows(tmp_path):
    data = tmp_path / "g.jsonl"
    write_rows(data, [("train", i) for i in range(20)] + [("test", i) for i in range(100, 120)])
    train = tasks.load("gsm8k", path=str(data), split="train")
    test = tasks.load("gsm8k", path=str(data), split="test")
    assert len(train) == len(test) == 20
    assert not {e.question for e in train} & {e.question for e in test}
    with pytest.raises(ConfigError, match=r"no row of .* has split 'validation' \(its rows' split field holds "
                                          r"\['test', 'train'\]\)"):
        tasks.load("gsm8k", path=str(data), split="validation")
    cfg = load_config(file_training_config(tmp_path / "out", data, lr_rule={"candidates": [1e-3, 1e-4], "n": 10}))
    assert cfg.training.lr_rule.split == "train"  # disjoint from the eval questions: accepted


def test_a_file_tasks_fingerprint_covers_the_rows_of_the_other_splits(tmp_path):
    data = tmp_path / "g.jsonl"
    write_rows(data, [("train", i) for i in range(20)] + [("test", i) for i in range(100, 120)])
    before = load_config(file_training_config(tmp_path / "out", data)).tasks["g"].describe()
    write_rows(data, [("train", i) for i in range(200, 220)] + [("test", i) for i in range(100, 120)])
    after = load_config(file_training_config(tmp_path / "out", data)).tasks["g"].describe()
    assert before != after  # the train rows changed; the task's own ("test") rows did not


# ---------------------------------------------------------------------- 15: the deletion gate on evidence
def _gate_runs(after: np.ndarray, before: np.ndarray, alone: np.ndarray) -> dict:
    runs = {"crl": {s: {"system": after.tolist(), "standalone": alone.tolist()} for s in (0, 1, 2)}}
    for t in ("grpo", "placebo"):
        runs[t] = {s: {"system": before.tolist(), "standalone": alone.tolist()} for s in (0, 1, 2)}
    return runs


def test_the_deletion_gate_requires_the_difference_to_exclude_zero():
    """A learner that defers on 99 of 100 questions: 0.74 against 0.73 without it is no evidence of collaboration."""
    q = 100
    without = np.zeros(q)
    without[:73] = 1.0  # 0.73 without the learner
    after = without.copy()
    after[73] = 1.0  # the trained system differs on one question: 0.74
    before = np.zeros(q)
    before[:70] = 1.0  # 0.70 before training: C-RL "gains" 4 points
    alone = np.zeros(q)
    alone[:25] = 1.0
    base = {"system": before.tolist(), "standalone": alone.tolist(), "without_learner": without.tolist()}
    out = training_tables({("vote", "arith"): base}, {("vote", "arith"): _gate_runs(after, before, alone)},
                          ["crl", "grpo", "placebo"], resamples=2000)
    (st,) = out["settings"]
    diff = st["delta_vs_without_learner"]["crl"]
    assert diff["value"] == pytest.approx(0.01) and diff["ci"][0] <= 0 < diff["ci"][1]
    assert not st["comparable"] and [g["name"] for g in st["gates"] if not g["passed"]] == ["not_deletion"]
    assert st["not_comparable"].startswith("not_deletion: crl: the system's gain does not beat the system without "
                                           "the learner (0.730)")
    assert out["summary"]["crl_vs"]["placebo"] == {"settings": 0, "not_comparable": 1}  # no win counted
    # a learner that really adds: right on 10 more questions than the system without it
    helped = without.copy()
    helped[73:83] = 1.0
    ok = training_tables({("vote", "arith"): base}, {("vote", "arith"): _gate_runs(helped, before, alone)},
                         ["crl", "grpo", "placebo"], resamples=2000)
    assert ok["settings"][0]["comparable"], ok["settings"][0]["not_comparable"]


def test_the_deletion_gate_without_a_difference_has_no_evidence():
    d = {"value": 0.02, "ci": [0.0, 0.04]}
    g = setting_gates(alone_before=0.25, alone_delta={}, system_delta={"crl": d, "placebo": {"value": 0.0, "ci": None}},
                      trainers=["crl", "placebo"], without_learner=0.70, before=0.69)
    assert [x["name"] for x in g["gates"] if not x["passed"]] == ["not_deletion"]


# ---------------------------------------------------------------------- 16: one definition per cell kind
def test_a_stray_module_redefining_a_kind_is_refused_in_one_line(tmp_path):
    stray = tmp_path / "stray_kinds"
    stray.mkdir()
    (stray / "zz_stray.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass

        from crl_envs.study.cells.valuation import ValuationCell as _Valuation


        @dataclass(frozen=True)
        class ValuationCell(_Valuation):
            kind = "valuation"

            def run(self, context):
                return {"report": {}, "summary": "forged"}
    """))
    script = textwrap.dedent("""
        import importlib
        import sys
        from crl_envs.study.cells.base import cell_kind
        cells = importlib.import_module("crl_envs.study.cells")  # (crl_envs.study.cells is also a function's name)
        cells.__path__.append(sys.argv[1])  # a module dropped beside the kinds' modules
        try:
            cells._import_kinds()
        except TypeError as e:
            print("REFUSED", type(e).__name__, e)
        else:
            print("REPLACED" if cell_kind("valuation").__module__.endswith("zz_stray") else "KEPT")
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(stray)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("REFUSED ConfigTypeError two cell kinds named 'valuation': "
                          "crl_envs.study.cells.valuation.ValuationCell and crl_envs.study.cells.zz_stray."
                          "ValuationCell; remove the second"), out
    assert "\n" not in out


# ---------------------------------------------------------------------- 17: the sweep's files read with checks
def rule_config(tmp_path: Path) -> dict:
    return {"study": {"out": str(tmp_path / "out")}, "pools": {"zoo": "zoo"}, "tasks": {"arith": {"n": 10}},
            "training": {"pool": "zoo", "learner": "model_4", "tasks": ["arith"], "setups": {"vote": {}},
                         "trainers": ["crl"], "seeds": [0], "lr_rule": {"candidates": [1e-3, 1e-4, 3e-5]}}}


@pytest.fixture
def swept(tmp_path):
    """A planned training cell and its finished sweep: 1e-3 lowers the learner alone, 1e-4 keeps it (the pick)."""
    cfg = load_config(rule_config(tmp_path))
    planned = study.plan(cfg)
    (train,) = [c for c in planned if c.kind == "training"]
    out = Path(cfg.out)
    after = {1e-3: 0.0, 1e-4: 0.26, 3e-5: 0.26}
    for c in planned:
        if c.kind == "lr_sweep":
            lr = c.spec.learning_rate
            cell_path(out, c).parent.mkdir(parents=True, exist_ok=True)
            cell_path(out, c).write_text(json.dumps({
                "id": c.id, "kind": c.kind, "fingerprint": c.fingerprint, "learning_rate": lr, "before": 0.26,
                "after": after[lr], "example_ids": [f"q{i}" for i in range(100)], "zero_variance": 0.5}))
    assert resolve_learning_rate(train.spec, out).learning_rate == 1e-4
    return train, out, out / "cells" / f"{train.spec.learning_rate['sweep']['0.001']}.json"


def test_a_sweep_file_of_another_cell_is_not_used_to_pick_the_rate(swept):
    train, out, path = swept
    path.write_text(json.dumps({"id": "baseline/x", "kind": "baseline", "fingerprint": "0" * 32, "before": 0.26,
                                "after": 0.9, "example_ids": []}))
    with pytest.raises(RunError, match=r"the learning-rate sweep cell file for lr 0\.001 .* is not a valid result: "
                                       r"another cell's fingerprint or kind; rerun the study") as e:
        resolve_learning_rate(train.spec, out)
    assert "\n" not in str(e.value)


def test_a_fifo_at_a_sweep_files_path_does_not_block_the_training_cell(swept):
    train, out, path = swept
    path.unlink()
    os.mkfifo(path)
    try:
        hung, got = in_thread(lambda: resolve_learning_rate(train.spec, out))
    finally:
        release_fifo(path)
    assert not hung, "the training cell blocked on a FIFO at its sweep file's path"
    assert isinstance(got, RunError) and "not a regular file" in str(got)
