"""Closed forms of the noise processes for tests, in float64 numpy, written from the papers.

Nothing here calls the library's maths: a process object is only read for its class and
its hyperparameters (``sigma_min``, ``beta_max``, ...). Every function takes scalars or
numpy arrays and returns float64 of the broadcast shape.

* VE (Song et al., ICLR 2021, eq. 30): ``alpha = 1``, ``sigma = sigma_min (sigma_max /
  sigma_min)^t``, ``f = 0``, ``g^2 = d sigma^2 / dt = 2 ln(sigma_max / sigma_min) sigma^2``.
* VP (eqs. 32-33): ``beta(t) = beta_min + t (beta_max - beta_min)``, ``m(t) = log alpha(t) =
  -t^2 (beta_max - beta_min) / 4 - t beta_min / 2``, ``sigma = sqrt(1 - alpha^2)``,
  ``f = -beta / 2``, ``g^2 = beta``.
* sub-VP (eq. 34): as VP but ``sigma = 1 - alpha^2`` and ``g^2 = beta (1 - exp(-2 int_0^t
  beta)) = beta (1 - alpha^4)``.
* EDM (Karras et al., NeurIPS 2022, Table 1): ``alpha = 1``, ``sigma = t``, ``f = 0``,
  ``g^2 = 2 t``.

Importable from every test directory (``pythonpath = ["tests"]`` in pyproject.toml):
``from closed_forms import alpha_sigma``.
"""

from __future__ import annotations

import math

import numpy as np


def _kind(p) -> str:
    name = type(p).__name__
    if name not in ("VE", "VP", "SubVP", "EDM"):
        raise TypeError(f"no closed form written for process {name}")
    return name


def beta(p, t):
    """VP / sub-VP ``beta(t) = beta_min + t (beta_max - beta_min)``."""
    return p.beta_min + np.asarray(t, np.float64) * (p.beta_max - p.beta_min)


def log_alpha(p, t):
    """``log alpha(t)``: ``m(t)`` for VP and sub-VP, 0 for VE and EDM."""
    t = np.asarray(t, np.float64)
    if _kind(p) in ("VE", "EDM"):
        return np.zeros_like(t)
    return -0.25 * t**2 * (p.beta_max - p.beta_min) - 0.5 * t * p.beta_min


def alpha_sigma(p, t):
    """``(alpha(t), sigma(t))`` in float64."""
    t = np.asarray(t, np.float64)
    kind = _kind(p)
    if kind == "VE":
        return np.ones_like(t), p.sigma_min * (p.sigma_max / p.sigma_min) ** t
    if kind == "EDM":
        return np.ones_like(t), t.copy()
    a = np.exp(log_alpha(p, t))
    if kind == "SubVP":
        return a, 1.0 - a**2
    return a, np.sqrt(1.0 - a**2)


def ve_sigma(p, t):
    """``sigma(t) / alpha(t)``."""
    a, s = alpha_sigma(p, t)
    return s / a


def f_g2(p, t):
    """``(f(t), g(t)^2)`` of the forward SDE ``dx = f(t) x dt + g(t) dw``."""
    t = np.asarray(t, np.float64)
    kind = _kind(p)
    if kind == "VE":
        s = p.sigma_min * (p.sigma_max / p.sigma_min) ** t
        return np.zeros_like(t), 2.0 * math.log(p.sigma_max / p.sigma_min) * s**2
    if kind == "EDM":
        return np.zeros_like(t), 2.0 * t
    b = beta(p, t)
    if kind == "SubVP":
        integral = p.beta_min * t + 0.5 * (p.beta_max - p.beta_min) * t**2  # int_0^t beta
        return -0.5 * b, b * (1.0 - np.exp(-2.0 * integral))
    return -0.5 * b, b


def t_of_ve_sigma(p, s):
    """Invert ``sigma(t) / alpha(t) = s`` (``s > 0``) in closed form."""
    s = np.asarray(s, np.float64)
    kind = _kind(p)
    if kind == "EDM":
        return s.copy()
    if kind == "VE":
        return np.log(s / p.sigma_min) / math.log(p.sigma_max / p.sigma_min)
    if kind == "VP":  # s = sqrt(exp(-2m) - 1)
        m = -0.5 * np.log1p(s**2)
    else:  # sub-VP: s = exp(-m) - exp(m)
        m = -np.arcsinh(s / 2.0)
    b0, db = p.beta_min, p.beta_max - p.beta_min
    if db == 0:  # 0.5 b0 t + m = 0
        return -2.0 * m / b0
    # 0.25 db t^2 + 0.5 b0 t + m = 0, positive root
    return (-0.5 * b0 + np.sqrt(0.25 * b0**2 - db * m)) / (0.5 * db)


def alpha_at_ve_sigma(p, s):
    """``alpha(t(s))``, exactly 1 at ``s = 0`` (the data frame)."""
    s = np.asarray(s, np.float64)
    safe = np.where(s > 0, s, 1.0)
    a, _ = alpha_sigma(p, t_of_ve_sigma(p, safe))
    return np.where(s > 0, a, 1.0)


def prior_std(p) -> float:
    """Standard deviation of the prior: ``sigma_max`` for VE and EDM, 1 for VP and sub-VP."""
    return float(p.sigma_max) if _kind(p) in ("VE", "EDM") else 1.0
