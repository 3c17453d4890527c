"""How many seeds a comparison needs: the power of the two-sample t-test.

A table compares two recipes by one value per seed (an FD, a C2ST accuracy) with a
two-sided t-test. Given the difference a paper reports (scaled to this table's metric) and
the spread over seeds measured here, :func:`seeds_needed` says how many seeds per recipe
would detect it with a given power; :func:`t_test_power` is the power at a given number.

The power of the two-sided two-sample t-test with ``n`` values per group, a common standard
deviation ``s`` and a true difference ``delta`` is (Cohen 1988, ch. 2; the noncentral t)::

    df = 2 n - 2,  nc = (delta / s) sqrt(n / 2),  t_c = t_{1 - alpha / 2, df}
    power = P(T' > t_c) + P(T' < -t_c),  T' ~ noncentral t(df, nc)

The values per seed are taken as normal with equal spreads (Welch's test, which the tables
run, has nearly the same power when the spreads are equal).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from scorelib._checks import check_int, check_real


def pooled_std(a, b) -> float:
    """The pooled standard deviation of two samples of one value per seed,
    ``sqrt(((n_a - 1) s_a^2 + (n_b - 1) s_b^2) / (n_a + n_b - 2))`` with ``s`` the sample
    standard deviations (``ddof=1``): the ``std`` of :func:`t_test_power` estimated from a
    table's seeds.

    Raises:
      ValueError: unless both hold 2 values or more, all finite.
    """
    a, b = np.asarray(a, float).ravel(), np.asarray(b, float).ravel()
    if min(a.size, b.size) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError(
            f"a and b must hold 2 finite values or more each; got {a.size} and {b.size}"
        )
    ss = (a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)
    return math.sqrt(ss / (a.size + b.size - 2))


def t_test_power(difference: float, std: float, n: int, *, alpha: float = 0.05) -> float:
    """The power of the two-sided two-sample t-test at level ``alpha`` with ``n`` values per
    group, a true difference of means ``difference`` and a common standard deviation
    ``std`` (module docstring).

    Raises:
      ValueError: naming ``std`` (> 0), ``n`` (>= 2) or ``alpha`` (in (0, 1)).
    """
    check_real(std, "std", low=0.0, low_open=True)
    n = check_int(n, "n", low=2)
    check_real(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True)
    check_real(difference, "difference")
    df = 2 * n - 2
    nc = abs(difference) / std * math.sqrt(n / 2)
    t_c = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = float(stats.nct.sf(t_c, df, nc)), float(stats.nct.cdf(-t_c, df, nc))
    if not math.isfinite(lower):
        # scipy's noncentral t returns nan far in its lower tail (seen only at nc >= 8,
        # where the term is below 1e-20: rejections on the wrong side, none)
        lower = 0.0
    return min(1.0, upper + lower)


def seeds_needed(
    difference: float,
    std: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    max_n: int = 100_000,
) -> int | None:
    """The smallest number of seeds per group at which the two-sided two-sample t-test at
    level ``alpha`` detects a true difference ``difference`` with probability ``power``,
    given a common standard deviation ``std`` over seeds (:func:`t_test_power`).

    Effect size ``difference / std`` 0.2, 0.5, 0.8 at alpha 0.05 and power 0.8 need 394,
    64 and 26 per group (G*Power's exact values; Cohen's 1988 Table 2.4.1, from an
    approximation, prints 393, 64, 26).

    Returns:
      ``n >= 2``, or ``None`` when even ``max_n`` is not enough (e.g. ``difference = 0``).

    Raises:
      ValueError: naming ``std``, ``alpha``, ``power`` (in (0, 1)) or ``max_n`` (>= 2).
    """
    check_real(power, "power", low=0.0, high=1.0, low_open=True, high_open=True)
    max_n = check_int(max_n, "max_n", low=2)
    if t_test_power(difference, std, max_n, alpha=alpha) < power:
        return None
    lo, hi = 2, max_n  # the power grows with n: bisect for the first n that reaches it
    if t_test_power(difference, std, lo, alpha=alpha) >= power:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if t_test_power(difference, std, mid, alpha=alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi
