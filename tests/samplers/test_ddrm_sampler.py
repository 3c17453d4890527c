"""DDRM (``scorelib.samplers.ddrm``) against an independent float64 numpy implementation.

* Two steps of the sampler against the paper's update (Kawar et al., NeurIPS 2022, eqs. 7-8,
  with ``sigma_t`` the level stepped to, as bahjat-kawar/ddrm ``functions/denoising.py``)
  written here per example and per singular direction, on the dense SVD of the operator's
  matrix (``numpy.linalg.svd``), the closed-form Gaussian denoiser and the noise rebuilt
  from the driver's documented key scheme (EDM ending at 0, VP ending above 0; both the
  "quiet" ``sigma' < sigma_y / s_j`` and the "loud" branch taken).
* Noiseless measurements with ``eta_b = 1``: the sample's measured part is the measurement
  (``A x = y`` to float precision) for inpainting and downsampling; not with ``eta_b < 1``.
* Refusals (a source that is not a MeasuredScore, an operator without an SVD, several noise
  levels, ``eta`` / ``eta_b`` outside ``[0, 1]``), ``info["nfe"]`` against a count of the
  prior's denoiser calls at run time, and a batch in CPU blocks against single examples.
"""

from __future__ import annotations

from typing import Any

import closed_forms as cf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scorelib import operators as ops
from scorelib.processes import EDM, VP
from scorelib.samplers import ddrm, driver, edm_grid
from scorelib.scores import GaussianScore, ScoreSource
from scorelib.scores.measured import MeasuredScore, posterior_source
from scorelib.scores.posterior import operator_matrix


def correlated(process, shape, seed=0):
    """``(prior, mu, cov)`` with a random full covariance."""
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    b = rng.normal(size=(d, d))
    cov = b @ b.T / d + 0.1 * np.eye(d)
    mu = rng.normal(size=d)
    return GaussianScore.from_covariance(process, mu, cov, shape), mu, cov


def driver_noise(key, first_index, batch, steps, data_shape):
    """The driver's draws (its module docstring): example ``b`` owns
    ``k_b = fold_in(key, first_index + b)``, starts from ``normal(fold_in(k_b, 0))`` and scan
    index ``i`` draws ``normal(fold_in(fold_in(k_b, i + 1), 0))``. Call inside x64."""

    def draw(k):
        return np.asarray(jax.random.normal(k, data_shape, jnp.float64)).reshape(-1)

    ks = [jax.random.fold_in(key, first_index + b) for b in range(batch)]
    start = np.stack([draw(jax.random.fold_in(k, 0)) for k in ks])
    steps_eps = [
        np.stack([draw(jax.random.fold_in(jax.random.fold_in(k, i + 1), 0)) for k in ks])
        for i in range(steps)
    ]
    return start, steps_eps


def ddrm_reference(process, mu, cov, a_mat, ys, sigma_y, grid, x_start, eps, eta, eta_b):
    """DDRM in float64 numpy, one example and one singular direction at a time.

    VE frame ``x / alpha``; ``A = U diag(s) V^T`` by ``numpy.linalg.svd`` (rank ``r``);
    ``x0 = mu + C (C + sigma^2 I)^-1 (x - mu)``. Per step to ``sigma'``: the part off
    ``A``'s row space is ``x0 + sqrt(1 - eta^2) sigma' (x - x0) / sigma + eta sigma' eps``
    (projected off the row space); along ``v_j`` with ``n_j = sigma_y / s_j`` and
    ``yb_j = u_j^T y / s_j``: if ``sigma' < n_j``,
    ``xb0_j + sqrt(1 - eta^2) sigma' (yb_j - xb0_j) / n_j + eta sigma' eps_j``, else
    ``(1 - eta_b) xb0_j + eta_b yb_j + sqrt(sigma'^2 - eta_b^2 n_j^2) eps_j``.
    Returns the samples (process coordinates at ``grid[-1]``) and the branch counts."""
    u, s, vt = np.linalg.svd(a_mat, full_matrices=False)
    r = int(np.sum(s > 1e-10 * s[0]))
    u, s, v = u[:, :r], s[:r], vt[:r].T
    eye = np.eye(len(mu))
    c = np.sqrt(1.0 - eta**2)
    out, counts = [], {"quiet": 0, "loud": 0}
    for b in range(len(x_start)):
        x = x_start[b] / cf.alpha_at_ve_sigma(process, grid[0])
        yb = (u.T @ ys[b]) / s
        for i in range(len(grid) - 1):
            sig, nxt = grid[i], grid[i + 1]
            x0 = mu + cov @ np.linalg.solve(cov + sig**2 * eye, x - mu)
            e = eps[i][b]
            off = x0 + c * nxt * (x - x0) / sig + eta * nxt * e
            xb0, eb = v.T @ x0, v.T @ e
            row = np.empty(r)
            for j in range(r):
                n_j = sigma_y / s[j]
                if nxt < n_j:
                    row[j] = xb0[j] + c * nxt * (yb[j] - xb0[j]) / n_j + eta * nxt * eb[j]
                    counts["quiet"] += 1
                else:
                    var = nxt**2 - (eta_b * n_j) ** 2
                    row[j] = (1 - eta_b) * xb0[j] + eta_b * yb[j] + np.sqrt(var) * eb[j]
                    counts["loud"] += 1
            x = off - v @ (v.T @ off) + v @ row
        out.append(x * cf.alpha_at_ve_sigma(process, grid[-1]))
    return np.stack(out), counts


