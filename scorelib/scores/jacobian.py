"""The asymmetry of a score source's Jacobian, per example: how far a score field is from a
gradient field.

A vector field ``s: R^d -> R^d`` is a gradient (a conservative field, ``s = grad log p``) on
a simply connected domain exactly when its Jacobian ``J = ds/dx`` is symmetric everywhere. A
network that outputs a score (or a denoiser) directly is not constrained to be one; Chao,
Sun, Cheng and Lee ("On investigating the conservative property of score-based generative
models", ICML 2022, arXiv 2209.12753, Sec. 4) measure and penalise the squared Frobenius norm
of the Jacobian's asymmetric part::

    R(x) = |J - J^T|_F^2 = 2 (|J|_F^2 - tr(J^2))                       (units 1 / data^4)

with ``|J|_F^2 = tr(J J^T)`` (units 1 / data^4). Two ways here, both per example:

* exact (:func:`asymmetry_exact`): the whole ``d x d`` Jacobian by forward mode
  (``jax.jacfwd``: ``d`` Jacobian-vector products), for small ``d``;
* Hutchinson (:func:`asymmetry_hutchinson`): with probes ``v`` of ``E[v v^T] = I``
  (Hutchinson 1989), one Jacobian-vector product ``a = J v`` and one vector-Jacobian product
  ``b = J^T v = (v^T J)^T`` per probe, averaged over the probes. Two unbiased forms:

  - ``'skew'`` (default): ``|a - b|^2 = |(J - J^T) v|^2``, whose mean is
    ``tr((J - J^T)^T (J - J^T)) = R``. It is >= 0 for every probe and exactly 0 for every
    probe where ``J`` is symmetric.
  - ``'paper'``: ``2 (|b|^2 - a . b) = 2 (v^T J J^T v - v^T J J v)``, the form of Chao et
    al.'s code (``traceJJt - traceJJ``, there without the factor 2): ``E|v^T J|^2 = |J|_F^2``
    and ``E[(v^T J)(J v)] = tr(J^2)``.

  Writing ``J = S + K`` (``S`` symmetric, ``K`` antisymmetric), the two are quadratic forms
  ``v^T M v`` with ``M_skew = -4 K^2`` and ``M_paper = -4 K^2 + 2 (K S - S K)``: near a
  gradient field (small ``K``) the paper's form has an extra term of order ``|K| |S|`` in
  its variance where the skew form's is of order ``|K|^2``, at the same cost
  (``tests/scores/test_jacobian.py`` checks both variances against the closed form of a
  quadratic form's variance). ``'skew'`` is ``|J v|^2 + |J^T v|^2 - 2 (J v).(J^T v)``,
  the paper's form with ``|J^T v|^2`` replaced by ``|J v|^2`` in one of its two copies.

The score of one example is ``source.score`` called on that example alone (``jax.vmap`` over
the batch), so a source's examples never mix. Probes of example ``b`` come from
``fold_in(key, first_index + b)`` (:func:`scorelib.keys.example_keys`), so an estimate does
not depend on the batch the example is in.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from scorelib._checks import check_array, check_choice, check_int, check_time
from scorelib.divergence import PROBE_NOISES, probe_vectors
from scorelib.keys import example_keys
from scorelib.scores.base import check_examples

Array = Any

FORMS = ("skew", "paper")


def example_probes(
    key: jax.Array,
    batch: int,
    probes: int,
    d: int,
    noise: str = "rademacher",
    *,
    first_index: Array = 0,
) -> Array:
    """``[batch, probes, d]`` probes; example ``b``'s from ``fold_in(key, first_index + b)``.

    Raises:
      ValueError: naming ``probes``, ``noise`` or ``batch``.
    """
    probes = check_int(probes, "probes", low=1)
    check_choice(noise, "noise", PROBE_NOISES)
    keys = example_keys(key, batch, first_index)
    return jax.vmap(lambda k: probe_vectors(k, probes, d, noise))(keys)


def asymmetry_exact(fn, x: Array) -> tuple[Array, Array]:
    """``(|J - J^T|_F^2, |J|_F^2)`` of ``J = d fn / d x`` at ``x``: two scalars.

    Args:
      fn: ``[d] -> [d]`` (one example's flattened score, units 1 / data).
      x: ``[d]`` (data units).

    The full Jacobian by forward mode (``d`` Jacobian-vector products): for small ``d``.
    Chao et al. 2022, Sec. 4 (the asymmetry ``|J - J^T|_F^2``).
    """
    jac = jax.jacfwd(fn)(x)
    return jnp.sum((jac - jac.T) ** 2), jnp.sum(jac**2)


def asymmetry_hutchinson(fn, x: Array, eps: Array, form: str = "skew") -> tuple[Array, Array]:
    """Hutchinson estimates ``(|J - J^T|_F^2, |J|_F^2)`` of ``J = d fn / d x`` at ``x``.

    With ``a_p = J eps_p`` (one JVP) and ``b_p = J^T eps_p`` (one VJP) per probe, the means
    over probes of ``|a_p - b_p|^2`` (``form='skew'``) or ``2 (|b_p|^2 - a_p . b_p)``
    (``form='paper'``, Chao et al. 2022's code), and of ``|b_p|^2`` (the Frobenius norm): each
    unbiased, its variance falling as ``1 / probes`` (module docstring).

    Args:
      fn: ``[d] -> [d]``.
      x: ``[d]``.
      eps: ``[probes, d]`` probes with ``E[eps eps^T] = I`` (:func:`probe_vectors`).
      form: ``'skew'`` or ``'paper'``.

    Returns:
      two scalars (units of ``fn``'s output squared per unit of ``x`` squared).

    Raises:
      ValueError: naming ``form``.
    """
    check_choice(form, "form", FORMS)
    primal, vjp = jax.vjp(fn, x)
    del primal
    b = jax.vmap(lambda e: vjp(e)[0])(eps)  # [probes, d]: J^T eps_p
    a = jax.vmap(lambda e: jax.jvp(fn, (x,), (e,))[1])(eps)  # [probes, d]: J eps_p
    bb = jnp.sum(b * b, axis=-1)
    if form == "skew":
        asym = jnp.sum((a - b) ** 2, axis=-1)
    else:
        asym = 2.0 * (bb - jnp.sum(a * b, axis=-1))
    return jnp.mean(asym), jnp.mean(bb)


def jacobian_asymmetry(
    source, x: Array, t: Array, *, eps: Array | None = None, form: str = "skew"
) -> tuple[Array, Array]:
    """Per-example ``(|J - J^T|_F^2, |J|_F^2)`` of a score source's score at ``(x, t)``.

    ``J_b = d source.score(x_b, t_b) / d x_b`` is the Jacobian of example ``b``'s score with
    respect to its own (flattened) input, evaluated on that example alone.

    Args:
      source: a score source (``source.score(x, t)``, units 1 / data).
      x: ``[batch, *data_shape]`` points in process coordinates (data units).
      t: scalar or ``[batch]`` process times.
      eps: ``None`` for the exact Jacobian (:func:`asymmetry_exact`, ``d`` forward-mode
        products per example), or ``[batch, probes, d]`` Hutchinson probes
        (:func:`example_probes`; :func:`asymmetry_hutchinson`).
      form: the Hutchinson form, ``'skew'`` or ``'paper'`` (unused when exact).

    Returns:
      ``(asym, frob)``: two ``[batch]`` arrays in units of 1 / data^4.

    Raises:
      ValueError: naming ``source`` (not a score source), ``x`` (not real ``[batch,
        *data_shape]`` with the source's ``data_shape``), ``t`` (neither a scalar nor
        ``[batch]``), ``eps`` (not ``[batch, probes, d]``) or ``form``.

    Source: Chao et al., ICML 2022 (arXiv 2209.12753), Sec. 4; Hutchinson 1989.
    """
    check_choice(form, "form", FORMS)
    n = check_examples(source, x, "x")
    check_time(t, "t", n)
    x = jnp.asarray(x)
    shape = x.shape[1:]
    d = math.prod(shape)
    t = jnp.broadcast_to(jnp.asarray(t), (n,))
    if eps is not None:
        check_array(eps, "eps", (n, "probes", d), note=" ([batch, probes, d] probes)")

    def one(xb, tb, eb):
        def fn(z):
            s = source.score(jnp.reshape(z, (1, *shape)), tb[None])
            return jnp.reshape(s, (d,))

        xf = jnp.reshape(xb, (d,))
        if eb is None:
            return asymmetry_exact(fn, xf)
        return asymmetry_hutchinson(fn, xf, eb.astype(xf.dtype), form)

    if eps is None:
        return jax.vmap(lambda xb, tb: one(xb, tb, None))(x, t)
    return jax.vmap(one)(x, t, eps)
