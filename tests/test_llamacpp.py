"""The ``llamacpp:`` backend (agents.llamacpp) on the real llama-cpp-python and the real SmolLM2 GGUF.

Checked against llama.cpp's own code paths, in separate ``llama_cpp.Llama`` instances: greedy tokens
equal ``Llama.generate(temp=0)``, greedy text and log-probs equal ``create_completion(logprobs=...)``,
sampled log-probs equal log-softmax of the logits llama.cpp returns when the same tokens are fed one
at a time; prompts equal HFAgent's token for token; reusing the KV cache of a shared prefix changes
nothing (bit for bit); seeds, stop strings and the context end behave as in HFAgent.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import torch

import agents
import crl_envs
from agents import Request, SamplingParams
from agents.base import cut_at_stop, encode_prompt_text, render_chat
from agents.llamacpp import common_prefix, reusable_prefix
from agents.pretrained import GEMMA3, SMOLLM2

LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not LLAMA_CPP, reason="llama-cpp-python is not installed: "
                                 "CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" pip install 'crl-envs[llamacpp]'")

QUESTIONS = [
    "What is 2 + 2?",
    "Write a haiku about the sea.",
    "What is 47 + 85? Answer with a number.",
    "Q: " + "Tom has 5 apples and buys 7 more; then he gives 4 away to his friend Ann, who already had 2. " * 3
    + "How many apples does Tom have?",
]
#: log-prob agreement with llama.cpp's own numbers from the same logits: float32 log-softmax in numpy
#: (llama-cpp-python) vs torch (ours) differed by at most 3e-5 nats on these prompts
LOGPROB_TOL = 1e-4


def chat(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


@pytest.fixture(scope="module")
def gguf():
    if not LLAMA_CPP:
        pytest.skip("llama-cpp-python is not installed")
    try:
        return agents.pretrained.smollm2_gguf()
    except ImportError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol(gguf):
    (agent,) = agents.pretrained.load([SMOLLM2], backend="llamacpp")
    yield agent
    agent.close()


@pytest.fixture(scope="module")
def reference(gguf):
    """An independent llama.cpp instance that keeps every position's logits (for log-probs)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2048, logits_all=True, verbose=False)
    yield llm
    llm.close()


def fed_one_at_a_time(llm, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """llama.cpp's logits before each of ``tokens``: the prompt evaluated at once, then one token a step."""
    llm.reset()
    llm.eval(prompt)
    for t in tokens[:-1]:
        llm.eval([t])
    return torch.from_numpy(np.array(llm.scores[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]))


# ---------------------------------------------------------------- pure helpers (no llama.cpp needed)
def test_only_whole_chunks_of_the_shared_prefix_are_reused():
    previous = list(range(100))
    cached = previous[: 100 // 32 * 32]  # what the agent keeps: the previous prompt's whole chunks
    assert reusable_prefix(cached, previous[:70] + [-1] * 50, 32) == 64
    assert reusable_prefix(cached, previous + [1, 2], 32) == 96  # not the partial last chunk
    assert reusable_prefix(cached, previous[:96], 32) == 64  # leaves a token to evaluate
    assert reusable_prefix(cached, previous[:31] + [7] * 40, 32) == 0
    assert reusable_prefix([], previous, 32) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_a_missing_llama_cpp_names_the_install_command(monkeypatch):
    from agents.llamacpp import require_llama_cpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError, match=r"crl-envs\[llamacpp\]"):
        require_llama_cpp()


def test_bad_paths_fail_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not end in .gguf"):
        agents.from_spec(f"llamacpp:{tmp_path / 'model.bin'}")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        agents.from_spec(f"llamacpp:{tmp_path / 'missing.gguf'}")
    with pytest.raises(ValueError, match="unknown llamacpp spec option 'n_thread'"):
        agents.from_spec(f"llamacpp:{tmp_path / 'missing.gguf'}?n_thread=2")
    with pytest.raises(ValueError, match="n_ctx=.* expected int"):
        agents.from_spec(f"llamacpp:{tmp_path / 'missing.gguf'}?n_ctx=big")
    with pytest.raises(ValueError, match=r"\['dtype'\] .* not options of backend=llamacpp"):
        agents.from_spec("pretrained:smollm2-135m-instruct?backend=llamacpp&dtype=bfloat16")
    with pytest.raises(ValueError, match="unknown pretrained backend 'onnx'"):
        agents.from_spec("pretrained:smollm2-135m-instruct?backend=onnx")
    with pytest.raises(ValueError, match="unknown pretrained backend"):
        agents.pretrained.load(backend="llama")


# ---------------------------------------------------------------- against llama.cpp itself
@needs_llama
@pytest.mark.slow
def test_greedy_equals_llama_cpp_and_logprobs_equal_create_completion(smol, reference):
    gens = smol.generate([Request(chat(q), SamplingParams(max_new_tokens=24)) for q in QUESTIONS])
    assert len({g.prompt_tokens for g in gens}) >= 3
    for g in gens:
        reference.reset()
        expected = []
        for t in reference.generate(g.prompt_token_ids, temp=0.0, repeat_penalty=1.0):
            if t in smol.eos_ids or len(expected) == 24:
                break
            expected.append(t)
        assert g.token_ids == expected
        assert g.finish_reason == ("length" if len(expected) == 24 else "stop")
        assert (g.prompt_tokens, g.completion_tokens, g.text) == (
            len(g.prompt_token_ids), len(g.token_ids), smol.decode_text(g.token_ids))
        assert g.seconds > 0
        reference.reset()
        out = reference.create_completion(prompt=g.prompt_token_ids, temperature=0.0, max_tokens=24, logprobs=1,
                                          repeat_penalty=1.0)["choices"][0]
        assert out["text"] == reference.detokenize(g.token_ids).decode()
        assert g.logprobs == pytest.approx(out["logprobs"]["token_logprobs"][: len(g.token_ids)], abs=LOGPROB_TOL)


@needs_llama
def test_sampled_logprobs_are_under_the_tempered_distribution_and_inside_the_nucleus(smol, reference):
    temperature, top_p = 0.7, 0.9
    reqs = [Request(chat(q), SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=i))
            for i, q in enumerate(QUESTIONS[:3])]
    for g in smol.generate(reqs):
        logp = torch.log_softmax(fed_one_at_a_time(reference, g.prompt_token_ids, g.token_ids) / temperature, -1)
        expected = logp.gather(-1, torch.tensor(g.token_ids)[:, None]).squeeze(-1)
        assert g.logprobs == pytest.approx(expected.tolist(), abs=LOGPROB_TOL)
        for row, token in zip(logp.exp(), g.token_ids):  # the token is among the top-p most likely
            assert float(row[row > row[token]].sum()) < top_p


