"""Mode statistics separate exact mixture samples from mode-dropping and blurred ones."""

import jax
import numpy as np
import pytest

from scorelib.data.targets import GaussianMixtureTarget
from scorelib.metrics.modes import mode_statistics

W = np.array([0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.22, 0.30])
ANG = np.arange(8) * np.pi / 4
TARGET = GaussianMixtureTarget.create(
    W, 2 * np.stack([np.cos(ANG), np.sin(ANG)], 1), stds=np.full(8, 0.15)
)


def test_exact_samples_cover_every_mode_with_the_true_mass():
    n = 20000
    x = np.asarray(TARGET.sample(jax.random.key(0), n))
    s = mode_statistics(x, TARGET)
    assert s["n_covered"] == 8
    assert np.all(np.abs(s["mass"] - W * (1 - np.exp(-4.5))) < 4 * np.sqrt(W / n))
    assert abs(s["off_mode"] - np.exp(-4.5)) < 4 * np.sqrt(np.exp(-4.5) / n)  # P(chi2_2 > 9)
    assert s["tv"] < 0.02


def test_dropped_and_blurred_modes_are_seen():
    x = np.asarray(TARGET.sample(jax.random.key(1), 8000))
    s = mode_statistics(x, TARGET)
    keep = np.linalg.norm(x - TARGET.means[0], axis=1) > 1.0  # drop the lightest mode
    dropped = mode_statistics(x[keep], TARGET)
    assert dropped["n_covered"] == 7 and not dropped["covered"][0]
    assert dropped["tv"] > s["tv"] + 0.01
    blurred = mode_statistics(x + 0.5 * np.random.default_rng(0).normal(size=x.shape), TARGET)
    assert blurred["off_mode"] > 0.5
    with pytest.raises(ValueError, match="samples must be finite"):
        mode_statistics(np.full((3, 2), np.nan), TARGET)
