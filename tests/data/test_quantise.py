"""quantise: clip and round to the data's own grey levels, as saving an image does."""

import numpy as np
import pytest

from scorelib.data.images import load_digits, quantise


def test_levels_against_integer_rounding():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.5, 1.5, 10_000)
    for levels in (2, 17, 256):
        q = quantise(x, levels)
        # independent: the integer code of the nearest level, by brute force over all levels
        grid = np.linspace(-1.0, 1.0, levels)
        nearest = grid[np.argmin(np.abs(np.clip(x, -1, 1)[:, None] - grid[None, :]), axis=1)]
        np.testing.assert_allclose(q, nearest, atol=1e-6)
        assert q.dtype == np.float32 and q.shape == x.shape
        assert len(np.unique(q)) == levels  # every level reached, no other value


def test_data_on_its_levels_is_unchanged():
    d = load_digits()
    assert d.levels == 17
    np.testing.assert_array_equal(quantise(d.train, d.levels), d.train)
    u8 = np.arange(256, dtype=np.uint8)
    x = u8.astype(np.float32) / 127.5 - 1.0  # the 8-bit mapping of the image loaders
    np.testing.assert_array_equal(quantise(x, 256), x)
    # [0, 1] range: 8-bit data x / 255
    y = u8.astype(np.float32) / 255.0
    np.testing.assert_array_equal(quantise(y, 256, low=0.0, high=1.0), y)


def test_clips_out_of_range_and_rounds_to_nearest():
    step = 2.0 / 16
    x = np.array([-1.8, 1.8, -1.0 + 0.49 * step, -1.0 + 0.51 * step, 0.0])
    np.testing.assert_allclose(quantise(x, 17), [-1.0, 1.0, -1.0, -1.0 + step, 0.0], atol=1e-7)


def test_errors():
    with pytest.raises(ValueError, match="levels must be an integer >= 2"):
        quantise(np.zeros(3), 1)
    with pytest.raises(ValueError, match="high must be"):
        quantise(np.zeros(3), 17, low=1.0, high=1.0)
    with pytest.raises(ValueError, match="x must be finite"):
        quantise(np.array([0.0, np.nan]), 17)
