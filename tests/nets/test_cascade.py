"""Cas-DM's cascaded network against the formulas written out by hand: module 1 is the EDM
denoiser of its own LocalMLP, module 2 adds ``sigma_data F2(D1 / sigma_data)``, the samplers'
denoiser is the blend ``(1 - r) D1 + r D2`` with ``r = 0, 1, sigma_data^2 / (sigma^2 +
sigma_data^2)``; module 2 reads module 1 through a stop-gradient; bad fields refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from cascade_nets import SMALL, random_cascade
from flax import nnx

from scorelib.nets import Cascade, with_blend
from scorelib.nets.local import LocalMLP
from scorelib.processes import EDM
from scorelib.scores import NetworkScore
from scorelib.scores.network import preconditioned_denoiser

SD = 0.5


def cascade(blend="snr"):
    return random_cascade(SD, blend)


@pytest.mark.parametrize("sigma", [0.05, 0.2, 0.5, 2.0])  # both sides of sigma_local = 0.3
def test_blends_are_the_modules_written_by_hand(sigma):
    g, p = cascade()
    net = nnx.merge(g, p)
    x = jax.random.normal(jax.random.key(2), (3, 4, 4, 1))
    # module 1 alone: its own LocalMLP behind EDM's preconditioning
    g1, p1 = nnx.split(net.first, nnx.Param)
    d1 = preconditioned_denoiser(g1, p1, x, jnp.asarray(sigma), SD)
    c_noise = jnp.full((3,), np.log(sigma) / 4)
    d2 = d1 + SD * net.second(d1 / SD, c_noise)
    r = {"first": 0.0, "second": 1.0, "snr": SD**2 / (sigma**2 + SD**2)}
    for blend, w in r.items():
        src = NetworkScore(process=EDM(), graphdef=with_blend(g, p, blend), params=p, sigma_data=SD)
        got = src.denoiser(x, jnp.asarray(sigma))
        np.testing.assert_allclose(got, (1 - w) * d1 + w * d2, rtol=2e-5, atol=2e-5)
    a, b = net.denoisers(x / np.sqrt(sigma**2 + SD**2), c_noise)
    np.testing.assert_allclose(a, d1, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(b, d2, rtol=2e-5, atol=2e-5)
    assert float(jnp.max(jnp.abs(d2 - d1))) > 1e-3  # module 2 does something here


def test_module_two_reads_module_one_through_a_stop_gradient():
    g, p = cascade()
    x = jax.random.normal(jax.random.key(3), (2, 4, 4, 1))
    c_noise = jnp.full((2,), np.log(0.4) / 4)

    def total(params, which):
        return jnp.sum(nnx.merge(g, params).denoisers(x, c_noise)[which])

    g2 = jax.grad(total)(p, 1)
    g1 = jax.grad(total)(p, 0)
    norm = lambda t: float(sum(jnp.sum(v**2) for v in jax.tree.leaves(t)))  # noqa: E731
    assert norm(g2["first"]) == 0.0 and norm(g2["second"]) > 0.0
    assert norm(g1["second"]) == 0.0 and norm(g1["first"]) > 0.0


def test_with_blend_changes_only_the_blend():
    g, p = cascade("snr")
    g2 = with_blend(g, p, "second")
    assert nnx.merge(g2, p).blend == "second" and nnx.merge(g, p).blend == "snr"
    net = LocalMLP((4, 4, 1), **SMALL, rngs=nnx.Rngs(0))
    gl, pl = nnx.split(net, nnx.Param)
    with pytest.raises(ValueError, match="with_blend needs a Cascade network; got LocalMLP"):
        with_blend(gl, pl, "first")


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(blend="mean"), "model.blend must be one of"),
        (dict(sigma_data=0.0), "model.sigma_data must be a number in (0.0"),
        (dict(num_classes=10), "model.num_classes: a class-conditional cascade is not built"),
        (dict(radius=-1), "model.radius"),
    ],
)
def test_bad_fields_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        Cascade((4, 4, 1), **{**SMALL, **kw}, rngs=nnx.Rngs(0))
