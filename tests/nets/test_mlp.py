"""The MLP network F(x, c_noise): shapes, zero-initialised output, dropout, gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets import MLP


@functools.partial(jax.jit, static_argnums=0)
def _run(graphdef, p0, p, x, c):
    f = lambda q, rngs=None: nnx.merge(graphdef, q)(x, c, rngs=rngs)
    return dict(
        init=f(p0),
        det=f(p),
        drop0=f(p, nnx.Rngs(dropout=jax.random.key(0))),
        drop1=f(p, nnx.Rngs(dropout=jax.random.key(1))),
        grad=jax.grad(lambda q: jnp.mean(f(q) ** 2))(p),
    )


@pytest.mark.parametrize("data_shape, embedding", [((2,), "fourier"), ((4, 4, 1), "positional")])
def test_mlp_shape_zero_init_dropout_grad(data_shape, embedding):
    model = MLP(
        data_shape, width=16, depth=2, emb_dim=8, embedding=embedding, dropout=0.3, rngs=nnx.Rngs(0)
    )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    assert len(jax.tree_util.tree_leaves(rest)) == 0
    rng = np.random.default_rng(0)
    trained = jax.tree_util.tree_map(
        lambda v: v + jnp.asarray(0.1 * rng.normal(size=v.shape), v.dtype), params
    )
    x = jnp.asarray(rng.normal(size=(3, *data_shape)), jnp.float32)
    c = jnp.asarray([-1.0, 0.0, 1.0])
    o = jax.tree_util.tree_map(np.asarray, _run(graphdef, params, trained, x, c))
    assert o["init"].shape == x.shape
    np.testing.assert_array_equal(o["init"], 0.0)
    assert np.std(o["det"]) > 1e-3
    np.testing.assert_array_equal(o["det"], _run(graphdef, params, trained, x, c)["det"])
    assert not np.allclose(o["det"], o["drop0"], atol=1e-5)
    assert not np.allclose(o["drop0"], o["drop1"], atol=1e-5)
    leaves = jax.tree_util.tree_leaves(o["grad"])
    assert all(np.all(np.isfinite(v)) for v in leaves)
    assert np.max(np.abs(o["grad"]["x_in"]["kernel"][...])) > 0
    if embedding == "fourier":  # the fixed frequencies get no gradient
        np.testing.assert_array_equal(o["grad"]["embed"]["freqs"][...], 0.0)


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(width=0), "model.width"),
        (dict(depth=0), "model.depth"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(emb_dim=7), "model.emb_dim"),
        (dict(embedding="nope"), "model.embedding"),
        (dict(norm="batch"), "model.norm"),
        (dict(skip="linear"), "model.skip"),
    ],
)
def test_mlp_invalid_config(kw, field):
    with pytest.raises(ValueError, match=field):
        MLP((2,), **{**dict(width=4, depth=1, emb_dim=4), **kw}, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("norm", ["layer", "none"])
def test_layer_norm_bounds_the_output_for_any_input(norm):
    """With norm='layer' the output layer sees silu(LayerNorm(h)), whose norm is at most
    sqrt(width) (LayerNorm's scale 1 and bias 0 at init), so
    |F(x)| <= ||W_out||_2 sqrt(width) + |b_out| however large x is; without it the
    output grows with the input."""
    width = 32
    model = MLP((6,), width=width, depth=3, emb_dim=8, norm=norm, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    model.out.kernel[...] = jnp.asarray(rng.normal(size=(width, 6)), jnp.float32)
    model.out.bias[...] = jnp.asarray(rng.normal(size=6), jnp.float32)
    bound = np.linalg.norm(np.asarray(model.out.kernel[...]), 2) * np.sqrt(width)
    bound += np.linalg.norm(np.asarray(model.out.bias[...]))
    x = jnp.asarray(rng.normal(size=(5, 6)), jnp.float32)
    c = jnp.linspace(-3.0, 3.0, 5)  # also outside EDM's usual c_noise range
    norms = [float(jnp.linalg.norm(model(s * x, c), axis=-1).max()) for s in (1.0, 1e3, 1e6)]
    if norm == "layer":
        assert max(norms) <= bound * (1 + 1e-5), (norms, bound)
    else:
        assert norms[-1] > 100 * bound, (norms, bound)


def test_affine_skip_starts_at_zero_and_adds_a_per_coordinate_affine_map():
    """skip='affine': zero at initialisation (like the plain MLP); with the hidden path's
    output layer at zero and only the biases of the skip set, F(x) = alpha * x + beta for
    every x and noise level (computed here directly from alpha, beta); and the skip
    parameters receive gradients."""
    d, width = 5, 16
    model = MLP((d,), width=width, depth=2, emb_dim=8, skip="affine", rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, d)), jnp.float32)
    c = jnp.asarray([-1.5, -0.2, 0.4, 1.1])
    np.testing.assert_array_equal(np.asarray(model(x, c)), 0.0)
    alpha = rng.normal(size=d).astype(np.float32)
    beta = rng.normal(size=d).astype(np.float32)
    model.skip_scale.bias[...] = jnp.asarray(alpha)
    model.skip_shift.bias[...] = jnp.asarray(beta)
    np.testing.assert_allclose(np.asarray(model(x, c)), alpha * np.asarray(x) + beta, rtol=1e-6)
    graphdef, params = nnx.split(model, nnx.Param)
    grad = jax.grad(lambda q: jnp.sum(nnx.merge(graphdef, q)(x, c) ** 2))(params)
    assert np.max(np.abs(np.asarray(grad["skip_scale"]["kernel"][...]))) > 0
    assert np.max(np.abs(np.asarray(grad["out"]["kernel"][...]))) > 0
    plain = MLP((d,), width=width, depth=2, emb_dim=8, rngs=nnx.Rngs(0))
    assert not hasattr(plain, "skip_scale") or plain.skip_scale is None
