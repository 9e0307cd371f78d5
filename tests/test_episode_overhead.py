"""The per-episode shortcuts keep what they replace: a :class:`crl_envs.spaces.TextSpace` built from shared charset
tables is the space gymnasium builds, ``SamplingParams.with_seed`` is ``dataclasses.replace``, a request key is the
digest of the JSON it always was, the cached answer extraction reads what the rules read, and a zoo pool's
registered size is its built size (read without loading a model). ``benchmarks/episode_overhead.py`` times them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle

import pytest
from gymnasium import spaces

import agents
from agents import SamplingParams
from crl_envs.protocols.base import Reply
from crl_envs.runner import request_key
from crl_envs.spaces import SAMPLE_CHARSET, TextSpace
from crl_envs.tasks import numeric
from crl_kit.errors import ConfigError, ConfigTypeError


def test_a_text_space_is_what_gymnasium_builds_with_its_own_generator():
    slow = spaces.Text(max_length=37, min_length=0, charset=SAMPLE_CHARSET)
    fast = TextSpace(37)
    assert vars(fast) == vars(slow)  # every attribute gymnasium's constructor sets, generator (None) included
    a, b = TextSpace(20, seed=1), TextSpace(20, seed=1)
    assert [a.sample() for _ in range(5)] == [b.sample() for _ in range(5)]
    c = TextSpace(20)
    c.seed(2)
    a.seed(1)
    draws = [a.sample() for _ in range(5)]
    assert draws != [c.sample() for _ in range(5)]  # seeding one space leaves the other's generator alone
    assert all(TextSpace(20).contains(x) and len(x) <= 20 for x in draws)
    assert pickle.loads(pickle.dumps(a)) == a and TextSpace(20) != TextSpace(21)
    assert TextSpace(20).np_random is not TextSpace(20).np_random


@pytest.mark.parametrize("bad, error, words", [(0, ConfigError, "max_length must be >= 1, got 0"),
                                                (2.5, ConfigTypeError, "max_length must be an int, got float 2.5"),
                                                (True, ConfigTypeError, "max_length must be an int, got bool")])
def test_a_text_space_refuses_a_bad_length(bad, error, words):
    with pytest.raises(error, match=words):
        TextSpace(bad)


def test_with_seed_is_replace_and_checks_the_seed_as_the_constructor_does():
    base = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=3, stop=["\n", "###"])
    for seed in (None, 0, 2**62, 7):
        assert base.with_seed(seed) == dataclasses.replace(base, seed=seed)
    import numpy as np

    moved = base.with_seed(np.int64(5))
    assert moved.seed == 5 and type(moved.seed) is int and base.seed == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.seed = 1
    for bad in ("1", 1.0, True):
        with pytest.raises(ConfigTypeError, match="SamplingParams.seed must be an int"):
            base.with_seed(bad)


def test_a_request_key_is_the_digest_it_always_was():
    """Keys name cached generations on disk: the JSON of (fingerprint, messages, dataclasses.asdict(sampling))."""
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2 + 2? é"}]
    for sampling in (SamplingParams(), SamplingParams(temperature=0.5, seed=9, stop=["\n"]),
                     SamplingParams(top_p=0.5, max_new_tokens=3)):
        request = agents.Request(messages, sampling)
        payload = json.dumps(["fp", messages, dataclasses.asdict(sampling)], sort_keys=True, ensure_ascii=False)
        assert request_key("fp", request) == hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()


def test_the_cached_extraction_reads_what_the_rules_read():
    texts = ["so 3 + 4 = 7. The answer is $1,200.", " 66 - 9 = 66 - 9", "26 + 34 = 52", "The answer is 4",
             "12 + 30 = 4", "What is 5?", "Agent 2: 9\n", "x = 3\nAgent 2: So 8.", "The answer is -7.5."]
    for text in texts:
        for reason in (None, "length", "stop"):
            expected = numeric._extract_number.__wrapped__(text, reason)
            assert numeric.extract_number(text, reason) == expected
            assert numeric.extract_number(Reply(text, reason), reason) == expected  # a str subclass: the same key
    assert numeric.extract_number("The answer is 4", 3) == numeric.extract_number("The answer is 4")
    assert numeric.extract_number(None) is None and numeric.extract_number(12) is None
    assert numeric._extract_number.cache_info().hits > 0


def test_a_zoo_pool_size_is_read_from_the_registry_and_is_its_built_size(monkeypatch):
    import sys

    import agents.zoo

    registry = sys.modules["agents.pool"]  # the module (agents.pool is the function)

    for name in ("zoo", "zoo4-ladder", next(iter(agents.zoo.POOLS16))):
        assert agents.pool_size(name) == len(agents.pool(name))
    monkeypatch.setitem(registry._NAMED_POOLS, "zoo4-ladder", lambda: pytest.fail("pool_size built the pool"))
    assert agents.pool_size("zoo4-ladder") == 8
    agents.register_pool("three", lambda: [agents.ScriptedAgent(f"s{i}", lambda example, messages: "1") for i in range(3)])
    try:
        assert agents.pool_size("three") == 3  # no size registered: built and counted
    finally:
        registry._NAMED_POOLS.pop("three")
    with pytest.raises(ConfigError, match="unknown pool"):
        agents.pool_size("no-such-pool")
