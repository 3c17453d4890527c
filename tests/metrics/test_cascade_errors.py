"""``cascade_errors`` on an exact pair for Gaussian data: module 1's error is the posterior
variance ``S^2 sigma^2 / (S^2 + sigma^2)`` within its standard error, an offset ``b`` on
module 2 gives a gap of ``b^2`` and adds it to the error (Pythagoras); bad input refused."""

import jax
import numpy as np
import pytest
from cascade_nets import ExactPair

from scorelib.metrics import cascade_errors

S = 0.7


def exact_pair(b=0.0):
    return ExactPair(S, b)


@pytest.mark.parametrize("sigma", [0.1, 0.5, 2.0])
def test_exact_pair(sigma):
    x0 = S * jax.random.normal(jax.random.key(0), (20_000, 3))
    e = cascade_errors(exact_pair(b=0.2), x0, sigma, jax.random.key(1))
    post = S**2 * sigma**2 / (S**2 + sigma**2)
    assert abs(e["first"] - post) < 4 * e["first_se"]
    assert abs(e["second"] - (post + 0.04)) < 4 * e["second_se"]
    assert e["gap"] == pytest.approx(0.04, rel=1e-5) and e["gap_se"] < 1e-6


def test_bad_input():
    with pytest.raises(ValueError, match="sigma must be a number in"):
        cascade_errors(exact_pair(), np.zeros((4, 2)), 0.0, jax.random.key(0))
    with pytest.raises(ValueError, match="x0 must hold at least 2 examples"):
        cascade_errors(exact_pair(), np.zeros((1, 2)), 0.5, jax.random.key(0))
