"""The third hostile round (issue 37), sandbox, code tasks and coalition cache: a StopIteration from the
program cannot end the checker's loop, the coalition cache is keyed by the tests (not a file name) and
validated on read, a function named like a module or builtin comes from the program, a timeout says so,
and bad data files or weights fail in one line naming the file."""

from __future__ import annotations

import json
import math
import shutil
import warnings

import numpy as np
import pytest

import agents
from crl_envs import tasks
from crl_envs.sandbox import isolation, run_tests
from crl_envs.tasks.code import MBPPTask, called_names
from crl_envs.valuation import CoalitionGame

needs_bwrap = pytest.mark.skipif(not isolation(), reason="needs bwrap (apt-get install bubblewrap)")
FAST = 30.0  # programs that end by themselves: a wall clock a loaded machine meets

IS_EVEN = "def is_even(x):\n    return x % 2 == 0\n"
IS_EVEN_TESTS = "assert all(map(lambda t: is_even(t[0]) == t[1], [(1, False), (2, True), (3, False)]))"
STOP = "def is_even(x):\n    raise StopIteration\n"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _mbpp_row(task_id, code, tests, setup=""):
    return {"task_id": task_id, "text": f"Problem {task_id}.", "code": code, "test_list": tests,
            "test_setup_code": setup, "challenge_test_list": []}


def _coder(name="coder"):
    """Answers every question with its reference code (an MBPP row's ``code``)."""
    return agents.ScriptedAgent(name, lambda example, messages: f"```python\n{example.answer}\n```")


# ---- 1. a forged pass through StopIteration ---------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("error", ["StopIteration", "StopAsyncIteration"])
def test_a_stop_iteration_from_the_program_cannot_end_the_checkers_loop(error, tmp_path):
    result = run_tests(STOP.replace("StopIteration", error), IS_EVEN_TESTS, timeout=FAST)
    assert not result.passed and result.status == "failed"
    assert f"RuntimeError: (raised by the program) {error}" in result.stdout_tail  # PEP 479's rule
    assert run_tests(IS_EVEN, IS_EVEN_TESTS, timeout=FAST).passed
    if error == "StopIteration":  # the row, through path=
        task = MBPPTask(path=_jsonl(tmp_path / "mbpp.jsonl", [_mbpp_row(1, IS_EVEN, [IS_EVEN_TESTS])]))
        assert task.score_many([STOP, IS_EVEN], [task[0]] * 2) == [0.0, 1.0]


@needs_bwrap
def test_other_exceptions_of_the_program_still_arrive_as_themselves():
    tests = "try:\n    f(0)\nexcept ZeroDivisionError as e:\n    assert 'by the program' in str(e)\nelse:\n    assert False"
    assert run_tests("def f(x):\n    return 1 / x\n", tests, timeout=FAST).passed


# ---- 2. the coalition cache is keyed by the tests, not by the file's name ---------------------------------


@needs_bwrap
def test_changing_the_asserts_in_an_mbpp_file_is_a_new_game(tmp_path):
    code = "def double(x):\n    return 2 * x\n"
    rows = [_mbpp_row(1, code, ["assert double(2) == 4", "assert double(0) == 0"])]
    path = _jsonl(tmp_path / "mbpp.jsonl", rows)
    cache = tmp_path / "cache"
    pool = agents.pool([_coder()])
    first = CoalitionGame("vote", pool, MBPPTask(path=path), cache_dir=cache, progress=False)
    assert first.value(1).tolist() == [1.0] and first.evaluations == 1
    # the same rows under another file name: the same game, read from the cache
    copy = CoalitionGame("vote", pool, MBPPTask(path=shutil.copy(path, tmp_path / "other-name.jsonl")),
                         cache_dir=cache, progress=False)
    assert copy.coalition_key(1) == first.coalition_key(1)
    assert copy.value(1).tolist() == [1.0] and copy.evaluations == 0
    # same id, question and answer, other asserts: played again, and the reference now fails
    _jsonl(path, [dict(rows[0], test_list=["assert double(2) == 5"])])
    edited = CoalitionGame("vote", pool, MBPPTask(path=path), cache_dir=cache, progress=False)
    assert edited.coalition_key(1) != first.coalition_key(1)
    assert edited.value(1).tolist() == [0.0] and edited.evaluations == 1


