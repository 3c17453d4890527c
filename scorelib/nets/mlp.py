"""MLP network ``F(x, c_noise)`` for vector (or flattened small image) data."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_choice, check_int, check_real
from scorelib.nets.embeddings import embed_labels, label_embedding, make_embedding


class MLP(nnx.Module):
    """A residual-free MLP conditioned on the noise embedding (and class label) by addition.

    ``x: [batch, *data_shape]`` is flattened, embedded with the noise level, passed
    through ``depth`` SiLU layers of ``width`` units, and mapped back to
    ``[batch, *data_shape]``. The last layer is zero-initialised, so an
    EDM-preconditioned model starts at ``D(x) = c_skip x``.

    Args:
      data_shape: shape of one example (e.g. ``(2,)`` or ``(8, 8, 1)``).
      width, depth: hidden units per layer and number of hidden layers (>= 1).
      emb_dim: size of the noise embedding; ``embedding`` is ``'fourier'`` or ``'positional'``,
        ``emb_scale`` its frequency scale (default: see ``embeddings.make_embedding``).
      dropout: dropout rate in [0, 1) applied after each hidden layer when training.
      norm: ``'none'`` or ``'layer'``: LayerNorm (Ba et al. 2016) before each hidden
        layer's activation and before the output layer, which bounds the output for
        any input, also at noise levels training rarely saw.
      skip: ``'none'`` or ``'affine'``: add a per-coordinate affine path
        ``a(c_noise) * x + b(c_noise)`` to the output, with ``a, b: [batch, d]`` linear in
        the SiLU of the embedded noise level (zero-initialised, so the network still
        starts at 0). It holds, at every noise level, the per-coordinate linear
        (Wiener-filter) part of the denoiser exactly, e.g. ``D = -1`` for an image's
        always-black border, which the hidden layers would otherwise have to
        reproduce from the input through the stack; they learn the remainder.
      num_classes: ``K >= 1`` makes the network class-conditional: ``labels: [batch]``
        in ``[0, K]`` are embedded (:class:`~scorelib.nets.embeddings.LabelEmbedding`,
        ``K`` the null label, the zero embedding) and added to the embedded noise level;
        0 (the default) is unconditional, with exactly the parameters it had before.

    Raises:
      ValueError: for non-positive sizes, a dropout rate outside [0, 1), an unknown norm
        or skip, a negative ``num_classes``.
    """

    def __init__(
        self,
        data_shape,
        width: int = 256,
        depth: int = 4,
        emb_dim: int = 64,
        embedding: str = "fourier",
        dropout: float = 0.0,
        emb_scale: float | None = None,
        norm: str = "none",
        skip: str = "none",
        num_classes: int = 0,
        *,
        rngs: nnx.Rngs,
    ):
        check_int(width, "model.width", low=1)
        check_int(depth, "model.depth", low=1)
        check_real(dropout, "model.dropout", low=0.0, high=1.0, high_open=True)
        check_choice(norm, "model.norm", ("none", "layer"))
        check_choice(skip, "model.skip", ("none", "affine"))
        self.data_shape = tuple(data_shape)
        d = math.prod(self.data_shape)
        self.embed = make_embedding(embedding, emb_dim, emb_scale, rngs=rngs)
        self.emb_in = nnx.Linear(emb_dim, width, rngs=rngs)
        self.label_emb = label_embedding(num_classes, width, rngs=rngs)
        self.num_classes = 0 if self.label_emb is None else self.label_emb.num_classes
        self.x_in = nnx.Linear(d, width, rngs=rngs)
        self.hidden = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.out = nnx.Linear(width, d, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)
        self.norms = (
            nnx.List([nnx.LayerNorm(width, rngs=rngs) for _ in range(depth + 1)])
            if norm == "layer"
            else None
        )
        zeros = nnx.initializers.zeros
        self.skip_scale, self.skip_shift = (
            (
                nnx.Linear(width, d, kernel_init=zeros, rngs=rngs),
                nnx.Linear(width, d, kernel_init=zeros, rngs=rngs),
            )
            if skip == "affine"
            else (None, None)
        )

    def _embedding(self, c_noise, labels, b):
        """``[b, width]``: the embedded noise level plus the embedded label (if any)."""
        emb = self.emb_in(self.embed(c_noise))
        lab = embed_labels(self, labels, b)
        return emb if lab is None else emb + lab

    def __call__(self, x, c_noise, labels=None, *, rngs: nnx.Rngs | None = None):
        """``x: [batch, *data_shape]``, ``c_noise: [batch]``, ``labels: [batch]`` int in
        ``[0, num_classes]`` or ``None`` (the null label; only ``None`` when unconditional);
        ``rngs`` enables dropout."""
        b = x.shape[0]
        flat = jnp.reshape(x, (b, -1))
        emb = self._embedding(c_noise, labels, b)
        h = self.x_in(flat) + emb
        for i, layer in enumerate(self.hidden):
            h = layer(jax.nn.silu(self._norm(i, h)))
            if rngs is not None:
                h = self.dropout(h, rngs=rngs, deterministic=False)
        out = self.out(jax.nn.silu(self._norm(-1, h)))
        if self.skip_scale is not None:
            e = jax.nn.silu(emb)
            out = out + self.skip_scale(e) * flat + self.skip_shift(e)
        return jnp.reshape(out, x.shape)

    def features(self, x, c_noise, labels=None):
        """The hidden activations of :meth:`__call__` (no dropout), for a discriminator head.

        Args:
          x: ``[batch, *data_shape]``; c_noise: ``[batch]``; labels: as :meth:`__call__`.

        Returns:
          a list of ``depth`` arrays ``[batch, width]``: the output of each hidden layer.
        """
        b = x.shape[0]
        h = self.x_in(jnp.reshape(x, (b, -1))) + self._embedding(c_noise, labels, b)
        out = []
        for i, layer in enumerate(self.hidden):
            h = layer(jax.nn.silu(self._norm(i, h)))
            out.append(h)
        return out

    def _norm(self, i, h):  # LayerNorm i (-1: before the output layer), or the identity
        return h if self.norms is None else self.norms[i](h)
