"""HFAgent: batching invariance, seeds, finish reasons, log-prob correctness, OOM splitting, options."""

from __future__ import annotations

import pytest
import torch

import agents
from agents import HFAgent, Request, SamplingParams
from agents.hf import is_out_of_memory, sample_next
from crl_envs.tasks import Example

PROMPTS = ["1+2=", "what is 17*3? think step by step", "x", "hello there, model", "99-1", "a longer prompt " * 4]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A 2-layer model gains nothing from intra-op threads, and they thrash on a busy shared CPU."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def agent(tiny_model_dir):
    return HFAgent(tiny_model_dir, name="tiny", batch_size=64)


def requests(temperature: float, seed0: int = 0, max_new: int | list[int] = 24, top_p: float = 1.0) -> list[Request]:
    limits = max_new if isinstance(max_new, list) else [max_new] * len(PROMPTS)
    return [
        Request(
            [{"role": "user", "content": p}],
            SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=m, seed=seed0 + i),
        )
        for i, (p, m) in enumerate(zip(PROMPTS, limits))
    ]


def ids(gens):
    return [g.token_ids for g in gens]


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.8)])
def test_batched_equals_one_at_a_time(agent, temperature, top_p):
    reqs = requests(temperature, max_new=[5, 20, 12, 16, 3, 10], top_p=top_p)
    batched = agent.generate(reqs)
    alone = [agent.generate([r])[0] for r in reqs]
    assert ids(batched) == ids(alone)
    assert [g.text for g in batched] == [g.text for g in alone]
    for b, a in zip(batched, alone):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    # and in a different batch composition / batch size
    reversed_small = HFAgent(agent.model, agent.tokenizer, batch_size=2).generate(reqs[::-1])[::-1]
    assert ids(reversed_small) == ids(batched)


def test_seeds_are_reproducible_and_matter(agent):
    first = agent.generate(requests(1.0, seed0=10))
    again = agent.generate(requests(1.0, seed0=10))
    other = agent.generate(requests(1.0, seed0=500))
    assert ids(first) == ids(again)
    assert sum(a != b for a, b in zip(ids(first), ids(other))) >= len(PROMPTS) - 1


def test_finish_reasons_and_eos_is_cut(agent):
    req = requests(1.0, max_new=16)[1]
    saved = agent.eos_ids
    try:
        agent.eos_ids = set()
        full = agent.generate([req])[0]
        assert full.finish_reason == "length" and len(full.token_ids) == 16 == full.completion_tokens
        stop_at = next(k for k in range(2, 16) if full.token_ids[k] not in full.token_ids[:k])
        agent.eos_ids = {full.token_ids[stop_at]}
        cut = agent.generate([req])[0]
    finally:
        agent.eos_ids = saved
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[:stop_at] and len(cut.logprobs) == stop_at
    assert cut.text == agent.tokenizer.decode(full.token_ids[:stop_at], skip_special_tokens=True)