@needs_llama
@pytest.mark.slow
def test_seeded_samples_are_reproducible_and_independent_of_the_other_requests(smol):
    reqs = [Request(chat(q), SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed))
            for q, seed in zip(QUESTIONS + QUESTIONS[:2], [3, 4, 5, 6, 7, 8])]
    together = smol.generate(reqs)
    reversed_ = smol.generate(reqs[::-1])[::-1]
    alone = [smol.generate([r])[0] for r in reqs]
    for a, b, c in zip(together, reversed_, alone):
        assert a.token_ids == b.token_ids == c.token_ids and a.logprobs == b.logprobs == c.logprobs
    assert together[0].token_ids != together[4].token_ids  # same prompt, other seed
    greedy = smol.generate([Request(chat(QUESTIONS[2]), SamplingParams(max_new_tokens=12))])[0]
    narrow = smol.generate([Request(chat(QUESTIONS[2]), SamplingParams(temperature=1.0, top_p=1e-6,
                                                                       max_new_tokens=12, seed=9))])[0]
    assert narrow.token_ids == greedy.token_ids  # a nucleus of one token is the argmax


@needs_llama
def test_a_stop_string_cuts_text_ids_and_logprobs_at_a_token_boundary(smol):
    question = chat("Write two sentences about the moon.")
    full = smol.generate([Request(question, SamplingParams(max_new_tokens=32))])[0]
    pieces = [smol.decode_text(full.token_ids[: k + 1]) for k in range(len(full.token_ids))]
    k = next(k for k in range(3, len(pieces)) if len(pieces[k]) - len(pieces[k - 1]) >= 3
             and full.text.find(pieces[k][len(pieces[k - 1]) + 1:]) == len(pieces[k - 1]) + 1)
    inside = pieces[k][len(pieces[k - 1]) + 1:]  # begins inside token k
    at_start = pieces[k][len(pieces[k - 1]):]  # begins where token k begins
    for stop in (inside, at_start):
        cut = smol.generate([Request(question, SamplingParams(max_new_tokens=32, stop=[stop]))])[0]
        kept, text = cut_at_stop(smol.decode_text, full.token_ids, [stop])
        assert kept == k and cut.finish_reason == "stop"
        assert cut.token_ids == full.token_ids[:kept] and cut.logprobs == full.logprobs[:kept]
        assert cut.text == text == pieces[k - 1] and stop not in cut.text


