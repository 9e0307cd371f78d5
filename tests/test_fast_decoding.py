"""HFAgent's fast decoding paths (#17) against the slow ones they replace, bit for bit.

- agents.kv_cache: the cache written in place gives the same tokens and log-probs as
  transformers' concatenating cache, greedy and seeded sampled, with rows dropped as they
  finish, across architectures (absolute positions, rotary + grouped-query attention,
  sliding-window layers), and when answers outgrow the first allocation;
- prompt forwards on more threads give the same outputs;
- agents.sampling.nucleus_draw gives the tokens of the full-sort draw without sorting the vocabulary.
"""

from __future__ import annotations

import pytest
import torch

from agents import HFAgent, Request, SamplingParams
from agents.kv_cache import INITIAL_ROOM, GrowingLayer, growing_cache
from agents.tiny import char_tokenizer


def _model(kind: str, seed: int = 0):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    tok = char_tokenizer()
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_positions=512, n_embd=64, n_layer=2, n_head=2, **common))
    elif kind == "llama-gqa":
        model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=512, **common))
    else:  # gemma3: sliding-window layers every other layer; window 24 is shorter than the answers below
        model = Gemma3ForCausalLM(Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                                   sliding_window=int(kind.split("-")[1]),
                                                   layer_types=["sliding_attention", "full_attention"],
                                                   max_position_embeddings=512, **common))
    return HFAgent(model.eval(), tokenizer=tok, name=kind, num_threads=1)


QUESTIONS = ["What is 3 + 4?", "Add 17 and 25, then say the sum twice.", "Hi", "Count from one to five, please.",
             "x" * 40, "What is 12 * 12? Explain."]


def _requests(temperature: float, lengths=(5, 90, 12, 90, 40, 3)) -> list[Request]:
    return [Request([{"role": "user", "content": q}],
                    SamplingParams(temperature=temperature, max_new_tokens=n, seed=i, top_p=0.9 if i % 2 else 1.0))
            for i, (q, n) in enumerate(zip(QUESTIONS, lengths))]


def _both(agent: HFAgent, requests: list[Request]):
    agent.eos_ids = set()  # a random model ends at random; fixed lengths make every row run its course
    runs = []
    for growing in (False, True):
        agent.growing_cache = growing
        runs.append(agent.generate(requests))
    return runs


