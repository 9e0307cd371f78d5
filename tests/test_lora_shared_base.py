"""Several learners as LoRA adapters on one shared base (``CRLConfig(lora_shared_base=True)``): the same numbers
as one model per learner, adapters that never touch each other, per-adapter checkpoints, errors before loading.
Zoo pool of three: zoo-nocarry and two zoo-rookies (copies of one base)."""

from __future__ import annotations

import sys

import pytest
import torch

import agents
import agents.zoo
from agents.hf import LoraAdapterAgent, active_adapter
from crl_envs import tasks
from trainers import CRLConfig, CRLTrainer, LOORewardConfig, LOORewardTrainer, LoraSettings
from trainers.rollout import learner_sequences, token_logprobs

FAST = dict(steps=2, questions_per_step=2, num_generations=4, max_new_tokens=24, learning_rate=1e-2, progress=False,
            seed=1, lora=LoraSettings(r=2, alpha=4))
ROOKIES = ["model_1", "model_2"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster on a busy CPU
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pool():
    return agents.pool(["zoo:zoo-nocarry", "zoo:zoo-rookie", "zoo:zoo-rookie"])


@pytest.fixture(scope="module")
def train():
    return tasks.load("arith", split="train", n=40, **agents.zoo.TASK_OPTIONS)


def _logprobs(trainer, learner, sequences):
    """``learner``'s teacher-forced log-probs of ``sequences`` (its adapter active on the shared base)."""
    policy = trainer.policies[learner]
    with torch.no_grad(), active_adapter(policy.model, policy.adapter):
        lp, _ = token_logprobs(policy.model, [s.prompt_ids for s in sequences], [s.completion_ids for s in sequences],
                               temperature=1.0, pad_id=policy.tokenizer.pad_token_id)
    return lp


@pytest.mark.parametrize("kind", ["crl", "loo"])
def test_shared_base_gives_the_numbers_of_one_model_per_learner(pool, train, kind, tmp_path):
    """Same LoRA init (each adapter is added in learner order and draws what its own model's would), same
    rollouts, same losses: equal to the last bit on CPU (a forward with one adapter active runs the same ops
    as the model with only that adapter); the test allows 1e-6."""
    trainer_class, config_class = {"crl": (CRLTrainer, CRLConfig), "loo": (LOORewardTrainer, LOORewardConfig)}[kind]
    runs = {}
    for shared in (False, True):
        cfg = config_class(**FAST, beta=0.05, lora_shared_base=shared, output_dir=str(tmp_path / str(shared)),
                           save_steps=1)
        trainer = trainer_class("vote", pool, train, learners=ROOKIES, config=cfg)
        init = {j: trainer.trainable_state(j) for j in ROOKIES}
        history = trainer.fit()
        runs[shared] = (trainer, init, history, {j: trainer.trainable_state(j) for j in ROOKIES})
    (separate, init_a, hist_a, final_a), (shared, init_b, hist_b, final_b) = runs[False], runs[True]
    assert any(h[f"grad_norm/{j}"] > 0 for h in hist_a for j in ROOKIES)  # something was learned
    assert shared.policies["model_1"].model is shared.policies["model_2"].model  # one base
    assert separate.policies["model_1"].model is not separate.policies["model_2"].model
    for j in ROOKIES:
        assert len(init_b[j]) == len(init_a[j]) and all(f".{j}." in n for n in init_b[j])  # its own adapter only
        assert all(torch.equal(a, b) for a, b in zip(init_a[j].values(), init_b[j].values()))
        for key in ("loss", "grad_norm", "kl", "learner_tokens", "reward_mean"):
            assert [h[f"{key}/{j}"] for h in hist_b] == pytest.approx([h[f"{key}/{j}"] for h in hist_a], abs=1e-6)
        assert max(float((a - b).abs().max()) for a, b in zip(final_a[j].values(), final_b[j].values())) < 1e-6
    assert shared.rollouts == separate.rollouts
    saved = torch.load(tmp_path / "True" / "checkpoint-000002" / "model_2" / "trainable.pt")
    assert saved.keys() == final_b["model_2"].keys()
    resumed = trainer_class("vote", pool, train, learners=ROOKIES, config=shared.config)
    assert resumed.load_checkpoint(tmp_path / "True" / "checkpoint-000002") and resumed.step == 2
    for j in ROOKIES:  # each adapter back from its own file, into the one shared model
        assert all(torch.equal(w, final_b[j][n]) for n, w in resumed.trainable_state(j).items())


def test_updating_one_adapter_leaves_the_other_and_the_base_exactly(pool, train):
    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST, lora_shared_base=True))
    episodes = trainer.play(trainer.questions_for(0), trainer.rollout_seed(0))
    own = {j: learner_sequences(episodes, j, [1.0] * len(episodes)) for j in ROOKIES}
    probe = own["model_2"]
    before = {j: _logprobs(trainer, j, probe) for j in ROOKIES}
    assert torch.equal(before["model_1"], before["model_2"])  # LoRA B starts at 0: both are the base
    model = trainer.policies["model_1"].model
    with torch.no_grad(), model.disable_adapter():
        base_before, _ = token_logprobs(model, [s.prompt_ids for s in probe], [s.completion_ids for s in probe],
                                       temperature=1.0, pad_id=trainer.policies["model_1"].tokenizer.pad_token_id)
    b_weights = trainer.trainable_state("model_2")
    stats = trainer.optimise(own["model_1"], "model_1")  # advantage +1 on every model_1 turn
    assert stats["grad_norm"] > 0
    after = {j: _logprobs(trainer, j, probe) for j in ROOKIES}
    assert torch.equal(after["model_2"], before["model_2"])  # exact: model_2's adapter and the base untouched
    assert all(torch.equal(w, trainer.trainable_state("model_2")[n]) for n, w in b_weights.items())
    assert float((after["model_1"] - before["model_1"]).abs().max()) > 1e-3  # model_1 moved
    with torch.no_grad(), model.disable_adapter():
        base_after, _ = token_logprobs(model, [s.prompt_ids for s in probe], [s.completion_ids for s in probe],
                                       temperature=1.0, pad_id=trainer.policies["model_1"].tokenizer.pad_token_id)
    assert torch.equal(base_after, base_before)
    assert model.active_adapter == "model_1"  # optimise restored the adapter that was active
    # the two agents now answer differently on the same prompts (each generates with its own adapter)
    from agents import Request, SamplingParams

    requests = [Request([{"role": "user", "content": f"What is {a} + {b}?"}], SamplingParams(temperature=1.0, seed=s,
                                                                                          max_new_tokens=12))
                for s, (a, b) in enumerate([(12, 9), (35, 47), (3, 8), (60, 25)])]
    lp = {j: [g.logprobs for g in trainer.policies[j].generate(requests)] for j in ROOKIES}
    assert lp["model_1"] != lp["model_2"]


def test_save_model_writes_each_adapter_alone_and_it_reloads_exactly(pool, train, tmp_path):
    from peft import PeftModel

    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST, lora_shared_base=True))
    episodes = trainer.play(trainer.questions_for(0), trainer.rollout_seed(0))
    sequences = learner_sequences(episodes, "model_1", [1.0] * len(episodes))
    trainer.optimise(sequences, "model_1")
    trainer.save_model(tmp_path)
    for j in ROOKIES:
        assert sorted(p.name for p in (tmp_path / j).glob("adapter_*")) == ["adapter_config.json",
                                                                            "adapter_model.safetensors"]
    reloaded = PeftModel.from_pretrained(pool["model_1"].model, tmp_path / "model_1").eval()  # a fresh base copy
    with torch.no_grad():
        lp, _ = token_logprobs(reloaded, [s.prompt_ids for s in sequences], [s.completion_ids for s in sequences],
                               temperature=1.0, pad_id=pool["model_1"].tokenizer.pad_token_id)
    assert torch.equal(lp, _logprobs(trainer, "model_1", sequences))
    reloaded.unload()  # the pool's model is left as it was


def test_shared_base_errors_are_one_line_and_come_before_loading(train, monkeypatch):
    with pytest.raises(ValueError, match=r"lora_shared_base=True holds each learner as a LoRA adapter on one base: "
                                         r"also set lora=LoraSettings"):
        CRLConfig(lora_shared_base=True)
    with pytest.raises(TypeError, match="CRLConfig.lora_shared_base must be True or False"):
        CRLConfig(lora=LoraSettings(), lora_shared_base="yes")
    pool_module = sys.modules["agents.pool"]
    real = pool_module.from_spec
    monkeypatch.setattr(pool_module, "from_spec", lambda spec: pytest.fail(f"built {spec} before checking"))
    shared = CRLConfig(**FAST, lora_shared_base=True)
    specs = ["zoo:zoo-rookie", "zoo:zoo-nocarry", "zoo:zoo-noborrow"]
    with pytest.raises(ValueError, match=r"lora_shared_base=True holds the learners as adapters of one base model, but "
                                         r"model_1 is 'zoo:zoo-nocarry' and model_2 is 'zoo:zoo-noborrow': write both"):
        CRLTrainer("vote", specs, train, learners=["model_1", "model_2"], config=shared)
    with pytest.raises(ValueError, match=r"config.lora is set but learner 'model_1' is the openai backend"):
        CRLTrainer("vote", ["zoo:zoo-rookie", "openai:http://127.0.0.1:9/v1#m", "zoo:zoo-rookie"], train,
                   learners=["model_1", "model_2"], config=shared)
    monkeypatch.setattr(pool_module, "from_spec", real)
    built = agents.pool(specs)  # built agents: compared weight by weight
    with pytest.raises(ValueError, match=r"but model_1 is 'zoo-nocarry' and model_2 is 'zoo-noborrow', whose weights "
                                         r"differ \(e\.g\. ") as info:
        CRLTrainer("vote", built, train, learners=["model_1", "model_2"], config=shared)
    assert "\n" not in str(info.value)


