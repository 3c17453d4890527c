"""The certified pruned pass of the exact training-set softmax (scorelib/scores/empirical.py):
the matmul error bound, the top sub-blocks, the certificate and its gate, against float64
brute force."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.datasets import load_digits

from scorelib.processes import EDM
from scorelib.processes.rectified import RectifiedFlow
from scorelib.scores import EmpiricalScore
from scorelib.scores.empirical import (
    AUTO_PRUNE,
    AUTO_PRUNE_MIN_DIM,
    full_softmax_stats,
    matmul_error_bound,
    may_certify,
    pruned_softmax_stats,
    scan_blocks,
    softmax_stats,
    sub_block,
    top_blocks,
)


def brute_mean(train, y, s):
    logw = -np.sum((y[:, None] - train[None]) ** 2, -1) / (2 * s**2)
    return np.exp(logw - logsumexp(logw, axis=1, keepdims=True)) @ train


def mean_of(stats):
    _, l, acc = stats
    return np.asarray(acc / l[:, None])


def test_matmul_error_bound_bounds_the_float32_logits():
    """|g - g_float64| <= the bound on data with large norms (offset 20, d = 64)."""
    rng = np.random.default_rng(0)
    train = rng.normal(size=(512, 64)) * 3 + 20.0
    y = train[:40] + rng.normal(size=(40, 64)) * 0.1
    tab = EmpiricalScore.create(EDM(), train, chunk=128)
    yj = jnp.asarray(y, jnp.float32)
    _, gs = scan_blocks(tab, yj, lambda c, blk: (c, blk[0]), 0)
    g = np.concatenate(list(np.asarray(gs)), axis=1)  # [b, n]
    t64 = np.asarray(tab.data, np.float64)
    y64 = np.asarray(yj, np.float64)
    ref = 2 * y64 @ t64.T - np.sum(t64**2, 1)
    err = np.abs(g - ref).max(axis=1)
    bound = np.asarray(matmul_error_bound(yj, float(np.max(np.sum(t64**2, 1)))))
    assert np.all(err <= bound)
    assert np.all(err > 0)  # float32 rounding is there to bound


def test_top_blocks_hold_the_r_nearest_and_bound_the_rest():
    rng = np.random.default_rng(1)
    train = rng.normal(size=(300, 6))
    tab = EmpiricalScore.create(EDM(), train, chunk=48)  # 16-point sub-blocks
    y = rng.normal(size=(9, 6))
    r = 5
    vals, ids = (np.asarray(a) for a in top_blocks(tab, jnp.asarray(y, jnp.float32), r))
    sub = sub_block(48)
    d2 = np.sum((y[:, None] - train[None]) ** 2, -1)
    g = np.sum(y**2, 1)[:, None] - d2  # 2 y.x - |x|^2
    for b in range(len(y)):
        inside = np.concatenate([np.arange(i * sub, (i + 1) * sub) for i in ids[b, :r]])
        assert set(np.argsort(d2[b])[:r]) <= set(inside)
        outside = np.setdiff1d(np.arange(300), inside)
        assert g[b, outside].max() <= vals[b, r] + 1e-4
        assert np.all(np.diff(vals[b]) <= 0)


def test_pruned_pass_equals_the_float64_softmax_where_certified():
    """Small noise, queries near training points: certified, and the answer is the float64
    loop's (also with fewer sub-blocks than ``prune`` and padding rows)."""
    rng = np.random.default_rng(2)
    for n, chunk in [(700, 64), (37, 8)]:
        train = rng.normal(size=(n, 10))
        tab = EmpiricalScore.create(EDM(), train, chunk=chunk)
        y = train[rng.integers(0, n, 12)] + 0.05 * rng.normal(size=(12, 10))
        stats, ok = pruned_softmax_stats(tab, jnp.asarray(y, jnp.float32), 0.5 / 0.05**2, 8)
        assert bool(np.all(np.asarray(ok)))
        np.testing.assert_allclose(mean_of(stats), brute_mean(train, y, 0.05), atol=2e-6)


