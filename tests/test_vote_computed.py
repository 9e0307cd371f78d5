"""Vote's coalitions computed from its members' one-member runs (#54 item 2a): bit for bit what playing
them through the env gives, ties and unparseable answers included, with truthful spend and no generation."""

from __future__ import annotations

import numpy as np
import pytest

import agents
import crl_envs
from agents import ScriptedAgent
from crl_envs.protocols.base import answer_codes, plurality, plurality_winners
from crl_envs.runner import stable_hash
from crl_envs.valuation import CoalitionGame, evaluate
from crl_envs.valuation.coalition import coalitions_outcomes


class _Guesser(ScriptedAgent):
    """Answers the reference, one of two wrong values or nothing parseable, decided by (name, question,
    request seed): so members tie often, agree on wrong answers and sometimes give no answer."""

    def _respond(self, request):
        ex = request.context.example
        draw = stable_hash(self.name, ex.id, request.sampling.seed) % 10
        if draw < 2:
            return "I cannot tell."
        offset = 0 if draw < 6 else (1 if draw < 8 else 2)
        return f"The answer is {int(ex.answer) + offset}."


def _pool(n: int) -> agents.Pool:
    return agents.pool([_Guesser(f"g{i}", lambda ex, msgs: "") for i in range(n)])


def _played(game: CoalitionGame, masks: list[int]):
    """Each coalition played through the env (the executors' own path), not computed."""
    return dict(zip(masks, coalitions_outcomes(game.run_spec(), masks)))


@pytest.mark.parametrize("n,samples", [(4, 1), (6, 2), (8, 1)])
def test_computed_vote_equals_played_bit_for_bit(n, samples):
    task = crl_envs.tasks.load("arith", n=15 if n == 8 else 25)
    sampling = agents.SamplingParams(temperature=1.0) if samples > 1 else None
    game = CoalitionGame("vote", _pool(n), task, samples=samples, sampling=sampling, cache_dir=False, progress=False)
    assert game.computed
    masks = list(range(1, 1 << n))
    values, spends = game.values(masks), game.spends(masks)
    assert game.evaluations == n  # only the models alone were played
    played = _played(game, masks)
    for m in masks:
        scores, spend, _ = played[m]
        assert np.array_equal(values[m], scores), m
        for field in ("calls", "prompt_tokens", "generated_tokens"):
            assert np.array_equal(spends[m].field(field), spend.field(field)), (m, field)
    # the test exercises what makes plurality subtle: ties between answers and members with no answer
    solo = [game._solo[1 << i].answers for i in range(n)]
    rows = [[solo[i][q][s] for i in range(n)] for q in range(len(task)) for s in range(samples)]
    assert any(None in r for r in rows) and any(all(a is None for a in r[:2]) for r in rows)
    tied = sum(1 for r in rows for m in masks if _tied([r[i] for i in range(n) if m >> i & 1]))
    assert tied > len(masks)


def _tied(answers) -> bool:
    counts = {a: answers.count(a) for a in answers if a is not None}
    return len(counts) > 1 and sorted(counts.values())[-1] == sorted(counts.values())[-2]


def test_plurality_winners_matches_a_direct_count():
    """The vectorised rule against a direct count of each coalition's votes, on random answer rows."""
    rng = np.random.default_rng(0)
    n = 7
    codes = rng.integers(-1, 3, size=(300, n))
    masks = np.arange(1 << n)
    winners = plurality_winners(codes, masks)
    for r in range(0, 300, 7):
        for m in masks:
            members = [j for j in range(n) if m >> j & 1 and codes[r, j] >= 0]
            if not members:
                assert winners[r, m] == -1
                continue
            counts = {c: sum(codes[r, j] == c for j in members) for c in set(codes[r, members])}
            top = max(counts.values())
            assert winners[r, m] == next(j for j in members if counts[codes[r, j]] == top)
    assert plurality(["5", None, "6", "6", "5"]) == "5" and plurality([None, None]) is None
    assert answer_codes(["a", None, "b", "a"]) == [0, -1, 1, 0]


def test_one_row_one_coalition_path_is_the_vectorised_rule():
    """plurality_winners' scalar path (one row, one coalition: a protocol's step) against its vectorised path (many
    of each), on every coalition of random answer rows with ties and non-answers, for 1 to 8 members."""
    rng = np.random.default_rng(1)
    for n in range(1, 9):
        codes = rng.integers(-1, 3, size=(40, n))
        winners = plurality_winners(codes, np.arange(1 << n))
        for r in range(40):
            for m in range(1 << n):
                assert plurality_winners(codes[r:r + 1], [m]).tolist() == [[winners[r, m]]], (n, r, m)


def test_evaluate_spends_only_the_models_alone_and_values_16_models():
    """evaluate() on vote plays the n models alone and nothing else, up to 16 models exactly; its cost game is
    the members' runs summed."""
    task = crl_envs.tasks.load("arith", n=12)
    pool = _pool(16)
    report = evaluate("vote", pool, task, cache_dir=False, progress=False, bootstrap_resamples=50)
    assert report.individual_evaluations == 16 and report.system_evaluations == 0
    assert report.coalitions == (1 << 16) - 1
    phi = report.shapley.per_question.mean(axis=1)
    assert np.isclose(phi.sum(), report.system.mean() - report.empty_value)
    costs = report.coalition_costs
    alone = {costs.masks[k]: costs.spends[k].tokens for k in range(len(costs.masks)) if costs.masks[k] in
             {1 << i for i in range(16)}}
    full = costs.spends[costs.masks.index((1 << 16) - 1)].tokens
    assert np.array_equal(full, sum(alone.values()))
    with pytest.raises(ValueError, match="131072 for a pool of 17"):
        evaluate("vote", _pool(17), task, cache_dir=False, progress=False)


def test_cached_singletons_carry_answers_and_old_files_are_replayed(tmp_path):
    task = crl_envs.tasks.load("arith", n=10)
    game = CoalitionGame("vote", _pool(5), task, cache_dir=tmp_path, progress=False)
    first = game.values(range(32))
    assert game.evaluations == 5
    again = CoalitionGame("vote", _pool(5), task, cache_dir=tmp_path, progress=False)
    assert all(np.array_equal(again.values(range(32))[m], first[m]) for m in range(32)) and again.evaluations == 0
    # a file written before answers were kept (no "solo") is played again, silently, for its answers
    import json
    path = again._path(1)
    record = json.loads(path.read_text())
    del record["solo"]
    path.write_text(json.dumps(record))
    third = CoalitionGame("vote", _pool(5), task, cache_dir=tmp_path, progress=False)
    third.values(range(32))
    assert third.evaluations == 1
    # answers whose scores do not average to the file's scores: refused with a warning, played again
    record = json.loads(path.read_text())
    record["solo"]["scores"][0][0] = 1.0 - record["solo"]["scores"][0][0]
    path.write_text(json.dumps(record))
    fourth = CoalitionGame("vote", _pool(5), task, cache_dir=tmp_path, progress=False)
    with pytest.warns(RuntimeWarning, match="do not average to its scores"):
        fourth.values(range(32))
    assert fourth.evaluations == 1


def test_interactive_protocols_are_played():
    game = CoalitionGame("debate", _pool(3), crl_envs.tasks.load("arith", n=4), cache_dir=False, progress=False)
    assert not game.computed
    game.values(range(8))
    assert game.evaluations == 7
