"""Divergence of a vector field, ``div fn(x) = tr(d fn / d x)``, and its probe estimators.

Written once for the PF-ODE likelihood (:mod:`scorelib.metrics.likelihood`) and the SURE
objective (:mod:`scorelib.objectives.sure`). For probes ``eps`` with ``E[eps eps^T] = I``
(Rademacher or standard normal), ``E[eps^T J eps] = tr J`` (Hutchinson, "A stochastic
estimator of the trace of the influence matrix for Laplacian smoothing splines", 1989), and:

* ``'jvp'``: ``eps^T J eps`` with ``J eps`` from one forward-mode product (``jax.jvp``): exact
  for each probe, so unbiased whatever the field;
* ``'fd'``: the finite difference ``eps^T (fn(x + h eps) - fn(x)) / h`` (Ramani, Blu and
  Unser, "Monte-Carlo SURE", IEEE TIP 2008): one more evaluation of ``fn`` per probe
  and no derivative code, at a bias of order ``h`` (the field's curvature) and a float32
  rounding error of order ``ulp(|fn|) / h``.

With ``P`` probes the estimate is their *mean*, so its variance is one probe's over ``P``:
``sum_{i<j} (J_ij + J_ji)^2`` for Rademacher probes and ``|J + J^T|_F^2 / 2`` for Gaussian
ones (the Rademacher probe has no diagonal term, hence the smaller variance).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import array_shape, check_array, check_choice, check_int, check_real

Array = Any

PROBE_NOISES = ("rademacher", "gaussian")
ESTIMATORS = ("jvp", "fd")


def probe_vectors(key: jax.Array, probes: int, d: int, noise: str = "rademacher") -> Array:
    """``[probes, d]`` float32 Hutchinson probes with ``E[eps eps^T] = I``.

    Rademacher (+-1 with probability 1/2 each; Hutchinson 1989) has the smaller variance
    (``sum_{i<j} (A_ij + A_ji)^2`` against Gaussian's ``2 |(A + A^T)/2|_F^2``, for one probe
    of ``eps^T A eps``).

    Raises:
      ValueError: naming ``probes`` or ``noise``.
    """
    probes = check_int(probes, "probes", low=1)
    check_choice(noise, "noise", PROBE_NOISES)
    if noise == "rademacher":
        return jax.random.rademacher(key, (probes, d), dtype=jnp.float32)
    return jax.random.normal(key, (probes, d), dtype=jnp.float32)


def exact_divergence(fn, x: Array) -> Array:
    """``div fn(x) = tr(d fn / d x)`` of ``fn: [d] -> [d]`` at ``x: [d]``: a scalar.

    The full Jacobian by forward mode (``d`` Jacobian-vector products): for small ``d``.
    """
    return jnp.trace(jax.jacfwd(fn)(x))


def value_and_divergence(
    fn, x: Array, eps: Array, *, estimator: str = "jvp", step: float | None = None
) -> tuple[Array, Array]:
    """``(fn(x), estimate of div fn(x))`` from the probes ``eps`` (module docstring).

    Args:
      fn: a field ``x -> fn(x)`` of the shape of ``x`` (one example).
      x: the point, any shape ``S`` (e.g. ``[d]`` or ``[H, W, C]``).
      eps: ``[probes, *S]`` probes with ``E[eps eps^T] = I`` (:func:`probe_vectors`,
        reshaped); the estimate is their mean.
      estimator: ``'jvp'`` (``eps^T J eps`` by ``jax.jvp``) or ``'fd'`` (the finite
        difference with step ``step``).
      step: ``'fd'`` only: the step ``h`` in units of ``x`` (> 0); refused with ``'jvp'``.

    Returns:
      ``(fn(x) of shape S, a scalar)``; ``fn`` is evaluated once at ``x`` (and once more per
      probe at ``x + h eps`` for ``'fd'``).

    The probes are cast to ``x``'s dtype (float32 probes against a float64 state under x64).

    Raises:
      ValueError: for an unknown ``estimator``, a ``step`` with ``'jvp'``, ``step`` not a
        positive number with ``'fd'``, or ``eps`` not ``[probes, *S]``.

    Reference: Hutchinson 1989; Grathwohl et al. 2019 (FFJORD), Sec. 3; Ramani, Blu and
    Unser 2008 (the finite difference).
    """
    check_choice(estimator, "estimator", ESTIMATORS)
    check_array(eps, "eps", ("probes", *array_shape(x)), note=" (probes of x's shape)")
    # jax.jvp needs tangents of the primal's dtype: a float64 x (under x64) with the float32
    # probes of probe_vectors would fail
    eps = jnp.asarray(eps).astype(jnp.asarray(x).dtype)
    axes = tuple(range(1, eps.ndim))
    if estimator == "jvp":
        if step is not None:
            raise ValueError(f"step is an option of estimator='fd' only; got step={step!r}")
        # the primal does not depend on the probe: vmap keeps it unbatched (one evaluation)
        out, jvp = jax.vmap(lambda e: jax.jvp(fn, (x,), (e,)), out_axes=(None, 0))(eps)
        return out, jnp.mean(jnp.sum(jvp * eps, axis=axes))
    h = check_real(step, "step", low=0.0, low_open=True)
    out = fn(x)
    shifted = jax.vmap(lambda e: fn(x + h * e))(eps)
    return out, jnp.mean(jnp.sum(eps * (shifted - out), axis=axes)) / h


def hutchinson_divergence(fn, x: Array, eps: Array) -> Array:
    """Hutchinson's estimate ``mean_p eps_p^T (d fn / d x) eps_p`` of ``div fn(x)``: a scalar.

    Args:
      fn: ``[d] -> [d]``.
      x: ``[d]``.
      eps: ``[probes, d]`` probes with ``E[eps eps^T] = I`` (:func:`probe_vectors`); the
        estimate averages them (its variance falls as ``1 / probes``).

    Reference: Hutchinson 1989; Grathwohl et al. 2019 (FFJORD), Sec. 3.
    """
    return value_and_divergence(fn, x, eps)[1]
