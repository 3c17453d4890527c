"""The t-test's power and the seeds a comparison needs: Cohen's table, and the power
against a simulation of the test itself (within the simulation's standard error)."""

import math

import numpy as np
import pytest
from scipy import stats

from scorelib.metrics import pooled_std, seeds_needed, t_test_power


@pytest.mark.parametrize("effect, n", [(0.2, 394), (0.5, 64), (0.8, 26), (1.2, 12)])
def test_seeds_needed_is_cohens_table(effect, n):
    """G*Power's exact sample sizes (two-sided, alpha 0.05, power 0.8; Cohen's 1988 Table
    2.4.1 prints 393 for 0.2 from an approximation)."""
    assert seeds_needed(effect * 3.0, 3.0) == n
    # the smallest such n: one fewer falls short
    assert t_test_power(effect * 3.0, 3.0, n) >= 0.8 > t_test_power(effect * 3.0, 3.0, n - 1)


@pytest.mark.parametrize("effect, n", [(1.0, 5), (2.0, 3), (0.4, 20)])
def test_the_power_is_the_simulated_rejection_rate(effect, n):
    """Draw both groups 20,000 times, run scipy's pooled t-test, count rejections at 0.05:
    the closed form is within 4 binomial standard errors of that rate."""
    rng = np.random.default_rng(0)
    reps = 20_000
    a = rng.normal(size=(reps, n))
    b = rng.normal(size=(reps, n)) + effect
    p = stats.ttest_ind(a, b, axis=1).pvalue
    rate = float(np.mean(p < 0.05))
    se = math.sqrt(rate * (1 - rate) / reps)
    assert t_test_power(effect, 1.0, n) == pytest.approx(rate, abs=4 * se)


def test_no_difference_is_never_enough_and_bad_input_is_named():
    assert t_test_power(0.0, 1.0, 10) == pytest.approx(0.05)  # the test's level
    assert seeds_needed(0.0, 1.0) is None
    assert seeds_needed(0.01, 1.0, max_n=100) is None
    assert seeds_needed(10.0, 1.0) == 2  # a huge effect: the fewest the test runs on
    with pytest.raises(ValueError, match="std must be"):
        t_test_power(1.0, 0.0, 5)
    with pytest.raises(ValueError, match="n must be an integer"):
        t_test_power(1.0, 1.0, 1)
    with pytest.raises(ValueError, match="power must be"):
        seeds_needed(1.0, 1.0, power=1.0)


def test_pooled_std_is_the_two_sample_t_tests():
    """Against scipy's pooled t statistic: t = (mean a - mean b) / (s_p sqrt(1/n_a + 1/n_b))."""
    a, b = [1.0, 2.0, 4.0], [3.0, 3.5, 6.0, 7.5]
    t = stats.ttest_ind(a, b).statistic
    s_p = pooled_std(a, b)
    assert t == pytest.approx((np.mean(a) - np.mean(b)) / (s_p * math.sqrt(1 / 3 + 1 / 4)))
    with pytest.raises(ValueError, match="2 finite values or more"):
        pooled_std([1.0], b)
