"""scorelib.operators against independent float64 computations: each operator's dense matrix
is built by applying ``A`` to the basis vectors, then checked against numpy (adjoint,
SVD, pseudo-inverse, Penrose identities), a numpy reshape-mean (downsampling) and
``scipy.ndimage.convolve`` (blur; its Kronecker SVD against ``numpy.linalg.svd`` of the dense
matrix, and the spectrum it drops)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage

from scorelib import operators as ops

IMG = (6, 6, 1)
RGB = (4, 4, 3)


def _build(name):
    """The operator ``name`` (built inside x64, so its arrays are float64)."""
    key = jax.random.key(3)
    return {
        "identity_flat": lambda: ops.Identity.create((7,)),
        "inpaint_box": lambda: ops.Inpainting.box(IMG, (2, 4)),
        "inpaint_random": lambda: ops.Inpainting.random(key, RGB, 0.4),
        "downsample": lambda: ops.Downsample.create(IMG, 3),
        "downsample_rgb": lambda: ops.Downsample.create(RGB, 2),
        "blur": lambda: ops.GaussianBlur.create(IMG, 0.6, 3),
        "blur_rgb": lambda: ops.GaussianBlur.create(RGB, 0.5, 3),
        "projection": lambda: ops.RandomProjection.create(key, IMG, 20),
        "projection_flat": lambda: ops.RandomProjection.create(key, (8,), 8),
        "colour": lambda: ops.Colourisation.create(RGB),
    }[name]()


NAMES = [
    "identity_flat",
    "inpaint_box",
    "inpaint_random",
    "downsample",
    "downsample_rgb",
    "blur",
    "blur_rgb",
    "projection",
    "projection_flat",
    "colour",
]


def _dense(op):
    """``[m, d]``: column j is ``A e_j`` (one batched call on the identity)."""
    eye = jnp.eye(op.d, dtype=jnp.float64).reshape(op.d, *op.data_shape)
    return np.asarray(op.A(eye)).T


def _dense_t(op):
    """``[d, m]``: column i is ``A^T e_i``."""
    eye = jnp.eye(op.m, dtype=jnp.float64)
    return np.asarray(op.At(eye)).reshape(op.m, op.d).T


@pytest.mark.parametrize("name", NAMES)
def test_linear_algebra(name):
    with jax.enable_x64(True):
        op = _build(name)
        rng = np.random.default_rng(0)
        M = _dense(op)
        assert M.shape == (op.m, op.d)
        # adjointness with random probes, relative to ||A x|| ||v||
        x = rng.standard_normal((5, op.d))
        v = rng.standard_normal((5, op.m))
        Ax = np.asarray(op.A(jnp.asarray(x.reshape(5, *op.data_shape))))
        Atv = np.asarray(op.At(jnp.asarray(v))).reshape(5, op.d)
        np.testing.assert_allclose(Ax, x @ M.T, rtol=0, atol=1e-12)
        gap = np.abs(np.sum(Ax * v, 1) - np.sum(x * Atv, 1))
        assert np.all(gap <= 1e-10 * np.linalg.norm(Ax, axis=1) * np.linalg.norm(v, axis=1))
        # At is the dense transpose
        np.testing.assert_allclose(_dense_t(op), M.T, rtol=0, atol=1e-13)

        # pinv against numpy, and the Penrose identities on the dense pseudo-inverse
        # (pinv applied to the basis of y-space: equal to np.linalg.pinv(M) @ y for every y)
        P_np = np.linalg.pinv(M)
        eye_m = jnp.eye(op.m, dtype=jnp.float64)
        P = np.asarray(op.pinv(eye_m, rcond=1e-12)).reshape(op.m, op.d).T  # [d, m]
        np.testing.assert_allclose(P, P_np, rtol=0, atol=1e-8 * np.abs(P_np).max())
        scale = np.abs(M).max()
        np.testing.assert_allclose(M @ P @ M, M, rtol=0, atol=1e-8 * scale)
        np.testing.assert_allclose(P @ M @ P, P, rtol=0, atol=1e-8 * np.abs(P).max())

        svd = op.svd()
        s = np.asarray(svd.s)
        r = s.shape[0]
        eye_r = jnp.eye(r, dtype=jnp.float64)
        U = np.asarray(svd.U(eye_r)).T  # [m, r]
        V = np.asarray(svd.V(eye_r)).reshape(r, op.d).T  # [d, r]
        np.testing.assert_allclose(U.T @ U, np.eye(r), rtol=0, atol=1e-12)
        np.testing.assert_allclose(V.T @ V, np.eye(r), rtol=0, atol=1e-12)
        np.testing.assert_allclose(U @ np.diag(s) @ V.T, M, rtol=0, atol=1e-12 * scale)
        # Ut and Vt are the transposes of U and V
        Ut = np.asarray(svd.Ut(jnp.eye(op.m, dtype=jnp.float64))).T  # [r, m]
        eye_d = jnp.eye(op.d, dtype=jnp.float64).reshape(op.d, *op.data_shape)
        Vt = np.asarray(svd.Vt(eye_d)).T  # [r, d]
        np.testing.assert_allclose(Ut, U.T, rtol=0, atol=1e-13)
        np.testing.assert_allclose(Vt, V.T, rtol=0, atol=1e-13)
        s_np = np.linalg.svd(M, compute_uv=False)
        np.testing.assert_allclose(np.sort(s)[::-1], s_np[:r], rtol=1e-10)
        assert np.all(s_np[r:] <= 1e-10 * s_np[0])  # r is the rank


def test_downsample_is_a_block_mean():
    with jax.enable_x64(True):
        x = np.random.default_rng(1).standard_normal((2, 6, 6, 2))
        op = ops.Downsample.create((6, 6, 2), 3)
        ref = x.reshape(2, 2, 3, 2, 3, 2).mean(axis=(2, 4)).reshape(2, -1)
        np.testing.assert_allclose(np.asarray(op.A(jnp.asarray(x))), ref, rtol=0, atol=1e-14)


def _conv_matrix_1d(n, g):
    """``[n, n]``: column j is ``scipy.ndimage.convolve1d`` of the basis vector ``e_j`` with
    ``g`` (zero boundary): the 1-D 'same' convolution, independent of ``blur_matrix_1d``."""
    return np.stack([scipy.ndimage.convolve1d(e, g, mode="constant") for e in np.eye(n)], axis=1)


def test_blur_matches_scipy_convolve():
    with jax.enable_x64(True):
        x = np.random.default_rng(2).standard_normal((2, 7, 6, 3))
        op = ops.GaussianBlur.create((7, 6, 3), 1.1, 5)
        k = op.kernel
        np.testing.assert_allclose(float(np.sum(k)), 1.0, rtol=1e-14)
        r = np.arange(5) - 2
        ref_k = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * 1.1**2))
        np.testing.assert_allclose(np.asarray(k), ref_k / ref_k.sum(), rtol=1e-13)
        g = np.exp(-(r**2) / (2 * 1.1**2))
        np.testing.assert_allclose(np.asarray(op.b_h), _conv_matrix_1d(7, g / g.sum()), atol=1e-15)
        np.testing.assert_allclose(np.asarray(op.b_w), _conv_matrix_1d(6, g / g.sum()), atol=1e-15)
        # asymmetric separable kernels (1-D matrices not symmetric) check the orientation of
        # the two products and of the adjoint
        rng = np.random.default_rng(3)
        gh, gw = rng.random(5), rng.random(5)
        op_asym = op.replace(
            kernel=jnp.asarray(np.outer(gh, gw)),
            b_h=jnp.asarray(_conv_matrix_1d(7, gh)),
            b_w=jnp.asarray(_conv_matrix_1d(6, gw)),
        )
        for op_k in (op, op_asym):
            kern = np.asarray(op_k.kernel)
            out = np.asarray(op_k.A(jnp.asarray(x))).reshape(x.shape)
            for b in range(2):
                for c in range(3):
                    ref = scipy.ndimage.convolve(x[b, :, :, c], kern, mode="constant")
                    np.testing.assert_allclose(out[b, :, :, c], ref, rtol=0, atol=1e-12)
            M = _dense(op_k)
            np.testing.assert_allclose(_dense_t(op_k), M.T, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    "shape, std, size", [((7, 6, 2), 1.1, 5), ((5, 8, 1), 0.8, 5)], ids=["rgb2", "wide"]
)
def test_blur_svd_against_the_dense_matrix(shape, std, size):
    """The Kronecker SVD against ``numpy.linalg.svd`` of the dense ``A`` (non-square images,
    several channels): the same singular values, ``U diag(s) V^T = A``, orthonormal columns,
    ``A^+`` equal to ``numpy.linalg.pinv``; nothing is dropped for these blurs."""
    with jax.enable_x64(True):
        op = ops.GaussianBlur.create(shape, std, size)
        M = _dense(op)
        svd = op.svd()
        s = np.asarray(svd.s)
        assert s.shape == (op.d,) and s.dtype == np.float64
        s_np = np.linalg.svd(M, compute_uv=False)
        np.testing.assert_allclose(np.sort(s)[::-1], s_np, rtol=1e-12, atol=1e-14)
        eye = jnp.eye(op.d, dtype=jnp.float64)
        U = np.asarray(svd.U(eye)).T
        V = np.asarray(svd.V(eye)).reshape(op.d, op.d).T
        np.testing.assert_allclose(U.T @ U, np.eye(op.d), rtol=0, atol=1e-13)
        np.testing.assert_allclose(V.T @ V, np.eye(op.d), rtol=0, atol=1e-13)
        np.testing.assert_allclose(U @ np.diag(s) @ V.T, M, rtol=0, atol=1e-14)
        P = np.asarray(op.pinv(eye, rcond=1e-12)).reshape(op.d, op.d).T
        P_np = np.linalg.pinv(M)
        np.testing.assert_allclose(P, P_np, rtol=0, atol=1e-11 * np.abs(P_np).max())


def test_blur_svd_drops_the_spectrum_below_the_cut():
    """A wide blur (std 1.5, 9 x 9 kernel, 12 x 12) has spectral entries below
    ``BLUR_SVD_CUT`` (1e-7) of the largest: exactly those are dropped (the kept values are
    numpy's largest, the dropped numpy's smallest), the kept directions are orthonormal and
    ``U diag(s) V^T`` is ``A`` to within the cut."""
    with jax.enable_x64(True):
        op = ops.GaussianBlur.create((12, 12, 1), 1.5, 9)
        M = _dense(op)
        s_np = np.linalg.svd(M, compute_uv=False)
        want_r = int(np.sum(s_np > ops.BLUR_SVD_CUT * s_np[0]))
        assert 0 < want_r < op.d  # the check can fail: some entries are below the cut
        svd = op.svd()
        s = np.asarray(svd.s)
        r = s.shape[0]
        assert r == want_r
        np.testing.assert_allclose(np.sort(s)[::-1], s_np[:r], rtol=1e-8)
        assert s.min() > ops.BLUR_SVD_CUT * s.max()
        eye_r = jnp.eye(r, dtype=jnp.float64)
        U = np.asarray(svd.U(eye_r)).T
        V = np.asarray(svd.V(eye_r)).reshape(r, op.d).T
        np.testing.assert_allclose(U.T @ U, np.eye(r), rtol=0, atol=1e-13)
        np.testing.assert_allclose(V.T @ V, np.eye(r), rtol=0, atol=1e-13)
        gap = np.abs(U @ np.diag(s) @ V.T - M).max()
        assert gap <= ops.BLUR_SVD_CUT * s_np[0]
        assert gap > 1e-15  # something was dropped
        # Ut, Vt are the transposes; pinv inverts the kept spectrum only
        Ut = np.asarray(svd.Ut(jnp.eye(op.m, dtype=jnp.float64))).T
        Vt = np.asarray(svd.Vt(jnp.eye(op.d, dtype=jnp.float64).reshape(op.d, *op.data_shape))).T
        np.testing.assert_allclose(Ut, U.T, rtol=0, atol=1e-13)
        np.testing.assert_allclose(Vt, V.T, rtol=0, atol=1e-13)
        P = np.asarray(op.pinv(jnp.eye(op.m, dtype=jnp.float64), rcond=0.0)).reshape(op.m, -1).T
        np.testing.assert_allclose(P, V @ np.diag(1 / s) @ U.T, rtol=0, atol=1e-8 * np.abs(P).max())
        assert np.abs(P).max() < 1.01 / s.min()


def test_inpainting_masks():
    box = ops.Inpainting.box((6, 8, 2), (2, 4))
    mask = np.asarray(box.mask)
    ref = np.ones((6, 8, 2), bool)
    ref[2:4, 2:6] = False
    np.testing.assert_array_equal(mask, ref)
    assert box.m == ref.sum()
    rnd = ops.Inpainting.random(jax.random.key(0), (5, 4, 3), 0.5)
    mask = np.asarray(rnd.mask)
    assert np.all(mask == mask[..., :1])  # whole pixels
    assert mask[..., 0].sum() == 10 and rnd.m == 30


def test_measurement_noise_std():
    op = ops.Identity.create((50, 40))
    meas = ops.Measurement.create(op, 0.3)
    x = jnp.full((10, 50, 40), 0.25)
    y = np.asarray(meas.measure(x, jax.random.key(5)), np.float64)
    n = y - 0.25
    N = n.size
    assert abs(n.mean()) < 4 * 0.3 / np.sqrt(N)
    # the sample std's standard error is about sigma / sqrt(2 N)
    assert abs(n.std() - 0.3) < 4 * 0.3 / np.sqrt(2 * N)
    y0 = ops.Measurement.create(op, 0.0).measure(x, jax.random.key(5))
    np.testing.assert_array_equal(np.asarray(y0), np.asarray(op.A(x)))


KEY = jax.random.key(0)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: ops.Inpainting.from_mask(np.zeros((4, 4, 1), bool)), "task.mask"),
        (lambda: ops.Inpainting.from_mask(np.ones((4, 4, 1))), "task.mask"),
        (lambda: ops.Inpainting.box((4, 4, 1), (4, 4)), "task.box"),
        (lambda: ops.Inpainting.box((4, 4, 1), (5, 1)), "task.box"),
        (lambda: ops.Inpainting.random(KEY, (4, 4, 1), 0.0), "task.keep"),
        (lambda: ops.Inpainting.random(KEY, (4, 4, 1), 0.01), "task.keep"),
        (lambda: ops.Downsample.create((6, 6, 1), 4), "task.factor"),
        (lambda: ops.Downsample.create((6, 4, 1), 3), "task.factor"),
        (lambda: ops.Downsample.create((6, 6, 1), 0), "task.factor"),
        (lambda: ops.Downsample.create((36,), 2), "data_shape"),
        (lambda: ops.RandomProjection.create(KEY, (4, 4, 1), 0), "task.m"),
        (lambda: ops.RandomProjection.create(KEY, (4, 4, 1), 17), "task.m"),
        (lambda: ops.GaussianBlur.create((4, 4, 1), 1.0, 5), "task.size"),
        (lambda: ops.GaussianBlur.create((4, 4, 1), 1.0, 2), "task.size"),
        (lambda: ops.GaussianBlur.create((4, 4, 1), 2.0), "task.size"),
        (lambda: ops.GaussianBlur.create((4, 4, 1), 0.0, 3), "task.std"),
        (lambda: ops.GaussianBlur.create((4, 4, 1), -1.0, 3), "task.std"),
        (lambda: ops.Colourisation.create((4, 4, 1)), "data_shape"),
        (lambda: ops.Identity.create((4, 0)), "data_shape"),
        (lambda: ops.Measurement.create(ops.Identity.create((3,)), -0.1), "sigma_y"),
        (lambda: ops.Measurement.create(ops.Identity.create((3,)), float("nan")), "sigma_y"),
        (lambda: ops.Identity.create((3,)).A(jnp.zeros((2, 4))), "x"),
        (lambda: ops.Identity.create((3,)).At(jnp.zeros((2, 4))), "y"),
        (lambda: ops.Identity.create((3,)).pinv(jnp.zeros((2, 3)), rcond=-1.0), "rcond"),
    ],
)
def test_bad_input_names_the_field(make, field):
    with pytest.raises(ValueError, match=rf"^{field} must "):
        make()


# --------------------------------------------------------------------------- Stacked
def _stacks():
    """Two stacks (built inside x64): overlapping row spaces, so no SVD."""
    key = jax.random.key(4)
    return {
        "down_inpaint": [ops.Downsample.create(IMG, 2), ops.Inpainting.random(key, IMG, 0.25)],
        "rgb_three": [
            ops.Colourisation.create(RGB),
            ops.RandomProjection.create(key, RGB, 5),
            ops.GaussianBlur.create(RGB, 0.5, 3),
        ],
    }


@pytest.mark.parametrize("name", ["down_inpaint", "rgb_three"])
def test_stacked_against_its_parts(name):
    """``A`` is the dense concatenation of the parts' matrices, ``At`` its transpose (and the
    adjoint on random probes), ``pinv`` (conjugate gradients) ``numpy.linalg.pinv``."""
    with jax.enable_x64(True):
        parts = _stacks()[name]
        op = ops.Stacked.create(parts)
        M = np.concatenate([_dense(p) for p in parts])
        assert op.m == sum(p.m for p in parts) and op.svd() is None
        np.testing.assert_allclose(_dense(op), M, rtol=0, atol=1e-13)
        np.testing.assert_allclose(_dense_t(op), M.T, rtol=0, atol=1e-13)
        rng = np.random.default_rng(1)
        x = rng.standard_normal((4, op.d))
        v = rng.standard_normal((4, op.m))
        Ax = np.asarray(op.A(jnp.asarray(x.reshape(4, *op.data_shape))))
        Atv = np.asarray(op.At(jnp.asarray(v))).reshape(4, op.d)
        np.testing.assert_allclose(Ax, x @ M.T, rtol=0, atol=1e-12)
        np.testing.assert_allclose(Atv, v @ M, rtol=0, atol=1e-12)
        P_np = np.linalg.pinv(M)
        pinv = jax.jit(lambda y: op.pinv(y, rcond=1e-12))  # CG loop compiled
        P = np.asarray(pinv(jnp.eye(op.m, dtype=jnp.float64))).reshape(op.m, op.d).T
        np.testing.assert_allclose(P, P_np, rtol=0, atol=1e-8 * np.abs(P_np).max())


def test_stacked_measurement_noise_per_part():
    """Each part's entries carry its own sigma_y: the noise std of each part within 4 s.e.
    (``sigma / sqrt(2 N)``) of its value, and nothing in the noise-free part."""
    shape = (50, 40)
    low = ops.Measurement.create(ops.Identity.create(shape), 0.3)
    few = ops.Measurement.create(ops.Inpainting.random(jax.random.key(0), shape, 0.5), 0.05)
    exact = ops.Measurement.create(ops.Identity.create(shape), 0.0)
    meas = ops.Measurement.stack([low, few, exact])
    assert not meas.scalar_noise
    m1, m2 = low.operator.m, few.operator.m
    want = np.concatenate([np.full(m1, 0.3), np.full(m2, 0.05), np.zeros(m1)])
    np.testing.assert_allclose(np.asarray(meas.sigma_y), want, rtol=1e-7)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(10, *shape)), jnp.float32)
    n = np.asarray(meas.measure(x, jax.random.key(5)), np.float64)
    n = n - np.asarray(meas.operator.A(x), np.float64)
    for part, sigma in ((n[:, :m1], 0.3), (n[:, m1 : m1 + m2], 0.05)):
        N = part.size
        assert abs(part.mean()) < 4 * sigma / np.sqrt(N)
        assert abs(part.std() - sigma) < 4 * sigma / np.sqrt(2 * N)
    np.testing.assert_array_equal(n[:, m1 + m2 :], 0.0)


def test_stacked_noise_levels_follow_x64():
    """Under x64 the per-entry sigma_y keep their float64 values (as a scalar sigma_y does)."""
    with jax.enable_x64(True):
        parts = [ops.Measurement.create(ops.Identity.create((3,)), s) for s in (0.1, 0.7)]
        meas = ops.Measurement.stack(parts)
        assert meas.sigma_y.dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(meas.sigma_y), [0.1] * 3 + [0.7] * 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ops.Stacked.create([]),
        lambda: ops.Stacked.create(ops.Identity.create((3,))),
        lambda: ops.Stacked.create([ops.Identity.create((3,)), ops.Identity.create((4,))]),
        lambda: ops.Stacked.create([ops.Identity.create((3,)), "blur"]),
        lambda: ops.Measurement.stack([]),
        lambda: ops.Measurement.stack([ops.Identity.create((3,))]),
        lambda: ops.Measurement.stack(
            [
                ops.Measurement.create(ops.Downsample.create(IMG, 2), 0.1),
                ops.Measurement.create(ops.Identity.create((36,)), 0.1),
            ]
        ),
    ],
    ids=[
        "empty",
        "not_a_list",
        "two_shapes",
        "not_operator",
        "no_parts",
        "not_measurement",
        "mixed",
    ],
)
def test_stacked_refusals(make):
    with pytest.raises(ValueError, match=r"^task\.operators must ") as e:
        make()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("std, size", [(1.0, 5), (1.5, 9)], ids=["converges", "stops_early"])
def test_pinv_by_cg_is_per_example(std, size):
    """Without an SVD (a blur wrapped in :class:`Stacked`: the same matrix on the
    conjugate-gradient path), an example's ``A^+ y`` does not depend on the other examples: a
    batch with one measurement 1e3 times larger than the other equals each example alone (one
    CG over the flattened batch, stopped at 1e-6 of the whole batch's residual, left the small
    example at 2e-5 of its size; 6% apart where 500 iterations do not converge), and where
    CG converges each example is ``numpy.linalg.pinv`` to its own tolerance."""
    with jax.enable_x64(True):
        shape = (12, 12, 1)
        op = ops.Stacked.create([ops.GaussianBlur.create(shape, std, size)])
        assert op.svd() is None
        rng = np.random.default_rng(5)
        ys = np.stack([1e3 * rng.normal(size=op.m), rng.normal(size=op.m)])
        pinv = jax.jit(op.pinv)  # CG loop compiled
        both = np.asarray(pinv(jnp.asarray(ys))).reshape(2, -1)
        for b in range(2):
            alone = np.asarray(pinv(jnp.asarray(ys[b : b + 1]))).reshape(-1)
            np.testing.assert_allclose(both[b], alone, rtol=0, atol=1e-10 * np.abs(alone).max())
            if std == 1.0:
                want = np.linalg.pinv(_dense(op)) @ ys[b]
                assert np.abs(both[b] - want).max() < 5e-6 * np.abs(want).max()
