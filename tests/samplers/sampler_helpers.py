"""Shared fixtures of the sampler tests: small analytic sources with known answers."""

import closed_forms as cf
import jax
import numpy as np

from scorelib.processes import EDM, VE, VP, SubVP
from scorelib.scores import GaussianScore, MixtureScore

PROCESSES = {"ve": VE(), "vp": VP(), "subvp": SubVP(), "edm": EDM()}


class Gauss:
    """A random d-dimensional Gaussian N(mu, Q diag(lam) Q^T), kept in float64 numpy."""

    def __init__(self, d, lam, seed=0):
        rng = np.random.default_rng(seed)
        self.q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        self.lam = np.asarray(lam, dtype=np.float64)
        self.mu = 0.5 * rng.normal(size=d)
        self.cov = self.q @ np.diag(self.lam) @ self.q.T

    def source(self, process, x64=False):
        """A GaussianScore; with ``x64`` its arrays are float64 (built under enable_x64)."""
        if x64:
            with jax.enable_x64(True):
                return GaussianScore.from_covariance(process, self.mu, self.cov)
        return GaussianScore.from_covariance(process, self.mu, self.cov)

    def denoise_ve(self, x_ve, sigma):
        """Independent numpy Wiener filter (VE frame): mu + Q diag(lam/(lam+s^2)) Q^T (x-mu)."""
        c = (x_ve - self.mu) @ self.q
        return self.mu + (c * self.lam / (self.lam + sigma**2)) @ self.q.T

    def pf_ode_ve(self, x_T_ve, s_T, s):
        """Closed-form PF-ODE solution in the VE frame (Wang & Vastola 2024, eq. 8)."""
        c = (x_T_ve - self.mu) @ self.q
        return self.mu + (c * np.sqrt((s**2 + self.lam) / (s_T**2 + self.lam))) @ self.q.T


def mixture_sources_dict():
    """A 2-D, 2-component mixture (one nearly flat component) for each process."""
    covs = [np.eye(2) * 0.1, np.diag([0.2, 0.01])]
    return {
        k: MixtureScore.create(p, [0.3, 0.7], [[1.0, 0.0], [-1.0, 0.5]], covs)
        for k, p in PROCESSES.items()
    }


def alpha_at(process, ve_sigma):
    """alpha(t(ve_sigma)) in float64 (1 at ve_sigma = 0), from ``tests/closed_forms.py``."""
    return float(cf.alpha_at_ve_sigma(process, ve_sigma))
