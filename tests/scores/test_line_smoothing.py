"""The smoothed piecewise-linear empirical score of points on a line (Chen 2025): its
denoiser by hand (EDM and VP), the Heun sampler's endpoints against the closed-form flow map,
the endpoint law (atoms and the interpolated mass) against its closed form within standard
errors, the exact empirical score's memorisation beside it, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib.processes.edm import EDM
from scorelib.processes.vp import VP
from scorelib.samplers import edm_grid, heun
from scorelib.scores import EmpiricalScore
from scorelib.scores.line_smoothing import SmoothedLineScore, endpoint, endpoint_law

U = np.array([1.0, 1.0]) / np.sqrt(2)  # the line's direction in R^2
O = np.array([0.0, 1.0])  # its origin
Y = np.array([-3.0, -1.0, 1.0, 3.0])  # four points, half gap h = 1


def on_line(a, normal=0.0):
    n = np.array([-U[1], U[0]])
    return (O + np.asarray(a)[:, None] * U + np.asarray(normal)[..., None] * n).astype(np.float32)


def test_denoiser_by_hand():
    """sigma = 0.4, kappa = 0.5: delta = 0.2, gap (-1, 1)'s ramp |a| < 0.8 maps a to a / 0.8;
    a = 0.9 is beside it (lands on 1); the normal part is removed."""
    s = SmoothedLineScore.create(EDM(), Y, kappa=0.5, direction=U, origin=O)
    x = on_line([0.4, 0.9, -2.5, 3.5], normal=[0.3, -0.2, 0.0, 1.0])
    d = np.asarray(s.denoiser(jnp.asarray(x), 0.4))
    np.testing.assert_allclose(d, on_line([0.5, 1.0, -2.0 - 0.5 / 0.8, 3.0]), atol=1e-6)
    # under VP the same in the VE frame: D(alpha x, t) with ve_sigma(t) = 0.4
    vp = VP()
    t = float(vp.t_of_ve_sigma(jnp.asarray(0.4)))
    sv = SmoothedLineScore.create(vp, Y, kappa=0.5, direction=U, origin=O)
    alpha = float(vp.alpha(jnp.asarray(t)))
    np.testing.assert_allclose(np.asarray(sv.denoiser(jnp.asarray(alpha * x), t)), d, atol=1e-5)


@pytest.mark.parametrize("kappa", [0.0, 0.5, 2.0])
def test_heun_endpoints_and_law_match_the_closed_forms(kappa):
    """From the noised training set at sigma0 = 0.4 along the line (and normal noise), Heun's
    endpoints are the closed-form flow map's (to 2e-3 of the gap), the normal distance is 0,
    and the map's masses on each point and between them are the endpoint law's within 4
    s.e."""
    n, sigma0 = 4000, 0.4
    rng = np.random.default_rng(0)
    a0 = Y[rng.integers(0, 4, n)] + sigma0 * rng.normal(size=n)
    x0 = on_line(a0, normal=sigma0 * rng.normal(size=n))
    s = SmoothedLineScore.create(EDM(), Y, kappa=kappa, direction=U, origin=O)
    grid = edm_grid(64, sigma_min=1e-3, sigma_max=sigma0)
    x, _ = heun(s, jax.random.key(0), x0.shape, grid=grid, x_T=x0)
    x = np.asarray(x)
    a = (x - O) @ U
    normal = np.linalg.norm(x - O - a[:, None] * U, axis=1)
    assert normal.max() < 1e-4
    np.testing.assert_allclose(a, endpoint(a0, Y, kappa=kappa, sigma0=sigma0), atol=2e-3)
    # the law: the closed-form map sends exactly the atoms' starts onto a point
    law = endpoint_law(Y, kappa=kappa, sigma0=sigma0)
    mapped = endpoint(a0, Y, kappa=kappa, sigma0=sigma0)
    for j, y in enumerate(Y):
        got, w = np.mean(mapped == y), law["atoms"][j]
        assert abs(got - w) <= 4 * np.sqrt(w * (1 - w) / n), (y, got, w)
    between = law["between"]
    got = np.mean(~np.isin(mapped, Y))
    assert abs(got - between) <= 4 * np.sqrt(between * (1 - between) / n), (got, between)
    if kappa == 0.0:  # nothing moves along the line between the outer points
        inside = (a0 > Y[0]) & (a0 < Y[-1])
        np.testing.assert_allclose(a[inside], a0[inside], atol=2e-3)


def test_the_empirical_score_memorises_where_the_smoothed_one_interpolates():
    """The exact empirical score of the four points sends every start onto a training point;
    the smoothed score (kappa = 0.5, sigma0 = 0.4) leaves 1 - sum(atoms) of the mass between
    them, here 0.46."""
    n, sigma0 = 2000, 0.4
    rng = np.random.default_rng(1)
    a0 = Y[rng.integers(0, 4, n)] + sigma0 * rng.normal(size=n)
    x0 = on_line(a0)
    grid = edm_grid(64, sigma_min=1e-3, sigma_max=sigma0)
    exact = EmpiricalScore.create(EDM(), on_line(Y))
    x, _ = heun(exact, jax.random.key(0), x0.shape, grid=grid, x_T=x0)
    a = (np.asarray(x) - O) @ U
    assert np.abs(a[:, None] - Y[None]).min(axis=1).max() < 1e-3
    assert endpoint_law(Y, kappa=0.5, sigma0=sigma0)["between"] > 0.45


@pytest.mark.parametrize(
    "call,needle",
    [
        (
            lambda: SmoothedLineScore.create(EDM(), [1.0, 0.0], kappa=1, direction=U),
            "points must be",
        ),
        (lambda: SmoothedLineScore.create(EDM(), Y, kappa=-1, direction=U), "kappa must be"),
        (
            lambda: SmoothedLineScore.create(EDM(), Y, kappa=1, direction=[0, 0]),
            "direction must be",
        ),
        (
            lambda: SmoothedLineScore.create(EDM(), Y, kappa=1, direction=U, origin=[0.0]),
            "origin must be",
        ),
        (lambda: endpoint([0.0], Y, kappa=3.0, sigma0=0.4), "kappa must be kappa * sigma0 < 1"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(call, needle):
    with pytest.raises(ValueError) as e:
        call()
    assert needle in str(e.value), str(e.value)


def test_kappa_for_between_inverts_the_endpoint_law():
    from scorelib.scores.line_smoothing import kappa_for_between

    for kappa in (0.1, 0.7, 1.9):
        b = endpoint_law(Y, kappa=kappa, sigma0=0.4)["between"]
        assert abs(kappa_for_between(Y, b, sigma0=0.4) - kappa) < 1e-6
        bt = endpoint_law(Y, kappa=kappa, sigma0=0.4, tol=0.05)["between_tol"]
        assert abs(kappa_for_between(Y, bt, sigma0=0.4, tol=0.05) - kappa) < 1e-6
    assert kappa_for_between(Y, 1.0, sigma0=0.4) == 0.0  # more than kappa = 0 leaves
    assert abs(kappa_for_between(Y, 0.0, sigma0=0.4) - 2.5) < 1e-6  # h / sigma0


def test_line_statistics_by_hand():
    from scorelib.scores.line_smoothing import line_statistics

    x = on_line([-1.0, 0.0, 2.96, 3.5], normal=[0.0, 0.5, 0.0, -1.0])
    st = line_statistics(x, Y, direction=U, origin=O, tol=0.05)
    assert st["between"] == 0.5  # 0.0 (offset 1) and 3.5 (offset 0.5); 2.96 is within 0.05
    assert abs(st["distance"] - 0.375) < 1e-6
    assert abs(st["offset"] - (0 + 1 + 0.04 + 0.5) / 4) < 1e-6


@pytest.mark.parametrize("kappa", [0.0, 0.8])
def test_endpoint_law_within_tol_matches_the_map(kappa):
    """The closed-form mass within tol = 0.05 of each point equals the flow map's on 200k
    starts within 4 s.e."""
    n, sigma0, tol = 200_000, 0.4, 0.05
    rng = np.random.default_rng(2)
    a0 = Y[rng.integers(0, 4, n)] + sigma0 * rng.normal(size=n)
    e = endpoint(a0, Y, kappa=kappa, sigma0=sigma0)
    law = endpoint_law(Y, kappa=kappa, sigma0=sigma0, tol=tol)
    for j, y in enumerate(Y):
        got, w = np.mean(np.abs(e - y) <= tol), law["near"][j]
        assert abs(got - w) <= 4 * np.sqrt(w * (1 - w) / n), (y, got, w)
    b = law["between_tol"]
    got = np.mean(np.abs(e[:, None] - Y[None]).min(axis=1) > tol)
    assert abs(got - b) <= 4 * np.sqrt(b * (1 - b) / n)


def test_line_through_and_along_line_by_hand():
    from scorelib.scores.line_smoothing import along_line, line_through

    y, o, u = line_through(on_line(Y))
    np.testing.assert_allclose(y, Y + O @ U, atol=1e-5)  # measured from the foot, not O
    np.testing.assert_allclose(u, U, atol=1e-6)
    np.testing.assert_allclose(o, [-0.5, 0.5], atol=1e-6)  # the line's foot from 0
    np.testing.assert_allclose(
        along_line(on_line([2.0], normal=[1.0]), direction=U, origin=O), [2.0], atol=1e-6
    )
    with pytest.raises(ValueError, match="points must be points on one line"):
        line_through(np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.0]]))
