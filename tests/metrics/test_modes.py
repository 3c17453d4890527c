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


# ---------------------------------------------------------------------- many-well modes
def test_well_weights_and_barrier_against_scipy():
    from scipy.integrate import quad
    from scipy.optimize import brentq

    from scorelib.data.targets import ManyWellTarget
    from scorelib.metrics.modes import well_barrier, well_mode_statistics

    tg = ManyWellTarget.create(4)
    e = lambda x: x**4 - 6 * x**2 - 0.5 * x  # noqa: E731
    barrier = brentq(lambda x: 4 * x**3 - 12 * x - 0.5, -0.5, 0.5)
    assert well_barrier(tg) == pytest.approx(barrier, abs=1e-10)
    right = (
        quad(lambda x: np.exp(-e(x)), barrier, 10)[0] / quad(lambda x: np.exp(-e(x)), -10, 10)[0]
    )
    assert -0.05 < barrier < -0.04  # c = 0.5 tilts the wells to the right
    s = well_mode_statistics(np.full((1, 4), -0.1), tg)
    assert s["right_weight"] == pytest.approx(right, abs=1e-6)
    w = np.array([(1 - right) ** 2, right * (1 - right), right * (1 - right), right**2])
    np.testing.assert_allclose(s["weights"], w, rtol=1e-5)
    # every sample left of the barrier: the all-left mode only
    assert s["mass"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert s["tv"] == pytest.approx(1 - w[0])


def test_well_statistics_separate_exact_from_stuck_samples():
    from scorelib.data.targets import ManyWellTarget
    from scorelib.metrics.modes import well_mode_statistics

    tg = ManyWellTarget.create(4)
    n = 20000
    x = np.asarray(tg.sample(jax.random.key(0), n))
    s = well_mode_statistics(x, tg)
    assert np.all(np.abs(s["mass"] - s["weights"]) < 4 * np.sqrt(s["weights"] / n))
    assert s["tv"] < 0.01
    assert np.allclose(s["right"], s["right_weight"], atol=4 * np.sqrt(0.15 / n))
    stuck = x.copy()  # Langevin from N(0, 1): each well by the sign of its start
    stuck[:, [0, 2]] = np.abs(stuck[:, [0, 2]]) * np.sign(
        np.random.default_rng(0).normal(size=(n, 2))
    )
    assert well_mode_statistics(stuck, tg)["tv"] > 0.3
    with pytest.raises(ValueError, match="samples must be of shape"):
        well_mode_statistics(x[:, :3], tg)
    with pytest.raises(ValueError, match="^target must be a double well"):
        well_mode_statistics(x, ManyWellTarget.create(4, b=-1.0))
