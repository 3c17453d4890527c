"""Measurement-conditioned score sources: posterior sampling for linear inverse problems.

A measurement ``y = A x0 + sigma_y n`` (:class:`~scorelib.operators.Measurement`) conditions a
prior source (any :class:`~scorelib.scores.ScoreSource`: a trained network, a class-conditional
or guided model, the analytic Gaussian) into an approximation of the posterior's noised score
``grad_x log p_t(x | y) = grad_x log p_t(x) + grad_x log p_t(y | x)``. The measurement is a
property of the source, bound per example as a conditional source binds its labels
(``scorelib/scores/conditional.py``): :class:`Observations` holds ``M`` measurements, each
shared by ``repeats`` consecutive examples (``repeats`` posterior draws per measurement), and
:meth:`MeasuredScore.for_examples` gives example ``i`` the measurement ``(i // repeats) % M``.
So every registered sampler, ``draw_samples`` and several devices draw posterior samples
unchanged; the sampler driver binds each block of examples.

Methods (each a source wrapping the prior; ``D = prior.denoiser(x, t)`` the prior's denoiser,
``J = dD/dx`` its Jacobian, ``r = y - A D`` the residual):

* :class:`Projection`, replacement on the denoiser: ``D + A^+ (y - A D)`` (the range-null
  decomposition of DDNM, Wang, Yu and Zhang, ICLR 2023, eq. 13; score_sde's replacement,
  Song et al. 2021, App. I.2, acts on the state: for noiseless inpainting and the
  probability-flow Euler step the two agree, the known coordinates of the state following
  ``y + sigma eps`` with the starting noise). The measured part of ``D`` is replaced by the
  measurement whatever ``sigma_y``: exact only in the noiseless limit. One denoiser call and
  one ``A^+`` per call.
* :class:`DPS` (Chung et al., ICLR 2023, "Diffusion posterior sampling for general noisy
  inverse problems", Algorithm 1; its code's unsquared norm): ``score + zeta J^T A^T r / ||r||``,
  the gradient of ``-zeta ||y - A D(x)||`` per example. ``zeta`` is in score units (1 / data,
  per unit of ``||r||``'s gradient): each sampler multiplies the score by its own step, so
  the paper's per-step ``zeta'`` (a DDPM step on 1000 steps) does not carry over; a
  probability-flow Euler step from ``sigma`` to ``sigma'`` moves ``x`` by
  ``(sigma - sigma') sigma zeta J^T A^T r / ||r||`` (VE frame). Biased at every ``zeta``:
  it is not the likelihood's gradient in any limit.
* :class:`PiGDM` (Song, Vahdat, Mardani and Kautz, ICLR 2023, "Pseudoinverse-guided diffusion
  models for inverse problems", eq. 7 and App. A): ``score + J^T A^T S^{-1} r`` with
  ``S = r_t^2 A A^T + sigma_y^2 I`` and ``r_t^2 = sigma_data^2 sigma^2 / (sigma_data^2 +
  sigma^2)`` (``sigma`` the VE noise level): the Gaussian approximation
  ``p(x0 | x_t) ~ N(D, r_t^2 I)`` of the posterior of ``x0``, the paper's
  ``r_t^2 = sigma^2 / (1 + sigma^2)`` for data of variance ``sigma_data^2``. **Exact** for a
  Gaussian prior ``N(mu, c I)`` with ``sigma_data^2 = c`` (then ``p(x0 | x_t)`` is that
  Gaussian, ``D`` affine, and ``p_t(y | x)`` exactly ``N(A D, S)``); biased otherwise. The
  ``sigma_y^2`` term public code leaves out is kept. ``S^{-1}`` by the operator's SVD, else
  by conjugate gradients.
* DDRM is a sampler, not a source (its update acts per singular direction):
  ``scorelib.samplers.ddrm`` on a :class:`MeasuredScore` whose operator has an SVD.

Cost per call: one prior denoiser call (:class:`Projection`); a forward and a
vector-Jacobian product through the prior (:class:`DPS`, :class:`PiGDM`: about three forward
passes of a network). Every sampler's ``info["nfe"]`` counts calls of the source.

Frame: ``x`` is in process coordinates at time ``t``; ``D`` is in data units, and the
likelihood's gradient is taken with respect to ``x`` itself (through ``D``), so no process
(VE, VP, EDM) needs a separate formula.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_real, require
from scorelib.operators import Measurement
from scorelib.scores.base import ScoreSource, check_query, score_from_denoiser

Array = Any

#: Conjugate-gradient settings of ``S^{-1} r`` where the operator has no SVD (relative
#: residual, iterations).
CG_TOL, CG_MAXITER = 1e-6, 200


class Observations(struct.PyTreeNode):
    """Which measurement each example of a draw is conditioned on, by its global index.

    Example ``i`` gets ``values[(i // repeats) % M]``: ``M`` measurements, each held by
    ``repeats`` consecutive examples (``repeats`` posterior draws per measurement).

    Fields:
      values: ``[M, m]`` measurements (data units), a leaf.
      repeats: consecutive examples per measurement (static, ``>= 1``).
    """

    values: Array = None
    repeats: int = struct.field(pytree_node=False, default=1)

    @classmethod
    def create(cls, values, m: int, repeats: int = 1) -> Observations:
        """Raises: ValueError naming ``y`` (not ``[M, m]`` or ``[m]``, or not finite) or
        ``task.draws`` (``repeats`` below 1)."""
        arr = np.asarray(values, np.float64) if _real(values) else None
        if arr is not None and arr.ndim == 1:
            arr = arr[None]
        ok = arr is not None and arr.ndim == 2 and arr.shape[1] == m and arr.shape[0] >= 1
        require(ok, "y", f"measurements of shape [M, {m}] (m = the operator's)", _shape(values))
        require(bool(np.all(np.isfinite(arr))), "y", "finite measurements", "non-finite values")
        r = repeats
        require(
            isinstance(r, int | np.integer) and not isinstance(r, bool) and r >= 1,
            "task.draws",
            "an integer >= 1 (posterior draws per measurement)",
            r,
        )
        dtype = jax.dtypes.canonicalize_dtype(np.float64)
        return cls(values=jnp.asarray(arr, dtype), repeats=int(r))

    @property
    def m(self) -> int:
        return int(self.values.shape[1])

    def take(self, first_index: Array, batch: int) -> Array:
        """``[batch, m]`` measurements of examples ``first_index .. first_index + batch - 1``
        (jit-safe with a traced ``first_index``)."""
        idx = jnp.asarray(first_index, jnp.int32) + jnp.arange(batch, dtype=jnp.int32)
        return jnp.take(self.values, (idx // self.repeats) % self.values.shape[0], axis=0)


def _real(values) -> bool:
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError):
        return False
    return np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)


def _shape(values):
    try:
        return f"shape {np.shape(values)}"
    except (TypeError, ValueError):
        return type(values).__name__


class MeasuredScore(ScoreSource):
    """A prior source with a measurement attached (module docstring); the base of the
    measurement-conditioned sources, and what ``scorelib.samplers.ddrm`` samples from.

    This base adds no likelihood term: calling its ``score``/``denoiser`` raises (a sampler
    given it would otherwise draw from the prior). :class:`Projection`, :class:`DPS` and
    :class:`PiGDM` are the sources samplers use.

    Fields:
      prior: the prior source (bound with the same examples by :meth:`for_examples`).
      measurement: ``A`` and ``sigma_y``.
      observations: the unbound measurements (:class:`Observations`).
      y: ``[batch, m]`` the measurements bound to the examples of a call, or ``None``.
    """

    prior: Any = None
    measurement: Any = None
    observations: Any = None
    y: Array = None

    @classmethod
    def create(cls, prior, measurement, y, *, repeats: int = 1, **fields) -> MeasuredScore:
        """Condition ``prior`` on the measurements ``y`` (``[M, m]``, or ``[m]`` for one),
        each held by ``repeats`` consecutive examples.

        Raises:
          ValueError: naming ``source`` (a prior that is not a score source), ``measurement``
            (not a Measurement), ``task`` (its operator on another data shape than the
            prior's), ``y`` or ``task.draws``; ``method`` or ``method.<option>`` for a
            subclass's options (one it does not use, a missing or invalid one).
        """
        require(isinstance(prior, ScoreSource), "source", "a score source", type(prior))
        require(
            isinstance(measurement, Measurement), "measurement", "a Measurement", type(measurement)
        )
        data_shape, _ = prior.expected_data_shape()
        op_shape = tuple(measurement.operator.data_shape)
        require(
            data_shape is None or tuple(data_shape) == op_shape,
            "task",
            f"an operator on the prior's data shape {data_shape}",
            f"an operator on {op_shape}",
        )
        obs = Observations.create(y, measurement.operator.m, repeats)
        return cls(
            process=prior.process,
            prior=prior,
            measurement=measurement,
            observations=obs,
            **cls.check_fields(fields),
        )

    @classmethod
    def check_fields(cls, fields: dict) -> dict:
        """The subclass's own fields, checked (default: none allowed)."""
        require(not fields, "method", f"no options for {cls.__name__}", sorted(fields))
        return {}

    def expected_data_shape(self):
        shape = tuple(self.measurement.operator.data_shape)
        return shape, f" (the data_shape of the {type(self).__name__}'s operator)"

    def for_examples(self, key, batch: int, first_index: Array = 0) -> MeasuredScore:
        """The prior bound to the same examples, and their measurements ``[batch, m]``."""
        return self.replace(
            prior=self.prior.for_examples(key, batch, first_index),
            y=self.observations.take(first_index, batch),
        )

    def bound_y(self, batch: int) -> Array:
        """The ``[batch, m]`` measurements of a call.

        Raises:
          ValueError: when none are bound (call ``for_examples``; every sampler does) or
            they are bound for another batch size.
        """
        require(
            self.y is not None and tuple(self.y.shape) == (batch, self.measurement.operator.m),
            f"{type(self).__name__}.y",
            f"[{batch}, {self.measurement.operator.m}] measurements bound with "
            f"for_examples(key, {batch}, first_index) (every sampler does it)",
            None if self.y is None else f"shape {tuple(self.y.shape)}",
        )
        return self.y

    def prior_denoiser(self, x: Array, t: Array) -> Array:
        """The prior's ``D(x, t)`` (data units; shape of ``x``)."""
        return self.prior.denoiser(x, t)

    def denoiser(self, x: Array, t: Array) -> Array:
        if type(self).score is MeasuredScore.score:
            raise NotImplementedError(
                "MeasuredScore adds no likelihood term: sample it with scorelib.samplers.ddrm, "
                "or use Projection, DPS or PiGDM with any sampler"
            )
        return super().denoiser(x, t)

    def score(self, x: Array, t: Array) -> Array:
        if type(self).denoiser is MeasuredScore.denoiser:
            raise NotImplementedError(
                "MeasuredScore adds no likelihood term: sample it with scorelib.samplers.ddrm, "
                "or use Projection, DPS or PiGDM with any sampler"
            )
        return super().score(x, t)

    def _residual_vjp(self, x, t):
        """``(D, vjp, r)``: the prior's denoiser, the VJP of ``x -> D(x, t)``, ``y - A D``."""
        y = self.bound_y(x.shape[0])
        d, vjp = jax.vjp(lambda z: self.prior_denoiser(z, t), x)
        r = y.astype(d.dtype) - self.measurement.operator._A(d)
        return d, vjp, r


class Projection(MeasuredScore):
    """Replacement on the denoiser, ``D + A^+ (y - A D)`` (module docstring; DDNM's
    range-null decomposition, score_sde's replacement on ``D``). ``A^+`` by the operator's
    SVD, else conjugate gradients (:meth:`~scorelib.operators.LinearOperator.pinv`)."""

    def denoiser(self, x: Array, t: Array) -> Array:
        """``[batch, *data_shape]`` in data units: the measured part of ``D`` replaced by
        ``A^+ y``."""
        check_query(self, x, t)
        y = self.bound_y(x.shape[0])
        d = self.prior_denoiser(x, t)
        op = self.measurement.operator
        return d + op.pinv(y.astype(d.dtype) - op._A(d))


class DPS(MeasuredScore):
    """Diffusion posterior sampling (module docstring): ``score + zeta J^T A^T r / ||r||``.

    Fields:
      zeta: the step in score units (a leaf: a sweep compiles once), ``>= 0``.
    """

    zeta: Array = 1.0

    @classmethod
    def check_fields(cls, fields: dict) -> dict:
        extra = sorted(set(fields) - {"zeta"})
        require(not extra, "method", "DPS options: zeta", extra)
        require("zeta" in fields, "method.zeta", "given (a number >= 0, score units)", None)
        zeta = check_real(fields["zeta"], "method.zeta", low=0.0)
        return {"zeta": jnp.asarray(zeta, jax.dtypes.canonicalize_dtype(np.float64))}

    def likelihood_score(self, x: Array, t: Array) -> tuple[Array, Array]:
        """``(D, zeta J^T A^T r / ||r||)``: the prior's denoiser and the added term, per
        example (a zero residual gives zero)."""
        d, vjp, r = self._residual_vjp(x, t)
        norm = jnp.linalg.norm(r, axis=1, keepdims=True)
        unit = r / jnp.where(norm > 0, norm, 1.0)
        (g,) = vjp(self.measurement.operator._At(unit))
        return d, jnp.asarray(self.zeta, x.dtype) * g

    def score(self, x: Array, t: Array) -> Array:
        """``[batch, *data_shape]``, units 1 / data."""
        check_query(self, x, t)
        d, g = self.likelihood_score(x, t)
        return score_from_denoiser(self.process, x, t, d) + g


class PiGDM(MeasuredScore):
    """Pseudoinverse-guided diffusion (module docstring): ``score + J^T A^T S^{-1} r``,
    ``S = r_t^2 A A^T + sigma_y^2 I``, ``r_t^2 = sigma_data^2 sigma^2 / (sigma_data^2 +
    sigma^2)``.

    Fields:
      sigma_data: the data's standard deviation of ``r_t^2`` (data units, ``> 0``; a leaf).
    """

    sigma_data: Array = 0.5

    @classmethod
    def check_fields(cls, fields: dict) -> dict:
        extra = sorted(set(fields) - {"sigma_data"})
        require(not extra, "method", "PiGDM options: sigma_data", extra)
        require(
            "sigma_data" in fields,
            "method.sigma_data",
            "given (the data's std, data units > 0; a network's own sigma_data)",
            None,
        )
        sd = check_real(fields["sigma_data"], "method.sigma_data", low=0.0, low_open=True)
        return {"sigma_data": jnp.asarray(sd, jax.dtypes.canonicalize_dtype(np.float64))}

    def r2(self, t: Array, dtype) -> Array:
        """``r_t^2`` (data units squared), scalar or ``[batch]`` as ``t``."""
        s2 = self.process.ve_sigma(t).astype(dtype) ** 2
        sd2 = jnp.asarray(self.sigma_data, dtype) ** 2
        return sd2 * s2 / (sd2 + s2)

    def solve(self, r: Array, r2: Array) -> Array:
        """``S^{-1} r`` for ``r: [batch, m]`` and ``r2`` scalar or ``[batch]``.

        With an SVD (``A A^T = U diag(s^2) U^T``) and one ``sigma_y``:
        ``U diag(1 / (r2 s^2 + sigma_y^2)) U^T r`` plus ``(r - U U^T r) / sigma_y^2`` off
        ``A``'s range (absent for the full-row-rank operators of ``scorelib.operators``);
        else conjugate gradients on ``S`` (:data:`CG_TOL`, :data:`CG_MAXITER`), one
        iteration per example (``vmap``), so an example's answer does not depend on the
        other examples of the batch.
        """
        meas = self.measurement
        op = meas.operator
        r2b = r2[:, None] if jnp.ndim(r2) else r2
        noise2 = meas.noise_std(r.dtype) ** 2
        svd = op.svd()
        if svd is not None and meas.scalar_noise:
            rt = svd.Ut(r)
            out = svd.U(rt / (r2b * svd.s.astype(r.dtype) ** 2 + noise2))
            if svd.s.shape[0] < op.m:
                out = out + (r - svd.U(rt)) / noise2
            return out

        def one(r_b, r2_b):  # one example: r_b [m], r2_b scalar
            def matvec(v):
                return r2_b * op._A(op._At(v[None]))[0] + noise2 * v

            v, _ = jax.scipy.sparse.linalg.cg(matvec, r_b, tol=CG_TOL, atol=0.0, maxiter=CG_MAXITER)
            return v

        return jax.vmap(one)(r, jnp.broadcast_to(r2, r.shape[:1]))

    def likelihood_score(self, x: Array, t: Array) -> tuple[Array, Array]:
        """``(D, J^T A^T S^{-1} r)``: the prior's denoiser and the added term."""
        d, vjp, r = self._residual_vjp(x, t)
        v = self.solve(r, self.r2(t, r.dtype))
        (g,) = vjp(self.measurement.operator._At(v))
        return d, g

    def score(self, x: Array, t: Array) -> Array:
        """``[batch, *data_shape]``, units 1 / data."""
        check_query(self, x, t)
        d, g = self.likelihood_score(x, t)
        return score_from_denoiser(self.process, x, t, d) + g


METHODS: dict[str, type[MeasuredScore]] = {
    "projection": Projection,
    "dps": DPS,
    "pigdm": PiGDM,
    "ddrm": MeasuredScore,
}
"""Method name -> source class (``ddrm``: the plain :class:`MeasuredScore` its sampler reads)."""


def posterior_source(method: str, prior, measurement, y, *, repeats: int = 1, **options):
    """The measurement-conditioned source of ``method`` (a name of :data:`METHODS`).

    Args:
      method: ``projection``, ``dps`` (``zeta=``), ``pigdm`` (``sigma_data=``) or ``ddrm``
        (sample it with ``scorelib.samplers.ddrm``; needs an operator with an SVD).
      prior, measurement, y, repeats: as :meth:`MeasuredScore.create`.

    Raises:
      ValueError: naming ``method.name`` for an unknown method, or for DDRM on an operator
        without an SVD or with several noise levels; ``method`` for an option the method
        does not use; ``method.zeta`` / ``method.sigma_data`` missing or out of range; and
        as :meth:`MeasuredScore.create`.
    """
    require(method in METHODS, "method.name", f"one of {sorted(METHODS)}", method)
    if method == "ddrm":
        op = measurement.operator if isinstance(measurement, Measurement) else None
        require(
            op is None or op.svd() is not None,
            "method.name",
            "a method without an SVD (projection, dps, pigdm): ddrm needs the operator's "
            "SVD, which " + type(op).__name__ + " does not have",
            method,
        )
        require(
            op is None or measurement.scalar_noise,
            "method.name",
            "a method other than ddrm for measurements with several noise levels",
            method,
        )
    return METHODS[method].create(prior, measurement, y, repeats=repeats, **options)


__all__ = [
    "Observations",
    "MeasuredScore",
    "Projection",
    "DPS",
    "PiGDM",
    "METHODS",
    "posterior_source",
]