@needs_llama
@pytest.mark.slow
def test_prefix_reuse_gives_the_outputs_of_a_fresh_evaluation(smol):
    system = {"role": "system", "content": "You are debating. " + "Think carefully and check every step. " * 6}
    question = "What is 17 * 3 + 4? Peers said: "
    first = [Request([system, {"role": "user", "content": question + peers}],
                     SamplingParams(temperature=0.7, max_new_tokens=16, seed=i))
             for i, peers in enumerate(["55.", "55 and 51.", "47, with 17 * 3 = 43.", "55 and 55."])]
    cached_before = smol.reused_prompt_tokens
    reused = smol.generate(first)
    assert smol.reused_prompt_tokens - cached_before >= 3 * 64  # the shared system prompt came from the cache
    # the next turn's prompt extends the previous prompt *and its answer*; the answer's positions were
    # decoded one token at a time, so they must not be reused
    follow = Request(first[3].messages + [{"role": "assistant", "content": reused[3].text},
                                          {"role": "user", "content": "Are you sure?"}],
                     SamplingParams(temperature=0.7, max_new_tokens=16, seed=9))
    reused += smol.generate([first[3]]) + smol.generate([follow])
    smol.prefix_cache = False
    try:
        cached_before = smol.reused_prompt_tokens
        fresh = smol.generate(first) + smol.generate([first[3]]) + smol.generate([follow])
        assert smol.reused_prompt_tokens == cached_before
    finally:
        smol.prefix_cache = True
    for a, b in zip(reused, fresh):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@needs_llama
@pytest.mark.slow
def test_the_context_end_finishes_with_length(gguf, smol):
    agent = agents.from_spec(f"llamacpp:{gguf}?n_ctx=256&n_threads=1&name=short")
    try:
        assert (agent.name, agent.n_threads, agent.context_length) == ("short", 1, 256)
        assert agent.spec == f"llamacpp:{gguf}?n_ctx=256&n_threads=1&name=short"
        def story(k: int) -> list[dict]:
            return [{"role": "system", "content": "The sky is blue today. " * k},
                    {"role": "user", "content": "Write a long story about a dragon who learns to fly."}]

        k = next(k for k in range(1, 100) if 256 - len(agent.encode_prompt(story(k + 1))) < 2)
        prompt = story(k)
        room = 256 - len(agent.encode_prompt(prompt))
        assert 2 <= room <= 12
        assert smol.generate([Request(prompt, SamplingParams(max_new_tokens=50))])[0].completion_tokens > room
        g = agent.generate([Request(prompt, SamplingParams(max_new_tokens=50))])[0]
        assert g.finish_reason == "length" and g.completion_tokens == room and len(g.logprobs) == room
        with pytest.raises(ValueError, match=r"has \d+ tokens, but the context holds 256; .*n_ctx"):
            agent.generate([Request(story(2 * k), SamplingParams(max_new_tokens=4))])
    finally:
        agent.close()


@needs_llama
def test_a_tokenizer_that_does_not_match_the_gguf_is_refused(gguf, tiny_model_dir):
    from transformers import AutoTokenizer

    from agents.llamacpp import LlamaCppAgent

    with pytest.raises(ValueError, match="the tokenizer does not match SmolLM2-135M-Instruct.Q4_1.gguf's vocabulary"):
        LlamaCppAgent(gguf, tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir))


@needs_llama
def test_fingerprint_follows_the_file_and_name_not_threads(smol, gguf):
    from agents.llamacpp import LlamaCppAgent

    # the context length counts (an answer that reaches it is cut): tests/test_hostile4_fingerprints.py
    other = LlamaCppAgent(gguf, name=SMOLLM2, n_ctx=smol.context_length, n_threads=1, tokenizer=smol.tokenizer)
    renamed = LlamaCppAgent(gguf, name="other", tokenizer=smol.tokenizer)
    try:
        assert other.fingerprint == smol.fingerprint != renamed.fingerprint
        assert smol.sha256 == agents.gguf.sha256_file(gguf)
        assert smol.fingerprint != agents.pool("zoo")["model_0"].fingerprint
    finally:
        other.close()
        renamed.close()


