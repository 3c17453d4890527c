"""Perceptual distances: LPIPS's form over the layers of a feature network, differentiable
in JAX (the metric loss of Cas-DM, :class:`scorelib.objectives.CascadeLoss`).

LPIPS (Zhang et al., "The unreasonable effectiveness of deep features as a perceptual
metric", CVPR 2018, eq. 1)::

    d(x, y) = sum_l  mean_{h,w}  sum_c  w_lc (f^l_hwc(x) / |f^l_hw(x)| - f^l_hwc(y) / |f^l_hw(y)|)^2

with ``f^l`` the activations of layer ``l`` of a pretrained network, unit-normalised over
the channels at each position, and ``w_l >= 0`` learned channel weights (``w = 1`` is the
paper's uncalibrated "baseline" form). :class:`PerceptualDistance` computes it for any
feature function; two are built here:

- :func:`digits_classifier_distance`: the layers of the bundled digits classifier
  (:mod:`scorelib.metrics.classifier`: three ReLU convolutions and the ReLU dense layer),
  ``w = 1``. It ships with the project, so it is what the digits tables use. The same
  classifier's logits are FD_digits' features: a model trained against it can move FD_digits
  more than the pixel two-sample test; read the pixel test first.
- :func:`lpips_vgg16`: LPIPS itself (VGG16's five ReLU stages and the learned ``w``), with
  every weight read from an ``.npz`` at a path (its keys in the function's docstring); the
  weights cannot be fetched on these machines, so it is a documented option, tested with
  random weights of the right shapes.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

Array = Any

#: LPIPS's input scaling of ``[-1, 1]`` RGB images (its ``ScalingLayer``): ``(x - shift) /
#: scale`` per channel.
LPIPS_SHIFT = (-0.030, -0.088, -0.188)
LPIPS_SCALE = (0.458, 0.448, 0.450)
#: VGG16's convolutions per stage and their channels (Simonyan and Zisserman 2015, config D).
VGG16_STAGES = ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))


def unit_normalise(f: Array, eps: float = 1e-10) -> Array:
    """``f / sqrt(sum_c f^2 + eps)`` over the last (channel) axis."""
    return f * jax.lax.rsqrt(jnp.sum(f * f, axis=-1, keepdims=True) + eps)


def layer_distance(fx: Array, fy: Array, weight: Array | None = None) -> Array:
    """One layer's term of LPIPS: ``mean_{h,w} sum_c w_c (fx_n - fy_n)^2``, ``_n`` the unit
    normalisation over channels.

    Args:
      fx, fy: ``[batch, H, W, C]`` activations (``[batch, C]`` is taken as ``H = W = 1``).
      weight: ``[C]`` non-negative channel weights, or ``None`` for 1.

    Returns:
      ``[batch]`` (dimensionless, in ``[0, 4 max w]``).
    """
    if fx.ndim == 2:
        fx, fy = fx[:, None, None, :], fy[:, None, None, :]
    d = (unit_normalise(fx) - unit_normalise(fy)) ** 2
    if weight is not None:
        d = d * weight
    return jnp.mean(jnp.sum(d, axis=-1), axis=(1, 2))


class PerceptualDistance(struct.PyTreeNode):
    """``d(x, y) = sum_l layer_distance(f_l(x), f_l(y), w_l)`` (module docstring) for the
    feature network ``features(graphdef, params, x) -> [f_1, ..., f_L]``.

    Fields:
      graphdef: the network's graph definition (static).
      params: its parameters (a pytree; never trained by the loss that uses it: the loss's
        gradient reaches only its inputs).
      features: ``(graphdef, params, x) -> list of [batch, H, W, C] or [batch, C]`` (static).
      weights: per-layer ``[C_l]`` channel weights, or ``None`` (all 1).
      name: what it is, for reports (static).

    ``__call__(x, y)``: ``x, y: [batch, *data_shape]`` images in ``[-1, 1]`` -> ``[batch]``.
    """

    graphdef: Any = struct.field(pytree_node=False, default=None)
    params: Any = None
    features: Any = struct.field(pytree_node=False, default=None)
    weights: Any = None
    name: str = struct.field(pytree_node=False, default="perceptual")

    def __call__(self, x: Array, y: Array) -> Array:
        params = jax.lax.stop_gradient(self.params)
        fx = self.features(self.graphdef, params, x)
        fy = self.features(self.graphdef, params, y)
        ws = self.weights if self.weights is not None else [None] * len(fx)
        return sum(layer_distance(a, b, w) for a, b, w in zip(fx, fy, ws, strict=True))


def _cnn_layers(graphdef, params, x):
    """Every ReLU layer of the digits classifier's :class:`~scorelib.metrics.classifier.CNN`."""
    net = nnx.merge(graphdef, params)
    out = []
    for conv in net.convs:
        x = jax.nn.relu(conv(x))
        out.append(x)
    out.append(jax.nn.relu(net.dense(x.reshape(x.shape[0], -1))))
    return out


