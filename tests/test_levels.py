"""The logit and weight levels (issue #56): logit fusion and contrast, soup, task arithmetic and TIES as
coalition games, checked on planted truth and against independent computations.

- hand-fused logits and hand-merged weights (numpy, written apart from the library) agree with the library's;
- the ensemble's lockstep, KV-cached decode gives the tokens of a hand-written greedy loop without caches, and the
  step-level env (each member's action its logits) gives the seat's answer;
- copies of one model in a fusion or a soup get equal Shapley values; a model whose weights are the base adds
  nothing to task arithmetic or TIES (every marginal contribution is 0, its Shapley value 0);
- exact Shapley from ``valuation.evaluate`` equals an average over all n! orderings computed here;
- one-line errors for another vocabulary, another architecture, members of different bases;
- C-RL's gradient through the learner's share of the fused distribution equals its closed form.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import agents
import crl_envs
from agents.logit import Fusion, LogitEnsemble, next_token_logits
from agents.merge import merged_agent
from crl_envs import protocols, tasks
from crl_envs.protocols.logit_fusion import LogitStepEnv
from crl_envs.valuation import evaluate
from crl_envs.valuation.game import CoalitionGame
from crl_kit.errors import ConfigError

QUESTIONS = 12
SAMPLING = agents.SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def zoo():
    return agents.pool("zoo")


@pytest.fixture(scope="module")
def task():
    return tasks.load("arith", n=QUESTIONS, seed=3, **agents.zoo.TASK_OPTIONS)


def zoo_agent(name: str) -> agents.HFAgent:
    return agents.from_spec(f"zoo:{name}")


# ---------------------------------------------------------------------- logit level
def test_fusion_rules_by_hand():
    z = torch.randn(4, 3, 7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(Fusion("mean")(z), z.sum(0) / 4)
    torch.testing.assert_close(Fusion("mean", weights=(1, 1, 2, 4))(z), (z[0] + z[1] + 2 * z[2] + 4 * z[3]) / 8)
    torch.testing.assert_close(Fusion("contrast", strength=0.5)(z), z[0] + 0.5 * ((z[0] - z[3]) + (z[1] - z[2])))
    torch.testing.assert_close(Fusion("contrast", strength=0.5)(z[:3]), z[0] + 0.5 * (z[0] - z[2]))
    torch.testing.assert_close(Fusion("contrast")(z[:1]), z[0])


def test_ensemble_decode_matches_a_hand_greedy_loop(zoo, task, one_thread):
    """The lockstep KV-cached batch decode against full forwards, the mean of the logits and argmax, by hand."""
    members = [zoo["model_0"], zoo["model_2"], zoo["model_4"]]
    ensemble = LogitEnsemble(members)
    messages = [[{"role": "user", "content": task.prompt(e)}] for e in task.examples[:4]]
    gens = ensemble.generate([agents.Request(m, SAMPLING) for m in messages])
    for m, gen in zip(messages, gens):
        prompt = members[0].encode_prompt(m)
        out: list[int] = []
        for _ in range(SAMPLING.max_new_tokens):
            with torch.no_grad():
                logits = sum(a.model(input_ids=torch.tensor([prompt + out])).logits[0, -1] for a in members) / 3
            token = int(logits.argmax())
            if token in members[0].eos_ids:
                break
            out.append(token)
        assert gen.token_ids == out[: len(gen.token_ids)]
        assert gen.text == members[0].decode_text(gen.token_ids)
        assert gen.completion_tokens == 3 * len(gen.token_ids)
        # its log-probs are the fused distribution's, recomputed by teacher forcing
        fused = ensemble.fused_logits(ensemble.encode(m), gen.token_ids)
        torch.testing.assert_close(torch.log_softmax(fused, -1).gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0],
                                   torch.tensor(gen.logprobs), atol=1e-4, rtol=0)


def test_step_env_gives_the_seat_answer(zoo, task, one_thread):
    """The PettingZoo step form (each member's action its logits) plays the fused game the seat plays."""
    pool = agents.pool([zoo["model_0"], zoo["model_1"]])
    seat = crl_envs.run_episodes(crl_envs.logit_fusion_v0, pool, task, examples=[0, 1, 2],
                                 sampling={"ensemble": SAMPLING}, progress=False)
    for k, episode in enumerate(seat):
        env = LogitStepEnv(pool, task, sampling=SAMPLING)
        obs, infos = env.reset(seed=0, options={"example": k})
        while env.agents:
            actions = {a: next_token_logits(pool[a], infos[a]["token_ids"]).numpy() for a in env.agents}
            obs, rewards, terms, truncs, infos = env.step(actions)
        assert env.outcome.details["text"] == episode.transcript[0].text
        assert env.outcome.score == episode.score
        assert env.action_space("model_0").shape == (pool["model_0"].model.config.vocab_size,)


@pytest.mark.parametrize("form", ["seat", "steps"])
def test_pettingzoo_api(form, zoo, task):
    """PettingZoo's own API and seed tests: the seat form (text actions) and the step form (logit actions)."""
    import warnings

    from pettingzoo.test import parallel_api_test, parallel_seed_test

    pool = agents.pool([zoo["model_0"], zoo["model_1"]])
    if form == "seat":
        def make():
            return crl_envs.soup_v0(pool, task)
    else:
        def make():
            return LogitStepEnv(pool, task, sampling=agents.SamplingParams(temperature=1.0, max_new_tokens=6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parallel_api_test(make(), num_cycles=20)
    parallel_seed_test(make, num_cycles=20)


def test_logit_protocols_are_registered_and_named():
    assert protocols.get("logit-fusion") is crl_envs.logit_fusion_v0 is protocols.get("logit_fusion_v0")
    assert protocols.family("logit_contrast") == "logit" and protocols.family("ties") == "weight"
    assert set(protocols.MODEL_LEVEL_PROTOCOLS) == {"logit_fusion", "logit_contrast", "soup", "task_arithmetic", "ties"}
    assert not set(protocols.MODEL_LEVEL_PROTOCOLS) & set(protocols.PROTOCOLS)


def test_vocabulary_and_logit_errors_are_one_line(zoo, task):
    from transformers import GPT2Config, GPT2LMHeadModel

    from agents.tiny import char_tokenizer

    tok = char_tokenizer("0123456789+- ")
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=16, n_head=2, bos_token_id=1,
                                       eos_token_id=1, pad_token_id=0))
    other = agents.HFAgent(model, tokenizer=tok, name="digits-only")
    for factory in (crl_envs.logit_fusion_v0, crl_envs.logit_contrast_v0):
        with pytest.raises(ConfigError, match=r"needs one vocabulary: 'zoo-nocarry' has \d+ tokens") as e:
            factory([zoo["model_0"], other], task)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="needs members whose next-token logits are readable"):
        crl_envs.logit_fusion_v0([zoo["model_0"], agents.ScriptedAgent.expert("x", 0.5)], task)
    with pytest.raises(ConfigError, match=r"weights name unknown agents \['model_9'\]"):
        crl_envs.logit_fusion_v0([zoo["model_0"]], task, weights={"model_9": 1.0})
    with pytest.raises(ConfigError, match="ranking must list every pool agent id once"):
        crl_envs.logit_contrast_v0([zoo["model_0"], zoo["model_1"]], task, ranking=["model_1"])


def test_contrast_roles_follow_the_declared_ranking(zoo, task):
    env = crl_envs.logit_contrast_v0(agents.pool([zoo["model_0"], zoo["model_1"], zoo["model_2"]]), task,
                                     ranking=["model_2", "model_0", "model_1"], strength=0.3)
    env.reset(options={"coalition": ["model_0", "model_1", "model_2"], "example": 0})
    ensemble = env.agent_for("ensemble")
    assert [m.name for m in ensemble.members] == ["zoo-small", "zoo-nocarry", "zoo-noborrow"]
    assert ensemble.fusion == Fusion("contrast", strength=0.3)
    env.reset(options={"coalition": ["model_1", "model_0"], "example": 0})
    assert [m.name for m in env.agent_for("ensemble").members] == ["zoo-nocarry", "zoo-noborrow"]


# ---------------------------------------------------------------------- weight level
def _np_state(agent):
    return {k: v.detach().numpy().astype(np.float64) for k, v in agent.model.state_dict().items()}


def _np_ties(base, states, density, scale):
    """TIES by hand, entry by entry in numpy (trim per tensor; elect; disjoint mean)."""
    out = {}
    for k, b in base.items():
        taus = []
        for s in states:
            t = (s[k] - b).ravel()
            keep = math.ceil(density * t.size)
            cut = np.sort(np.abs(t))[t.size - keep]
            taus.append(np.where(np.abs(t) >= cut, t, 0.0))
        taus = np.array(taus)
        sign = np.sign(taus.sum(0))
        merged = np.zeros(taus.shape[1])
        for j in range(taus.shape[1]):
            agree = [x for x in taus[:, j] if x != 0 and np.sign(x) == sign[j]]
            merged[j] = sum(agree) / len(agree) if agree else 0.0
        out[k] = b + scale * merged.reshape(b.shape)
    return out


