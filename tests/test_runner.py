"""run_episodes: determinism, batching invariance, policy overrides, records and usage."""

from __future__ import annotations

import re

import pytest

import agents
import crl_envs
from agents import HFAgent, SamplingParams

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def hf_pool(tiny_model_dir):
    return agents.pool([HFAgent(tiny_model_dir, name=f"tiny-{i}") for i in range(2)])


def texts(episodes):
    return [[t.text for t in e.transcript] for e in episodes]


def test_same_seed_same_episodes_hf(hf_pool, arith_task):
    run = lambda seed: crl_envs.run_episodes(  # noqa: E731
        "debate", hf_pool, arith_task, samples=2, seed=seed, sampling=SAMPLED, examples=[0, 1, 2], progress=False
    )
    a, b, c = run(0), run(0), run(1)
    assert texts(a) == texts(b)
    assert [e.score for e in a] == [e.score for e in b]
    assert texts(a) != texts(c)
    # the two samples of one question differ (their seeds differ)
    assert texts(a)[0] != texts(a)[1]


def test_results_do_not_depend_on_batching(hf_pool, arith_task):
    whole = crl_envs.run_episodes("vote", hf_pool, arith_task, seed=3, sampling=SAMPLED, progress=False)
    chunked = crl_envs.run_episodes("vote", hf_pool, arith_task, seed=3, sampling=SAMPLED, batch_size=5, progress=False)
    subset = crl_envs.run_episodes("vote", hf_pool, arith_task, seed=3, sampling=SAMPLED, examples=[4], progress=False)
    assert texts(whole) == texts(chunked)
    assert texts(subset)[0] == texts(whole)[4]


def test_same_seed_same_episodes_scripted(scripted_pool, arith_task):
    a = crl_envs.run_episodes("debate", scripted_pool, arith_task, progress=False)
    b = crl_envs.run_episodes("debate", scripted_pool, arith_task, progress=False)
    strip = lambda e: {k: v for k, v in e.to_dict().items() if k != "usage"}  # noqa: E731 - usage has timings
    assert [strip(e) for e in a] == [strip(e) for e in b]


class CountingAgent(agents.ScriptedAgent):
    def __init__(self, name):
        super().__init__(name, lambda ex, m: f"The answer is {ex.answer}.")
        self.calls = []

    def _generate(self, requests):
        self.calls.append(len(requests))
        return super()._generate(requests)


def test_one_batched_call_per_agent_per_phase(arith_task):
    shared = CountingAgent("shared")
    other = CountingAgent("other")
    pool = agents.pool([shared, shared, other])  # one Agent serving two seats
    eps = crl_envs.run_episodes("debate", pool, arith_task, samples=3, progress=False)
    n = len(arith_task) * 3
    assert shared.calls == [2 * n, 2 * n]  # two phases, both seats in one call
    assert other.calls == [n, n]
    assert all(e.score == 1.0 for e in eps)


def test_policy_override_records_tokens(hf_pool, arith_task, tiny_model_dir):
    learner = HFAgent(tiny_model_dir, name="learner")
    eps = crl_envs.run_episodes(
        "debate", hf_pool, arith_task, policies={"model_1": learner}, sampling=SAMPLED, examples=[0, 1], progress=False
    )
    for ep in eps:
        mine = ep.turns_of("model_1")
        assert [t.model for t in mine] == ["learner", "learner"]
        for t in mine:
            assert t.token_ids is not None and len(t.token_ids) == len(t.logprobs) > 0
            assert t.prompt_token_ids == learner.encode_prompt(t.messages)
            assert all(lp <= 0 for lp in t.logprobs)
        assert all(t.token_ids is None for t in ep.turns_of("model_0"))
        assert ep.usage["model_1"].calls == 2
        assert ep.usage["model_1"].completion_tokens == sum(len(t.token_ids) for t in mine)
    with pytest.raises(ValueError, match="policies name unknown agents"):
        crl_envs.run_episodes("vote", hf_pool, arith_task, policies={"model_5": learner}, progress=False)


def test_usage_is_summed_per_run(scripted_pool, arith_task):
    eps = crl_envs.run_episodes("debate", scripted_pool, arith_task, progress=False)
    total = crl_envs.total_usage(eps)
    assert set(total) == set(scripted_pool.ids)
    assert total["model_0"].calls == 2 * len(arith_task)
    assert total["model_0"].completion_tokens == sum(
        len(t.text.split()) for e in eps for t in e.turns_of("model_0")
    )


def test_agent_failure_names_agent_and_example(arith_task):
    def boom(ex, m):
        raise TimeoutError("server went away")

    pool = agents.pool([agents.ScriptedAgent("ok", lambda ex, m: "1"), agents.ScriptedAgent("bad", boom)])
    with pytest.raises(RuntimeError, match=r"model_1 \(bad\) failed.*test-0.*server went away"):
        crl_envs.run_episodes("vote", pool, arith_task, progress=False)


