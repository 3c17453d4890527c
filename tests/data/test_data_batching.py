"""Batches are pure functions of (seed, step, process_index), in Python and under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.data import (
    batch_indices,
    batch_keys,
    get_batch,
    get_dequantised_batch,
    level_spacing,
)


@pytest.fixture
def data():
    return np.arange(50 * 3, dtype=np.float32).reshape(50, 3)


def test_python_and_jit_agree(data):
    b = get_batch(data, 16, seed=1, step=7)
    assert isinstance(b, np.ndarray) and b.shape == (16, 3)
    step_fn = jax.jit(lambda d, s, p: get_batch(d, 16, seed=1, step=s, process_index=p))
    np.testing.assert_array_equal(step_fn(jnp.asarray(data), 7, 0), b)
    # rows are rows of the data set
    assert set(b[:, 0].tolist()) <= set(data[:, 0].tolist())
    np.testing.assert_array_equal(b, data[np.asarray(batch_indices(50, 16, seed=1, step=7))])


def test_contract(data):
    b = get_batch(data, 8, seed=0, step=3)
    np.testing.assert_array_equal(get_batch(data, 8, seed=0, step=3), b)
    parts = [get_batch(data, 4, seed=0, step=3, process_index=p) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(parts), b)  # global batch independent of P
    assert not np.array_equal(parts[0], parts[1])
    assert not np.array_equal(get_batch(data, 8, seed=0, step=4), b)
    assert not np.array_equal(get_batch(data, 8, seed=1, step=3), b)


def test_indices_cover_uniformly():
    n = 10
    idx = np.concatenate([np.asarray(batch_indices(n, 50, seed=0, step=s)) for s in range(40)])
    assert idx.min() >= 0 and idx.max() < n
    counts = np.bincount(idx, minlength=n)
    expected = idx.size / n
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_errors(data):
    with pytest.raises(ValueError, match="batch_size"):
        get_batch(data, 0, seed=0, step=0)
    with pytest.raises(ValueError, match="empty"):
        get_batch(data[:0], 4, seed=0, step=0)


def test_batch_keys_are_the_documented_fold_ins():
    """Example j of process p at (seed, step) uses fold_in(fold_in(key(seed), step), p B + j),
    written out here with plain fold_in (the rule the library's data, objectives and
    samplers share), in Python and with traced integers under jit."""
    b = 3
    for p in (0, 2):
        step_key = jax.random.fold_in(jax.random.key(5), 11)
        want = [jax.random.fold_in(step_key, p * b + j) for j in range(b)]
        got = batch_keys(b, seed=5, step=11, process_index=p)
        jitted = jax.jit(lambda s, t, q: batch_keys(b, seed=s, step=t, process_index=q))(5, 11, p)
        for keys in (got, jitted):
            np.testing.assert_array_equal(
                jax.random.key_data(keys), np.stack([jax.random.key_data(k) for k in want])
            )
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        batch_keys(0, seed=0, step=0)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_dequantised_batch_is_the_batch_plus_uniform_noise_over_each_bin():
    """Each value of the dequantised batch lies in its own level's bin around the plain
    batch's value; the noise is U(-delta/2, delta/2) (mean 0 and variance delta^2 / 12
    within 5 standard errors, every value inside the bin); the
    contract of get_batch holds (same call, jit, processes, prefix), and two examples that
    draw the same row get different noise."""
    levels = 17
    delta = level_spacing(levels)
    rows = np.random.default_rng(0).integers(0, levels, size=(6, 4, 4, 1))
    data = (rows / 8.0 - 1.0).astype(np.float32)  # the digits' levels
    b = np.asarray(get_dequantised_batch(data, 256, delta, seed=2, step=5))
    plain = get_batch(data, 256, seed=2, step=5)
    u = (b - plain) / delta
    assert np.all(np.abs(u) <= 0.5 + 1e-5)  # float32 rounding of x + u delta - x
    assert abs(u.mean()) < 5 * np.sqrt(1 / 12 / u.size)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt(1 / 180 / u.size)  # Var(u^2) = 1/80 - 1/144
    np.testing.assert_array_equal(get_dequantised_batch(data, 256, delta, seed=2, step=5), b)
    fn = jax.jit(
        lambda d, s, p: get_dequantised_batch(d, 8, delta, seed=2, step=s, process_index=p)
    )
    parts = [np.asarray(fn(jnp.asarray(data), 5, p)) for p in (0, 1)]
    np.testing.assert_allclose(np.concatenate(parts), b[:16], rtol=0, atol=1e-6)
    idx = np.asarray(batch_indices(len(data), 256, seed=2, step=5))
    i, j = np.flatnonzero(idx == idx[0])[:2]  # 256 draws of 6 rows: a repeated row
    assert not np.allclose(b[i], b[j])
    with pytest.raises(ValueError, match="delta"):
        get_dequantised_batch(data, 4, 0.0, seed=0, step=0)
