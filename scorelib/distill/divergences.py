"""f-divergences and their gradient weights ``h(r) = f''(r) r^2`` (Xu, Nie and Vahdat 2025).

``D_f(p || q) = E_q f(p / q)`` with ``r = p / q`` the density ratio of the (noised) teacher
``p`` to the (noised) student ``q``. The gradient of ``D_f(p_t || q_t)`` with respect to
the student's parameters (Xu et al. 2025, arXiv 2502.15681, Theorem 1) is::

    E_{z, eps} [ h(r(x_t)) (grad log q_t(x_t) - grad log p_t(x_t))^T dx_t / dtheta ],
    h(r) = f''(r) r^2,

so a divergence enters training only through ``h``. Reverse-KL (``h = 1``) is DMD/VSD.
The generator functions ``f`` are those of the paper's Table 1; ``h`` here is exactly
``f'' r^2`` for them (the authors' code drops the constant factors 1/4 of the squared
Hellinger and 2 of Neyman chi^2, which cancel in the batch normalisation of ``h``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from scorelib._checks import check_choice

Array = Any

#: ``name: (f(r), h(r) = f''(r) r^2, description)`` (Xu et al. 2025, Table 1; Neyman chi^2
#: from the authors' released code).
_TABLE = {
    "rkl": (lambda r: -jnp.log(r), lambda r: jnp.ones_like(r), "reverse-KL"),
    "kl": (lambda r: r * jnp.log(r), lambda r: r, "forward-KL"),
    "js": (
        lambda r: r * jnp.log(r) - (r + 1) * jnp.log((r + 1) / 2),
        lambda r: r / (1 + r),
        "Jensen-Shannon",
    ),
    "sf": (
        lambda r: (r + 1) * jnp.log(0.5 + 0.5 / r),
        lambda r: 1 / (1 + r),
        "softened reverse-KL",
    ),
    "sh": (lambda r: 1 - jnp.sqrt(r), lambda r: 0.25 * jnp.sqrt(r), "squared Hellinger"),
    "jf": (lambda r: (r - 1) * jnp.log(r), lambda r: 1 + r, "Jeffreys"),
    "neyman": (lambda r: (1 - r) ** 2 / r, lambda r: 2 / r, "Neyman chi^2"),
}

#: The divergence names accepted by :func:`f_fn`, :func:`h_weight` and ``distill.divergence``.
DIVERGENCES = tuple(_TABLE)


def check_divergence(name: str, field: str = "distill.divergence") -> str:
    """``name`` if it is one of :data:`DIVERGENCES`, else ``ValueError`` naming ``field``."""
    return check_choice(name, field, DIVERGENCES)


def f_fn(name: str, r: Array) -> Array:
    """The generator ``f(r)`` of divergence ``name`` (``r > 0``, same shape as ``r``).

    Raises:
      ValueError: an unknown ``name`` (naming ``distill.divergence``).
    """
    return _TABLE[check_divergence(name)][0](r)


def h_weight(name: str, r: Array) -> Array:
    """``h(r) = f''(r) r^2`` of divergence ``name`` (``r > 0``, same shape as ``r``).

    Raises:
      ValueError: an unknown ``name`` (naming ``distill.divergence``).
    """
    return _TABLE[check_divergence(name)][1](r)


def describe(name: str) -> str:
    """The divergence's full name (``'kl'`` -> ``'forward-KL'``)."""
    return _TABLE[check_divergence(name)][2]
