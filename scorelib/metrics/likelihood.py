"""Log-likelihood and bits/dim through the probability-flow ODE, for any score source.

The probability-flow ODE of a process (Song et al., ICLR 2021, eq. 13)::

    dx/dt = v(x, t) = f(t) x - g(t)^2 / 2 * score(x, t)

carries ``p_{t_min}`` to ``p_{t_max}``, and along a trajectory ``d log p_t(x_t) / dt =
-div v(x_t, t)`` (the instantaneous change of variables; Chen et al. 2018, "Neural ordinary
differential equations", Thm. 1). Integrating from ``t_min`` (data) up to ``t_max`` (prior)::

    log p_{t_min}(x) = log p_prior(x_{t_max}) + int_{t_min}^{t_max} div v(x_t, t) dt

(Song et al. 2021, Sec. 4.3 and App. D.2). The ODE is solved per example by diffrax's adaptive
Tsit5 (``diffrax.diffeqsolve`` with a ``PIDController``), so each example gets its own steps
and the result does not depend on which other examples share its batch. The divergence is
exact (``d`` forward-mode products: small ``d``) or Hutchinson's estimate ``E[eps^T J eps]``
(Hutchinson 1989; Grathwohl et al. 2019, "FFJORD", Sec. 3) with Rademacher or Gaussian
probes drawn once per example, held fixed along its trajectory, and *averaged*.

The prior is the process's ``N(0, prior_std^2 I)`` (:meth:`scorelib.processes.Process.prior_logp`),
not the noised data's exact marginal at ``t_max``: the mismatch is the model's prior error, part
of what is measured. A test with known data can pass the exact marginal as ``prior_logp``.

Bits/dim of discrete data (:func:`bits_per_dim`) uses uniform dequantisation (Theis et al.
2016, "A note on the evaluation of generative models", Sec. 3.1; Ho et al. 2019, "Flow++",
Sec. 3.1): ``y = x + u delta``, ``u ~ U(-1/2, 1/2)^d``, with ``delta`` the spacing of the
data's levels, so that ``-log P(x) <= E_u[-log p(y)] - d log delta`` (Jensen). The offset
``-log delta`` is derived from the levels and the range (never a constant such as score_sde's
``+7``, right only for 8-bit data in ``[-1, 1]``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_array, check_choice, check_int, check_real
from scorelib.data.images import level_spacing, quantise, uniform_dequantise
from scorelib.divergence import (  # their home (scorelib/divergence.py)
    PROBE_NOISES,
    exact_divergence,
    hutchinson_divergence,
    probe_vectors,
)
from scorelib.keys import example_keys
from scorelib.processes.base import Process
from scorelib.scores.base import check_examples

Array = Any

DIVERGENCES = ("exact", "hutchinson")


def pf_ode_log_likelihood(
    source,
    x: Array,
    key: jax.Array,
    *,
    divergence: str = "hutchinson",
    probes: int | None = None,
    noise: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    max_steps: int = 4096,
    prior_logp=None,
    first_index: int = 0,
):
    """``log p_{t_min}(x)`` (nats) of a score source's probability-flow ODE, per example.

    Args:
      source: a score source (``source.process`` is its process; ``source.score(x, t)``
        with ``x: [batch, *data_shape]`` and a scalar ``t``).
      x: ``[batch, *data_shape]`` points (data units; continuous: dequantise discrete data
        first, see :func:`bits_per_dim`).
      key: PRNG key of the Hutchinson probes: example ``b`` of the batch uses
        ``fold_in(key, first_index + b)`` (:func:`scorelib.keys.example_keys`), so a data set
        evaluated in chunks, each with ``first_index`` its offset, gets the probes of one
        whole batch; unused by the exact divergence.
      divergence: ``'exact'`` (``d`` Jacobian-vector products per evaluation) or
        ``'hutchinson'`` (``probes`` of them, averaged).
      probes: probes per example (Hutchinson only; >= 1; default 1).
      noise: ``'rademacher'`` (default) or ``'gaussian'`` probes (Hutchinson only).
      rtol, atol: tolerances of the adaptive step (``diffrax.PIDController``), in (0, 1).
      max_steps: most solver steps per example; more is an error (``diffrax`` raises).
      prior_logp: ``[batch, *data_shape] -> [batch]`` log-density at ``t_max``; default the
        process's prior, :meth:`~scorelib.processes.Process.prior_logp`.
      first_index: the index of example 0 within the whole data set (an int >= 0).

    Returns:
      ``(logp, info)``: ``logp`` ``[batch]`` nats (summed over the ``d`` coordinates; float32,
      or float64 when x64 is enabled: the ODE is solved in :func:`state_dtype`),
      ``info`` a dict of ``[batch]`` arrays: ``num_steps`` (solver steps, rejected included)
      and ``prior_logp`` (the prior term; ``logp - prior_logp`` is the divergence integral).

    Raises:
      ValueError: naming the option (``divergence``, ``probes``, ``noise``, ``rtol``, ``atol``,
        ``max_steps``) before any compute; an option the chosen divergence does not use
        (``probes``/``noise`` with ``'exact'``) is refused; naming ``source`` (not a score
        source) or ``x`` (not real, or not ``[batch, *data_shape]`` with the source's
        ``data_shape``, which the message gives).

    Reference: Song et al. 2021, eq. 13 and Sec. 4.3; Chen et al. 2018, Thm. 1.
    """
    check_choice(divergence, "divergence", DIVERGENCES)
    if divergence == "exact":
        if probes is not None or noise is not None:
            raise ValueError(
                "probes and noise are options of divergence='hutchinson'; the exact "
                f"divergence uses no probes: got probes={probes!r}, noise={noise!r}"
            )
        probes, noise = 1, "rademacher"  # unused
    else:
        probes = check_int(1 if probes is None else probes, "probes", low=1)
        noise = check_choice("rademacher" if noise is None else noise, "noise", PROBE_NOISES)
    rtol = check_real(rtol, "rtol", low=0.0, high=1.0, low_open=True, high_open=True)
    atol = check_real(atol, "atol", low=0.0, high=1.0, low_open=True, high_open=True)
    max_steps = check_int(max_steps, "max_steps", low=1)
    first_index = check_int(first_index, "first_index", low=0)
    check_examples(source, x, "x")
    process: Process = source.process
    x = jnp.asarray(x, state_dtype())
    prior = process.prior_logp if prior_logp is None else prior_logp
    keys = example_keys(key, x.shape[0], first_index)
    x_T, delta, steps = _solve(source, x, keys, divergence, probes, noise, rtol, atol, max_steps)
    # The prior enters after the solve, outside its compiled program: a solve is compiled once
    # whatever the prior (a Python callable; a bound ``process.prior_logp`` of an equal process
    # built anew hashes differently), not once per prior.
    prior_term = prior(jnp.reshape(x_T, x.shape))
    return prior_term + delta, {"num_steps": steps, "prior_logp": prior_term}


def state_dtype():
    """The ODE state's dtype: float32, or float64 when x64 is enabled (diffrax carries the
    state in the dtype of its times, which follow x64; the probes, the divergence
    accumulator and the times are all put in this one dtype)."""
    return jax.dtypes.canonicalize_dtype(np.float64)


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6, 7, 8))
def _solve(source, x, keys, divergence, probes, noise, rtol, atol, max_steps):
    """``(x_T [batch, d], divergence integral [batch], solver steps [batch])`` per example."""
    process = source.process
    shape = x.shape[1:]
    d = math.prod(shape)

    def one(xb, kb):
        def drift(xf, t):  # v(x, t) of one flattened example
            s = source.score(jnp.reshape(xf, (1,) + shape), t)
            return process.f(t) * xf - 0.5 * process.g2(t) * jnp.reshape(s, (d,))

        eps = probe_vectors(kb, probes, d, noise)

        def field(t, y, args):
            xf, _ = y
            fn = lambda z: drift(z, t)  # noqa: E731
            if divergence == "exact":
                div = exact_divergence(fn, xf)
            else:
                div = hutchinson_divergence(fn, xf, eps)
            return fn(xf), div

        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            t0=jnp.asarray(process.t_min, x.dtype),
            t1=jnp.asarray(process.t_max, x.dtype),
            dt0=None,
            y0=(jnp.reshape(xb, (d,)), jnp.zeros((), x.dtype)),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            max_steps=max_steps,
        )
        x_T, delta = sol.ys[0][-1], sol.ys[1][-1]
        return x_T, delta, sol.stats["num_steps"]

    return jax.vmap(one)(x, keys)


def dequantise(
    x, key: jax.Array, *, levels: int, low: float = -1.0, high: float = 1.0, first_index: int = 0
):
    """Uniform dequantisation: ``x + u delta``, ``u ~ U(-1/2, 1/2)^d`` per example.

    Every value of ``x`` must be one of the ``levels`` values of :func:`quantise`; each gets
    uniform noise over its own bin ``[x - delta/2, x + delta/2]``
    (:func:`scorelib.data.images.level_spacing`, :func:`scorelib.data.images.uniform_dequantise`).
    Example ``b`` draws from ``fold_in(key, first_index + b)``
    (:func:`scorelib.keys.example_keys`): its noise does not depend on the batch it is in.

    Args:
      x: ``[batch, *data_shape]`` data on the levels.
      key: PRNG key.
      levels, low, high: the levels, as for :func:`scorelib.data.images.quantise`.
      first_index: the index of example 0 within the whole data set (an int >= 0).

    Returns:
      ``[batch, *data_shape]`` float32.

    Raises:
      ValueError: naming ``x`` when a value is not on the levels (continuous data, or data
        in another range: say which ``low``/``high``), or as
        :func:`scorelib.data.images.level_spacing`.

    Reference: Theis et al. 2016, Sec. 3.1.
    """
    delta = level_spacing(levels, low, high)
    first_index = check_int(first_index, "first_index", low=0)
    check_array(x, "x", ("batch", "*data_shape"))
    x = np.asarray(x, np.float32)
    on = quantise(x, levels, low=low, high=high)
    off = np.abs(on - x) > 1e-3 * delta
    if np.any(off):
        raise ValueError(
            f"x must lie on the {levels} levels of [{low}, {high}]; {int(off.sum())} values "
            f"do not (e.g. {float(x[off][0])!r}): quantise samples first, or give the data's "
            "own levels, low and high"
        )
    return uniform_dequantise(on, example_keys(key, x.shape[0], first_index), delta)


def bits_per_dim(
    source,
    x,
    key: jax.Array,
    *,
    levels: int,
    low: float = -1.0,
    high: float = 1.0,
    first_index: int = 0,
    **ode_options,
):
    """Bits per dimension of discrete data ``x`` under a score source's PF-ODE.

    ``bpd = (-log p(y) - d log delta) / (d ln 2)`` with ``y`` the uniform dequantisation of
    ``x`` (:func:`dequantise`) and ``log p`` from :func:`pf_ode_log_likelihood`: an upper
    bound, in expectation over the dequantisation noise, on the discrete ``-log2 P(x) / d``,
    which is >= 0. Rescaling the data (say ``[0, 1]`` instead of ``[-1, 1]``) moves
    ``-log p / (d ln 2)`` and ``-log delta / ln 2`` by opposite amounts: bits/dim do not
    depend on the range.

    Args:
      source: a score source; x: ``[batch, *data_shape]`` on the levels.
      key: PRNG key; split into the dequantisation key and the probe key, so the same key
        gives the same number.
      levels, low, high: the data's levels (digits: 17 in ``[-1, 1]``; 8-bit: 256).
      first_index: the index of example 0 within the whole data set (an int >= 0): the
        dequantisation noise and the probes of an example depend on its index, not on
        the batch it is evaluated in.
      **ode_options: options of :func:`pf_ode_log_likelihood` (``divergence``, ``probes``,
        ``noise``, ``rtol``, ``atol``, ``max_steps``, ``prior_logp``).

    Returns:
      ``(bpd, info)``: ``bpd`` ``[batch]`` float32 bits/dim; ``info`` as
      :func:`pf_ode_log_likelihood`'s, plus ``nll`` (``[batch]`` nats of the dequantised
      points, ``-log p(y)``) and ``offset`` (``-log2 delta``, bits/dim).

    Raises:
      ValueError: as :func:`dequantise` and :func:`pf_ode_log_likelihood`.

    Reference: Theis et al. 2016, Sec. 3.1; Song et al. 2021, App. D.2.
    """
    k_deq, k_ode = jax.random.split(key)
    y = dequantise(x, k_deq, levels=levels, low=low, high=high, first_index=first_index)
    logp, info = pf_ode_log_likelihood(source, y, k_ode, first_index=first_index, **ode_options)
    d = math.prod(y.shape[1:])
    offset = -math.log2(level_spacing(levels, low, high))
    bpd = -logp / (d * math.log(2.0)) + offset
    return bpd, {**info, "nll": -logp, "offset": offset}
