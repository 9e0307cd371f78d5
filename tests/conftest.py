"""Shared fixtures: scripted pools, small tasks, and a tiny randomly initialised GPT-2 on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.fixture
def one_thread():
    """One torch thread for the test (``agents.sampling.cpu_threads``): small models gain nothing from intra-op
    threads, and on a busy 2-core machine two threads ran several times slower (spin-waits)."""
    from agents.sampling import cpu_threads

    with cpu_threads(1):
        yield


@pytest.fixture
def arith_task():
    from crl_envs import tasks

    return tasks.load("arith", n=12, seed=0)


@pytest.fixture
def scripted_pool():
    """Three deterministic experts (accuracy 0.8, 0.6, 0.4)."""
    import agents

    return agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.8, 0.6, 0.4)])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer GPT-2 with a char tokenizer, saved with save_pretrained."""
    from transformers.utils import logging

    from agents.tiny import tiny_gpt2

    logging.disable_progress_bar()
    return tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), seed=0)
