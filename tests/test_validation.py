"""The shared checks (crl_kit/validation.py) and the registries' public names: one rule, one wording,
whichever layer refuses the value."""

from __future__ import annotations

import numpy as np
import pytest

import agents
from crl_envs import tasks
from crl_kit.errors import ConfigError, ConfigTypeError
from crl_kit.validation import check_int, did_you_mean, int_problem


@pytest.mark.parametrize("value, kind, words", [
    ("5", ConfigTypeError, "n must be an int >= 1, got '5' (str) (write n=5 without quotes)"),
    (2.0, ConfigTypeError, "n must be an int >= 1, got 2.0 (float)"),
    (True, ConfigTypeError, "n must be an int >= 1, got True (bool)"),
    (0, ConfigError, "n must be an int >= 1, got 0"),
])
def test_check_int_refuses_in_one_wording(value, kind, words):
    with pytest.raises(kind) as info:
        check_int("n", value, minimum=1)
    assert str(info.value) == words and type(info.value) is kind
    with pytest.raises(kind) as loaded:  # the task's own check is the same one
        tasks.load("arith", n=value)
    assert str(loaded.value) == words


def test_check_int_accepts_numpy_integers_and_none_when_allowed():
    assert check_int("seed", np.int64(3)) == 3 and type(check_int("seed", np.int64(3))) is int
    assert check_int("batch_size", None, minimum=1, allow_none=True) is None
    with pytest.raises(ConfigTypeError):
        check_int("batch_size", None, minimum=1)
    assert int_problem(7, minimum=1) is None
    assert int_problem(0, minimum=1, why="e.g. 4") == "must be an int >= 1 (e.g. 4), got 0"


def test_did_you_mean_only_for_a_near_miss():
    assert did_you_mean("debat", ["debate", "vote"]) == " (did you mean 'debate'?)"
    assert did_you_mean("xyz", ["debate", "vote"]) == ""


def test_the_registries_name_their_entries_publicly():
    assert {"zoo", "pretrained"} <= set(agents.pool_names()) and agents.pool_names() == sorted(agents.pool_names())
    assert {"hf", "openai", "vllm", "llamacpp"} <= set(agents.backend_names())
    assert tasks.option_names("arith") == ["digits", "operations"]
    assert "path" in tasks.option_names("gsm8k")
    with pytest.raises(ConfigError, match=r"unknown task 'arit' \(did you mean 'arith'\?\)"):
        tasks.option_names("arit")