@needs_llama
@pytest.mark.slow
def test_prompt_ids_equal_hfagents(smol):
    (hf,) = agents.pretrained.load([SMOLLM2], num_threads=1)
    chats = [chat(q) for q in QUESTIONS] + [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Ünïcödé, 日本語 🙂?"}]]
    gens = smol.generate([Request(c, SamplingParams(max_new_tokens=1)) for c in chats])
    assert [g.prompt_token_ids for g in gens] == [hf.encode_prompt(c) for c in chats]
    assert smol.eos_ids >= hf.eos_ids


@needs_llama
@pytest.mark.slow
def test_a_vote_of_llamacpp_agents_plays_end_to_end(gguf):
    pool = agents.pool([f"llamacpp:{gguf}?name=voter-{i}&n_threads=1" for i in range(3)])
    task = crl_envs.tasks.load("arith", n=3, seed=0)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=32)
    run = dict(sampling=sampling, seed=0, progress=False, record=pool.ids)
    episodes = crl_envs.run_episodes("vote", pool, task, **run)
    one_by_one = crl_envs.run_episodes("vote", pool, task, batch_size=1, **run)
    assert len(episodes) == 3
    for e, f in zip(episodes, one_by_one):
        assert [t.text for t in e.transcript] == [t.text for t in f.transcript] and e.score == f.score
        assert 0.0 <= e.score <= 1.0 and len(e.transcript) == 3
        for turn in e.transcript:
            agent = pool[turn.agent]
            assert turn.prompt_token_ids == agent.encode_prompt(turn.messages)
            assert agent.decode_text(turn.token_ids) == turn.text and len(turn.logprobs) == len(turn.token_ids)
            assert all(lp <= 0 for lp in turn.logprobs)
    assert len({tuple(t.token_ids) for e in episodes for t in e.transcript}) > 1
    for agent in pool.values():
        agent.close()


@needs_llama
@pytest.mark.slow
def test_gemma3_runs_through_llama_cpp():
    """gemma-3-270m (gemma3 architecture, sliding-window attention, no chat template, BOS added)."""
    import llama_cpp

    try:
        (gemma,) = agents.pretrained.load([GEMMA3], backend="llamacpp")
    except ImportError as e:
        pytest.skip(str(e))
    try:
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(agents.pretrained.model_dir(GEMMA3))
        base = "Question: a shop sells pens at 3 dollars each. " * 8
        reqs = [Request(chat(base + q), SamplingParams(temperature=0.8, max_new_tokens=12, seed=i))
                for i, q in enumerate(["How much are 4 pens?", "How much are 7 pens?"])]
        cached = gemma.generate(reqs)
        assert gemma.reused_prompt_tokens >= 64
        for r, g in zip(reqs, cached):
            assert g.prompt_token_ids == encode_prompt_text(hf_tokenizer, render_chat(hf_tokenizer, r.messages))
            assert g.prompt_token_ids[0] == hf_tokenizer.bos_token_id
            assert "\nUser:" not in g.text  # plain chat format: the next turn marker stops it
        gemma.prefix_cache = False
        assert [g.token_ids for g in gemma.generate(reqs)] == [g.token_ids for g in cached]
        greedy = gemma.generate([Request(chat("What is 2 + 2?"), SamplingParams(max_new_tokens=8))])[0]
        llm = llama_cpp.Llama(model_path=str(gemma.path), n_ctx=512, verbose=False)
        try:
            expected = []
            for t in llm.generate(greedy.prompt_token_ids, temp=0.0, repeat_penalty=1.0):
                if t in gemma.eos_ids or len(expected) == len(greedy.token_ids):
                    break
                expected.append(t)
        finally:
            llm.close()
        assert greedy.token_ids == expected
    finally:
        gemma.close()


@needs_llama
@pytest.mark.slow
def test_a_bare_gguf_gets_its_tokenizer_from_the_file_once(gguf, smol, tmp_path, monkeypatch):
    """Without an HFAgent conversion in the cache, the tokenizer is built from the GGUF and saved."""
    from agents.gguf import gguf_tokenizer

    monkeypatch.setenv("CRL_ENVS_CACHE", str(tmp_path))
    built = gguf_tokenizer(gguf, smol.sha256)
    saved = list((tmp_path / "gguf").glob(f"{smol.sha256}-tokenizer-transformers-*"))
    assert len(saved) == 1 and (saved[0] / "tokenizer_config.json").exists()
    again = gguf_tokenizer(gguf, smol.sha256)
    messages = [{"role": "user", "content": "Ünïcödé, 日本語 🙂 and 12 + 35?"}]
    for tok in (built, again):
        assert encode_prompt_text(tok, render_chat(tok, messages)) == smol.encode_prompt(messages)
    agent = agents.from_spec(f"llamacpp:{gguf}?n_threads=1")
    try:
        assert agent.name == gguf.stem and agent.encode_prompt(messages) == smol.encode_prompt(messages)
    finally:
        agent.close()
