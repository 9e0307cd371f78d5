"""Tasks: numeric extraction, arith generation, GSM8K loading and grading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agents import Agent, Generation, Pool
from crl_envs import run_episodes, tasks
from crl_envs.tasks.numeric import extract_number, normalize_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", "42"),
        ("the answer is: $1,234", "1234"),
        ("Therefore \\boxed{17} is it, not 3", "17"),
        ("\\boxed{\\frac{3}{4}} hmm", "0.75"),  # a boxed fraction is its value (it used to read "4")
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


#: 45 rows of GSM8K's test split, shipped with the tests (MIT; which rows: tests/data/README.md).
GSM8K_SAMPLE = Path(__file__).parent / "data" / "gsm8k-test-sample.jsonl"


@pytest.fixture(scope="module")
def gsm8k():
    return tasks.load("gsm8k", path=str(GSM8K_SAMPLE))


def test_gsm8k_gold_solutions_all_correct(gsm8k):
    assert len(gsm8k) == 45
    assert sum("," in e.metadata["solution"].rsplit("####", 1)[1] for e in gsm8k) == 14  # thousands separators
    assert all(gsm8k.score(e.metadata["solution"], e) == 1.0 for e in gsm8k)


def test_gsm8k_changed_final_number_is_wrong(gsm8k):
    wrong = 0
    for e in gsm8k:
        head, final = e.metadata["solution"].rsplit("####", 1)
        changed = f"{head}#### {normalize_number(final) and float(normalize_number(final)) + 1:g}"
        wrong += gsm8k.score(changed, e) == 0.0
    assert wrong == len(gsm8k)


def test_gsm8k_subsample_is_seeded(gsm8k):
    a = tasks.load("gsm8k", path=str(GSM8K_SAMPLE), n=10, seed=1)
    b = tasks.load("gsm8k", path=str(GSM8K_SAMPLE), n=10, seed=1)
    c = tasks.load("gsm8k", path=str(GSM8K_SAMPLE), n=10, seed=2)
    assert [e.id for e in a] == [e.id for e in b] and len(a) == 10
    assert [e.id for e in a] != [e.id for e in c]


# ---- extraction rules on real text (crl_envs/tasks/numeric.py docstring; each case was read wrong before) ----
@pytest.mark.parametrize(
    "text, expected",
    [
        # a subtraction sign is not a negative sign; an unevaluated expression is no answer
        (" 66 - 9 = 66 - 9", None),
        ("66-9=57", "57"),
        ("So the result is −4.", "-4"),  # U+2212 is a minus sign
        ("The answer is 2 - 84.", None),
        ("5 - -3 = 8, and the answer is -8 + 16 = 8", "8"),
        # an equation after the marker counts by its result
        ("So, the answer is 249 / 12 = 18.25 pounds.", "18.25"),
        # the literal placeholder the instruction shows
        ("The answer is N = 130.\nThat took 3 steps.", "130"),
        ("The answer is 25. The answer is N.", "25"),
        # "N is the answer" is a final marker too
        ("Now we add 16 to 16 to get 0, which is the answer. I used 5 steps.", "0"),
        # the last final marker wins, whatever its kind
        ("The answer is 61.\n#### 60", "60"),
        ("\\boxed{5} was my guess; the answer is 6.", "6"),
        # thousands separators are commas in groups of three
        ("counting 1,2,3", "3"),
        ("The answer is $1,234,567.50.", "1234567.5"),
        # the model's own turn ends where it starts writing the protocol's next turn
        (" 69 + 40 = 101\nAgent 2: We have 69 + 40 = 120.\n\nSo, the answer is 120.\nYour previous answer: 69 + 40 = 101",
         "101"),
        # numbers in a question or in a plan are not answers
        (" Kelly has 5 quarters. If she buys a can of pop for 55 cents, how many cents will she have left?", None),
        (" To solve this problem, we need to find the difference between 82 and 44.", None),
    ],
)
def test_extraction_rules_on_real_text(text, expected):
    assert extract_number(text) == expected


@pytest.mark.parametrize(
    "text, complete, cut",
    [
        ("The answer is N = 1", "1", None),  # the fragment of "N = 130" scored 1 before
        ("Joey has 131 points + 10 = 14", "14", None),  # no final marker: no fallback once cut
        ("The answer is 130.\nThe answer is 130.\nThe answer is ", "130", "130"),  # a complete final before the cut
        (" 26 + 34 = 52\nAgent 2: To solve this problem, we need to subtract 26 fr", "52", "52"),  # ended by a turn
    ],
)
def test_a_cut_off_answer_counts_only_through_a_complete_final_marker(text, complete, cut):
    assert extract_number(text) == extract_number(text, "stop") == complete
    assert extract_number(text, finish_reason="length") == cut


class _FixedAgent(Agent):
    """Answers every request with one text and one finish reason (a backend that hit max_new_tokens)."""

    def __init__(self, text: str, finish_reason: str):
        self.name, self.text, self.finish_reason = f"fixed-{finish_reason}", text, finish_reason

    def _generate(self, requests):
        return [Generation(self.text, finish_reason=self.finish_reason) for _ in requests]


def test_the_runner_passes_finish_reason_to_the_tasks_extraction():
    task = tasks.load("arith", n=1)
    e = task[0]
    text = f"{e.question[8:-1]} = {e.answer}"  # "26 + 34 = 60"
    whole = run_episodes("vote", Pool([_FixedAgent(text, "stop")]), task, progress=False)[0]
    cut = run_episodes("vote", Pool([_FixedAgent(text, "length")]), task, progress=False)[0]
    assert (whole.answer, whole.score) == (e.answer, 1.0)
    assert (cut.answer, cut.score) == (None, 0.0)  # the number may be the start of a longer one
    assert cut.transcript[0].finish_reason == "length"
    # an action the env truncates to max_action_chars is cut off as well
    truncated = run_episodes("vote", Pool([_FixedAgent(text + "0 or so", "stop")]), task, progress=False,
                             options={"max_action_chars": len(text)})[0]
    assert truncated.answer is None