def test_setup_code_and_humaneval_tests_change_the_coalition_key(tmp_path):
    pool = agents.pool([_coder()])

    def key(task):
        return CoalitionGame("vote", pool, task, cache_dir=False, progress=False).coalition_key(1)

    row = _mbpp_row(1, "def f():\n    return X\n", ["assert f() == 1"], setup="X = 1")
    mbpp = [key(MBPPTask(path=_jsonl(tmp_path / f"m{i}.jsonl", [r]))) for i, r in
            enumerate([row, dict(row, test_setup_code="X = 2"), row])]
    assert mbpp[0] != mbpp[1] and mbpp[0] == mbpp[2]  # setup code counts; the file's name does not
    he = {"task_id": "T/0", "prompt": "def f():\n    \"\"\"One.\"\"\"\n", "canonical_solution": "    return 1\n",
          "test": "def check(candidate):\n    assert candidate() == 1\n", "entry_point": "f"}
    humaneval = [key(tasks.load("humaneval", path=_jsonl(tmp_path / f"h{i}.jsonl", [r]))) for i, r in
                 enumerate([he, dict(he, test=he["test"].replace("== 1", "== 2"))])]
    assert humaneval[0] != humaneval[1]


# ---- 4. a tampered coalition cache is recomputed, with a warning naming the file --------------------------


@pytest.mark.parametrize("tamper", ["7.5", "nan", "inf", "-0.5", "true", "truncated", "record []", "not json"])
def test_a_tampered_coalition_cache_entry_is_played_again_with_a_warning(tamper, tmp_path):
    # debate: a played protocol (vote's coalitions are computed from its members' answers and never cached)
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a) for a in (0.8, 0.5)])
    task = tasks.load("arith", n=6, seed=0)
    game = CoalitionGame("debate", pool, task, cache_dir=tmp_path, progress=False)
    truth = game.value(0b11)
    path = game._path(0b11)
    record = json.loads(path.read_text())
    if tamper == "truncated":
        record["scores"] = record["scores"][:-1]
    elif tamper not in ("record []", "not json"):
        record["scores"][2] = {"7.5": 7.5, "nan": math.nan, "inf": math.inf, "-0.5": -0.5, "true": True}[tamper]
    path.write_text({"record []": "[]", "not json": "{'scores': "}.get(tamper) or json.dumps(record))
    again = CoalitionGame("debate", pool, task, cache_dir=tmp_path, progress=False)
    with pytest.warns(RuntimeWarning, match=rf"coalition cache file {path}: .*played again"):
        value = again.value(0b11)
    np.testing.assert_array_equal(value, truth)
    assert again.evaluations == 1  # recomputed ...
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ... and rewritten: a third game reads it without a warning
        third = CoalitionGame("debate", pool, task, cache_dir=tmp_path, progress=False)
        np.testing.assert_array_equal(third.value(0b11), truth)
    assert third.evaluations == 0


# ---- 6. a function named like a module or a builtin comes from the program --------------------------------

COPY = "def copy(xs):\n    return list(xs)\n"
SUM = "def sum(xs):\n    total = 1\n    for x in xs:\n        total += x\n    return total\n"
SHADOW_ROWS = [_mbpp_row(1, COPY, ["assert copy((1, 2)) == [1, 2]", "assert len(copy('ab')) == 2"]),
               _mbpp_row(2, SUM, ["assert sum([1, 2]) == 4", "assert sum([]) == 1"])]


def test_called_names_keep_builtins_and_modules_unless_the_reference_defines_them():
    tests = "assert copy((1, 2)) == [1, 2]\nassert len(copy('ab')) == 2\nassert math.floor(sum([1.5])) == 2"
    assert called_names(tests) == []
    assert called_names(tests, defined=["copy", "sum", "math", "helper"]) == ["copy", "sum"]
    assert called_names("def copy(x):\n    return x\nassert copy(1) == 1", defined=["copy"]) == []  # tests bind it


