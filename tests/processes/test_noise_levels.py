"""The noise-level draws (``scorelib.processes.noise_levels``) against independent forms."""

import jax.numpy as jnp
import numpy as np
from scipy import stats

from scorelib.processes.noise_levels import log_normal_sigma, rho_spaced


def test_rho_spaced_is_linear_in_sigma_to_the_one_over_rho():
    """Karras et al. 2022, eq. 5: sigma^(1/rho) moves linearly from sigma_max^(1/rho) at
    u = 0 to sigma_min^(1/rho) at u = 1; numpy in, numpy out (float64), JAX in, JAX out."""
    lo, hi = 0.002, 80.0
    for rho in (1.0, 3.0, 7.0):
        u = np.linspace(0.0, 1.0, 11)
        s = rho_spaced(u, lo, hi, rho)
        assert isinstance(s, np.ndarray) and s.dtype == np.float64
        np.testing.assert_allclose([s[0], s[-1]], [hi, lo], rtol=1e-10)
        root = s ** (1.0 / rho)
        np.testing.assert_allclose(
            np.diff(root), (lo ** (1 / rho) - hi ** (1 / rho)) / 10, rtol=1e-9
        )
    out = rho_spaced(jnp.asarray([0.25, 0.5]), lo, hi, 7.0)
    assert isinstance(out, type(jnp.zeros(1))) and out.dtype == jnp.float32


def test_log_normal_sigma_quantiles_are_scipys():
    """z = Phi^{-1}(q) gives the q-quantile of LogNormal(P_mean, P_std^2) (EDM: -1.2, 1.2)."""
    q = np.array([0.001, 0.1, 0.5, 0.9, 0.999])
    for p_mean, p_std in ((-1.2, 1.2), (0.4, 0.5)):
        want = stats.lognorm(s=p_std, scale=np.exp(p_mean)).ppf(q)
        got = log_normal_sigma(jnp.asarray(stats.norm.ppf(q)), P_mean=p_mean, P_std=p_std)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6)
