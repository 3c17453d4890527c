"""A noise-conditional classifier network ``F(x, c_noise) -> logits`` for class guidance.

The body is :class:`~scorelib.nets.MLP`'s: the flattened input and the embedded noise level
are added, then ``depth`` SiLU layers of ``width`` units; the head maps to ``num_classes``
logits instead of the data shape. It is the classifier of classifier guidance (Dhariwal and
Nichol 2021, Sec. 4; Song et al. 2021, "Score-based generative modeling through SDEs",
App. I.4, whose noise-conditional Wide-ResNet adds Fourier features of the noise level to its
activations), small enough for the CPU. Smooth activations (SiLU): the DLSM loss
(``scorelib/objectives/classifier.py``) differentiates the input gradient of its output once
more.

The network knows nothing of processes: :class:`scorelib.scores.classifier.NoisyClassifier`
feeds it EDM's ``c_in(sigma) x`` and ``c_noise(sigma)`` (Karras et al. 2022, Table 1).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_choice, check_int, check_real, is_int, require
from scorelib.nets.embeddings import DEFAULT_SCALES, make_embedding


class ClassifierMLP(nnx.Module):
    """``x: [batch, *data_shape]``, ``c_noise: [batch]`` -> logits ``[batch, num_classes]``.

    The output layer is zero-initialised: a fresh classifier gives uniform class
    probabilities (cross-entropy ``log num_classes``) and a zero input gradient.

    Args:
      data_shape: shape of one example (e.g. ``(2,)`` or ``(8, 8, 1)``).
      num_classes: ``K >= 2`` classes (built from the data's labels, not a config field).
      width, depth: hidden units per layer and number of hidden layers (>= 1).
      emb_dim: size of the noise embedding (a positive even int); ``embedding`` is
        ``'fourier'`` or ``'positional'``, ``emb_scale`` its frequency scale (``None``: 16
        for Fourier features, 1 for the positional embedding; ``scorelib.nets.embeddings``).
      norm: ``'none'`` or ``'layer'`` (LayerNorm before each activation, as ``MLP``).

    Raises:
      ValueError: naming ``classifier.<field>`` for sizes out of range, an unknown
        embedding or norm, a non-positive ``emb_scale``, fewer than 2 classes.
    """

    def __init__(
        self,
        data_shape,
        num_classes: int,
        width: int = 256,
        depth: int = 3,
        emb_dim: int = 64,
        embedding: str = "fourier",
        emb_scale: float | None = None,
        norm: str = "none",
        *,
        rngs: nnx.Rngs,
    ):
        check_int(num_classes, "classifier.num_classes", low=2)
        check_int(width, "classifier.width", low=1)
        check_int(depth, "classifier.depth", low=1)
        require(
            is_int(emb_dim) and emb_dim > 0 and emb_dim % 2 == 0,
            "classifier.emb_dim",
            "a positive even int",
            emb_dim,
        )
        check_choice(embedding, "classifier.embedding", tuple(DEFAULT_SCALES))
        if emb_scale is not None:
            check_real(emb_scale, "classifier.emb_scale", low=0.0, low_open=True)
        check_choice(norm, "classifier.norm", ("none", "layer"))
        self.data_shape = tuple(data_shape)
        self.num_classes = int(num_classes)
        d = math.prod(self.data_shape)
        self.embed = make_embedding(embedding, emb_dim, emb_scale, rngs=rngs)
        self.emb_in = nnx.Linear(emb_dim, width, rngs=rngs)
        self.x_in = nnx.Linear(d, width, rngs=rngs)
        self.hidden = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.out = nnx.Linear(
            width, self.num_classes, kernel_init=nnx.initializers.zeros, rngs=rngs
        )
        self.norms = (
            nnx.List([nnx.LayerNorm(width, rngs=rngs) for _ in range(depth + 1)])
            if norm == "layer"
            else None
        )

    def __call__(self, x, c_noise):
        """``x: [batch, *data_shape]``, ``c_noise: [batch]`` -> ``[batch, num_classes]``
        logits (unnormalised log class probabilities). Each example is treated on its
        own (no batch statistics), so per-example input gradients are those of the sum."""
        b = x.shape[0]
        h = self.x_in(jnp.reshape(x, (b, -1))) + self.emb_in(self.embed(c_noise))
        for i, layer in enumerate(self.hidden):
            h = layer(jax.nn.silu(self._norm(i, h)))
        return self.out(jax.nn.silu(self._norm(-1, h)))

    def _norm(self, i, h):  # LayerNorm i (-1: before the output layer), or the identity
        return h if self.norms is None else self.norms[i](h)
