"""Without the Hugging Face hub, loading a hub model or dataset fails at once and names the fix
(``path=`` for tasks, a local directory for models) instead of retrying for tens of seconds."""

from __future__ import annotations

import pytest

import agents
from agents import hub
from crl_envs import tasks


@pytest.fixture
def unreachable_hub(monkeypatch):
    """Downloads switched on, the endpoint a closed local port (what a machine without network sees)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    hub._unreachable.cache_clear()
    yield
    hub._unreachable.cache_clear()


def test_unreachable_hub_task_names_path(unreachable_hub):
    with pytest.raises(hub.HubUnavailableError) as caught:
        tasks.load("gsm8k", n=5)
    message = str(caught.value)
    assert message.startswith("task 'gsm8k' (hub dataset 'openai/gsm8k') needs the Hugging Face hub, but "
                              "127.0.0.1:9 is unreachable")
    assert "pass path= a local copy" in message and "--task-option path=" in message
    assert "HF_HUB_OFFLINE=1" in message
    assert isinstance(caught.value, ConnectionError)  # what callers catching ConnectionError expect


def test_unreachable_hub_model_names_a_local_directory(unreachable_hub):
    with pytest.raises(hub.HubUnavailableError, match=r"HFAgent\('org/model'\) needs the Hugging Face hub, but "
                                                      r"127.0.0.1:9 is unreachable.*local model directory .*or a GGUF file"):
        agents.pool("hf:org/model")


def test_offline_cache_miss_names_path(monkeypatch):
    """HF_HUB_OFFLINE set (as in conftest) and the dataset not cached: datasets' own error, reworded."""
    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        pytest.skip("huggingface_hub was imported with downloads on")
    assert hub.unavailable_reason() == "HF_HUB_OFFLINE is set"
    with pytest.raises(hub.HubUnavailableError, match=r"not in the local Hugging Face cache and HF_HUB_OFFLINE is "
                                                      r"set .*pass path= a local copy of 'openai/gsm8k'"):
        tasks.load("gsm8k", n=5)


def test_local_model_directory_needs_no_hub(unreachable_hub, tiny_model_dir):
    agent = agents.HFAgent(tiny_model_dir)
    assert agent.name == tiny_model_dir.name


@pytest.mark.parametrize("kwargs, error, match", [
    ({"n": "5"}, TypeError, r"n must be an int >= 1, got '5' \(str\) \(write n=5 without quotes\)"),
    ({"n": 0}, ValueError, "n must be an int >= 1, got 0"),
    ({"n": 2.5}, TypeError, "n must be an int"),
    ({"seed": "1"}, TypeError, "seed must be an int"),
    ({"split": 1}, TypeError, "split must be a str"),
    ({"digit": 3}, ValueError, r"task 'arith': unknown option 'digit' \(did you mean 'digits'\?\); valid options: "
                               r"split, n, seed, digits, operations"),
])
def test_task_load_checks_its_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        tasks.load("arith", **kwargs)


def test_unknown_task_suggests_a_name():
    with pytest.raises(ValueError, match=r"unknown task 'gsm8' \(did you mean 'gsm8k'\?\)"):
        tasks.load("gsm8", n=2)
