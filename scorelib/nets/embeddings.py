"""Noise-level embeddings for the ``c_noise`` input of a network.

* Fourier features (Tancik et al. 2020; used by NCSN++ in Song et al. 2021):
  ``[cos(2 pi w c), sin(2 pi w c)]`` with fixed random frequencies ``w ~ N(0, scale^2)``.
* Positional (Transformer sinusoidal; Ho et al. 2020, used by DDPM++):
  ``[cos(c f_k), sin(c f_k)]`` with ``f_k = max_positions^(-k / (dim/2))``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_choice, check_real, is_int, require


class FourierEmbedding(nnx.Module):
    """``c: [batch] -> [batch, dim]``; the frequencies are fixed (not trained)."""

    def __init__(self, dim: int, scale: float = 16.0, *, rngs: nnx.Rngs):
        require(
            is_int(dim) and dim > 0 and dim % 2 == 0, "model.emb_dim", "a positive even int", dim
        )
        # Stored as a Param so the model is one parameter pytree, but never trained:
        # the forward pass stops its gradient, so Adam's update for it is exactly 0.
        self.freqs = nnx.Param(jax.random.normal(rngs.params(), (dim // 2,)) * scale)

    def __call__(self, c):
        """``c: [batch]`` -> ``[batch, dim]`` (cosines, then sines)."""
        arg = 2 * math.pi * c[:, None] * jax.lax.stop_gradient(self.freqs[...])[None, :]
        return jnp.concatenate([jnp.cos(arg), jnp.sin(arg)], axis=-1)


class PositionalEmbedding(nnx.Module):
    """``c: [batch] -> [batch, dim]`` sinusoidal embedding (no parameters)."""

    def __init__(self, dim: int, max_positions: float = 10000.0, scale: float = 1.0):
        require(
            is_int(dim) and dim > 0 and dim % 2 == 0, "model.emb_dim", "a positive even int", dim
        )
        self.dim = dim
        self.max_positions = max_positions
        self.scale = scale

    def __call__(self, c):
        """``c: [batch]`` -> ``[batch, dim]`` (cosines, then sines)."""
        half = self.dim // 2
        f = jnp.exp(-math.log(self.max_positions) * jnp.arange(half) / half)
        arg = (self.scale * c)[:, None] * f[None, :]
        return jnp.concatenate([jnp.cos(arg), jnp.sin(arg)], axis=-1)


class LabelEmbedding(nnx.Module):
    """``labels: [batch]`` int in ``[0, K]`` -> ``[batch, dim]``: a linear map without bias of
    the one-hot class vector scaled to unit RMS (``sqrt(K) onehot``), the null label ``K``
    being the zero vector, hence the zero embedding (EDM, Karras et al. 2022,
    ``training/networks.py``: ``map_label`` of ``class_labels * sqrt(label_dim)``, added to
    the noise embedding; a zero class vector is the unconditional input).

    Args:
      num_classes: ``K >= 1``.
      dim: the embedding size.
    """

    def __init__(self, num_classes: int, dim: int, *, rngs: nnx.Rngs):
        self.num_classes = num_classes
        self.map = nnx.Linear(num_classes, dim, use_bias=False, rngs=rngs)

    def __call__(self, labels):
        """``[batch]`` int labels (``K``: null) -> ``[batch, dim]``."""
        onehot = jax.nn.one_hot(labels, self.num_classes)  # all zeros for the null label K
        return self.map(onehot * math.sqrt(self.num_classes))


def label_embedding(num_classes: int, dim: int, *, rngs: nnx.Rngs) -> LabelEmbedding | None:
    """A :class:`LabelEmbedding` for ``num_classes >= 1``; ``None`` for 0 (unconditional).

    Raises:
      ValueError: naming ``model.num_classes`` unless it is an int ``>= 0``.
    """
    require(
        is_int(num_classes) and num_classes >= 0,
        "model.num_classes",
        "an int >= 0 (0: unconditional)",
        num_classes,
    )
    return LabelEmbedding(int(num_classes), dim, rngs=rngs) if num_classes else None


def embed_labels(module, labels, batch: int):
    """The label embedding of ``module`` (its ``label_emb``, ``None`` when unconditional) for
    ``labels: [batch]`` (``None``: the null label), or ``None``.

    Raises:
      ValueError: labels given to an unconditional network, or not ``[batch]``.
    """
    emb = module.label_emb
    if labels is None:
        if emb is None:
            return None
        labels = jnp.full((batch,), emb.num_classes, jnp.int32)
    require(
        emb is not None,
        "labels",
        "None for an unconditional network (model.num_classes = 0)",
        f"labels of shape {tuple(jnp.shape(labels))}",
    )
    require(
        tuple(jnp.shape(labels)) == (batch,), "labels", f"of shape ({batch},)", jnp.shape(labels)
    )
    return emb(labels)


DEFAULT_SCALES = {"fourier": 16.0, "positional": 1.0}


def make_embedding(kind: str, dim: int, scale: float | None = None, *, rngs: nnx.Rngs):
    """The embedding ``kind`` in ``{'fourier', 'positional'}`` of ``c_noise``.

    ``scale`` multiplies the frequencies; the defaults (:data:`DEFAULT_SCALES`) suit
    EDM's ``c_noise = ln(sigma) / 4`` (about [-1.6, 1.1]): NCSN++'s Fourier scale 16, and
    the positional embedding applied to ``c_noise`` directly, as EDM's DDPM++ does (the
    DDPM convention ``1000 t`` assumes ``t`` in [0, 1]).

    Raises:
      ValueError: unknown ``kind`` or a non-positive ``scale``.
    """
    if scale is None:
        scale = DEFAULT_SCALES.get(kind, 1.0)
    check_choice(kind, "model.embedding", ("fourier", "positional"))
    scale = check_real(scale, "model.emb_scale", low=0.0, low_open=True, high_open=True)
    if kind == "fourier":
        return FourierEmbedding(dim, scale, rngs=rngs)
    return PositionalEmbedding(dim, scale=scale)