def digits_classifier_distance(extractor) -> PerceptualDistance:
    """LPIPS's uncalibrated form (``w = 1``) on the layers of a digits classifier.

    Args:
      extractor: a :class:`scorelib.metrics.FeatureExtractor` (e.g. the bundled digits
        classifier, ``FeatureExtractor.load_or_train(ClassifierConfig(), cache_dir)``).

    Returns:
      a :class:`PerceptualDistance` on images ``[batch, *extractor.input_shape]`` in
      ``[-1, 1]``.
    """
    return PerceptualDistance(
        graphdef=extractor._graphdef,
        params=extractor._params,
        features=_cnn_layers,
        name=f"digits classifier layers ({extractor.config.dataset})",
    )


class VGG16Features(nnx.Module):
    """VGG16's convolutional stages (config D), returning the last ReLU of each of the five
    (LPIPS's ``relu1_2 ... relu5_3``); 2x2 max pooling between stages."""

    def __init__(self, *, rngs: nnx.Rngs):
        convs, c = [], 3
        for n, ch in VGG16_STAGES:
            for _ in range(n):
                convs.append(nnx.Conv(c, ch, (3, 3), padding="SAME", rngs=rngs))
                c = ch
        self.convs = nnx.List(convs)

    def __call__(self, x):
        out, i = [], 0
        for s, (n, _) in enumerate(VGG16_STAGES):
            if s:
                x = nnx.max_pool(x, (2, 2), strides=(2, 2))
            for _ in range(n):
                x = jax.nn.relu(self.convs[i](x))
                i += 1
            out.append(x)
        return out


def _vgg_layers(graphdef, params, x):
    if x.shape[-1] == 1:  # grey images as RGB
        x = jnp.repeat(x, 3, axis=-1)
    x = (x - jnp.asarray(LPIPS_SHIFT)) / jnp.asarray(LPIPS_SCALE)
    return nnx.merge(graphdef, params)(x)


def lpips_vgg16(path: str | os.PathLike) -> PerceptualDistance:
    """LPIPS (VGG16, v0.1) with its weights read from ``path``.

    The ``.npz`` holds ``conv{i}_kernel`` (``[3, 3, C_in, C_out]``, HWIO) and ``conv{i}_bias``
    for the 13 convolutions ``i = 0..12`` of VGG16 (the ImageNet weights LPIPS uses, converted
    from OIHW), and ``lin{l}`` (``[C_l]``, non-negative) for the five stages ``l = 0..4``
    (LPIPS's ``lin`` layers, v0.1). Images are ``[batch, H, W, 1 or 3]`` in ``[-1, 1]`` with
    ``H, W >= 16`` (four poolings).

    Raises:
      FileNotFoundError: naming ``objective.metric_weights`` when ``path`` is missing.
      ValueError: naming it for a file that is not an ``.npz`` of arrays, or one without
        these arrays or with other shapes.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"objective.metric_weights: no LPIPS weights at {path} (an .npz of VGG16's conv"
            "{i}_kernel/_bias and lin{l}; scorelib.metrics.perceptual.lpips_vgg16)"
        )
    net = VGG16Features(rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(net, nnx.Param)
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = dict(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"objective.metric_weights: {path} is not a readable .npz of arrays ({e})"
        ) from None
    pure = nnx.to_pure_dict(state)
    for i in range(len(net.convs)):
        for part, key in (("kernel", f"conv{i}_kernel"), ("bias", f"conv{i}_bias")):
            want = pure["convs"][i][part].shape
            got = arrays.get(key)
            if got is None or tuple(got.shape) != tuple(want):
                raise ValueError(
                    f"objective.metric_weights: {path} must hold {key} of shape {want}; got "
                    f"{None if got is None else got.shape}"
                )
            pure["convs"][i][part] = jnp.asarray(got, jnp.float32)
    nnx.replace_by_pure_dict(state, pure)
    weights = []
    for s, (_, ch) in enumerate(VGG16_STAGES):
        w = arrays.get(f"lin{s}")
        if w is None or np.shape(w) != (ch,) or np.any(np.asarray(w) < 0):
            raise ValueError(
                f"objective.metric_weights: {path} must hold lin{s}, [{ch}] non-negative"
            )
        weights.append(jnp.asarray(w, jnp.float32))
    return PerceptualDistance(
        graphdef=graphdef, params=state, features=_vgg_layers, weights=weights, name="LPIPS"
    )
