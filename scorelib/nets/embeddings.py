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
