"""``permutation_weights`` accepts only permutations: a repeated or missing player would silently bias
the Monte-Carlo Shapley estimate."""

from __future__ import annotations

import numpy as np
import pytest

from crl_envs.valuation.estimators import permutation_weights, sample_permutations


@pytest.mark.parametrize("rows, match", [
    ([[0, 1, 2], [0, 0, 2]], r"row 1 \(\[0, 0, 2\]\) is not a permutation of 0..2"),
    ([[0, 1, 3]], r"row 0 \(\[0, 1, 3\]\) is not a permutation of 0..2"),
    ([[0.0, 1.0, 2.0]], "int array"),
    ([0, 1, 2], r"\(budget, n\)"),
])
def test_rows_must_be_permutations(rows, match):
    with pytest.raises(ValueError, match=match):
        permutation_weights(np.array(rows))


def test_sampled_permutations_are_accepted():
    masks, weights = permutation_weights(sample_permutations(4, 6, seed=0))
    assert weights.shape == (4, len(masks))
    assert np.allclose(weights.sum(axis=1), 0.0)  # each marginal is v(P + i) - v(P): weights +1/b and -1/b
