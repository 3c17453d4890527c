"""How the two modules of a cascaded denoiser (Cas-DM, :class:`scorelib.nets.Cascade`) differ
at one noise level: each one's denoising error on clean data and the gap between them.

By Tweedie both modules trained by squared error alone estimate ``E[x0 | x_t]``, so their
gap is the training error, not a property of the data; a metric loss on module 2
(:class:`scorelib.objectives.CascadeLoss`) moves it off the posterior mean, which raises its
squared error and the gap by the same amount when module 1 is exact (``E|D2 - x0|^2 =
E|D1 - x0|^2 + E|D2 - D1|^2`` for ``D1 = E[x0 | x_t]``, since ``x0 - D1`` is orthogonal to
every function of ``x_t``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_real
from scorelib.objectives.cascade import cascade_denoisers


def cascade_errors(source, x0, sigma: float, key) -> dict:
    """Each module's per-pixel squared error and their gap at the VE-frame noise ``sigma``.

    ``x_t = alpha(t) (x0 + sigma n)`` with ``t = t_of_ve_sigma(sigma)`` and ``n ~ N(0, I)``
    from ``key``; ``first = mean (D1 - x0)^2``, ``second = mean (D2 - x0)^2``, ``gap = mean
    (D2 - D1)^2`` (means over pixels, then examples).

    Args:
      source: a cascade (:func:`scorelib.objectives.cascade_denoisers`).
      x0: ``[n, *data_shape]`` clean data (data units), ``n >= 2``.
      sigma: VE-frame noise level (> 0, data units).
      key: PRNG key of the noise.

    Returns:
      ``{"first", "second", "gap"}`` (squared data units) and each one's standard error over
      the examples (``"<name>_se"``), Python floats.

    Raises:
      ValueError: naming ``sigma`` (not positive) or ``x0`` (fewer than 2 examples).
    """
    sigma = check_real(sigma, "sigma", low=0.0, low_open=True, high_open=True)
    x0 = jnp.asarray(x0)
    if x0.shape[0] < 2:
        raise ValueError(f"x0 must hold at least 2 examples; got shape {x0.shape}")
    p = source.process
    t = jnp.full((x0.shape[0],), p.t_of_ve_sigma(jnp.asarray(sigma)))
    n = jax.random.normal(key, x0.shape, x0.dtype)
    alpha = p.alpha(t).reshape((-1,) + (1,) * (x0.ndim - 1))
    d1, d2 = cascade_denoisers(source, alpha * (x0 + sigma * n), t)
    axes = tuple(range(1, x0.ndim))
    out = {}
    for name, e in (("first", d1 - x0), ("second", d2 - x0), ("gap", d2 - d1)):
        v = np.asarray(jnp.mean(e**2, axis=axes), np.float64)
        out[name] = float(v.mean())
        out[f"{name}_se"] = float(v.std(ddof=1) / np.sqrt(v.size))
    return out
