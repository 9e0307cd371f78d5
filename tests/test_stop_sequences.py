"""Stop sequences on the backends without a model here: scripted agents and vLLM's request translation
(HFAgent's are in test_hf_agent.py, the pretrained models' in test_pretrained.py)."""

from __future__ import annotations

from agents import Request, SamplingParams, ScriptedAgent
from agents.base import PLAIN_CHAT_STOP
from agents.vllm import vllm_sampling_kwargs


def test_scripted_answers_end_before_the_stop_string():
    agent = ScriptedAgent("chatty", lambda example, messages: "The answer is 4.\nUser: and 5+5?")
    plain, cut = agent.generate([
        Request([{"role": "user", "content": "2+2?"}]),
        Request([{"role": "user", "content": "2+2?"}], SamplingParams(stop=["\nUser:", "answer is 5"])),
    ])
    assert plain.text == "The answer is 4.\nUser: and 5+5?"
    assert cut.text == "The answer is 4." and cut.finish_reason == "stop" and cut.completion_tokens == 4


def test_vllm_requests_carry_the_stop_strings():
    kw = vllm_sampling_kwargs(SamplingParams(stop=["\n\n"]), stop=PLAIN_CHAT_STOP)
    assert kw["stop"] == ["\n\n", *PLAIN_CHAT_STOP]
    assert "stop" not in vllm_sampling_kwargs(SamplingParams())  # vLLM's default (None)
