"""A network whose receptive field depends on the noise level: global above ``sigma_local``,
a small pixel neighbourhood below it.

Kamb & Ganguli ("An analytic theory of creativity in convolutional diffusion models", ICML
2025, arXiv:2412.20292, Sec. 3) explain the novel samples of convolutional diffusion models
by locality: the optimal denoiser under the constraint that output pixel ``p`` sees only the
patch of the noisy image around ``p`` (their "local score machine") composes new images out
of training patches, where the unconstrained optimum (the training set's own denoiser)
reproduces training images. Trained CNNs behave like it with a receptive field that shrinks
as the noise level falls. :class:`LocalMLP` builds that constraint in, in its simplest form:
at ``sigma >= sigma_local`` the output is an :class:`~scorelib.nets.MLP` of the whole image;
at ``sigma < sigma_local`` output pixel ``p`` is a function of the ``(2 radius + 1)^2``
neighbourhood of ``p``, of ``p``'s position and of the noise level only (a per-position MLP
with shared weights, i.e. a CNN with one ``(2 radius + 1)``-wide convolution followed by 1x1
convolutions, plus a learned embedding of the position).

On the 8x8 digits (the main job, docs/main-job.md, "How the preset was chosen") this is what lets an
MLP-sized network make digits a classifier cannot easily tell from real ones without
copying training digits: the local part cannot look up a whole training image.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_int, check_real
from scorelib.nets.embeddings import embed_labels, label_embedding, make_embedding
from scorelib.nets.mlp import MLP
from scorelib.nets.precond import edm_precond


def patches(x, radius: int):
    """The ``(2 radius + 1)^2`` neighbourhood of every pixel, zero-padded at the borders.

    Args:
      x: ``[batch, H, W, C]``.
      radius: neighbourhood radius (>= 0).

    Returns:
      ``[batch, H * W, (2 radius + 1)^2 * C]``: row ``i * W + j`` holds
      ``x[:, i + di, j + dj, :]`` for ``di, dj = -radius .. radius`` (``di`` slowest, then
      ``dj``, then the channel), 0 outside the image.
    """
    b, h, w, c = x.shape
    k = 2 * radius + 1
    p = jnp.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)))
    cols = [p[:, di : di + h, dj : dj + w, :] for di in range(k) for dj in range(k)]
    return jnp.concatenate(cols, axis=-1).reshape(b, h * w, k * k * c)


class PatchMLP(nnx.Module):
    """``F(x, c_noise)[p]`` from the neighbourhood of pixel ``p``, its position and ``c_noise``.

    ``h_p = W_in patch_p(x) + pos_p + W_emb emb(c_noise)``, then ``depth`` layers
    ``h <- W_l SiLU(h)`` and ``F_p = W_out SiLU(h)`` (zero-initialised), with the same
    weights at every pixel; ``pos_p`` is a learned ``[H * W, width]`` table.

    Args:
      data_shape: ``(H, W, C)``.
      radius: neighbourhood radius (>= 0; 1 is 3x3).
      width, depth: hidden units and hidden layers (>= 1).
      emb_dim, embedding, emb_scale: the noise embedding (``embeddings.make_embedding``).
      dropout: dropout rate in [0, 1) after each hidden layer when training.
      num_classes: ``K >= 1``: class-conditional, the embedded label added to the embedded
        noise level (as :class:`~scorelib.nets.MLP`); 0: unconditional.
    """

    def __init__(
        self,
        data_shape,
        radius: int = 1,
        width: int = 64,
        depth: int = 3,
        emb_dim: int = 64,
        embedding: str = "fourier",
        emb_scale: float | None = None,
        dropout: float = 0.0,
        num_classes: int = 0,
        *,
        rngs: nnx.Rngs,
    ):
        data_shape = tuple(data_shape)
        if len(data_shape) != 3:
            raise ValueError(
                f"model: a local network needs image data, data_shape (H, W, C); got {data_shape}"
            )
        self.radius = check_int(radius, "model.radius", low=0)
        check_int(width, "model.local_width", low=1)
        check_int(depth, "model.local_depth", low=1)
        check_real(dropout, "model.dropout", low=0.0, high=1.0, high_open=True)
        h, w, c = data_shape
        k = 2 * self.radius + 1
        self.embed = make_embedding(embedding, emb_dim, emb_scale, rngs=rngs)
        self.emb_in = nnx.Linear(emb_dim, width, rngs=rngs)
        self.label_emb = label_embedding(num_classes, width, rngs=rngs)
        self.num_classes = 0 if self.label_emb is None else self.label_emb.num_classes
        self.x_in = nnx.Linear(k * k * c, width, rngs=rngs)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (h * w, width)))
        self.hidden = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.out = nnx.Linear(width, c, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)

    def _hidden(self, x, c_noise, labels, rngs):
        """Each hidden layer's output ``[batch, H * W, width]`` (dropout with ``rngs``)."""
        emb = self.emb_in(self.embed(c_noise))  # [batch, width]
        lab = embed_labels(self, labels, x.shape[0])
        emb = emb if lab is None else emb + lab
        h = self.x_in(patches(x, self.radius)) + self.pos[...][None] + emb[:, None, :]
        out = []
        for layer in self.hidden:
            h = layer(jax.nn.silu(h))
            if rngs is not None:
                h = self.dropout(h, rngs=rngs, deterministic=False)
            out.append(h)
        return out

    def __call__(self, x, c_noise, labels=None, *, rngs: nnx.Rngs | None = None):
        """``x: [batch, H, W, C]``, ``c_noise: [batch]``, ``labels: [batch]`` (or ``None``)
        -> ``[batch, H, W, C]``; ``rngs`` enables dropout."""
        h = self._hidden(x, c_noise, labels, rngs)[-1]
        return jnp.reshape(self.out(jax.nn.silu(h)), x.shape)

    def features(self, x, c_noise, labels=None):
        """The hidden activations of :meth:`__call__` (no dropout), for a discriminator head.

        Args:
          x: ``[batch, H, W, C]``; c_noise: ``[batch]``; labels: as :meth:`__call__`.

        Returns:
          a list of ``depth`` arrays ``[batch, H, W, width]``: each hidden layer's output.
        """
        b, h, w, _ = x.shape
        return [jnp.reshape(f, (b, h, w, -1)) for f in self._hidden(x, c_noise, labels, None)]


