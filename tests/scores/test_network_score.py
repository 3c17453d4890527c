"""EDM preconditioning and the network score source (Karras et al. 2022, Table 1, eq. 7)."""

import math
import re

import closed_forms
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib.nets.local import LocalMLP
from scorelib.nets.mlp import MLP
from scorelib.nets.precond import edm_precond, fisher_precond
from scorelib.nets.unet import UNet
from scorelib.objectives import weights
from scorelib.objectives.weights import edm_weight
from scorelib.processes import EDM, VP, SubVP
from scorelib.scores import NetworkScore, preconditioned_denoiser


@pytest.mark.parametrize(
    "sigma, sigma_data, c_skip, c_out, c_in, c_noise",
    [
        # Computed by hand from Table 1: sigma_d^2/(s^2+sigma_d^2), s sigma_d/sqrt(.), 1/sqrt(.),
        # ln(s)/4.
        (0.5, 0.5, 0.5, 0.25 / math.sqrt(0.5), 1 / math.sqrt(0.5), math.log(0.5) / 4),
        (2.0, 0.5, 0.25 / 4.25, 1.0 / math.sqrt(4.25), 1 / math.sqrt(4.25), math.log(2.0) / 4),
        (80.0, 1.0, 1 / 6401, 80 / math.sqrt(6401), 1 / math.sqrt(6401), math.log(80.0) / 4),
    ],
)
def test_edm_precond_table_values(sigma, sigma_data, c_skip, c_out, c_in, c_noise):
    c = edm_precond(sigma, sigma_data)
    np.testing.assert_allclose(
        [c.c_skip, c.c_out, c.c_in, c.c_noise], [c_skip, c_out, c_in, c_noise], rtol=1e-6
    )
    # Spot values written out: sigma = 0.5 = sigma_data gives c_skip = 1/2, c_in = sqrt 2.
    if sigma == sigma_data == 0.5:
        np.testing.assert_allclose([c.c_skip, c.c_in, c.c_out], [0.5, 1.41421356, 0.35355339])


@pytest.mark.parametrize("sigma_data", [0.5, 1.3])
def test_edm_precond_identities(sigma_data):
    sigma = jnp.asarray([0.002, 0.1, 1.0, 10.0, 80.0])
    c = edm_precond(sigma, sigma_data)
    lam = edm_weight(ve_sigma=sigma, sigma_data=sigma_data)
    np.testing.assert_allclose(lam * c.c_out**2, 1.0, rtol=1e-5)  # unit weight on F
    np.testing.assert_allclose(c.c_skip + (c.c_out / sigma_data) ** 2, 1.0, rtol=1e-5)
    np.testing.assert_allclose(c.c_in**2 * (sigma**2 + sigma_data**2), 1.0, rtol=1e-5)
    # Unit-variance training target (y - c_skip (y + n)) / c_out for var(y) = sigma_data^2.
    target_var = ((1 - c.c_skip) ** 2 * sigma_data**2 + c.c_skip**2 * sigma**2) / c.c_out**2
    np.testing.assert_allclose(target_var, 1.0, rtol=1e-4)
    assert c.c_noise.shape == sigma.shape


def ref_alpha_sigma(p, t):
    """Closed-form alpha, sigma (float64 scalars), independent of the library."""
    a, s = closed_forms.alpha_sigma(p, t)
    return float(a), float(s)


def make_source(p, data_shape, sigma_data=0.5, dropout=0.0, zero_out=True, key=None):
    model = MLP(data_shape, width=16, depth=2, emb_dim=8, dropout=dropout, rngs=nnx.Rngs(0))
    if not zero_out:
        k = model.out.kernel[...]
        model.out.kernel[...] = jax.random.normal(jax.random.key(5), k.shape) * 0.3
    graphdef, params = nnx.split(model, nnx.Param)
    src = NetworkScore(
        process=p, graphdef=graphdef, params=params, sigma_data=sigma_data, dropout_key=key
    )
    return src, model