def teacher_forced_logprobs(agent: HFAgent, prompt: list[int], generated: list[int], temperature: float) -> list[float]:
    """Independent check: one forward over prompt + generated tokens, no padding, no cache."""
    with torch.no_grad():
        logits = agent.model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / scale, dim=-1)
    return [float(logp[len(prompt) - 1 + k, tok]) for k, tok in enumerate(generated)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_match_a_teacher_forced_forward_despite_left_padding(agent, temperature):
    reqs = requests(temperature, max_new=20)
    gens = agent.generate(reqs)  # short prompts are left-padded to the longest
    widths = {len(g.prompt_token_ids) for g in gens}
    assert len(widths) > 1, "the batch must mix prompt lengths to exercise padding"
    for g in gens:
        expected = teacher_forced_logprobs(agent, g.prompt_token_ids, g.token_ids, temperature)
        assert g.logprobs == pytest.approx(expected, abs=1e-5)
        assert g.prompt_token_ids == agent.encode_prompt([{"role": "user", "content": PROMPTS[gens.index(g)]}])


def test_finished_rows_are_dropped_from_the_cache(agent, monkeypatch):
    rows_seen = []
    forward = agent.model.forward

    def counting(*args, **kwargs):
        rows_seen.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(agent.model, "forward", counting)
    gens = agent.generate(requests(0.0, max_new=[2, 2, 2, 40, 2, 2]))
    assert rows_seen[0] == len(PROMPTS)
    assert rows_seen[-1] == 1 and len(rows_seen) == 40  # 1 prefill + 39 decode steps
    assert [len(g.token_ids) for g in gens] == [2, 2, 2, 40, 2, 2]


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
        torch.OutOfMemoryError("out of memory"),
    ],
)
def test_out_of_memory_batches_are_split(tiny_model_dir, error, monkeypatch):
    agent = HFAgent(tiny_model_dir, batch_size=64)
    reqs = requests(0.9, max_new=[5, 30, 12, 24, 3, 18]) * 3  # 18 requests
    expected = agent.generate(reqs)
    sizes = []
    forward = agent.model.forward

    def limited(*args, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        sizes.append(rows)
        if rows > 4:
            raise error
        return forward(*args, **kwargs)

    monkeypatch.setattr(agent.model, "forward", limited)
    with pytest.warns(RuntimeWarning, match="ran out of memory; retrying in batches of"):
        split = agent.generate(reqs)
    assert ids(split) == ids(expected)
    for a, b in zip(split, expected):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert sizes[:4] == [18, 9, 4, 4]  # halved until it fits


def test_out_of_memory_on_one_request_and_other_errors_surface(tiny_model_dir, monkeypatch):
    agent = HFAgent(tiny_model_dir)

    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(agent.model, "forward", oom)
    with pytest.raises(RuntimeError, match="ran out of memory on a single request.*lower max_new_tokens"):
        agent.generate(requests(0.0)[:1])

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(agent.model, "forward", broken)
    with pytest.raises(RuntimeError, match="^shape mismatch$"):
        agent.generate(requests(0.0)[:3])
    assert is_out_of_memory(torch.OutOfMemoryError("x")) and not is_out_of_memory(ValueError("out of memory"))


def test_sampling_is_top_p_restricted_and_row_independent():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]]).repeat(3, 1)
    temperature = torch.tensor([1.0, 1.0, 0.0])
    top_p = torch.tensor([0.5, 1.0, 1.0])
    draws: list[set[int]] = [set(), set(), set()]
    for seed in range(200):
        gens = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed), None]
        chosen, lp = sample_next(logits, temperature, top_p, gens)
        for row in range(3):
            draws[row].add(int(chosen[row]))
        expected = torch.log_softmax(logits[0], -1)[chosen]
        assert torch.allclose(lp, expected)
        alone, _ = sample_next(logits[1:2], temperature[1:2], top_p[1:2], [torch.Generator().manual_seed(seed)])
        assert int(alone[0]) == int(chosen[1])
    assert draws[0] == {0}  # p(token 0) = 0.61 > top_p: the nucleus is one token
    assert draws[1] == {0, 1, 2, 3}
    assert draws[2] == {0}  # greedy


def test_spec_options_dtype_and_batch_size(tiny_model_dir):
    agent = agents.from_spec(f"hf:{tiny_model_dir}?dtype=bfloat16&batch_size=3&name=tiny-bf16")
    assert isinstance(agent, HFAgent)
    assert next(agent.model.parameters()).dtype == torch.bfloat16
    assert (agent.batch_size, agent.name) == (3, "tiny-bf16")
    gen = agent.generate(requests(0.0, max_new=4)[:2])
    assert all(len(g.token_ids) == 4 for g in gen)
    with pytest.raises(ValueError, match="unknown dtype 'bf17'"):
        agents.from_spec(f"hf:{tiny_model_dir}?dtype=bf17")
    with pytest.raises(ValueError, match="unknown hf spec option 'batchsize'"):
        agents.from_spec(f"hf:{tiny_model_dir}?batchsize=3")


def test_answers_stop_at_the_context_end_and_too_long_prompts_raise(agent):
    context = agent.context_length
    assert context == 512
    long_question = "7" * (context - 10)  # the chat template adds <user> and <assistant>
    prompt_len = len(agent.encode_prompt([{"role": "user", "content": long_question}]))
    saved = agent.eos_ids
    agent.eos_ids = set()
    try:
        gen = agent.generate([Request([{"role": "user", "content": long_question}], SamplingParams(max_new_tokens=50))])[0]
    finally:
        agent.eos_ids = saved
    assert len(gen.token_ids) == context - prompt_len and gen.finish_reason == "length"
    too_long = Request([{"role": "user", "content": "7" * context}], metadata={"example": Example("ex-9", "q", "1")})
    with pytest.raises(ValueError, match="prompt of example 'ex-9' has 514 tokens, but the model's context holds 512"):
        agent.generate([too_long])
