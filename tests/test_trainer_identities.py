"""The identities the trainers rest on, checked on numbers (see FIELD-NOTES, "Group-baseline RL")."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

import agents
from crl_envs import tasks
from trainers import (
    CRLConfig,
    CRLTrainer,
    LOORewardConfig,
    LOORewardTrainer,
    compute_advantages,
    shapley_weight,
)
from trainers.losses import LossInputs, get_loss
from trainers.rollout import learner_sequences, token_logprobs


# ---------------------------------------------------------------------- advantages
def test_loo_reward_under_group_mean_equals_crl_exactly():
    """(r - v) - mean(r - v) == r - mean(r) when v = v(N \\ {i}) is fixed per question."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randint(0, 2, (50, 8), generator=g).double()  # binary system outcomes, G = 8
    counterfactual = torch.randint(0, 9, (50,), generator=g).double() / 8  # v estimated from 8 samples
    crl = compute_advantages("group_mean", rewards)
    loo = compute_advantages("group_mean", rewards - counterfactual[:, None])
    assert torch.equal(loo, crl)  # bit for bit
    # arbitrary real rewards and counterfactuals: equal up to float rounding only
    r, v = torch.rand(50, 8, generator=g).double(), torch.rand(50, generator=g).double()
    assert torch.allclose(compute_advantages("group_mean", r - v[:, None]), compute_advantages("group_mean", r),
                          atol=1e-14, rtol=0)
    # and the explicit counterfactual estimator is not the same thing (it keeps v as the baseline)
    explicit = compute_advantages("loo_counterfactual", rewards, counterfactual=counterfactual)
    assert torch.equal(explicit, rewards - counterfactual[:, None])
    assert not torch.equal(explicit, crl)


def test_advantage_estimators_against_hand_computation():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mean0 = 3 / 5
    assert compute_advantages("group_mean", r)[0].tolist() == pytest.approx([1 - mean0, -mean0, -mean0, 1 - mean0, 1 - mean0])
    std0 = math.sqrt(sum((x - mean0) ** 2 for x in r[0].tolist()) / 4)  # unbiased, as torch/TRL
    assert compute_advantages("group_mean_std", r)[0].tolist() == pytest.approx(
        [(x - mean0) / (std0 + 1e-4) for x in r[0].tolist()])
    assert compute_advantages("group_mean_std", r)[1].abs().sum() == 0  # zero-variance group: no signal
    rloo = compute_advantages("rloo", r)
    for k in range(5):
        others = [x for j, x in enumerate(r[0].tolist()) if j != k]
        assert rloo[0, k].item() == pytest.approx(r[0, k].item() - sum(others) / 4)
    w = torch.tensor([2.0, 0.5], dtype=torch.float64)
    assert torch.allclose(compute_advantages("shapley_credit", r, weights=w), w[:, None] * compute_advantages("group_mean", r))
    with pytest.raises(ValueError, match="counterfactual"):
        compute_advantages("loo_counterfactual", r)
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        compute_advantages("nope", r)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
def test_shapley_weights_sum_to_one_and_give_the_shapley_value(n):
    """Σ over coalitions T ∋ i of w(T) is 1, and Σ_T w(T) v(T) - Σ_{S∌i} w(S ∪ i) v(S) is the Shapley value
    computed by permutations, for a random game."""
    players = list(range(n))
    assert sum(math.comb(n - 1, s - 1) * shapley_weight(s, n) for s in range(1, n + 1)) == pytest.approx(1.0)
    g = torch.Generator().manual_seed(n)
    values = {frozenset(c): torch.rand(1, generator=g).item() for k in range(n + 1) for c in itertools.combinations(players, k)}
    values[frozenset()] = 0.0
    by_permutation = 0.0
    for perm in itertools.permutations(players):
        before = frozenset(perm[: perm.index(0)])
        by_permutation += values[before | {0}] - values[before]
    by_permutation /= math.factorial(n)
    with_i = sum(shapley_weight(len(c), n) * v for c, v in values.items() if 0 in c)
    without_i = sum(shapley_weight(len(c) + 1, n) * v for c, v in values.items() if 0 not in c)
    assert with_i - without_i == pytest.approx(by_permutation)


