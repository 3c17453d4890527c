"""Linear measurement operators for inverse problems: ``y = A x0 + sigma_y n``.

Every operator is a frozen pytree dataclass (arrays as leaves, shapes static) acting on a
batch of examples ``x: [batch, *data_shape]`` in data units (images ``[batch, H, W, C]``
in ``[-1, 1]``; flat data ``[batch, d]`` where the operator makes sense) and giving
flattened measurements ``[batch, m]``:

- ``A(x) -> [batch, m]``, ``At(y) -> [batch, *data_shape]`` (the true adjoint
  ``<A x, y> = <x, At y>``, not an interpolation);
- ``svd()`` -> :class:`SVD` (``A = U diag(s) V^T`` with ``s: [r]`` positive and ``U: m x r``,
  ``V: d x r`` with orthonormal columns, all applied per batch) or ``None`` when no cheap
  SVD exists;
- ``pinv(y, rcond)`` -> the Moore-Penrose pseudo-inverse ``A^+ y``, ``[batch, *data_shape]``.

Operators: :class:`Identity` (denoising), :class:`Inpainting` (a keep-mask),
:class:`Downsample` (box average), :class:`GaussianBlur` (zero boundary; a separable SVD),
:class:`RandomProjection` (compressed sensing), :class:`Colourisation` (grey = channel mean),
:class:`Stacked` (several operators' measurements concatenated).
:class:`Measurement` pairs an operator with the noise level ``sigma_y`` (data units of x0:
double a figure quoted for ``[0, 1]`` images to use it on ``[-1, 1]``).

Constructors (``create``, ``from_mask``, ``box``, ``random``) validate on the host, before
anything is traced, and raise ``ValueError`` naming the config field (``task.mask``,
``task.factor``, ``task.std``, ``task.size``, ``task.m``, ``task.keep``, ``task.box``,
``data_shape``, ``sigma_y``) and its allowed range. The SVD-based operators are those DDRM
needs (Kawar et al., NeurIPS 2022, Sec. 4 and App. B; bahjat-kawar/ddrm
functions/svd_replacement.py); the pseudo-inverse zeroes singular values below ``rcond``
times the largest, never dividing by an unguarded value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_array, check_int, check_real, require

Array = Any


def _shape(data_shape: Any, field: str = "data_shape") -> tuple[int, ...]:
    """``data_shape`` as a tuple of positive ints (one example's shape, no batch axis)."""
    try:
        shape = tuple(int(s) for s in data_shape)
        ok = len(shape) >= 1 and all(s >= 1 for s in shape)
        ok = ok and all(float(a) == b for a, b in zip(data_shape, shape, strict=True))
    except (TypeError, ValueError):
        shape, ok = None, False
    require(ok, field, "a non-empty tuple of positive integers", data_shape)
    return shape


def _image_shape(data_shape: Any, what: str) -> tuple[int, int, int]:
    """``data_shape`` as ``(H, W, C)`` for an operator on images."""
    shape = _shape(data_shape)
    require(len(shape) == 3, "data_shape", f"(H, W, C) for {what}", data_shape)
    return shape


class SVD(struct.PyTreeNode):
    """``A = U diag(s) V^T``, applied per batch.

    Fields:
      s: ``[r]`` positive singular values.
      U: ``[batch, r] -> [batch, m]`` (orthonormal columns).
      Ut: ``[batch, m] -> [batch, r]``.
      V: ``[batch, r] -> [batch, *data_shape]`` (orthonormal columns).
      Vt: ``[batch, *data_shape] -> [batch, r]``.
    """

    s: Array = None
    U: Callable = struct.field(pytree_node=False, default=None)
    Ut: Callable = struct.field(pytree_node=False, default=None)
    V: Callable = struct.field(pytree_node=False, default=None)
    Vt: Callable = struct.field(pytree_node=False, default=None)


class LinearOperator(struct.PyTreeNode):
    """A linear map from ``[*data_shape]`` (``d`` entries) to ``[m]``; see the module doc.

    Subclasses implement ``_A`` and ``_At`` on checked, batched inputs and may override
    :meth:`svd`.
    """

    data_shape: tuple = struct.field(pytree_node=False, default=())

    @property
    def d(self) -> int:
        """The number of entries of one example."""
        return math.prod(self.data_shape)

    @property
    def m(self) -> int:
        """The measurement dimension."""
        raise NotImplementedError

    def A(self, x: Array) -> Array:
        """``A x``: ``[batch, *data_shape] -> [batch, m]``.

        Raises:
          ValueError: naming ``x`` for a wrong shape or a non-real dtype.
        """
        check_array(x, "x", ("batch", *self.data_shape))
        return self._A(x)

    def At(self, y: Array) -> Array:
        """The adjoint ``A^T y``: ``[batch, m] -> [batch, *data_shape]``.

        Raises:
          ValueError: naming ``y`` for a wrong shape or a non-real dtype.
        """
        check_array(y, "y", ("batch", self.m))
        return self._At(y)

    def svd(self) -> SVD | None:
        """The singular value decomposition, or ``None`` when no cheap one exists."""
        return None

    def pinv(self, y: Array, rcond: float = 1e-6, maxiter: int = 500) -> Array:
        """The Moore-Penrose pseudo-inverse ``A^+ y``: ``[batch, m] -> [batch, *data_shape]``.

        With an SVD: ``V diag(1/s) U^T y`` over the singular values ``s > rcond * max(s)``
        (the others zeroed). Without: conjugate gradients on the normal equations
        ``A^T A x = A^T y`` from ``x = 0`` (the iterates stay in the range of ``A^T``, so the
        limit is the minimum-norm least-squares solution, i.e. ``A^+ y``), stopped at a
        relative residual ``rcond`` or after ``maxiter`` iterations (``maxiter`` is unused
        with an SVD). Ill-conditioned operators (wide blurs) converge slowly. Each example
        runs its own iteration (``vmap``: its own step sizes and stopping test), so its
        answer does not depend on the other examples of the batch.

        Raises:
          ValueError: naming ``y``, ``rcond`` (a number in [0, 1)) or ``maxiter``.
        """
        rcond = check_real(rcond, "rcond", low=0.0, high=1.0, high_open=True)
        maxiter = check_int(maxiter, "maxiter", low=1)
        check_array(y, "y", ("batch", self.m))
        svd = self.svd()
        if svd is not None:
            s = svd.s
            keep = s > rcond * jnp.max(s)
            inv = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0), 0.0)
            return svd.V(inv * svd.Ut(y))

        def normal(v):  # one example, [*data_shape]
            return self._At(self._A(v[None]))[0]

        def one(rhs):
            x, _ = jax.scipy.sparse.linalg.cg(normal, rhs, tol=rcond, atol=0.0, maxiter=maxiter)
            return x

        return jax.vmap(one)(self._At(y))

    def _A(self, x: Array) -> Array:
        raise NotImplementedError

    def _At(self, y: Array) -> Array:
        raise NotImplementedError


