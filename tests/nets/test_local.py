"""The noise-level-dependent local network: patches, locality, the switch at sigma_local."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets import MLP, LocalMLP, PatchMLP, edm_precond
from scorelib.nets.local import patches


def _randomise_outputs(model, rng):
    """Random output layers (they start at zero), so that the output depends on the input."""
    for layer in (model.out,) if isinstance(model, PatchMLP) else (model.local.out, model.glob.out):
        layer.kernel[...] = jnp.asarray(rng.normal(size=layer.kernel.shape), jnp.float32)


@pytest.mark.parametrize("radius", [0, 1, 2])
def test_patches_match_a_loop(radius):
    rng = np.random.default_rng(radius)
    x = rng.normal(size=(2, 5, 4, 3)).astype(np.float32)
    got = np.asarray(patches(jnp.asarray(x), radius))
    k = 2 * radius + 1
    want = np.zeros((2, 5 * 4, k * k * 3), np.float32)
    for i in range(5):
        for j in range(4):
            col = 0
            for di in range(-radius, radius + 1):
                for dj in range(-radius, radius + 1):
                    if 0 <= i + di < 5 and 0 <= j + dj < 4:
                        want[:, i * 4 + j, col : col + 3] = x[:, i + di, j + dj, :]
                    col += 3
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("radius", [1, 2])
@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_patch_mlp_output_depends_only_on_the_neighbourhood(radius):
    """d F[i, j] / d x[k, l] is exactly 0 outside the (2 radius + 1)^2 neighbourhood of
    (i, j) and non-zero inside it (Jacobian by autodiff); the same patch at two positions
    gives different outputs (the position embedding)."""
    h, w, c = 6, 5, 2
    model = PatchMLP((h, w, c), radius=radius, width=16, depth=2, emb_dim=8, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    _randomise_outputs(model, rng)
    x = jnp.asarray(rng.normal(size=(1, h, w, c)), jnp.float32)
    cn = jnp.asarray([0.3])
    jac = np.asarray(jax.jacrev(lambda y: model(y, cn)[0])(x))[:, :, :, 0]  # [h,w,c,h,w,c]
    size = np.abs(jac).max(axis=(2, 5))  # [h, w, h, w]
    for i, j, k, m in np.ndindex(h, w, h, w):
        inside = max(abs(i - k), abs(j - m)) <= radius
        assert (size[i, j, k, m] > 0) == inside, (i, j, k, m, size[i, j, k, m])
    same = jnp.zeros((1, h, w, c))  # every interior pixel sees the same patch
    out = np.asarray(model(same, cn))
    assert abs(out[0, 2, 2, 0] - out[0, 3, 2, 0]) > 1e-4


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_patch_mlp_zero_init_dropout_and_features():
    model = PatchMLP(
        (4, 4, 1), radius=1, width=8, depth=3, emb_dim=8, dropout=0.5, rngs=nnx.Rngs(1)
    )
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 4, 4, 1)), jnp.float32)
    cn = jnp.asarray([-1.0, 0.0, 0.5])
    np.testing.assert_array_equal(np.asarray(model(x, cn)), 0.0)
    _randomise_outputs(model, rng)
    det = np.asarray(model(x, cn))
    np.testing.assert_array_equal(det, np.asarray(model(x, cn)))
    assert not np.allclose(det, np.asarray(model(x, cn, rngs=nnx.Rngs(dropout=0))), atol=1e-5)
    feats = model.features(x, cn)
    assert [f.shape for f in feats] == [(3, 4, 4, 8)] * 3


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_local_mlp_is_the_global_mlp_above_sigma_local_and_local_below():
    """Per example: c_noise >= c_noise(sigma_local) gives the global MLP's output, below it
    the PatchMLP's (each called on its own); the loss of an example below sigma_local
    sends no gradient to the global MLP and vice versa; zero at initialisation."""
    s_loc = 0.6
    model = LocalMLP(
        (4, 4, 1),
        sigma_local=s_loc,
        local_width=8,
        local_depth=2,
        width=16,
        depth=2,
        emb_dim=8,
        rngs=nnx.Rngs(2),
    )
    rng = np.random.default_rng(2)
    sigmas = np.array([0.1, 0.999 * s_loc, s_loc, 1.001 * s_loc, 5.0])
    # c_noise as the preconditioning computes it from float32 sigmas (sigma_local included)
    cn = edm_precond(jnp.asarray(sigmas, jnp.float32), 1.0).c_noise
    x = jnp.asarray(rng.normal(size=(5, 4, 4, 1)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(model(x, cn)), 0.0)
    _randomise_outputs(model, rng)
    out = np.asarray(model(x, cn))
    glob, loc = np.asarray(model.glob(x, cn)), np.asarray(model.local(x, cn))
    is_global = sigmas >= s_loc
    np.testing.assert_array_equal(out[is_global], glob[is_global])
    np.testing.assert_array_equal(out[~is_global], loc[~is_global])
    assert not np.allclose(glob, loc)
    graphdef, params = nnx.split(model, nnx.Param)

    def grad_norms(idx):
        g = jax.grad(lambda q: jnp.sum(nnx.merge(graphdef, q)(x[idx], cn[idx]) ** 2))(params)
        norm = lambda t: math.sqrt(sum(float(jnp.sum(v**2)) for v in jax.tree.leaves(t)))
        return norm(g["glob"]), norm(g["local"])

    g_glob, g_loc = grad_norms(np.array([0, 1]))
    assert g_glob == 0.0 and g_loc > 0
    g_glob, g_loc = grad_norms(np.array([3, 4]))
    assert g_glob > 0 and g_loc == 0.0
    feats = model.features(x, cn)
    assert [f.shape for f in feats] == [(5, 16)] * 2 + [(5, 4, 4, 8)] * 2
    np.testing.assert_array_equal(np.asarray(feats[0]), np.asarray(model.glob.features(x, cn)[0]))


def test_local_mlp_passes_the_global_options_to_its_mlp():
    model = LocalMLP(
        (4, 4, 1),
        width=16,
        depth=3,
        emb_dim=8,
        norm="layer",
        skip="affine",
        dropout=0.1,
        rngs=nnx.Rngs(0),
    )
    assert isinstance(model.glob, MLP) and len(model.glob.hidden) == 3
    assert model.glob.norms is not None and model.glob.skip_scale is not None


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(sigma_local=0.0), "model.sigma_local"),
        (dict(sigma_local=-1.0), "model.sigma_local"),
        (dict(sigma_local=float("inf")), "model.sigma_local"),
        (dict(radius=-1), "model.radius"),
        (dict(local_width=0), "model.local_width"),
        (dict(local_depth=0), "model.local_depth"),
        (dict(width=0), "model.width"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(skip="linear"), "model.skip"),
    ],
)
def test_local_mlp_invalid_config(kw, field):
    with pytest.raises(ValueError, match=field):
        LocalMLP((4, 4, 1), **{**dict(width=4, depth=1, emb_dim=4), **kw}, rngs=nnx.Rngs(0))


def test_local_mlp_needs_images():
    with pytest.raises(ValueError, match="image data"):
        LocalMLP((2,), rngs=nnx.Rngs(0))