def test_certificate_refuses_when_pruned_points_carry_weight():
    """A query equidistant from 200 points (>> prune sub-blocks): pruning would drop most
    of the mass; the certificate refuses and softmax_stats falls back to the full pass."""
    rng = np.random.default_rng(3)
    u = rng.normal(size=(200, 8))
    train = u / np.linalg.norm(u, axis=1, keepdims=True)
    tab = EmpiricalScore.create(EDM(), train, chunk=64)
    y = np.zeros((3, 8))
    yj = jnp.asarray(y, jnp.float32)
    stats, ok = pruned_softmax_stats(tab, yj, 0.5 / 0.01**2, 8)
    assert not np.any(np.asarray(ok))
    ref = brute_mean(train, y, 0.01)
    assert np.abs(mean_of(stats) - ref).max() > 0.01  # what pruning would have returned
    got = mean_of(softmax_stats(tab, yj, 0.5 / 0.01**2))
    np.testing.assert_allclose(got, ref, atol=5e-5)  # float32 matmul logits at sigma 0.01


def test_the_gate_never_rules_out_a_certifiable_query():
    """may_certify is a necessary condition: over noise levels from 1e-3 to 30, no query is
    certified where the gate said no, and both are reached."""
    x = load_digits().data[:500] / 8 - 1
    tab = EmpiricalScore.create(EDM(), x)
    rng = np.random.default_rng(4)
    gates, certs = [], []
    for s in np.geomspace(1e-3, 30, 12):
        y = jnp.asarray(x[rng.integers(0, 500, 64)] + s * rng.normal(size=(64, 64)), jnp.float32)
        _, ok = pruned_softmax_stats(tab, y, 0.5 / s**2, 8)
        gate = np.asarray(may_certify(tab, y, 0.5 / s**2))
        assert not np.any(np.asarray(ok) & ~gate)
        gates.append(gate.mean())
        certs.append(np.asarray(ok).mean())
    assert gates[0] == 1 and gates[-1] == 0 and certs[0] == 1 and certs[-1] == 0


@pytest.mark.parametrize("sigma", [0.01, 0.3, 3.0])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_same_answer_with_and_without_pruning(sigma):
    """Heun-like queries at small, middle and large noise: prune=8 and prune=0 agree with
    the float64 loop (the branch taken does not change the answer)."""
    x = load_digits().data[:400] / 8 - 1
    rng = np.random.default_rng(5)
    y = x[rng.integers(0, 400, 16)] + sigma * rng.normal(size=(16, 64))
    ref = brute_mean(x, y, sigma)
    for prune in (0, 8):
        tab = EmpiricalScore.create(EDM(), x, prune=prune)
        got = mean_of(softmax_stats(tab, jnp.asarray(y, jnp.float32), 0.5 / sigma**2))
        np.testing.assert_allclose(got, ref, atol=3e-5)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_the_cfdm_regime_is_pruned():
    """sigma-CFDM on the digits (rectified flow, t in [0.95, 1), perturbed queries): every
    query is certified, so the fast path is the one that runs."""
    x = load_digits().data / 8 - 1
    tab = EmpiricalScore.create(RectifiedFlow(), x)
    rng = np.random.default_rng(6)
    for t in (0.95, 0.97, 0.99):
        xt = t * x[rng.integers(0, len(x), 256)] + (1 - t) * rng.normal(size=(256, 64))
        y = (xt + 0.4 * rng.normal(size=xt.shape)) / t  # VE frame of a perturbed query
        s = (1 - t) / t
        yj = jnp.asarray(y, jnp.float32)
        assert bool(np.all(np.asarray(may_certify(tab, yj, 0.5 / s**2))))
        _, ok = pruned_softmax_stats(tab, yj, 0.5 / s**2, 8)
        assert bool(np.all(np.asarray(ok)))
        full = mean_of(full_softmax_stats(tab, yj, 0.5 / s**2))
        np.testing.assert_allclose(mean_of(softmax_stats(tab, yj, 0.5 / s**2)), full, atol=1e-6)


def test_prune_auto_resolves_by_the_flattened_dimension():
    """``prune="auto"`` (the default) prunes from AUTO_PRUNE_MIN_DIM dimensions of a
    flattened point on and streams below; an explicit setting is kept as given."""
    low, high = AUTO_PRUNE_MIN_DIM - 1, AUTO_PRUNE_MIN_DIM
    assert EmpiricalScore.create(EDM(), np.zeros((3, low))).prune == 0
    assert EmpiricalScore.create(EDM(), np.zeros((3, high))).prune == AUTO_PRUNE > 0
    assert EmpiricalScore.create(EDM(), np.zeros((3, 2, high // 2 + 1))).prune == AUTO_PRUNE
    assert EmpiricalScore.create(EDM(), np.zeros((3, 2)), prune=5).prune == 5
    assert EmpiricalScore.create(EDM(), np.zeros((3, high)), prune=0).prune == 0