# ---------------------------------------------------------------------- losses
def _hand_loss(lp, old, adv, mask, kind, eps=0.2, max_len=None, beta=0.0, ref=None):
    """Per-token clipped surrogate with explicit loops, then each normalisation."""
    per_seq_sums, per_seq_means, total_tokens = [], [], 0
    for b in range(len(lp)):
        s, n = 0.0, 0
        for t in range(len(lp[b])):
            if not mask[b][t]:
                continue
            ratio = math.exp(lp[b][t] - old[b][t])
            term = -min(ratio * adv[b], min(max(ratio, 1 - eps), 1 + eps) * adv[b])
            if beta:
                d = ref[b][t] - lp[b][t]
                term += beta * (math.exp(d) - d - 1)
            s, n = s + term, n + 1
        per_seq_sums.append(s)
        per_seq_means.append(s / max(n, 1))
        total_tokens += n
    if kind == "grpo":
        return sum(per_seq_means) / len(lp)
    if kind == "dapo":
        return sum(per_seq_sums) / total_tokens
    return sum(per_seq_sums) / (len(lp) * max_len)


LP = [[-0.5, -1.2, -0.1, -2.0], [-0.3, -0.9, -4.0, -1.0], [-1.5, -0.2, -0.7, -0.1]]
OLD = [[-0.6, -0.8, -0.1, -1.0], [-0.9, -0.9, -3.0, -1.0], [-1.4, -0.2, -2.0, -0.1]]  # ratios both inside and outside the clip range
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
ADV = [0.75, -1.5, 0.4]