denoiser_fn = jax.jit(lambda src, x, t: src.denoiser(x, t))
score_fn = jax.jit(lambda src, x, t: src.score(x, t))


@pytest.mark.parametrize("p", [EDM(), VP(), SubVP()], ids=repr)
@pytest.mark.parametrize("data_shape", [(3,), (4, 4, 1)])
@pytest.mark.slow  # over 4 s on 2 idle cores: `make test` only
def test_zero_initialised_network_gives_c_skip_x_in_the_ve_frame(p, data_shape):
    sd = 0.7
    src, _ = make_source(p, data_shape, sigma_data=sd)
    x = jax.random.normal(jax.random.key(1), (3, *data_shape))
    t = 0.5 if not isinstance(p, EDM) else 3.0
    a, s = ref_alpha_sigma(p, t)
    ve = s / a
    d_ref = sd**2 / (ve**2 + sd**2) * np.asarray(x) / a
    np.testing.assert_allclose(denoiser_fn(src, x, t), d_ref, rtol=1e-4, atol=1e-6)
    # Tweedie with the closed-form alpha, sigma.
    np.testing.assert_allclose(
        score_fn(src, x, t), (a * d_ref - np.asarray(x)) / s**2, rtol=1e-3, atol=1e-5
    )


@pytest.mark.parametrize("p", [EDM(), VP()], ids=repr)
def test_network_denoiser_is_preconditioned_network(p):
    src, model = make_source(p, (3,), sigma_data=0.5, zero_out=False)
    x = jax.random.normal(jax.random.key(2), (4, 3))
    ts = [0.1, 0.3, 0.6, 0.9] if isinstance(p, VP) else [0.01, 0.5, 5.0, 60.0]
    out = denoiser_fn(src, x, jnp.asarray(ts))
    for i, t in enumerate(ts):
        a, s = ref_alpha_sigma(p, t)
        ve = s / a
        xv = np.asarray(x[i : i + 1]) / a
        c_in, c_noise = 1 / math.sqrt(ve**2 + 0.25), math.log(ve) / 4
        f = np.asarray(model(jnp.asarray(c_in * xv), jnp.asarray([c_noise])))
        d_ref = 0.25 / (ve**2 + 0.25) * xv + ve * 0.5 / math.sqrt(ve**2 + 0.25) * f
        np.testing.assert_allclose(out[i : i + 1], d_ref, rtol=1e-4, atol=1e-5)
    # The F term matters here (the test is not only checking c_skip x).
    c_skip_only = 0.25 / (
        np.asarray([ref_alpha_sigma(p, t)[1] / ref_alpha_sigma(p, t)[0] for t in ts]) ** 2 + 0.25
    )
    assert not np.allclose(out, c_skip_only[:, None] * np.asarray(x), atol=1e-3)