def test_merges_agree_with_hand_merged_weights(zoo):
    a, b, c = zoo["model_0"], zoo["model_1"], zoo["model_2"]
    sa, sb, sc = _np_state(a), _np_state(b), _np_state(c)
    soup = merged_agent("soup", [a, b, c]).model.state_dict()
    arith = merged_agent("task_arithmetic", [b, c], a, scale=0.7).model.state_dict()
    for k in sa:
        np.testing.assert_allclose(soup[k].numpy(), (sa[k] + sb[k] + sc[k]) / 3, atol=1e-6)
        np.testing.assert_allclose(arith[k].numpy(), sa[k] + 0.7 * ((sb[k] - sa[k]) + (sc[k] - sa[k])), atol=1e-6)
    small = ["transformer.h.0.ln_1.weight", "transformer.h.3.attn.c_proj.bias", "transformer.ln_f.bias"]
    ties = merged_agent("ties", [b, c, zoo["model_3"]], a, density=0.3, scale=1.0).model.state_dict()
    hand = _np_ties({k: sa[k] for k in small}, [{k: s[k] for k in small} for s in (sb, sc, _np_state(zoo["model_3"]))],
                    0.3, 1.0)
    for k in small:
        np.testing.assert_allclose(ties[k].numpy(), hand[k], atol=1e-6)
    # cached by content: the same members give the same object; other members another
    assert merged_agent("soup", [a, b, c]) is merged_agent("soup", [a, b, c])
    assert merged_agent("soup", [a, b]) is not merged_agent("soup", [a, c])


def test_weight_errors_are_one_line(zoo, task):
    with pytest.raises(ConfigError, match="needs one architecture: 'zoo-nocarry' and 'zoo3-s' differ in config") as e:
        crl_envs.soup_v0([zoo["model_0"], zoo_agent("zoo3-s")], task)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"declare different bases \(zoo-base: zoo-nocarry; zoo4-base: zoo4-nocarry\)"):
        crl_envs.ties_v0([zoo["model_0"], zoo_agent("zoo4-nocarry")], task, base=zoo["model_1"])
    with pytest.raises(ConfigError, match="task_arithmetic_v0 needs base="):
        crl_envs.task_arithmetic_v0([zoo["model_0"]], task)
    with pytest.raises(ConfigError, match="soup_v0 takes no base"):
        crl_envs.soup_v0([zoo["model_0"]], task, base=zoo["model_1"])
    with pytest.raises(ConfigError, match=r"density must be in \(0, 1\]"):
        crl_envs.ties_v0([zoo["model_0"]], task, base=zoo["model_1"], density=0)


# ---------------------------------------------------------------------- planted truth in the coalition games
def _shapley_by_orderings(values: dict[int, np.ndarray], n: int, empty: float) -> np.ndarray:
    """Shapley values as the mean marginal contribution over all n! orderings (independent of the library's weights)."""
    v = {0: empty, **{m: float(x.mean()) for m, x in values.items()}}
    phi = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        mask = 0
        for i in order:
            phi[i] += v[mask | 1 << i] - v[mask]
            mask |= 1 << i
    return phi / len(orders)


