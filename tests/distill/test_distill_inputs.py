"""Entry checks of the distillation's losses, ratio normalisation and step builder on static
shapes, in float32 and under x64: a ``[batch, 1]`` weight against ``[batch]`` losses (which
broadcasts to ``[batch, batch]``), a 1-D logit array (whose mean over "heads" is a scalar),
a real batch of another shape: each is a ``ValueError`` naming the argument, the shape got
and the shape expected. The per-example student loss is checked against a loop."""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scorelib import distill
from scorelib.data.targets import GaussianMixtureTarget
from scorelib.nets import MLP
from scorelib.processes import EDM
from scorelib.training import EMA

PRECISIONS = ["float32", "x64"]


def scope(precision: str):
    return jax.enable_x64(True) if precision == "x64" else contextlib.nullcontext()


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("b", [1, 2, 7])
def test_student_loss_per_example_against_a_loop(precision, b):
    # value: 0.5 (w h)^2 mean_dims (x_fake - x_teacher)^2, example by example
    rng = np.random.default_rng(b)
    g, xt, xf = (rng.normal(size=(b, 3, 2)) for _ in range(3))
    h, w = rng.uniform(0.5, 2, b), rng.uniform(0.5, 2, b)
    with scope(precision):
        got = distill.student_example_losses(*map(jnp.asarray, (g, xt, xf, h, w)))
        want = [0.5 * (w[i] * h[i]) ** 2 * np.mean((xf[i] - xt[i]) ** 2) for i in range(b)]
        assert got.shape == (b,)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
        with pytest.raises(ValueError, match=re.escape("h must have shape [batch=")):
            distill.student_example_losses(g, xt, xf, h[:, None], w)
        with pytest.raises(ValueError, match=re.escape("x_fake must have shape [batch=")):
            distill.student_example_losses(g, xt, xf[:, :1], h, w)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_losses_and_ratios_refuse_mismatched_shapes(precision):
    with scope(precision):
        g, x = jnp.zeros((4, 2)), jnp.zeros((4, 1))
        logits = jnp.zeros((4, 3))
        i0, r1, r10 = jnp.zeros(4, jnp.int32), jnp.ones(4), jnp.ones(10)
        ex = "[batch=4, *data_shape=(2,)]"
        cases = [
            (
                lambda: distill.dmd_weight(g, x),
                f"x_teacher must have shape {ex} (the shape of g); got shape (4, 1)",
            ),
            (
                lambda: distill.fake_score_example_losses(g, x),
                f"g must have shape {ex} (the shape of x_fake); got shape (4, 1)",
            ),
            (
                lambda: distill.gan_generator_losses(logits[:, 0]),
                "logits must have shape [batch, heads]; got shape (4,)",
            ),
            (
                lambda: distill.ratio_from_logits(logits[:, 0]),
                "logits must have shape [batch, heads]; got shape (4,)",
            ),
            (
                lambda: distill.discriminator_losses(logits, logits[:3]),
                "logits_real must have shape [batch=4, heads=3] (the shape of logits_fake); "
                "got shape (3, 3)",
            ),
            (
                lambda: distill.r1_example_losses(logits, logits[:, :1]),
                "logits_noised must have shape [batch=4, heads=3]",
            ),
            (
                lambda: distill.bin_means(r1[:, None], i0, 10, r10, 0.0),
                "values must have shape [batch]; got shape (4, 1)",
            ),
            (
                lambda: distill.bin_means(r1, i0, 10, r10[:9], 0.0),
                "previous must have shape [10]; got shape (9,)",
            ),
            (
                lambda: distill.normalise_ratio(r1[:, None], i0, r10),
                "r must have shape [batch]; got shape (4, 1)",
            ),
            (
                lambda: distill.normalise_weights(r1[:, None]),
                "h must have shape [batch]; got shape (4, 1)",
            ),
            (
                lambda: distill.bin_index(r1[:, None], 0.002, 80.0, 10),
                "ve_sigma must have shape [batch]; got shape (4, 1)",
            ),
            (
                lambda: distill.network_inputs(EDM(), g, jnp.ones(3), 1.0),
                "t must be a scalar or have shape [batch=4]; got shape (3,)",
            ),
            (
                lambda: distill.dmd_weight(g.astype(jnp.complex64), g),
                "g must be a real (floating or integer) array; got dtype complex64",
            ),
        ]
        for fn, want in cases:
            with pytest.raises(ValueError, match="^" + re.escape(want)):
                fn()


def _setup():
    target = GaussianMixtureTarget.create([0.5, 0.5], [[1.0, 0], [-1, 0]], stds=[0.3, 0.3])
    model = MLP((2,), width=8, depth=1, emb_dim=8, rngs=nnx.Rngs(0))
    gd, pm = nnx.split(model, nnx.Param)
    disc = distill.Discriminator(
        [(8,)], 8, MLP((2,), width=8, depth=1, emb_dim=8, rngs=nnx.Rngs(2)), rngs=nnx.Rngs(1)
    )
    gdd, _ = nnx.split(disc, nnx.Param)
    cfg = distill.DistillConfig(divergence="js", student_every=2)
    opts = {k: distill.make_optimizer(1e-3, 0.01) for k in distill.PARTS}
    return target, gd, pm, gdd, cfg, opts


@pytest.mark.parametrize("precision", PRECISIONS)
def test_make_distill_step_checks_the_teacher_and_the_real_batch_when_built(precision):
    with scope(precision):
        target, gd, pm, gdd, cfg, opts = _setup()
        teacher = target.noisy_score(EDM())
        nets = distill.Networks(gd, gdd, None, 1.0)
        ema = EMA(batch_size=4, decay=0.9)

        def build(batch_fn, data_shape, teacher=teacher):
            return distill.make_distill_step(
                teacher, nets, cfg, opts, ema, batch_fn, 4, data_shape, jit=False
            )

        build(lambda i: jnp.zeros((4, 2)), (2,))  # good: builds
        with pytest.raises(ValueError, match=re.escape("batch_fn(step) must have shape [4, 2]")):
            build(lambda i: jnp.zeros((4, 3)), (2,))
        with pytest.raises(ValueError, match=re.escape("batch_fn(step) must have shape [4, 2]")):
            build(lambda i: jnp.zeros((8, 2)), (2,))
        with pytest.raises(ValueError, match=r"^batch_fn\(step\) must be a real"):
            build(lambda i: jnp.zeros((4, 2), bool), (2,))
        with pytest.raises(ValueError, match=re.escape("data_shape must be the teacher's (2,)")):
            build(lambda i: jnp.zeros((4, 3)), (3,))
        with pytest.raises(ValueError, match=r"^teacher must be a scorelib ScoreSource"):
            build(lambda i: jnp.zeros((4, 2)), (2,), teacher=target)