def test_network_time_shapes():
    p = VP()
    src, _ = make_source(p, (4, 4, 1), zero_out=False)
    x = jax.random.normal(jax.random.key(3), (3, 4, 4, 1))
    ts = jnp.asarray([0.2, 0.5, 0.8])
    batched = denoiser_fn(src, x, ts)
    for i in range(3):
        np.testing.assert_allclose(
            batched[i], denoiser_fn(src, x[i : i + 1], ts[i])[0], rtol=1e-5, atol=1e-6
        )
    for bad in (ts[:2], ts[:, None]):
        with pytest.raises(ValueError, match="shape"):
            denoiser_fn(src, x, bad)
        with pytest.raises(ValueError, match="shape"):
            score_fn(src, x, bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MLP((4, 4, 1), width=16, depth=2, emb_dim=8, rngs=nnx.Rngs(0)),
        lambda: LocalMLP((4, 4, 1), local_width=8, width=16, emb_dim=8, rngs=nnx.Rngs(0)),
        lambda: UNet(
            (4, 4, 1),
            channels=8,
            channel_mult=(1, 2),
            num_res_blocks=1,
            attn_resolutions=(),
            rngs=nnx.Rngs(0),
        ),
    ],
    ids=["mlp", "local_mlp", "unet"],
)
def test_one_noise_level_for_the_batch_embeds_it_once(make):
    """A scalar ``t`` (the samplers' call) gives the outputs of the same level given per
    example, and the network's noise embedding is computed once: no ``cos`` in the
    program has the batch's size (5) in its shape (with ``t: [batch]`` every one does)."""
    graphdef, params = nnx.split(make(), nnx.Param)
    src = NetworkScore(process=EDM(), graphdef=graphdef, params=params)
    x = jax.random.normal(jax.random.key(7), (5, 4, 4, 1))
    for t in (0.02, 1.3, 40.0):
        np.testing.assert_allclose(
            denoiser_fn(src, x, t), denoiser_fn(src, x, jnp.full((5,), t)), rtol=1e-6, atol=1e-6
        )

    def cos_shapes(t):  # the shapes of every cos in the program, nested ones included
        text = str(jax.make_jaxpr(lambda x, t: src.denoiser(x, t))(x, t))
        return [
            tuple(map(int, filter(None, m.split(","))))
            for m in re.findall(r"f32\[([\d,]*)\] = cos", text)
        ]

    per_example, scalar = cos_shapes(jnp.full((5,), 1.3)), cos_shapes(jnp.float32(1.3))
    assert per_example and all(5 in s for s in per_example), per_example
    assert scalar and not any(5 in s for s in scalar), scalar


def test_dropout_only_with_a_key():
    p = EDM()
    x = jax.random.normal(jax.random.key(4), (4, 3))
    det, _ = make_source(p, (3,), dropout=0.5, zero_out=False)
    a1, a2 = denoiser_fn(det, x, 1.0), denoiser_fn(det, x, 1.0)
    np.testing.assert_array_equal(a1, a2)
    k1 = det.replace(dropout_key=jax.random.key(0))
    k2 = det.replace(dropout_key=jax.random.key(1))
    b1, b1_again, b2 = denoiser_fn(k1, x, 1.0), denoiser_fn(k1, x, 1.0), denoiser_fn(k2, x, 1.0)
    assert not np.allclose(a1, b1)
    assert not np.allclose(b1, b2)
    np.testing.assert_array_equal(b1, b1_again)  # randomness only through the explicit key


def test_direct_preconditioned_denoiser_matches_source():
    src, _ = make_source(EDM(), (3,), zero_out=False)
    x = jax.random.normal(jax.random.key(6), (2, 3))
    np.testing.assert_allclose(
        preconditioned_denoiser(src.graphdef, src.params, x, jnp.asarray([0.3, 2.0]), 0.5),
        denoiser_fn(src, x, jnp.asarray([0.3, 2.0])),
        rtol=1e-5,
        atol=1e-6,
    )


# --- Fisher-scaled preconditioning (scorelib/nets/precond.py, fisher_precond) -------------


def _np_fisher(sigma, sd, sf):
    """The coefficients written from their definitions in float64: EDM's (Table 1) with
    c_out multiplied by sigma / sqrt(sigma^2 + sf^2); the score form by Tweedie."""
    c_skip = sd**2 / (sigma**2 + sd**2)
    c_out = sigma * sd / np.sqrt(sigma**2 + sd**2) * sigma / np.sqrt(sigma**2 + sf**2)
    return c_skip, c_out, (c_skip - 1) / sigma**2, c_out / sigma**2


