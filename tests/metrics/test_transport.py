"""Exact W2 against the linear assignment (scipy) and a Gaussian closed form."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from scorelib.metrics.transport import exact_w2


def test_equals_the_assignment_cost_for_equal_sizes():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 3)), rng.normal(size=(60, 3)) + 0.5
    cost = np.sum((x[:, None] - y[None]) ** 2, -1)
    r, c = linear_sum_assignment(cost)
    assert exact_w2(x, y) == pytest.approx(np.sqrt(cost[r, c].mean()), rel=1e-10)


def test_a_translation_is_its_length_and_separates_good_from_bad():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 2))
    assert exact_w2(x, x + np.array([3.0, 4.0])) == pytest.approx(5.0, rel=1e-9)
    same = exact_w2(rng.normal(size=(300, 2)), rng.normal(size=(300, 2)))
    shifted = exact_w2(rng.normal(size=(300, 2)), rng.normal(size=(300, 2)) * 2.0)
    assert same < 0.5 < shifted


def test_bad_input():
    with pytest.raises(ValueError, match=r"^y must have shape \[m, \*shape=\(2,\)\]"):
        exact_w2(np.zeros((3, 2)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="finite"):
        exact_w2(np.full((3, 2), np.nan), np.zeros((3, 2)))