def _equal_rows_svd(op: LinearOperator, c: float) -> SVD:
    """The SVD of an operator whose rows are orthogonal, each of norm ``1 / c``: ``U = I``,
    every singular value ``1 / c``, ``V^T = c A``."""
    return SVD(
        s=jnp.full(op.m, 1.0 / c),
        U=lambda z: z,
        Ut=lambda y: y,
        V=lambda z: c * op._At(z),
        Vt=lambda x: c * op._A(x),
    )


def _flat(x: Array) -> Array:
    return x.reshape(x.shape[0], -1)


class Identity(LinearOperator):
    """``A = I`` (denoising): ``m = d``, all singular values 1."""

    @classmethod
    def create(cls, data_shape) -> Identity:
        """Raises: ValueError naming ``data_shape``."""
        return cls(data_shape=_shape(data_shape))

    @property
    def m(self) -> int:
        return self.d

    def _A(self, x):
        return _flat(x)

    def _At(self, y):
        return y.reshape(y.shape[0], *self.data_shape)

    def svd(self) -> SVD:
        return SVD(s=jnp.ones(self.d), U=lambda z: z, Ut=lambda y: y, V=self._At, Vt=self._A)


class Inpainting(LinearOperator):
    """Keep the coordinates where ``mask`` is true: ``A`` selects them (``m`` = number
    kept), ``A^T`` puts ``y`` back with zeros elsewhere; ``A A^T = I``, so the SVD is
    ``s = 1``, ``U = I``, ``V = A^T``. The measurement holds only kept entries (DPS's
    multiply-by-mask keeps noisy zeros at missing pixels, which inflates residual norms).

    Fields:
      index: ``[m]`` int, the kept flat indices of one example (ascending).
      data_shape: one example's shape (static).
    """

    index: Array = None

    @classmethod
    def from_mask(cls, mask) -> Inpainting:
        """From a boolean keep-mask of one example's shape (``data_shape = mask.shape``).

        Raises:
          ValueError: naming ``task.mask`` for a non-boolean, scalar or empty (all-false) mask.
        """
        mask = np.asarray(mask)
        require(mask.dtype == np.bool_, "task.mask", "a boolean keep-mask", mask.dtype)
        require(mask.ndim >= 1, "task.mask", "a keep-mask of data_shape", mask.shape)
        require(bool(mask.any()), "task.mask", "a keep-mask with at least one true entry", mask)
        index = np.flatnonzero(mask.reshape(-1)).astype(np.int32)
        return cls(data_shape=tuple(mask.shape), index=jnp.asarray(index))

    @classmethod
    def box(cls, data_shape, box) -> Inpainting:
        """Images ``(H, W, C)`` with a centred ``box = (h, w)`` hole (all channels) missing.

        The hole starts at row ``(H - h) // 2`` and column ``(W - w) // 2``.

        Raises:
          ValueError: naming ``data_shape``, or ``task.box`` for a hole that is not two
            integers in ``[0, H] x [0, W]`` or that covers the whole image.
        """
        H, W, C = _image_shape(data_shape, "a box inpainting")
        ok = isinstance(box, tuple | list) and len(box) == 2
        ok = ok and all(isinstance(b, int | np.integer) and not isinstance(b, bool) for b in box)
        ok = ok and 0 <= box[0] <= H and 0 <= box[1] <= W and (box[0], box[1]) != (H, W)
        require(ok, "task.box", f"(h, w) with 0 <= h <= {H}, 0 <= w <= {W}, not both full", box)
        h, w = int(box[0]), int(box[1])
        mask = np.ones((H, W, C), bool)
        r, c = (H - h) // 2, (W - w) // 2
        mask[r : r + h, c : c + w, :] = False
        return cls.from_mask(mask)

    @classmethod
    def random(cls, key, data_shape, keep: float) -> Inpainting:
        """Keep ``round(keep * P)`` of the ``P`` pixels, drawn without replacement by ``key``.

        A pixel is a spatial position with all its channels for images ``(H, W, C)`` and one
        coordinate for flat data ``(d,)``.

        Raises:
          ValueError: naming ``data_shape``, or ``task.keep`` for a fraction outside
            ``(0, 1]`` or one that keeps no pixel.
        """
        shape = _shape(data_shape)
        keep = check_real(keep, "task.keep", low=0.0, high=1.0, low_open=True)
        spatial = shape[:-1] if len(shape) == 3 else shape
        P = math.prod(spatial)
        k = round(keep * P)
        require(k >= 1, "task.keep", f"a fraction keeping at least one of {P} pixels", keep)
        chosen = np.asarray(jax.random.permutation(key, P))[:k]
        pixels = np.zeros(P, bool)
        pixels[chosen] = True
        mask = pixels.reshape(spatial)
        if len(shape) == 3:
            mask = np.broadcast_to(mask[..., None], shape)
        return cls.from_mask(mask)

    @property
    def m(self) -> int:
        return int(self.index.shape[0])

    @property
    def mask(self) -> Array:
        """The boolean keep-mask ``[*data_shape]``."""
        return jnp.zeros(self.d, bool).at[self.index].set(True).reshape(self.data_shape)

    def _A(self, x):
        return _flat(x)[:, self.index]

    def _At(self, y):
        out = jnp.zeros((y.shape[0], self.d), y.dtype).at[:, self.index].set(y)
        return out.reshape(y.shape[0], *self.data_shape)

    def svd(self) -> SVD:
        return SVD(s=jnp.ones(self.m), U=lambda z: z, Ut=lambda y: y, V=self._At, Vt=self._A)