@pytest.mark.parametrize("sd, sf", [(0.5, 0.5), (1.8, 0.35)])
def test_fisher_precond_against_definition_and_limits(sd, sf):
    sigma = np.geomspace(1e-3, 80.0, 13)
    c = fisher_precond(jnp.asarray(sigma), sd, sf)
    e = edm_precond(jnp.asarray(sigma), sd)
    c_skip, c_out, c_skip_score, c_out_score = _np_fisher(sigma, sd, sf)
    np.testing.assert_allclose(c.c_skip, c_skip, rtol=1e-5)
    np.testing.assert_allclose(c.c_out, c_out, rtol=1e-5)
    np.testing.assert_allclose(c.c_skip_score, c_skip_score, rtol=1e-4)
    np.testing.assert_allclose(c.c_out_score, c_out_score, rtol=1e-4)
    np.testing.assert_array_equal(c.c_in, e.c_in)
    np.testing.assert_array_equal(c.c_noise, e.c_noise)
    # EDM's c_out well above sigma_fisher; a unit-scale score predictor (1 / sf) well below
    hi, lo = sigma > 30 * sf, sigma < sf / 30
    np.testing.assert_allclose(c.c_out[hi], e.c_out[hi], rtol=1e-3)
    np.testing.assert_allclose(c.c_out_score[lo], 1.0 / sf, rtol=1e-3)
    # unit weight on F: fisher_weight * c_out_score^2 = 1 (alpha = 1)
    lam = weights.fisher_weight(process=EDM(), t=jnp.asarray(sigma), sigma_data=sd, sigma_fisher=sf)
    np.testing.assert_allclose(lam * c.c_out_score**2, 1.0, rtol=1e-4)


@pytest.mark.parametrize("p", [EDM(), VP()], ids=repr)
def test_fisher_network_score_is_the_preconditioned_network(p):
    """score = (1 / alpha) (c_skip_score x_ve + c_out_score F(c_in x_ve; c_noise)) with
    numpy coefficients; the denoiser is Tweedie of it, (x + sigma^2 s) / alpha."""
    sd, sf = 0.5, 0.2
    src, model = make_source(p, (3,), sigma_data=sd, zero_out=False)
    src = src.replace(sigma_fisher=sf)
    x = jax.random.normal(jax.random.key(2), (4, 3))
    ts = [0.1, 0.3, 0.6, 0.9] if isinstance(p, VP) else [0.001, 0.05, 1.0, 60.0]
    out = score_fn(src, x, jnp.asarray(ts))
    den = denoiser_fn(src, x, jnp.asarray(ts))
    for i, t in enumerate(ts):
        a, s = ref_alpha_sigma(p, t)
        ve = s / a
        xv = np.asarray(x[i : i + 1], np.float64) / a
        c_in, c_noise = 1 / math.sqrt(ve**2 + sd**2), math.log(ve) / 4
        f = np.asarray(model(jnp.asarray(c_in * xv, jnp.float32), jnp.asarray([c_noise])))
        _, _, cs, co = _np_fisher(ve, sd, sf)
        s_ref = (cs * xv + co * f) / a
        np.testing.assert_allclose(out[i : i + 1], s_ref, rtol=1e-4, atol=1e-5)
        d_ref = (np.asarray(x[i : i + 1], np.float64) + s**2 * s_ref) / a
        np.testing.assert_allclose(den[i : i + 1], d_ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="sigma_fisher"):
        src.replace(sigma_fisher=0.0)


def test_fisher_score_keeps_float32_precision_at_small_sigma():
    """At sigma = 1e-3 the score in score form matches float64 to 1e-5, where Tweedie from
    a float32 denoiser ((D - x) / sigma^2, EDM's path) loses about 1e-2 to cancellation."""
    sd, sf, sigma = 1.0, 0.3, 1e-3
    src, model = make_source(EDM(), (8,), sigma_data=sd, zero_out=False)
    src = src.replace(sigma_fisher=sf)
    x = 2.0 * jax.random.normal(jax.random.key(7), (64, 8))
    xd = np.asarray(x, np.float64)
    c_in, c_noise = 1 / math.sqrt(sigma**2 + sd**2), math.log(sigma) / 4
    f = np.asarray(model(jnp.asarray(c_in * xd, jnp.float32), jnp.full((64,), c_noise)), np.float64)
    _, _, cs, co = _np_fisher(sigma, sd, sf)
    ref = cs * xd + co * f
    got = np.asarray(score_fn(src, x, sigma), np.float64)
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-5
    tweedie = (np.asarray(denoiser_fn(src, x, sigma), np.float32) - np.asarray(x)) / sigma**2
    assert np.max(np.abs(tweedie - ref)) / np.max(np.abs(ref)) > 1e-3
