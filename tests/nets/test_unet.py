"""The DDPM++-style U-Net. Shapes are checked by tracing (jax.eval_shape, no compilation);
numerics on one tiny 8x8 model (XLA:CPU convolutions are slow)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets import UNet, edm_precond

TINY = dict(channels=8, channel_mult=(1, 2, 2), num_res_blocks=1, emb_dim=16)


def abstract_model(shape, **kw):
    cfg = {**TINY, **kw}
    return nnx.eval_shape(lambda: UNet(shape, **cfg, rngs=nnx.Rngs(0)))


def traced_output_shape(model, shape, batch=2, dropout=False):
    graphdef, params = nnx.split(model, nnx.Param)

    def f(p, x, c, key):
        rngs = nnx.Rngs(dropout=key) if dropout else None
        return nnx.merge(graphdef, p)(x, c, rngs=rngs)

    out = jax.eval_shape(
        f,
        params,
        jax.ShapeDtypeStruct((batch, *shape), jnp.float32),
        jax.ShapeDtypeStruct((batch,), jnp.float32),
        jax.random.key(0),
    )
    return out.shape, out.dtype


@pytest.mark.parametrize(
    "shape, kw",
    [
        ((8, 8, 1), dict(attn_resolutions=(4,))),
        ((28, 28, 1), dict(attn_resolutions=(7,))),  # 28 -> 14 -> 7
        pytest.param(
            (28, 28, 1),
            dict(channel_mult=(1, 2, 2, 2), attn_resolutions=(7, 4)),  # 7 -> 4 -> 7
            marks=pytest.mark.slow,
        ),
        ((32, 32, 3), dict(attn_resolutions=(16,), embedding="fourier")),
        pytest.param(
            (32, 32, 3),
            dict(attn_resolutions=(), scale_shift=False, num_res_blocks=2),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            (12, 20, 2), dict(attn_resolutions=(3,)), marks=pytest.mark.slow
        ),  # non-square, odd at the last level
    ],
)
def test_output_shape(shape, kw):
    model = abstract_model(shape, **kw)
    assert traced_output_shape(model, shape, dropout=shape[0] == 28) == ((2, *shape), jnp.float32)


def test_all_state_is_param():
    model = abstract_model((28, 28, 1), attn_resolutions=(14,), embedding="fourier")
    _, params, rest = nnx.split(model, nnx.Param, ...)
    assert len(rest) == 0 and len(jax.tree_util.tree_leaves(rest)) == 0
    assert len(jax.tree_util.tree_leaves(params)) > 20


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(channel_mult=()), "model.channel_mult"),
        (dict(channel_mult=(1, 0)), "model.channel_mult"),
        (dict(attn_resolutions=(16,)), "model.attn_resolutions"),  # 8x8 reaches 8, 4, 2
        (dict(attn_resolutions=(3,)), "model.attn_resolutions"),
        (dict(channels=0), "model.channels"),
        (dict(num_res_blocks=0), "model.num_res_blocks"),
        (dict(dropout=1.0), "model.dropout"),
        (dict(emb_dim=15), "model.emb_dim"),
        (dict(embedding="sinusoid"), "model.embedding"),
        (dict(channels=9), "model.num_groups"),  # 2 groups do not divide 9 channels
        (dict(channels=160, channel_mult=(1, 2)), None),  # 160 / 32 groups: fine
        (dict(channels=200, channel_mult=(1,)), "model.num_groups"),  # 32 does not divide 200
        (dict(attn_heads=3, attn_resolutions=(4,)), "model.attn_heads"),
    ],
)
def test_invalid_config_raises_naming_the_field(kw, field):
    if field is None:
        abstract_model((8, 8, 1), **{**dict(attn_resolutions=()), **kw})
        return
    with pytest.raises(ValueError, match=re.escape(field)):
        abstract_model((8, 8, 1), **{**dict(attn_resolutions=()), **kw})


def test_invalid_data_shape_and_inputs():
    with pytest.raises(ValueError, match="model.data_shape"):
        abstract_model((8, 8), attn_resolutions=())
    model = abstract_model((8, 8, 1), attn_resolutions=())
    with pytest.raises(ValueError, match="x must be of shape"):
        traced_output_shape(model, (8, 8, 3))
    graphdef, params = nnx.split(model, nnx.Param)
    with pytest.raises(ValueError, match="c_noise"):
        jax.eval_shape(
            lambda p, x, c: nnx.merge(graphdef, p)(x, c),
            params,
            jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32),
            jax.ShapeDtypeStruct((2, 1), jnp.float32),
        )


# --- numerics on one real 8x8 model -------------------------------------------------


SMALL = dict(channels=8, channel_mult=(1, 2), num_res_blocks=1, emb_dim=16, attn_resolutions=())


@pytest.fixture(scope="module")
def tiny():
    """One real 8x8 model and a single compiled function computing everything the tests need.

    (The rbg PRNG only makes the eager initialisation cheaper to compile on CPU.)
    """
    model = UNet((8, 8, 1), **SMALL, dropout=0.3, rngs=nnx.Rngs(jax.random.key(0, impl="rbg")))
    graphdef, params = nnx.split(model, nnx.Param)
    # inputs and perturbations drawn in numpy: no eager XLA op to compile for each shape
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 8, 8, 1)).astype(np.float32)
    c = np.asarray(edm_precond(np.asarray([0.05, 1.0, 20.0]), 0.5).c_noise, np.float32)
    # A trained-looking model: every parameter (incl. the zero output conv) perturbed.
    trained = jax.tree_util.tree_map(
        lambda v: jnp.asarray(np.asarray(v) + 0.1 * rng.normal(size=v.shape), v.dtype), params
    )
    x2 = x.copy()
    x2[1:] = 5 * rng.normal(size=x[1:].shape)
    c3 = c.copy()
    c3[0] += 1.0
    # Few compilations, at a low XLA optimisation level (compile time dominates on CPU).
    opts = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

    @functools.partial(jax.jit, compiler_options=opts)
    def run(p0, p):
        f = lambda q, xx, cc, rngs=None: nnx.merge(graphdef, q)(xx, cc, rngs=rngs)
        both = jax.tree_util.tree_map(lambda u, v: jnp.stack([u, v]), p0, p)
        init, det = jax.vmap(lambda q: f(q, x, c))(both)
        # One batch of 9 = (x, c), (x2, c), (x, c3): examples must not interact.
        big = f(p, jnp.concatenate([x, x2, x]), jnp.concatenate([c, c, c3]))
        drop = jax.vmap(lambda k: f(p, x, c, nnx.Rngs(dropout=k)))(jax.random.split(key0, 2))
        grad = jax.grad(lambda q: jnp.mean(f(q, x, c) ** 2))(p)
        return dict(init=init, det=det, big=big, drop0=drop[0], drop1=drop[1], grad=grad)

    key0 = jax.random.key(0)
    out = jax.tree_util.tree_map(np.asarray, run(params, trained))
    out["det_again"] = np.asarray(run(params, trained)["det"])
    out["other_examples"], out["other_noise"] = out["big"][3:6], out["big"][6:9]
    return dict(out=out, params=params, x=x)


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_zero_initialised_output(tiny):
    out = tiny["out"]["init"]
    assert out.shape == tiny["x"].shape
    np.testing.assert_array_equal(out, 0.0)
    np.testing.assert_array_equal(tiny["params"]["conv_out"]["kernel"][...], 0.0)


@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_dropout_only_with_rngs(tiny):
    o = tiny["out"]
    assert np.all(np.isfinite(o["det"])) and np.std(np.asarray(o["det"])) > 1e-3
    np.testing.assert_array_equal(o["det"], o["det_again"])
    np.testing.assert_allclose(o["big"][:3], o["det"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(o["det"], o["drop0"], atol=1e-4)
    assert not np.allclose(o["drop0"], o["drop1"], atol=1e-4)


def test_examples_are_independent_and_noise_conditioning_matters(tiny):
    """GroupNorm and attention must not mix examples; c_noise must change the output."""
    o = tiny["out"]
    np.testing.assert_allclose(o["other_examples"][0], o["det"][0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(o["other_examples"][1:], o["det"][1:], atol=1e-4)
    assert not np.allclose(o["other_noise"][0], o["det"][0], atol=1e-4)
    np.testing.assert_allclose(o["other_noise"][1:], o["det"][1:], rtol=1e-5, atol=1e-6)


def test_gradient_is_finite_and_reaches_the_input_layer(tiny):
    g = tiny["out"]["grad"]
    assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(g))
    assert np.max(np.abs(g["conv_in"]["kernel"][...])) > 0
    assert np.max(np.abs(g["emb1"]["kernel"][...])) > 0


@pytest.mark.slow
@pytest.mark.parametrize("shape, attn", [((28, 28, 1), (7,)), ((32, 32, 3), (16,))])
def test_real_forward_larger_images(shape, attn):
    # an rbg key: the eager initialisation compiles far faster on CPU than with threefry
    model = UNet(shape, **TINY, attn_resolutions=attn, rngs=nnx.Rngs(jax.random.key(0, impl="rbg")))
    out = nnx.jit(lambda m, x, c: m(x, c))(model, jnp.ones((2, *shape)), jnp.zeros(2))
    assert out.shape == (2, *shape)
    np.testing.assert_array_equal(out, 0.0)