@needs_bwrap
def test_an_mbpp_function_named_copy_or_sum_is_scored_on_the_program(tmp_path):
    task = MBPPTask(path=_jsonl(tmp_path / "mbpp.jsonl", SHADOW_ROWS))
    assert [task.program_names(e) for e in task] == [["copy"], ["sum"]]
    assert task.score_many([e.answer for e in task], list(task)) == [1.0, 1.0]
    wrong = ["def copy(xs):\n    return xs\n", "def sum(xs):\n    return 0\n"]
    assert task.score_many(wrong, list(task)) == [0.0, 0.0]


# ---- smaller: a timeout says so; bad data files and weights name the file ---------------------------------


@needs_bwrap
def test_a_timed_out_run_tests_says_it_timed_out():
    result = run_tests("def f(x):\n    while True:\n        pass\n", "assert f(1) == 1", timeout=2.0)
    assert result.status == "timeout" and not result.passed
    assert result.returncode == -9  # killed at the wall clock (it used to read 1, a failed test)
    assert "sandbox: timed out: killed at the wall clock after 2 s; pass a larger timeout=" in result.stdout_tail


@pytest.mark.parametrize("task", ["mbpp", "gsm8k"])
@pytest.mark.parametrize("name, content, message", [
    ("empty.jsonl", "", r"the data file '.*empty\.jsonl' is empty; it needs rows with fields"),
    ("bad.jsonl", '{"task_id": 1, "text": "x"\n', r"cannot read '.*bad\.jsonl' as JSONL \(JSON parse error: .*\); "
                                                 r"fix the file: it needs rows with fields"),
    ("bad.json", '[{"a":', r"cannot read '.*bad\.json' as JSON \(.*\); fix the file"),
    ("none.json", "[]", r"cannot read '.*none\.json' as JSON \(no rows\); fix the file"),
    ("x.jsonl", None, r"'.*x\.jsonl' is a directory, not a data file; pass path= the file itself"),
])
def test_bad_data_files_fail_in_one_line_naming_the_file(task, name, content, message, tmp_path):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises((ValueError, OSError), match=rf"^{task}: {message}") as info:
        tasks.load(task, path=str(path))
    assert "\n" not in str(info.value)


def test_bogus_safetensors_name_the_file(tiny_model_dir, tmp_path):
    from agents.hf import HFAgent
    from agents.vllm import _load_checkpoint

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (model / "model.safetensors").write_bytes(b"not a safetensors file" * 10)
    bad = rf"{model / 'model.safetensors'} is not a valid safetensors file \(.*header too large\); re-save"
    with pytest.raises(OSError, match=rf"^HFAgent could not load '{model}': {bad}"):
        HFAgent(str(model))
    with pytest.raises(OSError, match=rf"^cannot load the checkpoint {model}: {bad}"):
        _load_checkpoint(model)


# ---- issue 35 item 5: the limits are one frozen object, validated once -------------------------------------


def test_sandbox_limits_are_one_frozen_object_validated_when_made(tmp_path):
    import dataclasses

    from crl_envs.sandbox import SandboxLimits

    limits = SandboxLimits(timeout=2.5, memory_mb=256, file_size_mb=1, max_processes=4)
    assert limits.rlimit_args() == [str(256 << 20), "4", str(1 << 20), "4"]  # bytes, CPU-s = ceil(2.5) + 1, ...
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.timeout = 100
    for bad in ({"timeout": 0}, {"memory_mb": -1}, {"tmpfs_mb": 0}, {"max_processes": 0}, {"max_output_bytes": 0}):
        with pytest.raises(ValueError, match=r"^sandbox limits must be positive"):
            SandboxLimits(**bad)
    task = MBPPTask(path=_jsonl(tmp_path / "mbpp.jsonl", SHADOW_ROWS[:1]), timeout=3)
    assert task.limits == SandboxLimits(timeout=3) and (task.timeout, task.memory_mb) == (3, 1024)