class LocalMLP(nnx.Module):
    """Global :class:`~scorelib.nets.MLP` at ``sigma >= sigma_local``, :class:`PatchMLP` below.

    ``F(x, c_noise) = MLP(x, c_noise)`` where ``c_noise >= c_noise(sigma_local)``, else
    ``PatchMLP(x, c_noise)``, per example; ``c_noise(sigma) = ln(sigma) / 4`` is EDM's
    (:func:`scorelib.nets.edm_precond`), so the network is meant to sit behind the EDM
    preconditioning. Both parts start at 0 (zero-initialised output layers). The two are
    trained on disjoint noise levels: each example's loss reaches only the part that
    produced its output. Both are evaluated for every example (``jnp.where``), so a call
    costs the sum of the two. The switch makes the denoiser, and the PF-ODE's velocity,
    jump at ``sigma_local``; the samplers step across it, and so does the adaptive solver of
    :func:`scorelib.metrics.bits_per_dim` (the digits preset: 30 to 34 accepted steps per
    test digit at rtol 1e-3).

    Args:
      data_shape: ``(H, W, C)``.
      sigma_local: the noise level (> 0, data units) below which the output is local.
      radius, local_width, local_depth: the :class:`PatchMLP`'s neighbourhood radius and
        size.
      width, depth, emb_dim, embedding, emb_scale, dropout, norm, skip: the global
        :class:`~scorelib.nets.MLP`'s (``emb_dim``, ``embedding``, ``emb_scale`` and
        ``dropout`` are also the :class:`PatchMLP`'s).
      num_classes: ``K >= 1``: both parts class-conditional (each its own label
        embedding); 0: unconditional.

    Raises:
      ValueError: for a ``data_shape`` that is not ``(H, W, C)``, a non-positive
        ``sigma_local`` or any invalid field of the two parts.
    """

    def __init__(
        self,
        data_shape,
        sigma_local: float = 1.0,
        radius: int = 1,
        local_width: int = 64,
        local_depth: int = 3,
        width: int = 512,
        depth: int = 4,
        emb_dim: int = 64,
        embedding: str = "fourier",
        emb_scale: float | None = None,
        dropout: float = 0.0,
        norm: str = "none",
        skip: str = "none",
        num_classes: int = 0,
        *,
        rngs: nnx.Rngs,
    ):
        sigma_local = check_real(
            sigma_local, "model.sigma_local", low=0.0, low_open=True, high_open=True
        )
        self.c_local = float(edm_precond(sigma_local, 1.0).c_noise)
        self.local = PatchMLP(
            data_shape,
            radius=radius,
            width=local_width,
            depth=local_depth,
            emb_dim=emb_dim,
            embedding=embedding,
            emb_scale=emb_scale,
            dropout=dropout,
            num_classes=num_classes,
            rngs=rngs,
        )
        self.num_classes = self.local.num_classes
        self.glob = MLP(
            data_shape,
            width=width,
            depth=depth,
            emb_dim=emb_dim,
            embedding=embedding,
            dropout=dropout,
            emb_scale=emb_scale,
            norm=norm,
            skip=skip,
            num_classes=num_classes,
            rngs=rngs,
        )

    def __call__(self, x, c_noise, labels=None, *, rngs: nnx.Rngs | None = None):
        """``x: [batch, H, W, C]``, ``c_noise: [batch]``, ``labels: [batch]`` (or ``None``);
        ``rngs`` enables dropout."""
        use_global = (c_noise >= self.c_local).reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.where(
            use_global,
            self.glob(x, c_noise, labels, rngs=rngs),
            self.local(x, c_noise, labels, rngs=rngs),
        )

    def features(self, x, c_noise, labels=None):
        """Both parts' hidden activations, for discriminator heads: the global MLP's
        (``depth`` arrays ``[batch, width]``) then the local part's (``local_depth`` arrays
        ``[batch, H, W, local_width]``), whatever the noise level."""
        return self.glob.features(x, c_noise, labels) + self.local.features(x, c_noise, labels)