@pytest.mark.parametrize("kind", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_each_loss_normalisation_against_hand_computation(kind, beta):
    ref = [[x - 0.25 * (i + 1) for i, x in enumerate(row)] for row in LP]
    inputs = LossInputs(
        logprobs=torch.tensor(LP, dtype=torch.float64), old_logprobs=torch.tensor(OLD, dtype=torch.float64),
        advantages=torch.tensor(ADV, dtype=torch.float64), mask=torch.tensor(MASK, dtype=torch.float64),
        total_tokens=sum(map(sum, MASK)), total_sequences=3, max_len=6, beta=beta,
        ref_logprobs=torch.tensor(ref, dtype=torch.float64) if beta else None,
    )
    loss, stats = get_loss(kind)(inputs)
    assert loss.item() == pytest.approx(_hand_loss(LP, OLD, ADV, MASK, kind, max_len=6, beta=beta, ref=ref), rel=1e-12)
    # clipped tokens by hand: seq 0 token 1 (ratio e^-0.4 < 0.8 but A > 0: not clipped), token 3 masked;
    # seq 1 token 0 (ratio e^0.6 > 1.2, A < 0: not clipped), token 2 (ratio e^-1 < 0.8, A < 0: clipped);
    # seq 2 token 2 masked
    assert stats["clipped_tokens"] == 1


def test_losses_differ_where_lengths_differ():
    """The three normalisations are genuinely different on unequal lengths (and agree when every
    sequence has max_len tokens)."""
    base = dict(logprobs=torch.tensor(LP, dtype=torch.float64), old_logprobs=torch.tensor(OLD, dtype=torch.float64),
                advantages=torch.tensor(ADV, dtype=torch.float64), total_sequences=3, max_len=4)
    uneven = {k: get_loss(k)(LossInputs(mask=torch.tensor(MASK, dtype=torch.float64), total_tokens=9, **base))[0].item()
              for k in ("grpo", "dapo", "dr_grpo")}
    assert len({round(v, 12) for v in uneven.values()}) == 3
    full = {k: get_loss(k)(LossInputs(mask=torch.ones(3, 4, dtype=torch.float64), total_tokens=12, **base))[0].item()
            for k in ("grpo", "dapo", "dr_grpo")}
    assert full["grpo"] == pytest.approx(full["dapo"]) == pytest.approx(full["dr_grpo"])


# ---------------------------------------------------------------------- trainer-level identities
@pytest.fixture
def system(tiny_model_dir):
    learner = agents.HFAgent(str(tiny_model_dir), name="tiny")
    pool = agents.pool([agents.ScriptedAgent.expert("e0", 0.7), learner, agents.ScriptedAgent.expert("e2", 0.5)])
    return pool, tasks.load("arith", split="train", n=6, seed=1)


def _gradient(trainer, episodes, advantages, loss_type="dapo"):
    model = trainer.policy.model
    model.zero_grad(set_to_none=True)
    seqs = learner_sequences(episodes, trainer.learner, advantages)
    lp, mask = token_logprobs(model, [s.prompt_ids for s in seqs], [s.completion_ids for s in seqs], temperature=1.0,
                              pad_id=trainer.policy.tokenizer.pad_token_id)
    old = torch.zeros_like(lp)
    for row, s in enumerate(seqs):
        old[row, : len(s.logprobs)] = torch.tensor(s.logprobs)
    loss, _ = get_loss(loss_type)(LossInputs(lp, old, torch.tensor([s.advantage for s in seqs]), mask,
                                             int(mask.sum()), len(seqs), 8))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def test_partner_tokens_do_not_enter_the_loss_or_gradient(system):
    pool, task = system
    trainer = CRLTrainer("debate", pool, task, learner="model_1",
                         config=CRLConfig(num_generations=4, questions_per_step=3, max_new_tokens=8, progress=False))
    batch = trainer.collect(trainer.questions_for(0), seed=3)
    advantages = [0.5 - 0.25 * (i % 5) for i in range(len(batch.episodes))]  # arbitrary, non-zero
    loss, grads = _gradient(trainer, batch.episodes, advantages)
    changed = copy.deepcopy(batch.episodes)
    n_changed = 0
    for ep in changed:
        for turn in ep.transcript:
            if turn.agent != "model_1":
                turn.text = "something else entirely 12345"
                turn.token_ids, turn.logprobs, turn.prompt_token_ids = [7, 8, 9], [-0.1, -0.2, -0.3], [1, 2]
                turn.messages = [{"role": "user", "content": "other"}]
                n_changed += 1
    assert n_changed > 0
    loss2, grads2 = _gradient(trainer, changed, advantages)
    assert torch.equal(loss, loss2)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads2)) and len(grads) == len(grads2) > 0
    # ...whereas changing the learner's own advantages does change the gradient
    _, grads3 = _gradient(trainer, batch.episodes, [-a for a in advantages])
    assert not all(torch.equal(a, b) for a, b in zip(grads, grads3))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_gradient_accumulation_does_not_change_the_gradient(system, loss_type):
    pool, task = system
    grads = []
    for accumulation in (1, 3):
        cfg = CRLConfig(num_generations=4, questions_per_step=2, max_new_tokens=8, progress=False, loss_type=loss_type,
                        gradient_accumulation_steps=accumulation, learning_rate=1e-3)
        trainer = CRLTrainer("vote", pool, task, learner="model_1", config=cfg)
        batch = trainer.collect(trainer.questions_for(0), seed=5)
        seqs = learner_sequences(batch.episodes, "model_1", [0.3 * ((i % 3) - 1) for i in range(len(batch.episodes))])
        trainer.optimizer.step = lambda: None  # keep the gradient for inspection
        trainer.optimizer.zero_grad = lambda set_to_none=True: None
        trainer.optimise(seqs)
        grads.append([p.grad.clone() for p in trainer.policy.model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(*grads))


def test_loo_trainer_shares_crl_rollouts_and_group_mean_advantages(system, monkeypatch):
    """Same seed, same questions: the LOO trainer's system rollouts are C-RL's; its LOO reward under the
    group-mean baseline gives C-RL's advantages exactly; it pays Q extra episodes without the learner."""
    pool, task = system
    cfg = dict(num_generations=4, questions_per_step=3, max_new_tokens=8, progress=False)
    crl = CRLTrainer("debate", pool, task, learner="model_1", config=CRLConfig(**cfg))
    loo = LOORewardTrainer("debate", pool, task, learner="model_1", config=LOORewardConfig(**cfg))
    qs = crl.questions_for(0)
    a, b = crl.collect(qs, seed=11), loo.collect(qs, seed=11)
    assert torch.equal(a.rewards, b.rewards)
    assert [t.token_ids for ep in a.episodes for t in ep.turns_of("model_1")] == \
           [t.token_ids for ep in b.episodes for t in ep.turns_of("model_1")]
    v = b.context["counterfactual"]
    assert torch.equal(compute_advantages("group_mean", b.rewards - v[:, None]), compute_advantages("group_mean", a.rewards))
    assert a.rollouts == 3 * 4 and b.rollouts == 3 * 4 + 3