@pytest.mark.parametrize("protocol", ["logit_fusion", "soup"])
def test_copies_of_one_model_have_equal_values(protocol, task, one_thread):
    pool = agents.pool([zoo_agent("zoo-nocarry"), zoo_agent("zoo-nocarry"), zoo_agent("zoo-small")])
    report = evaluate(protocol, pool, task, sampling=SAMPLING, cache_dir=False, progress=False)
    assert report.shapley["model_0"] == report.shapley["model_1"]
    np.testing.assert_array_equal(report.shapley.per_question[0], report.shapley.per_question[1])
    game = CoalitionGame(protocol, pool, task, sampling=SAMPLING, cache_dir=False, progress=False)
    values = game.values(range(1, 8))
    np.testing.assert_allclose(report.shapley.means, _shapley_by_orderings(values, 3, game.empty_value), atol=1e-12)
    # the coalition cost is token forwards as deployed: a fusion of two costs twice one model's answer tokens
    spend = game.spends([1, 3])
    if protocol == "logit_fusion":
        assert spend[3].generated_tokens.sum() == 2 * spend[1].generated_tokens.sum() > 0


@pytest.mark.parametrize("protocol", ["task_arithmetic", "ties"])
def test_a_model_equal_to_the_base_adds_nothing(protocol, task, one_thread):
    base = zoo_agent("zoo-nocarry")
    pool = agents.pool([zoo_agent("zoo-nocarry"), zoo_agent("zoo-noborrow"), zoo_agent("zoo-small")])
    options = {"base": base, "scale": 1.0}
    # the runner's default sampling (greedy, 256 tokens): the one v(∅), the base alone, is measured with
    game = CoalitionGame(protocol, pool, task, options=options, cache_dir=False, progress=False)
    values = game.values(range(1, 8))
    for mask in range(2, 8, 2):  # every coalition without the base's copy, then with it
        np.testing.assert_array_equal(values[mask | 1], values[mask])
    assert game.empty_value == pytest.approx(values[1].mean())  # alone it is the base: v(∅) is the base's score
    report = evaluate(protocol, pool, task, options=options, cache_dir=False, progress=False)
    assert report.shapley["model_0"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(report.shapley.means, _shapley_by_orderings(values, 3, game.empty_value), atol=1e-12)


@pytest.mark.slow  # two fresh interpreters: about 25 s idle
def test_logit_games_through_the_cli_with_the_coalition_cache(tmp_path):
    cmd = [sys.executable, "-m", "crl_envs.commands", "value", "--protocol", "logit-fusion", "--pool",
           "zoo:zoo-nocarry,zoo:zoo-small", "--n", "6", "--max-new-tokens", "24", "--quiet", "--out",
           str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "logit_fusion_v0" in first.stdout
    cached = sorted((tmp_path / "cache" / "logit_fusion_v0").glob("*.json"))
    assert len(cached) == 3
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "runs executed: 0 of 3 coalitions + 0 of 2 individual (5 from cache)" in again.stdout
    table = [line for line in first.stdout.splitlines() if line.startswith("model_")]
    assert len(table) == 2 and table == [line for line in again.stdout.splitlines() if line.startswith("model_")]


# ---------------------------------------------------------------------- C-RL at the logit level
def test_the_logit_policy_gradient_is_the_closed_form(task, one_thread):
    """Planted: a fixed answer with advantage A. The library's gradient on the learner's weights equals
    A * (c / T) (e_y - p)ᵀ ∂z_learner/∂θ summed over tokens, with c = the learner's weight share."""
    from trainers.logit import reinforce_loss

    learner, partner = zoo_agent("zoo-rookie"), zoo_agent("zoo-nocarry")
    ensemble = LogitEnsemble([learner, partner], Fusion("mean", weights=(1.0, 3.0)))
    messages = [{"role": "user", "content": task.prompt(task.examples[0])}]
    prompts = ensemble.encode(messages)
    answer = learner.tokenizer.encode("The answer is 12.", add_special_tokens=False)
    advantage, temperature = 0.75, 0.8
    params = [p for p in learner.model.parameters() if p.requires_grad]
    loss = reinforce_loss(ensemble, 0, [(prompts, answer, advantage)], temperature)
    library = torch.autograd.grad(loss, params, allow_unused=True)
    assert all(p.grad is None for p in partner.model.parameters())
    # the closed form: d(-A Σ_t log p_t(y_t)) / dz_learner = -A (c / T) (e_y - p), through the learner's forward
    ids = torch.tensor([prompts[0] + answer])
    z_learner = learner.model(input_ids=ids).logits[0, len(prompts[0]) - 1 : len(prompts[0]) - 1 + len(answer)]
    with torch.no_grad():
        z_partner = partner.model(input_ids=torch.tensor([prompts[1] + answer])).logits[
            0, len(prompts[1]) - 1 : len(prompts[1]) - 1 + len(answer)]
        p = torch.softmax((0.25 * z_learner + 0.75 * z_partner) / temperature, -1)
        upstream = -advantage * (0.25 / temperature) * (torch.nn.functional.one_hot(torch.tensor(answer), p.shape[-1]) - p)
    closed = torch.autograd.grad(z_learner, params, grad_outputs=upstream, allow_unused=True)
    assert sum(float(g.abs().sum()) for g in library if g is not None) > 0
    for got, want in zip(library, closed):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_train_in_ensemble_moves_the_learner_only(task, one_thread):
    from trainers.logit import LogitCRLConfig, train_in_ensemble

    pool = agents.pool([zoo_agent("zoo-rookie"), zoo_agent("zoo-nocarry")])
    before = [p.detach().clone() for p in pool["model_0"].model.parameters()]
    partner = pool["model_1"].fingerprint
    log = train_in_ensemble(pool, task, "model_0", LogitCRLConfig(steps=2, questions=3, group=3, learning_rate=1e-3))
    assert [r["step"] for r in log] == [0, 1] and all(0 <= r["reward"] <= 1 for r in log)
    moved = any(not torch.equal(a, b) for a, b in zip(before, pool["model_0"].model.parameters()))
    assert moved == any(r["loss"] != 0 for r in log)
    assert pool["model_1"].fingerprint == partner
    with pytest.raises(ConfigError, match="needs a logit-level protocol"):
        train_in_ensemble(pool, task, "model_0", LogitCRLConfig(steps=1), protocol="soup")


# ---------------------------------------------------------------------- the committed measurement
@pytest.mark.slow
def test_committed_levels_figures(one_thread):
    """docs/levels.json (benchmarks/levels.py): zoo v1's exact Shapley values in vote, fusion and soup re-played on
    12 of its questions (a question's Shapley values depend on that question's coalition values alone), and every
    pool's cross-fit and same-question taus recomputed from the committed per-question values."""
    import json
    from pathlib import Path

    from benchmarks import levels

    d = json.loads((Path(__file__).resolve().parents[1] / "docs" / "levels.json").read_text())
    zoo = d["pools"]["zoo"]
    task = levels.task_for(d["questions"], d["seed"])
    assert [e.id for e in task.examples] == zoo["example_ids"]
    part = task.subset(zoo["example_ids"][:12])
    sampling = agents.SamplingParams(max_new_tokens=d["max_new_tokens"])
    for game in ("vote", "fusion", "soup"):
        report = evaluate(levels.GAMES[game][1], agents.pool("zoo"), part, seed=d["seed"], sampling=sampling,
                          cache_dir=False, progress=False)
        committed = np.asarray(zoo["games"][game]["shapley_per_question"])[:, :12]
        np.testing.assert_allclose(report.shapley.per_question, committed, atol=1e-12, err_msg=game)
    for name, pool in d["pools"].items():
        for pair, found in pool["agreement"].items():
            a, b = pair.split("~")
            again = levels.agreement(pool["games"][a]["shapley_per_question"], pool["games"][b]["shapley_per_question"],
                                     pool["example_ids"])
            assert again == found, (name, pair)
            means = np.asarray(pool["games"][a]["shapley_per_question"]).mean(axis=1)
            np.testing.assert_allclose(means, pool["games"][a]["shapley"], atol=1e-12)
    assert levels.pooled(d) == d["pooled"]
