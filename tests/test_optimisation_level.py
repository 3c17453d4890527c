"""The suite compiles XLA:CPU code at LLVM's O1 (``XLA_FLAGS`` in tests/conftest.py) where
runs get XLA's default, O3: the two must compute the same numbers to float32 rounding, or
the suite would check other numbers than users get. The EDM loss of a U-Net and its
gradient through convolutions, group norms, attention and the noise embedding, compiled at
each level, agree within float32 rounding (bit for bit with jax 0.10.2). A whole train step
does not always agree bit for bit: where a gradient entry is near zero, Adam's division by
the root of its second moment turns a last-bit difference into about 1e-4 of the step
(measured on a two-level U-Net; a run's numbers differ as much between two CPUs)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scorelib.nets.unet import UNet
from scorelib.objectives import EDMLoss
from scorelib.processes import EDM
from scorelib.training import network_source


def test_the_suites_o1_computes_the_default_o3s_numbers_to_float32_rounding():
    assert "--xla_backend_optimization_level=1" in os.environ["XLA_FLAGS"]  # conftest's
    model = UNet(
        (8, 8, 2),
        channels=8,
        channel_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=(8,),
        emb_dim=16,
        num_groups=4,
        rngs=nnx.Rngs(0),
    )
    graphdef, params = nnx.split(model, nnx.Param)
    proc = EDM()
    source = network_source(proc, graphdef, sigma_data=0.5)
    objective = EDMLoss(process=proc)
    x0 = jnp.tanh(jax.random.normal(jax.random.key(1), (4, 8, 8, 2)))
    key = jax.random.key(2)

    def loss_and_grads(params):
        return jax.value_and_grad(lambda p: objective(source(p, key), x0, key)[0])(params)

    lowered = jax.jit(loss_and_grads).lower(params)
    (loss1, g1), (loss3, g3) = (
        jax.tree.map(np.asarray, lowered.compile(compiler_options=options)(params))
        for options in (None, {"xla_backend_optimization_level": 3})  # the suite's, XLA's
    )
    assert np.isfinite(loss1) and abs(loss1 - loss3) <= 1e-6 * abs(loss3)
    g1, g3 = jax.tree.leaves(g1), jax.tree.leaves(g3)
    scale = max(float(np.max(np.abs(g))) for g in g3)
    assert len(g1) == len(g3) > 20 and scale > 0
    for a, b in zip(g1, g3, strict=True):
        assert np.max(np.abs(a - b)) <= 1e-5 * scale, (a.shape, np.max(np.abs(a - b)), scale)
