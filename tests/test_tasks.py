"""Tasks: numeric extraction, arith generation, GSM8K loading and grading."""

from __future__ import annotations

import re

import pytest
from conftest import GSM8K_TEST

from crl_envs import tasks
from crl_envs.tasks.numeric import extract_number, normalize_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", "42"),
        ("the answer is: $1,234", "1234"),
        ("Therefore \\boxed{17} is it, not 3", "17"),
        ("\\boxed{\\frac{3}{4}} hmm", "4"),  # numeric tasks take the last number inside the box
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18"),
        ("first 3 then 5 and finally -7", "-7"),
        ("The answer is 72.0", "72"),
        ("answer = 0.50", "0.5"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == expected


def test_answer_is_beats_later_numbers():
    assert extract_number("The answer is 12. (I checked 3 times)") == "12"


def test_normalize_number_rejects_non_numbers():
    assert normalize_number("abc") is None
    assert normalize_number("1,000,000") == "1000000"


def test_arith_is_seeded_and_correct():
    a = tasks.load("arith", n=50, seed=3)
    b = tasks.load("arith", n=50, seed=3)
    c = tasks.load("arith", n=50, seed=4)
    assert [e.question for e in a] == [e.question for e in b]
    assert [e.question for e in a] != [e.question for e in c]
    for e in a:
        x, op, y = re.match(r"What is (\d+) ([+*-]) (\d+)\?", e.question).groups()
        assert int(e.answer) == eval(f"{x}{op}{y}")  # independent check of the reference
        assert a.score(f"The answer is {e.answer}.", e) == 1.0
        assert a.score(f"The answer is {int(e.answer) + 1}.", e) == 0.0


def test_arith_splits_are_disjoint_and_configurable():
    train = tasks.load("arith", split="train", n=400)
    test = tasks.load("arith", split="test", n=400)
    assert not {e.question for e in train} & {e.question for e in test}
    mul = tasks.load("arith", n=20, digits=3, operations="*")
    assert all(" * " in e.question for e in mul)
    assert max(int(e.metadata["a"]) for e in mul) < 1000


def test_unknown_task_and_bad_options():
    with pytest.raises(ValueError, match="unknown task 'nope'.*arith"):
        tasks.load("nope")
    with pytest.raises(ValueError, match="operations"):
        tasks.load("arith", operations="/")
    with pytest.raises(ValueError, match="splits"):
        tasks.load("arith", split="validation")
    with pytest.raises(FileNotFoundError, match="no such file"):
        tasks.load("gsm8k", path="/does/not/exist.jsonl")


@pytest.fixture(scope="module")
def gsm8k():
    if not GSM8K_TEST.exists():
        pytest.skip(f"{GSM8K_TEST} not present")
    return tasks.load("gsm8k", path=str(GSM8K_TEST))


def test_gsm8k_gold_solutions_all_correct(gsm8k):
    assert len(gsm8k) == 1319
    assert all(gsm8k.score(e.metadata["solution"], e) == 1.0 for e in gsm8k)


def test_gsm8k_changed_final_number_is_wrong(gsm8k):
    wrong = 0
    for e in gsm8k:
        head, final = e.metadata["solution"].rsplit("####", 1)
        changed = f"{head}#### {normalize_number(final) and float(normalize_number(final)) + 1:g}"
        wrong += gsm8k.score(changed, e) == 0.0
    assert wrong == len(gsm8k)


def test_gsm8k_subsample_is_seeded(gsm8k):
    a = tasks.load("gsm8k", path=str(GSM8K_TEST), n=10, seed=1)
    b = tasks.load("gsm8k", path=str(GSM8K_TEST), n=10, seed=1)
    assert [e.id for e in a] == [e.id for e in b] and len(a) == 10
