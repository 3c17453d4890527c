"""The exact posterior of a Gaussian prior under a linear-Gaussian measurement: the oracle the
measurement-conditioned samplers are checked against (issue 37, item 3).

Prior ``x0 ~ N(mu, C)`` (a :class:`~scorelib.scores.GaussianScore`), measurement
``y = A x0 + sigma_y n`` (a :class:`~scorelib.operators.Measurement`; ``sigma_y`` a scalar or
one per entry, a stacked measurement's). With ``S = A C A^T + diag(sigma_y^2)`` (solved, never
inverted)::

    m_post = mu + C A^T S^{-1} (y - A mu)
    C_post = C - C A^T S^{-1} A C

(the Gaussian conditioning formula, e.g. Bishop 2006, eqs. 2.113-2.117 in covariance form),
and the noised posterior ``p_t(x_t | y) = N(alpha m_post, alpha^2 C_post + sigma^2 I)`` is
the diffused law of ``N(m_post, C_post)``: :func:`gaussian_posterior` returns it as a
``GaussianScore``, so every sampler draws from the exact posterior and its score is exact at
every time. ``sigma_y = 0`` is allowed when ``A C A^T`` is invertible (noiseless inpainting of
a full-rank prior); ``S`` is then solved as it is.
"""

from __future__ import annotations

import numpy as np

from scorelib._checks import require
from scorelib.operators import Measurement
from scorelib.scores.gaussian import GaussianScore


def prior_covariance(prior: GaussianScore) -> tuple[np.ndarray, np.ndarray]:
    """``(mu [d], C [d, d])`` of a ``GaussianScore``, float64:
    ``C = U diag(lam) U^T + residual_var (I - U U^T)``."""
    mu = np.asarray(prior.mean, np.float64)
    u = np.asarray(prior.eigvecs, np.float64)
    lam = np.asarray(prior.eigvals, np.float64)
    cov = (u * lam) @ u.T
    if u.shape[1] < u.shape[0]:
        cov = cov + float(prior.residual_var) * (np.eye(u.shape[0]) - u @ u.T)
    return mu, cov


def operator_matrix(measurement: Measurement, d: int, data_shape) -> np.ndarray:
    """``A`` as a dense ``[m, d]`` float64 matrix: ``A`` applied to the ``d`` basis vectors
    (small ``d``: the oracle's Gaussian tests and tables)."""
    basis = np.eye(d).reshape(d, *data_shape)
    return np.asarray(measurement.operator.A(basis), np.float64).T


def gaussian_posterior(prior: GaussianScore, measurement: Measurement, y) -> GaussianScore:
    """The exact posterior of ``prior`` given one measurement ``y`` (module docstring), as a
    ``GaussianScore`` under the prior's process and data shape.

    Args:
      prior: the Gaussian prior ``N(mu, C)``, ``d`` = its dimension.
      measurement: ``A`` (acting on the prior's ``data_shape``) and ``sigma_y >= 0``.
      y: ``[m]`` the measurement (data units).

    Returns:
      ``GaussianScore.from_covariance(process, m_post, C_post, data_shape)``.

    Raises:
      ValueError: naming ``measurement`` when its operator acts on another data shape,
        ``y`` when it is not ``[m]`` and finite, or ``sigma_y`` when it is 0 and
        ``A C A^T`` is singular (the posterior is then degenerate in a way this form does
        not solve).
    """
    require(isinstance(measurement, Measurement), "measurement", "a Measurement", measurement)
    mu, cov = prior_covariance(prior)
    d = mu.shape[0]
    shape = tuple(prior.data_shape) or (d,)
    op_shape = tuple(measurement.operator.data_shape)
    require(op_shape == shape, "measurement", f"an operator on data of shape {shape}", op_shape)
    a = operator_matrix(measurement, d, shape)
    m = a.shape[0]
    y = np.asarray(y, np.float64)
    require(y.shape == (m,) and np.all(np.isfinite(y)), "y", f"[{m}] finite values", y.shape)
    sigma_y = np.broadcast_to(np.asarray(measurement.sigma_y, np.float64), (m,))
    ca_t = cov @ a.T  # [d, m]
    s = a @ ca_t + np.diag(sigma_y**2)
    require(
        bool(np.all(sigma_y > 0)) or np.linalg.cond(s) < 1e12,
        "sigma_y",
        "> 0 when A C A^T is singular (the noiseless posterior of this prior is degenerate)",
        float(np.min(sigma_y)),
    )
    gain = np.linalg.solve(s, ca_t.T).T  # C A^T S^{-1}, [d, m]
    mean = mu + gain @ (y - a @ mu)
    post = cov - gain @ ca_t.T
    return GaussianScore.from_covariance(prior.process, mean, 0.5 * (post + post.T), shape)
