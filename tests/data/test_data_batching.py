"""Batches are pure functions of (seed, step, process_index), in Python and under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.data import batch_indices, batch_keys, get_batch


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
