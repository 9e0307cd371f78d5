"""agents.kv_cache: HFAgent's in-place KV cache against transformers' own dynamic cache.

The contract (#17): the cache written in place gives the same tokens and the same log-probs,
bit for bit, as the concatenating cache, for greedy and seeded sampled decoding, with rows
dropped as they finish, across architectures (absolute positions, rotary + grouped-query
attention, sliding-window layers), and when answers outgrow the first allocation.
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


def test_growing_layer_refuses_to_write_past_its_capacity():
    layer = GrowingLayer(capacity=4)
    layer.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    with pytest.raises(RuntimeError, match="5 positions exceed the capacity of 4"):
        layer.update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        GrowingLayer(capacity=0)