OPERATORS = {  # name: (data shape, make(key, shape))
    "projection": ((6,), lambda key, shape: ops.RandomProjection.create(key, shape, 3)),
    "blur": ((4, 4, 1), lambda key, shape: ops.GaussianBlur.create(shape, 0.8, 3)),
}


@pytest.mark.parametrize("op_name", list(OPERATORS))
@pytest.mark.parametrize(
    "process, grid",
    [(EDM(), [1.5, 0.3, 0.0]), (VP(), [2.0, 0.3, 0.05])],
    ids=["edm-to-0", "vp-above-0"],
)
def test_two_steps_against_the_paper_update(process, grid, op_name):
    """Batch 3 from first index 1, two measurements held by two examples each (examples 1,
    2, 3 read measurements 0, 1, 1); a random projection and a blur (its Kronecker SVD)."""
    sigma_y, eta, eta_b = 0.2, 0.85, 0.7
    shape, make = OPERATORS[op_name]
    key, first, batch = jax.random.key(4), 1, 3
    grid = np.asarray(grid)
    with jax.enable_x64(True):
        d = int(np.prod(shape))
        prior, mu, cov = correlated(process, shape, seed=1)
        meas = ops.Measurement.create(make(key, shape), sigma_y)
        a_mat = operator_matrix(meas, d, shape)
        ys = np.random.default_rng(2).normal(size=(2, meas.operator.m))
        src = posterior_source("ddrm", prior, meas, ys, repeats=2)
        x, info = ddrm(
            src,
            key,
            (batch, *shape),
            grid=grid,
            first_index=first,
            float64=True,
            eta=eta,
            eta_b=eta_b,
        )
        start, eps = driver_noise(key, first, batch, len(grid) - 1, shape)
    a0 = cf.alpha_at_ve_sigma(process, grid[0])
    x_start = a0 * grid[0] * start
    want, counts = ddrm_reference(
        process, mu, cov, a_mat, ys[[0, 1, 1]], sigma_y, grid, x_start, eps, eta, eta_b
    )
    assert counts["quiet"] > 0 and counts["loud"] > 0, counts  # both branches checked
    x = np.asarray(x).reshape(batch, d)
    np.testing.assert_allclose(x, want, rtol=0, atol=1e-11 * np.abs(want).max())
    assert info == {"nfe": 2, "steps": 2}


@pytest.mark.parametrize("op_name", ["inpainting", "downsample"])
def test_noiseless_measurements_are_kept_exactly(op_name):
    """float64 (source built under x64) to 1e-12, float32 to 1e-5, relative to ``max |y|``."""
    shape = (4, 4, 1)
    ys = np.random.default_rng(4).normal(size=(3, 8 if op_name == "inpainting" else 4))
    grid = edm_grid(8, 0.002, 80.0)

    def source():
        prior, _, _ = correlated(EDM(), shape, seed=3)
        op = {
            "inpainting": lambda: ops.Inpainting.random(jax.random.key(1), shape, 0.5),
            "downsample": lambda: ops.Downsample.create(shape, 2),
        }[op_name]()
        return op, posterior_source("ddrm", prior, ops.Measurement.create(op, 0.0), ys)

    with jax.enable_x64(True):
        op, src = source()
        x, _ = ddrm(src, jax.random.key(0), (3, *shape), grid=grid, float64=True)
        assert np.abs(np.asarray(op.A(x)) - ys).max() < 1e-12 * np.abs(ys).max()
        # eta_b < 1 mixes the denoiser into the measured part: the check can fail
        x, _ = ddrm(src, jax.random.key(0), (3, *shape), grid=grid, float64=True, eta_b=0.5)
        assert np.abs(np.asarray(op.A(x)) - ys).max() > 1e-2
    op, src = source()
    x, _ = ddrm(src, jax.random.key(0), (3, *shape), grid=grid)
    assert x.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(x)))
    assert np.abs(np.asarray(op.A(x), np.float64) - ys).max() < 1e-5 * np.abs(ys).max()