@pytest.mark.parametrize("kind", ["gpt2", "llama-gqa", "gemma3-24", "gemma3-512"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_in_place_cache_is_bit_identical_to_the_dynamic_cache(kind, temperature):
    dynamic, growing = _both(_model(kind), _requests(temperature))
    for a, b in zip(dynamic, growing):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs  # exact floats, not approximately
        assert a.finish_reason == b.finish_reason
    # rows of different lengths finished at different steps (so rows were dropped), and the
    # 90-token answers outgrew the first allocation of INITIAL_ROOM new positions
    assert sorted(len(g.token_ids) for g in growing) == [3, 5, 12, 40, 90, 90] and 90 > INITIAL_ROOM


def test_the_cache_layers_chosen_per_architecture():
    from transformers.cache_utils import DynamicSlidingWindowLayer

    short = growing_cache(_model("gemma3-24").model, capacity=100)
    assert isinstance(short.layers[0], DynamicSlidingWindowLayer)  # the window cuts: transformers' own layer
    assert isinstance(short.layers[1], GrowingLayer) and not short.layers[1].is_sliding
    wide = growing_cache(_model("gemma3-512").model, capacity=100)
    assert [type(x) for x in wide.layers] == [GrowingLayer, GrowingLayer]
    assert wide.is_sliding == [True, False]  # the masks still follow the model's layer types
    remote = type("RemoteCodeModel", (type(_model("gpt2").model),), {})  # a class defined outside transformers
    assert growing_cache(remote(_model("gpt2").model.config), capacity=100) is None


def test_growing_layer_keeps_what_was_written_through_growth_and_row_drops():
    layer = GrowingLayer(capacity=3 + 2 * INITIAL_ROOM)
    torch.manual_seed(0)
    steps = [torch.randn(4, 2, 3, 8)] + [torch.randn(4, 2, 1, 8) for _ in range(INITIAL_ROOM + 5)]
    for i, step in enumerate(steps):
        keys, values = layer.update(step, -step)
        expected = torch.cat(steps[: i + 1], dim=-2)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
    assert layer.get_seq_length() == 3 + INITIAL_ROOM + 5 and layer.get_mask_sizes(1) == (layer.length + 1, 0)
    layer.batch_select_indices(torch.tensor([0, 2]))
    assert torch.equal(layer.keys, torch.cat(steps, dim=-2)[[0, 2]])
    after = torch.randn(2, 2, 1, 8)
    keys, _ = layer.update(after, after)
    assert torch.equal(keys[:, :, -1:], after) and keys.shape[-2] == layer.length


def test_growing_layer_offloads_and_prefetches_its_buffers():
    layer = GrowingLayer(capacity=8)
    step = torch.randn(2, 1, 3, 4)
    layer.update(step, -step)
    layer.offload()
    assert torch.equal(layer.keys, step) and torch.equal(layer.values, -step)
    layer.device = torch.device("meta")  # pretend the layer lives elsewhere: prefetch moves it there
    layer.prefetch()
    assert layer.keys.device.type == "meta" and layer.keys.shape == (2, 1, 3, 4) and layer._k.device.type == "meta"


def test_growing_layer_refuses_to_write_past_its_capacity():
    layer = GrowingLayer(capacity=4)
    layer.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    with pytest.raises(RuntimeError, match="5 positions exceed the capacity of 4"):
        layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        GrowingLayer(capacity=0)


def test_prompt_forward_threads_do_not_change_outputs(tmp_path):
    """Small models decode on one thread but prefill big prompt batches on torch's threads:
    the same tokens and log-probs, bit for bit, either way."""
    from agents.hf import PARALLEL_PREFILL_TOKENS
    from agents.tiny import tiny_gpt2

    agent = HFAgent(tiny_gpt2(tmp_path / "m", seed=3, n_layer=2, n_embd=64, n_head=2))
    assert agent.num_threads == 1 and agent.prefill_threads is None  # chosen automatically
    requests = [Request([{"role": "user", "content": f"{q} {'ab' * (i % 7)}" * 2}],
                        SamplingParams(temperature=1.0, max_new_tokens=8, seed=i))
                for i, q in enumerate(QUESTIONS * 11)]
    assert len(requests) * 60 >= PARALLEL_PREFILL_TOKENS  # the prompt batch is large enough to go parallel
    runs = []
    with torch.no_grad():
        for threads in (1, 2):
            agent.prefill_threads = threads
            runs.append([(g.token_ids, g.logprobs) for g in agent.generate(requests)])
    assert runs[0] == runs[1]
    assert HFAgent(tiny_gpt2(tmp_path / "n", seed=3), num_threads=2).prefill_threads == 2  # explicit: kept


def _draw_cases():
    """Rows of probabilities over a 49k vocabulary: peaked and flat, ties inside and at the edge of
    the window, mass spread past the window, with uniforms from 0 to 1."""
    from agents.sampling import DRAW_WINDOWS

    window = DRAW_WINDOWS[0]

    g = torch.Generator().manual_seed(0)
    vocab = 49152
    rows = []
    for scale in (0.5, 2.0, 4.0, 8.0, 16.0):  # softmax of N(0, scale²) logits: flat to peaked
        rows.append(torch.softmax(torch.randn(12, vocab, generator=g) * scale, -1))
    tied = torch.softmax(torch.randn(8, vocab, generator=g) * 4, -1)
    top = tied.topk(window + 1, dim=-1).indices
    tied.scatter_(1, top[:, window - 1 : window + 1], tied.gather(1, top[:, window - 1 : window]).expand(-1, 2))
    tied.scatter_(1, top[:, 3:6], tied.gather(1, top[:, 3:4]).expand(-1, 3))  # ties inside the window
    rows.append(tied)
    probs = torch.cat(rows)
    return probs, g


@pytest.mark.parametrize("top_p", [1.0, 0.99, 0.9, 0.5, 0.05])
def test_nucleus_draw_equals_the_full_sort(top_p, monkeypatch):
    import agents.sampling as hf

    probs, g = _draw_cases()
    tops = torch.full((probs.shape[0],), top_p)
    uniforms = [torch.rand(probs.shape[0], generator=g) for _ in range(6)]
    uniforms += [torch.full((probs.shape[0],), u) for u in (0.0, 1e-9, 0.5, 1 - 1e-7, 0.99999994)]
    expected = [hf.sorted_nucleus_draw(probs, tops, u) for u in uniforms]
    sorted_rows, reference = [], hf.sorted_nucleus_draw

    def counting(p, t, u):
        sorted_rows.append(len(p))
        return reference(p, t, u)

    monkeypatch.setattr(hf, "sorted_nucleus_draw", counting)
    for u, want in zip(uniforms, expected):
        assert torch.equal(hf.nucleus_draw(probs, tops, u), want)
    # the windows decided the rest: per draw (68 rows), the 12 nearly uniform rows (scale 0.5, whose top
    # 4096 tokens hold a tenth of the mass) and a few scale-2 rows were sorted in full
    assert sum(sorted_rows) <= len(uniforms) * 18, sorted_rows


def test_nucleus_draw_window_sums_are_the_full_sorts_prefix():
    """What the exactness rests on: the window's cumulative sums are the full sort's, bit for bit."""
    from agents.sampling import DRAW_WINDOWS

    window = DRAW_WINDOWS[0]

    probs, _ = _draw_cases()
    full = probs.sort(dim=-1, descending=True, stable=True).values.cumsum(-1)[:, :window]
    window = probs.topk(window, dim=-1).values.cumsum(-1)
    assert torch.equal(full[:-8], window[:-8])  # (the tied rows' window order differs only among equals)


def test_sampled_decoding_of_a_real_vocabulary_is_unchanged_by_the_window(monkeypatch):
    """A model with a 50k vocabulary: seeded sampled answers equal those drawn with a full sort."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import agents.sampling as hf
    from agents.tiny import char_tokenizer

    tok = char_tokenizer()
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50_000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # peaked enough that nuclei end inside and outside the window
    agent = HFAgent(model.eval(), tokenizer=tok, num_threads=1)
    agent.eos_ids = set()
    requests = [Request([{"role": "user", "content": q}], SamplingParams(temperature=t, top_p=p, max_new_tokens=12, seed=i))
                for i, (q, t, p) in enumerate(zip(QUESTIONS * 3, [0.7, 1.0, 1.3] * 6, [1.0, 0.9, 0.95] * 6))]
    fast = [(g.token_ids, g.logprobs) for g in agent.generate(requests)]
    monkeypatch.setattr(hf, "nucleus_draw", hf.sorted_nucleus_draw)
    assert fast == [(g.token_ids, g.logprobs) for g in agent.generate(requests)]
