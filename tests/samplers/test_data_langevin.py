"""Early-stopped Langevin from the data (Koehler and Vuong 2024): mode weights kept from the
data where Langevin from noise loses them, ULA's moments after k steps against their closed
form, the key rule, recorded stops, and bad input."""

import jax
import numpy as np
import pytest

from scorelib.data.targets import GaussianMixtureTarget
from scorelib.metrics.modes import mode_statistics
from scorelib.processes.edm import EDM
from scorelib.samplers.data_langevin import langevin_from_data, langevin_from_noise

T = 0.002  # the vanilla score's time: EDM's sigma_min, far below the modes' std 0.5
TWO = GaussianMixtureTarget.create([0.8, 0.2], [[4.0], [-4.0]], stds=[0.5, 0.5])


def test_from_data_keeps_the_weights_and_from_noise_loses_them():
    """Modes 8 std apart: no chain crosses in 500 steps of h = 0.01, so from the data each
    mode keeps its share of the starts (the weights, within their standard error over the
    data and the chains), and from N(0, 1) each mode gets its basin's share of the start law
    (the basins meet at x = -log(4)/32, so the 0.8 mode gets Phi(0.043) = 0.517)."""
    source = TWO.noisy_score(EDM())
    n, N = 4000, 2000
    data = np.asarray(TWO.sample(jax.random.key(1), N))
    kw = dict(t=T, step_size=0.01, n_steps=500, num_samples=n)
    x, start = langevin_from_data(source, jax.random.key(2), data, **kw)
    stats = mode_statistics(x, TWO)
    se = np.sqrt(0.8 * 0.2 * (1 / n + 1 / N))
    share = stats["mass"][0] / stats["mass"].sum()
    assert abs(share - 0.8) < 4 * se, (share, se)
    assert stats["off_mode"] < 0.02
    # every chain ends in the mode it started in
    assert np.array_equal(x[:, 0] > 0, data[start, 0] > 0)
    z = langevin_from_noise(source, jax.random.key(2), (1,), init_scale=1.0, **kw)
    noise = mode_statistics(z, TWO)
    share_noise = noise["mass"][0] / noise["mass"].sum()
    assert abs(share_noise - 0.517) < 4 * np.sqrt(0.25 / n)
    assert abs(share_noise - 0.8) > 20 * se  # the failure the method avoids


def test_ula_moments_after_k_steps_match_their_closed_form():
    """N(m, v) from N(0, s0^2): after k steps of h, mean m (1 - a^k) and variance v_inf +
    a^(2k) (s0^2 - v_inf), a = 1 - h / v, v_inf = v / (1 - h / (2 v)); each within 4 standard
    errors, at every recorded stop of one run."""
    m, v, h, s0, n = 1.0, 0.25, 0.02, 0.2, 20000
    one = GaussianMixtureTarget.create([1.0], [[m]], stds=[np.sqrt(v)])
    stops = (0, 3, 10, 40, 200)
    x = langevin_from_noise(
        one.noisy_score(EDM()),
        jax.random.key(5),
        (1,),
        t=T,
        step_size=h,
        n_steps=stops,
        num_samples=n,
        init_scale=s0,
    )
    assert x.shape == (len(stops), n, 1)
    v = v + T**2  # the source is p_t at sigma = T
    a = 1 - h / v
    v_inf = v / (1 - h / (2 * v))
    for i, k in enumerate(stops):
        mean_k = m * (1 - a**k)
        var_k = v_inf + a ** (2 * k) * (s0**2 - v_inf)
        got = x[i, :, 0]
        assert abs(got.mean() - mean_k) < 4 * np.sqrt(var_k / n), (k, got.mean(), mean_k)
        assert abs(got.var(ddof=1) / var_k - 1) < 4 * np.sqrt(2 / (n - 1)), (k, got.var(), var_k)


def test_key_rule_and_recorded_stops():
    """Chain i depends on fold_in(key, i) only (a slice with first_index is the same), and
    the state recorded at step K on the way to a later stop is the state of a run stopped at
    K."""
    source = TWO.noisy_score(EDM())
    data = np.asarray(TWO.sample(jax.random.key(0), 50))
    kw = dict(t=T, step_size=0.01)
    whole, s_whole = langevin_from_data(
        source, jax.random.key(4), data, n_steps=7, num_samples=6, **kw
    )
    part, s_part = langevin_from_data(
        source, jax.random.key(4), data, n_steps=7, num_samples=2, first_index=4, **kw
    )
    np.testing.assert_array_equal(whole[4:], part)
    np.testing.assert_array_equal(s_whole[4:], s_part)
    rec, _ = langevin_from_data(
        source, jax.random.key(4), data, n_steps=(0, 7, 9), num_samples=6, **kw
    )
    np.testing.assert_allclose(rec[1], whole, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rec[0], data[s_whole])  # step 0: the drawn examples


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(step_size=0.0), "step_size must be a number in (0.0, inf)"),
        (dict(n_steps=(5, 3)), "n_steps must be an integer >= 0 or strictly increasing"),
        (dict(n_steps=-1), "n_steps must be an integer"),
        (dict(t=0.0), "t must be a number in [0.002, 80.0]"),
        (dict(t=100.0), "t must be a number in [0.002, 80.0]"),
        (dict(data=np.zeros((0, 1), np.float32)), "data must be [N, *data_shape] with N >= 1"),
        (dict(num_samples=0), "num_samples must be an integer"),
        (dict(data=np.zeros((5, 2), np.float32)), "data must have shape"),
        (dict(data=np.full((5, 1), np.nan, np.float32)), "data must be finite values"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(kw, needle):
    args = dict(t=T, step_size=0.01, n_steps=3, num_samples=2, data=np.zeros((5, 1), np.float32))
    args.update(kw)
    data = args.pop("data")
    with pytest.raises(ValueError, match=None) as e:
        langevin_from_data(TWO.noisy_score(EDM()), jax.random.key(0), data, **args)
    assert needle in str(e.value), str(e.value)


def test_noise_start_shape_must_be_the_sources():
    with pytest.raises(ValueError, match=r"data_shape must be the source's data shape \[1\]"):
        langevin_from_noise(
            TWO.noisy_score(EDM()),
            jax.random.key(0),
            (2,),
            t=T,
            step_size=0.01,
            n_steps=1,
            num_samples=2,
        )


def test_mean_displacement_by_hand():
    from scorelib.metrics import mean_displacement

    start = np.zeros((2, 1))
    x = np.array([[0.5], [-1.5]])  # moved 0.5 and 1.5: mean 1, in units of std 0.5 -> 2
    assert mean_displacement(x, start, TWO) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="start must be of x's shape"):
        mean_displacement(x, np.zeros((3, 1)), TWO)