class Downsample(LinearOperator):
    """Box average over ``factor x factor`` blocks, per channel, of images ``(H, W, C)``;
    ``m = H W C / factor^2``.

    Each row of ``A`` is ``1/f^2`` on one block, rows disjoint: ``A A^T = I / f^2``, so
    ``s = 1/f`` (``r = m``), ``U = I``, ``V = f A^T``. ``A^T`` spreads ``y / f^2`` over the
    block (the adjoint; nearest-neighbour upsampling is ``f^2 A^T``, not the adjoint).
    """

    factor: int = struct.field(pytree_node=False, default=1)

    @classmethod
    def create(cls, data_shape, factor: int) -> Downsample:
        """Raises: ValueError naming ``data_shape``, or ``task.factor`` unless an integer
        >= 1 dividing both H and W."""
        H, W, C = _image_shape(data_shape, "downsampling")
        f = check_int(factor, "task.factor", low=1)
        require(H % f == 0 and W % f == 0, "task.factor", f"an integer dividing H={H} and W={W}", f)
        return cls(data_shape=(H, W, C), factor=f)

    @property
    def m(self) -> int:
        return self.d // self.factor**2

    def _A(self, x):
        H, W, C = self.data_shape
        f = self.factor
        return _flat(x.reshape(x.shape[0], H // f, f, W // f, f, C).mean(axis=(2, 4)))

    def _At(self, y):
        H, W, C = self.data_shape
        f = self.factor
        y = y.reshape(y.shape[0], H // f, 1, W // f, 1, C) / f**2
        return jnp.broadcast_to(y, (y.shape[0], H // f, f, W // f, f, C)).reshape(
            y.shape[0], H, W, C
        )

    def svd(self) -> SVD:
        return _equal_rows_svd(self, float(self.factor))  # each row: f^2 pixels of 1 / f^2


def gaussian_kernel(std: float, size: int) -> np.ndarray:
    """The normalised ``[size, size]`` kernel ``exp(-(i^2 + j^2) / (2 std^2))``, offsets
    ``i, j`` in ``-(size//2) .. size//2``, summing to 1 (float64 numpy)."""
    r = np.arange(size, dtype=np.float64) - size // 2
    g = np.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2.0 * std**2))
    return g / g.sum()


def blur_matrix_1d(n: int, std: float, size: int) -> np.ndarray:
    """The ``[n, n]`` matrix of the 1-D 'same' convolution with the normalised kernel
    ``g_r = exp(-r^2 / (2 std^2)) / sum``, ``r`` in ``-(size//2) .. size//2``, zero boundary
    (float64 numpy; symmetric, the kernel being even)."""
    p = size // 2
    r = np.arange(size, dtype=np.float64) - p
    g = np.exp(-(r**2) / (2.0 * std**2))
    g = g / g.sum()
    i = np.arange(n)
    off = i[:, None] - i[None, :]
    return np.where(np.abs(off) <= p, g[np.clip(off + p, 0, size - 1)], 0.0)


#: Spectral entries of a blur below this fraction of the largest are dropped from its SVD
#: (treated as unmeasured): float32 cannot resolve them.
BLUR_SVD_CUT = 1e-7


class GaussianBlur(LinearOperator):
    """Per-channel 2-D convolution of images ``(H, W, C)`` with a normalised Gaussian
    kernel, zero boundary, output the size of the input (``m = d``): ``(A x)[i, j] =
    sum_{a, b} k[a, b] x[i - a, j - b]`` with offsets centred (``scipy.ndimage.convolve``
    with ``mode="constant"``). ``A^T`` is the correlation with the same kernel, i.e. the
    convolution with the flipped kernel under the same zero boundary (the transpose of the
    convolution matrix).

    The Gaussian kernel is separable (``k = g g^T``, ``g`` the normalised 1-D kernel), so
    ``A`` is the Kronecker product ``B_H (x) B_W`` of two 1-D convolution matrices (zero
    boundary, per channel; :func:`blur_matrix_1d`), and ``A x = B_H X B_W^T``,
    ``A^T y = B_H^T Y B_W`` per channel are computed as two small matrix products (float32
    on CPU at batch 1024, against ``jax.lax.conv_general_dilated``: 0.3 ms for 8 ms on
    8 x 8 images, 13 ms for 0.44 s on 32 x 32 x 3).

    SVD: the Kronecker product of the 1-D matrices' SVDs (``numpy.linalg.svd`` once at
    construction): ``s_{kl} = s_k s_l``, ``U = U_H (x) U_W``, ``V = V_H (x) V_W`` (DDRM's
    deblurring, Kawar et al. 2022, App. B; its code zeroes small 1-D singular values, here
    only those below :data:`BLUR_SVD_CUT` times the largest are dropped, so
    ``U diag(s) V^T`` is ``A`` to that precision). Wide blurs are ill-conditioned
    (``s_min / s_max`` about 1e-3 for std 1 on 8 x 8): a noiseless measurement amplifies
    float32 rounding by ``1 / s``; give ``sigma_y > 0``.

    Fields:
      kernel: ``[size, size]`` (sums to 1; ``g g^T``, for reference: ``A`` applies ``b_h``
        and ``b_w``).
      std: the kernel's standard deviation in pixels (static).
      size: the kernel's odd width in pixels (static).
      b_h, b_w: the 1-D convolution matrices, ``[H, H]`` and ``[W, W]``.
      u_h, s_h, v_h, u_w, s_w, v_w: their SVDs (``[H, H]``, ``[H]``, ...).
      keep: ``[r]`` int, the kept entries of the flattened ``(k, l, c)`` spectrum.
    """

    kernel: Array = None
    std: float = struct.field(pytree_node=False, default=1.0)
    size: int = struct.field(pytree_node=False, default=1)
    b_h: Array = None
    b_w: Array = None
    u_h: Array = None
    s_h: Array = None
    v_h: Array = None
    u_w: Array = None
    s_w: Array = None
    v_w: Array = None
    keep: Array = None

    @classmethod
    def create(cls, data_shape, std: float, size: int | None = None) -> GaussianBlur:
        """``size`` defaults to the odd ``2 ceil(3 std) + 1``.

        Raises:
          ValueError: naming ``data_shape``, ``task.std`` (a number > 0) or ``task.size``
            (an odd integer in ``[1, min(H, W)]``; a kernel wider than the image is refused).
        """
        H, W, C = _image_shape(data_shape, "a Gaussian blur")
        std = check_real(std, "task.std", low=0.0, low_open=True)
        if size is None:
            size = 2 * math.ceil(3.0 * std) + 1
            require(size <= min(H, W), "task.size", f"an odd integer in [1, {min(H, W)}]", size)
        size = check_int(size, "task.size", low=1, high=min(H, W))
        require(size % 2 == 1, "task.size", f"an odd integer in [1, {min(H, W)}]", size)
        kernel = jnp.asarray(gaussian_kernel(std, size))
        bh, bw = blur_matrix_1d(H, std, size), blur_matrix_1d(W, std, size)
        uh, sh, vht = np.linalg.svd(bh)
        uw, sw, vwt = np.linalg.svd(bw)
        spectrum = np.broadcast_to(np.outer(sh, sw)[:, :, None], (H, W, C)).reshape(-1)
        keep = np.flatnonzero(spectrum > BLUR_SVD_CUT * spectrum.max()).astype(np.int32)
        f = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(
            data_shape=(H, W, C),
            kernel=kernel,
            std=std,
            size=size,
            b_h=jnp.asarray(bh, f),
            b_w=jnp.asarray(bw, f),
            u_h=jnp.asarray(uh, f),
            s_h=jnp.asarray(sh, f),
            v_h=jnp.asarray(vht.T, f),
            u_w=jnp.asarray(uw, f),
            s_w=jnp.asarray(sw, f),
            v_w=jnp.asarray(vwt.T, f),
            keep=jnp.asarray(keep),
        )

    @property
    def m(self) -> int:
        return self.d

    def _A(self, x):
        return _flat(self._kron(self.b_h, self.b_w, x))

    def _At(self, y):
        return self._kron(self.b_h.T, self.b_w.T, y.reshape(y.shape[0], *self.data_shape))

    def _kron(self, left, right, z):
        """``(left (x) right)`` applied to ``z: [batch, H, W, C]`` over ``(H, W)``."""
        hi = jax.lax.Precision.HIGHEST
        z = jnp.asarray(z)  # numpy float64 outside x64: JAX's float32, no dtype warning
        z = jnp.einsum("ik,bkwc->biwc", left.astype(z.dtype), z, precision=hi)
        return jnp.einsum("jl,bilc->bijc", right.astype(z.dtype), z, precision=hi)

    def _spread(self, z):
        """``[batch, r]`` kept spectral entries -> ``[batch, H, W, C]`` (zeros elsewhere)."""
        z = jnp.asarray(z)
        full = jnp.zeros((z.shape[0], self.d), z.dtype).at[:, self.keep].set(z)
        return full.reshape(z.shape[0], *self.data_shape)

    def svd(self) -> SVD:
        """The Kronecker SVD of the separable blur (class docstring); ``r`` = the kept
        entries."""
        s = (self.s_h[:, None, None] * self.s_w[None, :, None]) * jnp.ones(self.data_shape[2])
        return SVD(
            s=s.reshape(-1)[self.keep],
            U=lambda z: _flat(self._kron(self.u_h, self.u_w, self._spread(z))),
            Ut=lambda y: _flat(
                self._kron(self.u_h.T, self.u_w.T, y.reshape(y.shape[0], *self.data_shape))
            )[:, self.keep],
            V=lambda z: self._kron(self.v_h, self.v_w, self._spread(z)),
            Vt=lambda x: _flat(self._kron(self.v_h.T, self.v_w.T, x))[:, self.keep],
        )


class RandomProjection(LinearOperator):
    """Compressed sensing: a dense ``[m, d]`` matrix with i.i.d. ``N(0, 1/m)`` entries
    (Candes & Tao 2006; ``E ||A x||^2 = ||x||^2``), ``1 <= m <= d``. The SVD is
    ``jnp.linalg.svd`` of the matrix, computed once at construction.

    Fields:
      matrix: ``[m, d]``.
      u: ``[m, r]``, s: ``[r]``, vt: ``[r, d]`` its thin SVD (``r = m``).
    """

    matrix: Array = None
    u: Array = None
    s: Array = None
    vt: Array = None

    @classmethod
    def create(cls, key, data_shape, m: int) -> RandomProjection:
        """Raises: ValueError naming ``data_shape``, or ``task.m`` unless an integer in
        ``[1, d]``."""
        shape = _shape(data_shape)
        d = math.prod(shape)
        m = check_int(m, "task.m", low=1, high=d)
        matrix = jax.random.normal(key, (m, d)) / math.sqrt(m)
        u, s, vt = jnp.linalg.svd(matrix, full_matrices=False)
        return cls(data_shape=shape, matrix=matrix, u=u, s=s, vt=vt)

    @property
    def m(self) -> int:
        return int(self.matrix.shape[0])

    def _A(self, x):
        return jnp.dot(_flat(x), self.matrix.T.astype(x.dtype), precision="highest")

    def _At(self, y):
        x = jnp.dot(y, self.matrix.astype(y.dtype), precision="highest")
        return x.reshape(y.shape[0], *self.data_shape)

    def svd(self) -> SVD:
        hi = jax.lax.Precision.HIGHEST
        return SVD(
            s=self.s,
            U=lambda z: jnp.dot(z, self.u.T, precision=hi),
            Ut=lambda y: jnp.dot(y, self.u, precision=hi),
            V=lambda z: jnp.dot(z, self.vt, precision=hi).reshape(z.shape[0], *self.data_shape),
            Vt=lambda x: jnp.dot(_flat(x), self.vt.T, precision=hi),
        )


class Colourisation(LinearOperator):
    """RGB to grey by the mean of the 3 channels (last axis): ``m = d / 3``.

    Each row of ``A`` is ``1/3`` on one pixel's channels: ``A A^T = I / 3``, so
    ``s = 1/sqrt(3)``, ``U = I``, ``V = sqrt(3) A^T``. (A luminance weighting would be a
    different operator; the mean keeps the SVD closed-form as in DDRM.)
    """

    @classmethod
    def create(cls, data_shape) -> Colourisation:
        """Raises: ValueError naming ``data_shape`` unless its last axis has 3 channels."""
        shape = _shape(data_shape)
        require(shape[-1] == 3, "data_shape", "a shape with 3 channels last (RGB)", data_shape)
        return cls(data_shape=shape)

    @property
    def m(self) -> int:
        return self.d // 3

    def _A(self, x):
        return _flat(x.mean(axis=-1))

    def _At(self, y):
        y = y.reshape(y.shape[0], *self.data_shape[:-1], 1) / 3.0
        return jnp.broadcast_to(y, (y.shape[0], *self.data_shape))

    def svd(self) -> SVD:
        return _equal_rows_svd(self, math.sqrt(3.0))  # each row: 3 channels of 1 / 3


class Stacked(LinearOperator):
    """Several operators on the same data, their measurements concatenated:
    ``A x = [A_1 x; A_2 x; ...]``, ``A^T y = sum_k A_k^T y_k``, ``m = sum_k m_k`` (sensor
    fusion: a low-resolution image and a few point observations in one posterior). No SVD
    (the parts' row spaces overlap): :meth:`pinv` runs conjugate gradients.

    Fields:
      operators: the parts (a tuple of :class:`LinearOperator`, each on ``data_shape``).
    """

    operators: tuple = ()

    @classmethod
    def create(cls, operators) -> Stacked:
        """Raises: ValueError naming ``task.operators`` for fewer than one operator, a part
        that is not a LinearOperator, or parts on different data shapes."""
        ops = tuple(operators) if isinstance(operators, list | tuple) else ()
        require(len(ops) >= 1, "task.operators", "a list of at least one operator", operators)
        for op in ops:
            require(isinstance(op, LinearOperator), "task.operators", "LinearOperators", type(op))
        shapes = {tuple(op.data_shape) for op in ops}
        require(len(shapes) == 1, "task.operators", "operators on one data shape", shapes)
        return cls(data_shape=tuple(ops[0].data_shape), operators=ops)

    @property
    def m(self) -> int:
        return sum(op.m for op in self.operators)

    def _A(self, x):
        return jnp.concatenate([op._A(x) for op in self.operators], axis=1)

    def _At(self, y):
        out, start = 0.0, 0
        for op in self.operators:
            out = out + op._At(y[:, start : start + op.m])
            start += op.m
        return out


class Measurement(struct.PyTreeNode):
    """A noisy linear measurement ``y = A x0 + sigma_y n``, ``n ~ N(0, I)``.

    Fields:
      operator: the :class:`LinearOperator` ``A``.
      sigma_y: the noise standard deviation in data units of x0 (images in ``[-1, 1]``:
        twice a figure quoted for ``[0, 1]``): a scalar, or ``[m]`` one per measured entry
        (:meth:`stack`: each part its own); a leaf, so sweeps compile once.
    """

    operator: LinearOperator = None
    sigma_y: Array = 0.0

    @classmethod
    def create(cls, operator: LinearOperator, sigma_y: float) -> Measurement:
        """Raises: ValueError naming ``operator`` (not a LinearOperator) or ``sigma_y``
        (a number >= 0)."""
        require(
            isinstance(operator, LinearOperator), "operator", "a LinearOperator", type(operator)
        )
        sigma_y = check_real(sigma_y, "sigma_y", low=0.0)
        return cls(operator=operator, sigma_y=sigma_y)

    @classmethod
    def stack(cls, measurements) -> Measurement:
        """Several measurements of the same data as one: a :class:`Stacked` operator and the
        ``[m]`` noise levels of its parts (each part's ``sigma_y`` over its entries), in JAX's
        default float dtype (float64 under ``jax.enable_x64``).

        Raises:
          ValueError: naming ``task.operators`` (see :meth:`Stacked.create`) or a part that
            is not a Measurement.
        """
        parts = tuple(measurements) if isinstance(measurements, list | tuple) else ()
        for p in parts:
            require(isinstance(p, Measurement), "task.operators", "Measurements", type(p))
        op = Stacked.create([p.operator for p in parts])
        sigma = np.concatenate(
            [np.broadcast_to(np.asarray(p.sigma_y, np.float64), (p.operator.m,)) for p in parts]
        )
        return cls(
            operator=op, sigma_y=jnp.asarray(sigma, jax.dtypes.canonicalize_dtype(np.float64))
        )

    @property
    def scalar_noise(self) -> bool:
        """Whether ``sigma_y`` is one number for every entry (static)."""
        return jnp.ndim(self.sigma_y) == 0

    def noise_std(self, dtype=jnp.float32) -> Array:
        """``sigma_y`` as a scalar or ``[m]`` array of ``dtype``, broadcastable against
        ``[batch, m]``."""
        return jnp.asarray(self.sigma_y, dtype)

    def measure(self, x: Array, key) -> Array:
        """``A x + sigma_y n`` for ``x: [batch, *data_shape]``; returns ``[batch, m]``.

        Raises:
          ValueError: naming ``x`` for a wrong shape or dtype.
        """
        Ax = self.operator.A(x)
        n = jax.random.normal(key, Ax.shape, Ax.dtype)
        return Ax + self.noise_std(Ax.dtype) * n
