"""The one-step generator and the discriminator head (Xu, Nie and Vahdat 2025, Sec. 4).

* Generator: an EDM-preconditioned network evaluated once at the noise level
  ``sigma_g``: ``G(z) = D_theta(sigma_g z; sigma_g)`` with ``z ~ N(0, I)`` (Karras et al.
  2022, eq. 7; the student is initialised from the teacher network when there is one);
  ``G(z, c) = D_theta(sigma_g z; sigma_g, c)`` for a class-conditional student.
* Discriminator: light heads on features of the noisy input, one logit per head. The
  features are the frozen teacher network's (``MLP.features``: its hidden layers;
  ``UNet.features``: one feature map per resolution and the bottleneck; at each example's
  class for a class-conditional teacher), or, for a teacher without a network (an
  analytic or empirical score), those of a trainable ``backbone`` network owned by the
  discriminator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_array, check_int, check_shape, check_time, require
from scorelib.keys import example_keys
from scorelib.nets.precond import edm_precond
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.conditional import Labels
from scorelib.scores.network import check_network_input, preconditioned_denoiser

Array = Any


def generate(
    graphdef,
    params,
    z: Array,
    sigma_g: float,
    sigma_data: float,
    sigma_refine: float | None = None,
    *,
    labels: Array | None = None,
) -> Array:
    """Sample ``G(z) = D(sigma_g z; sigma_g)`` of the preconditioned network, or with a
    refining stage ``G(z) = D(D(sigma_g z; sigma_g); sigma_refine)``; a class-conditional
    student ``G(z, c)`` is conditioned on ``labels`` at every evaluation.

    The refining stage feeds the first stage's output to the same network at the low noise
    level ``sigma_refine`` (no noise is added): for a network whose receptive field shrinks
    with the noise level (:class:`scorelib.nets.LocalMLP` below its ``sigma_local``) this is
    the student's local part, which the one evaluation at ``sigma_g`` never reaches. It
    costs a second network evaluation (NFE 2).

    Args:
      graphdef, params: the student network (``nnx.split(model, nnx.Param)``).
      z: ``[batch, *data_shape]`` standard normal noise.
      sigma_g: the generator's input noise level (data units, > 0; EDM: 80).
      sigma_data: the preconditioning's data standard deviation.
      sigma_refine: the refining stage's noise level (data units, in ``(0, sigma_g)``), or
        ``None`` for none.
      labels: ``[batch]`` int classes in ``[0, num_classes)`` for a class-conditional
        network, or ``None`` (an unconditional network).

    Returns:
      ``[batch, *data_shape]`` samples in data units.

    Raises:
      ValueError: naming ``z`` unless it is real ``[batch, *data_shape]`` with the
        network's ``data_shape``; naming ``labels`` (given to an unconditional network, or
        not ``[batch]``).
    """
    batch = check_network_input(graphdef, params, z, "z")
    if labels is not None:
        check_shape(labels, "labels", (batch,), note=" (one class per example of z)")
    sigma = jnp.full((z.shape[0],), sigma_g, jnp.float32)
    x = preconditioned_denoiser(graphdef, params, sigma_g * z, sigma, sigma_data, labels=labels)
    if sigma_refine is None:
        return x
    sigma = jnp.full((z.shape[0],), sigma_refine, jnp.float32)
    return preconditioned_denoiser(graphdef, params, x, sigma, sigma_data, labels=labels)


def generator_nfe(sigma_refine: float | None) -> int:
    """Network evaluations per sample of :func:`generate`: 1, or 2 with a refining stage."""
    return 1 if sigma_refine is None else 2


def one_step_sampler(
    graphdef,
    sigma_g: float,
    sigma_data: float,
    sigma_refine: float | None = None,
    labels: Labels | None = None,
):
    """The student as a sampler: ``sample(params, key, shape, *, first_index=0) -> (x, info)``
    with the library's sampler signature (``scorelib.samplers``), so
    ``scorelib.samplers.draw_samples(sample, params, key, data_shape, ...)`` draws any number
    of one-step samples in batches.

    Example ``b`` of a call draws ``z = normal(fold_in(key, first_index + b), data_shape)``
    (:func:`scorelib.keys.example_keys`) and returns ``G(z)`` (:func:`generate`), with a
    class-conditional student ``G(z, c)`` for the class ``c`` that ``labels`` gives its
    global index (``labels.take(key, first_index, batch)``: the same rule and key as every
    sampler's, so ``labels.take(key, 0, num_samples)`` are the classes of a whole draw). A
    sample depends on its key and global index only, not on the batch it was drawn in.

    Args:
      graphdef: the student network's graph definition.
      sigma_g: the generator's input noise level (data units, > 0).
      sigma_data: the preconditioning's data standard deviation.
      sigma_refine: the generator's refining stage (:func:`generate`), or ``None``.
      labels: a :class:`scorelib.scores.Labels` rule (balanced, uniform, a table) over the
        student's classes for a class-conditional student; ``None`` for an unconditional
        one (a conditional student has no trained null label: it needs a rule).

    Returns:
      ``sample``; ``info = {"nfe": 1 or 2, "steps": 1}``. Compiled once per batch shape.
    """

    @jax.jit(static_argnums=2)
    def draw(params, key, shape, first_index):
        keys = example_keys(key, shape[0], first_index)
        z = jax.vmap(lambda k: jax.random.normal(k, shape[1:]))(keys)
        c = None if labels is None else labels.take(key, first_index, shape[0])
        return generate(graphdef, params, z, sigma_g, sigma_data, sigma_refine, labels=c)

    nfe = generator_nfe(sigma_refine)

    def sample(params, key, shape, *, first_index: int = 0):
        shape = tuple(int(s) for s in shape)
        return draw(params, key, shape, first_index), {"nfe": nfe, "steps": 1}

    return sample


def network_inputs(process, x: Array, t: Array, sigma_data: float) -> tuple[Array, Array]:
    """``(c_in x / alpha(t), c_noise)``: what a preconditioned network sees at ``(x, t)``.

    ``x: [batch, *data_shape]``, ``t`` scalar or ``[batch]`` -> (``[batch, *data_shape]``,
    ``[batch]``) (Karras et al. 2022, Table 1, in the VE frame of ``scores.network``).

    Raises:
      ValueError: naming ``x`` (not real ``[batch, *data_shape]``) or ``t`` (neither a
        scalar nor ``[batch]``).
    """
    check_time(t, "t", check_array(x, "x", ("batch", "*data_shape"))["batch"])
    c = edm_precond(process.ve_sigma(t), sigma_data)
    x_ve = x / broadcast_to_data(process.alpha(t), x)
    return broadcast_to_data(c.c_in, x) * x_ve, jnp.broadcast_to(c.c_noise, (x.shape[0],))


def network_features(
    graphdef, params, x_in: Array, c_noise: Array, labels: Array | None = None
) -> list[Array]:
    """``net.features(x_in, c_noise[, labels])`` of a split network (``MLP``, ``LocalMLP``
    or ``UNet``).

    Args:
      graphdef, params: the network (``nnx.split(net, nnx.Param)``).
      x_in: ``[batch, *data_shape]`` preconditioned inputs (:func:`network_inputs`).
      c_noise: ``[batch]`` noise conditioning.
      labels: ``[batch]`` int classes for a class-conditional network (its features at
        each example's class), or ``None`` (unconditional; a conditional network's null
        label).

    Returns:
      a list of features, one per discriminator head: ``[batch, width]`` per hidden layer
      (``MLP.features``, ``depth`` of them), or ``[batch, H, W, c]`` per resolution and the
      bottleneck (``UNet.features``).

    Raises:
      ValueError: naming ``x_in`` (not real ``[batch, *data_shape]`` with the network's
        ``data_shape``), ``c_noise`` or ``labels`` (not ``[batch]``; labels given to an
        unconditional network).
    """
    batch = check_network_input(graphdef, params, x_in, "x_in")
    check_shape(c_noise, "c_noise", (batch,), note=" (one level per example of x_in)")
    net = nnx.merge(graphdef, params)
    if labels is None:
        return net.features(x_in, c_noise)
    check_shape(labels, "labels", (batch,), note=" (one class per example of x_in)")
    return net.features(x_in, c_noise, labels)


class _VectorHead(nnx.Module):
    """``[batch, c] -> [batch]``: LayerNorm, SiLU, Linear(width), SiLU, Linear(1)."""

    def __init__(self, c: int, width: int, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(c, rngs=rngs)
        self.l1 = nnx.Linear(c, width, rngs=rngs)
        self.l2 = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, f):
        return self.l2(jax.nn.silu(self.l1(jax.nn.silu(self.norm(f)))))[:, 0]


class _ConvHead(nnx.Module):
    """``[batch, H, W, c] -> [batch]``: stride-2 4x4 convolutions (GroupNorm, SiLU) down to
    at most 4x4, a spatial mean, then a linear logit (the heads of Xu et al. 2025, App. B,
    with the final 4x4 -> 1 convolution replaced by a mean)."""

    def __init__(self, c: int, hw: int, width: int, *, rngs: nnx.Rngs):
        convs, norms, cin = [], [], c
        while hw > 4 or not convs:
            norms.append(nnx.GroupNorm(cin, num_groups=max(1, min(32, cin // 4)), rngs=rngs))
            convs.append(nnx.Conv(cin, width, (4, 4), strides=2 if hw > 4 else 1, rngs=rngs))
            cin, hw = width, (hw + 1) // 2 if hw > 4 else hw
        self.norms, self.convs = nnx.List(norms), nnx.List(convs)
        self.out = nnx.Linear(width, 1, rngs=rngs)

    def __call__(self, f):
        for norm, conv in zip(self.norms, self.convs, strict=True):
            f = conv(jax.nn.silu(norm(f)))
        return self.out(jnp.mean(jax.nn.silu(f), axis=(1, 2)))[:, 0]


class Discriminator(nnx.Module):
    """Heads on a list of features; ``__call__`` returns ``[batch, heads]`` logits.

    Args:
      feature_shapes: the per-example shapes of the features, ``(c,)`` (MLP) or
        ``(H, W, c)`` (U-Net), one head each.
      width: hidden units (channels) of each head (>= 1).
      backbone: a network with ``features(x_in, c_noise[, labels])`` (``scorelib.nets.MLP``
        or ``UNet``; class-conditional for a class-conditional teacher), trained with the
        heads, for teachers without a network; ``None``: the features are passed in (the
        frozen teacher's, at each example's class for a conditional teacher).

    Raises:
      ValueError: naming ``distill.disc_width``, or a feature that is neither ``(c,)`` nor
        ``(H, W, c)``.
    """

    def __init__(
        self,
        feature_shapes: Sequence[tuple[int, ...]],
        width: int = 128,
        backbone: nnx.Module | None = None,
        *,
        rngs: nnx.Rngs,
    ):
        check_int(width, "distill.disc_width", low=1)
        heads = []
        for shape in feature_shapes:
            require(len(shape) in (1, 3), "discriminator feature shape", "(c,) or (H, W, c)", shape)
            if len(shape) == 1:
                heads.append(_VectorHead(shape[0], width, rngs=rngs))
            else:
                heads.append(_ConvHead(shape[-1], shape[0], width, rngs=rngs))
        self.heads = nnx.List(heads)
        self.backbone = backbone

    def __call__(
        self,
        x_in: Array,
        c_noise: Array,
        features: list[Array] | None = None,
        labels: Array | None = None,
    ):
        """Logits ``[batch, heads]`` from ``features``, or from the backbone at
        ``(x_in, c_noise)`` (preconditioned inputs, :func:`network_inputs`) and, for a
        class-conditional backbone, each example's class ``labels: [batch]`` (the heads
        themselves take no label: it enters through the features, as in FastGen)."""
        if self.backbone is not None:
            if labels is None:
                features = self.backbone.features(x_in, c_noise)
            else:
                features = self.backbone.features(x_in, c_noise, labels)
        return jnp.stack([head(f) for head, f in zip(self.heads, features, strict=True)], -1)