def test_cli_play_prints_transcripts(capsys):
    from crl_envs.commands import main

    assert main(["play", "--protocol", "vote", "--task", "arith", "--n", "2", "--pool", "scripted", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "vote_v0 on arith" in out and "mean score" in out
    assert main(["play", "--protocol", "nope", "--pool", "scripted"]) == 2


# ---------------------------------------------------------------------------- bad input fails at once, naming the fix
def test_sampling_must_be_sampling_params(scripted_pool, arith_task):
    with pytest.raises(TypeError, match=r"sampling\['model_0'\] must be a SamplingParams, got 0.5 \(float\); "
                                        r"e.g. sampling=\{'model_0': SamplingParams\(temperature=0.5\)\}"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, sampling={"model_0": 0.5}, progress=False)
    with pytest.raises(TypeError, match="sampling must be a SamplingParams .* got str"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, sampling="greedy", progress=False)
    with pytest.raises(ValueError, match=r"sampling names unknown agents \['model_7'\]"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, sampling={"model_7": SamplingParams()}, progress=False)


def test_policy_given_as_a_spec_string_is_built(hf_pool, arith_task, tiny_model_dir):
    """``policies={"model_0": "hf:..."}`` plays that model, exactly as the Agent built from the spec would."""
    by_spec = crl_envs.run_episodes("vote", hf_pool, arith_task, policies={"model_0": f"hf:{tiny_model_dir}?name=spec"},
                                    sampling=SAMPLED, examples=[0, 1], progress=False)
    by_agent = crl_envs.run_episodes("vote", hf_pool, arith_task, policies={"model_0": HFAgent(tiny_model_dir)},
                                     sampling=SAMPLED, examples=[0, 1], progress=False)
    assert texts(by_spec) == texts(by_agent)
    assert [t.model for e in by_spec for t in e.turns_of("model_0")] == ["spec", "spec"]
    assert all(t.token_ids for e in by_spec for t in e.turns_of("model_0"))  # an override is recorded
    with pytest.raises(TypeError, match=r"policies\['model_0'\] must be an agents.Agent or a spec string"):
        crl_envs.run_episodes("vote", hf_pool, arith_task, policies={"model_0": 3}, progress=False)


def test_examples_must_be_indices_or_ids(scripted_pool, arith_task):
    import numpy as np

    with pytest.raises(TypeError, match=r"got 1.5 \(float\)"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, examples=[1.5], progress=False)
    with pytest.raises(TypeError, match=r"examples must be a list .* e.g. examples=\['test-1'\]"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, examples="test-1", progress=False)
    with pytest.raises(ValueError, match=r"out of range for a task of 12 \(valid: 0..11\)"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, examples=[12], progress=False)
    played = crl_envs.run_episodes("vote", scripted_pool, arith_task, examples=[np.int64(3), "test-5"], progress=False)
    assert [e.example_id for e in played] == [arith_task[3].id, "test-5"]


@pytest.mark.parametrize("kwargs, match", [
    ({"samples": "2"}, r"samples must be an int >= 1, got '2' \(str\) \(write samples=2 without quotes\)"),
    ({"samples": 0}, "samples must be an int >= 1, got 0"),
    ({"batch_size": 2.0}, "batch_size must be an int >= 1"),
    ({"seed": "0"}, "seed must be an int"),
])
def test_numbers_must_be_numbers(kwargs, match, scripted_pool, arith_task):
    with pytest.raises((TypeError, ValueError), match=match):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, progress=False, **kwargs)


def test_coalition_in_protocol_options_points_to_coalition_argument(scripted_pool, arith_task):
    with pytest.raises(ValueError, match=r"unknown option 'coalition' \(a reset option, not a protocol option: "
                                         r"pass run_episodes\(\.\.\., coalition=\[\.\.\.\]\)"):
        crl_envs.run_episodes("vote", scripted_pool, arith_task, options={"coalition": ["model_0"]}, progress=False)
    played = crl_envs.run_episodes("vote", scripted_pool, arith_task, coalition=["model_0"], progress=False)
    assert all(e.coalition == ["model_0"] for e in played)


def test_protocol_options_are_checked_before_the_pool_is_built(arith_task):
    """A typo fails before any model loads: this pool spec would fail (no such model) if it were built."""
    with pytest.raises(ValueError, match=r"debate_v0: unknown option 'round' \(did you mean 'rounds'\?\)"):
        crl_envs.run_episodes("debate", "hf:/no/such/model", arith_task, options={"round": 3}, progress=False)


# ---------------------------------------------------------------------------- progress
def test_progress_bar_moves_with_phases_and_tokens(scripted_pool, arith_task, capsys):
    """Lockstep episodes all end in the last phase, so the bar counts generated tokens and names the
    phase it is in; it is redrawn at every phase (not 0/N, then N/N)."""
    eps = crl_envs.run_episodes("debate", scripted_pool, arith_task, options={"rounds": 3}, progress=True)
    err = capsys.readouterr().err
    for phase in ("round_1", "round_2", "round_3"):
        assert f"phase {phase}, 0/{len(eps)} episodes done" in err
    # scripted agents count whitespace tokens
    per_round = [sum(len(t.text.split()) for e in eps for t in e.transcript if t.phase_name == f"round_{r}")
                 for r in (1, 2, 3)]
    # when round 2 is announced, the bar shows round 1's tokens
    assert re.search(rf"\b{per_round[0]}tok\b.*phase round_2", err), err[-500:]
    assert re.search(rf"\b{per_round[0] + per_round[1]}tok\b.*phase round_3", err)


def test_zoo_loads_without_progress_bars():
    """``agents.pool("zoo")`` from the Python API draws no per-model "Loading weights" bars, and
    leaves transformers' own progress-bar setting as it found it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    probe = ("import agents\nfrom transformers.utils import logging\n"
             "pool = agents.pool('zoo')\nprint(len(pool), logging.is_progress_bar_enabled())\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.split() == ["5", "True"], out.stderr[-2000:]
    assert "Loading weights" not in out.stderr and "it/s" not in out.stderr, out.stderr[-2000:]