def _refusal_cases():
    shape = (4, 4, 1)
    prior, _, _ = correlated(EDM(), shape)
    down = ops.Measurement.create(ops.Downsample.create(shape, 2), 0.1)
    no_svd = ops.Stacked.create([ops.GaussianBlur.create(shape, 0.8, 3)])  # a blur, no SVD
    no_svd = ops.Measurement.create(no_svd, 0.1)
    stacked = ops.Measurement.stack([down, ops.Measurement.create(ops.Identity.create(shape), 0.3)])
    several = ops.Measurement(operator=down.operator, sigma_y=jnp.array([0.1, 0.2, 0.1, 0.2]))
    good = MeasuredScore.create(prior, down, np.zeros(4))
    return {
        "prior": (prior, {}, "source"),
        "no_svd": (MeasuredScore.create(prior, no_svd, np.zeros(16)), {}, "method.name"),
        "stacked": (MeasuredScore.create(prior, stacked, np.zeros(20)), {}, "method.name"),
        "several": (MeasuredScore.create(prior, several, np.zeros(4)), {}, "method.name"),
        "eta_high": (good, {"eta": 1.5}, "sampler.eta"),
        "eta_low": (good, {"eta": -0.1}, "sampler.eta"),
        "eta_b": (good, {"eta_b": 2.0}, "sampler.eta_b"),
    }


@pytest.mark.parametrize(
    "case", ["prior", "no_svd", "stacked", "several", "eta_high", "eta_low", "eta_b"]
)
def test_refusals_name_their_field(case):
    source, opts, field = _refusal_cases()[case]
    with pytest.raises(ValueError, match=rf"^{field} must ") as e:
        ddrm(source, jax.random.key(0), (2, 4, 4, 1), grid=edm_grid(3), **opts)
    assert "\n" not in str(e.value)


def test_an_option_ddrm_does_not_use_is_refused():
    source = _refusal_cases()["eta_b"][0]
    with pytest.raises(ValueError, match="^sampler.S_churn is not used by sampler ddrm"):
        ddrm(source, jax.random.key(0), (2, 4, 4, 1), grid=edm_grid(3), S_churn=1.0)


CALLS: list = []


class Counting(ScoreSource):
    """A prior that counts its denoiser calls when they run (a host callback into CALLS)."""

    inner: Any = None

    def denoiser(self, x, t):
        jax.debug.callback(lambda: CALLS.append(1))
        return self.inner.denoiser(x, t)


@pytest.mark.parametrize("steps", [1, 5])
def test_nfe_is_the_number_of_prior_calls(steps):
    shape = (4, 4, 1)
    prior, _, _ = correlated(EDM(), shape)
    CALLS.clear()
    counting = Counting(process=prior.process, inner=prior)
    meas = ops.Measurement.create(ops.Downsample.create(shape, 2), 0.1)
    src = MeasuredScore.create(counting, meas, np.zeros(4))
    _, info = ddrm(src, jax.random.key(0), (2, *shape), grid=edm_grid(steps))
    jax.effects_barrier()
    assert info == {"nfe": steps, "steps": steps}
    assert len(CALLS) == steps


def test_a_batch_in_blocks_equals_single_examples(monkeypatch):
    """Batch 5 from first index 2 in blocks of 2 against 5 calls of one example; each
    example reads its own measurement ((2 + b) % 3)."""
    shape = (4, 4, 1)
    prior, _, _ = correlated(EDM(), shape, seed=5)
    meas = ops.Measurement.create(ops.Inpainting.random(jax.random.key(2), shape, 0.5), 0.05)
    ys = np.random.default_rng(6).normal(size=(3, meas.operator.m))
    src = posterior_source("ddrm", prior, meas, ys)
    grid, key = edm_grid(4, 0.01, 10.0), jax.random.key(7)
    monkeypatch.setattr(driver, "CPU_CHUNK", 2)
    blocks, _ = ddrm(src, key, (5, *shape), grid=grid, first_index=2)
    ones = [ddrm(src, key, (1, *shape), grid=grid, first_index=2 + i)[0] for i in range(5)]
    np.testing.assert_allclose(np.asarray(blocks), np.concatenate(ones), rtol=1e-5, atol=1e-5)
    kept = np.asarray(meas.operator.A(blocks))  # near each example's own measurement
    reads = [(2 + b) % 3 for b in range(5)]
    assert np.abs(kept - ys[reads]).max() < 0.5
    assert np.abs(kept - ys[[0] * 5]).max() > 1.0