def test_rollout_policies_must_serve_adapters_one_agent_each(pool, train):
    shared = CRLConfig(**FAST, lora_shared_base=True)
    with pytest.raises(TypeError, match=r"has no set_lora\(\): with lora_shared_base"):
        CRLTrainer("vote", pool, train, learners=ROOKIES, config=shared,
                   rollout_policy={"model_1": pool["model_1"]})

    def served(name):  # an agent that records the adapter path it is told to serve
        agent = agents.ScriptedAgent.expert(name, 0.5)
        agent.set_lora = lambda path: setattr(agent, "path", path)
        return agent

    one = served("served")
    with pytest.raises(ValueError, match="rollout_policy gives several learners the same agent"):
        CRLTrainer("vote", pool, train, learners=ROOKIES, config=shared, rollout_policy={j: one for j in ROOKIES})
    trainer = CRLTrainer("vote", pool, train, learners=ROOKIES, config=shared,
                         rollout_policy={"model_2": served("served")})
    assert isinstance(trainer.policies["model_2"], LoraAdapterAgent)
    assert trainer.sync_rollout_policy()  # model_2's adapter written for its server, model_1 plays itself
    served = trainer.learner_states["model_2"].rollout_policy.path
    assert sorted(p.name for p in served.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not trainer.sync_rollout_policy()  # unchanged since: nothing written


def test_lora_rank_slot_is_the_smallest_vllm_rank_that_holds_the_adapter():
    from agents.vllm import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="vLLM serves LoRA adapters up to rank 512, got r=600; lower LoraSettings.r"):
        lora_rank_slot(600)


@pytest.mark.slow  # imports vLLM (10 s)
def test_vllm_rollouts_of_gpt2_adapters_are_refused_before_the_engine_loads(pool, train, monkeypatch):
    """The zoo's models are GPT-2, for which vLLM has no LoRA: one line, before any engine is built."""
    pytest.importorskip("vllm")
    import agents.vllm

    monkeypatch.setattr(agents.vllm, "_engine", lambda *a, **kw: pytest.fail("built an engine before checking"))
    with pytest.raises(ValueError, match=r"with LoRA: vLLM [\d.]+ has no LoRA for GPT2LMHeadModel \(its model class "
                                         r"lacks SupportsLoRA") as info:
        CRLTrainer("vote", pool, train, learners=ROOKIES, config=CRLConfig(**FAST, lora_shared_base=True),
                   rollout_policy="vllm")
    assert "\n" not in str(info.value)
