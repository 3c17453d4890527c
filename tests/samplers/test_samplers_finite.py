"""Every sampler at N in {1, 2, 3, 10, 50} returns finite values (terminal and degenerate
steps), on a 2-D mixture with a nearly flat component, from the EDM grid (final sigma
exactly 0, sigma from 80 to 0.002): on VP at every N, on the other processes at the
degenerate and the long grids (N in {1, 2, 50}; each N is a compile of its own)."""

import jax
import numpy as np
import pytest

from scorelib.samplers import SAMPLERS, edm_grid

CONFIGS = {
    **{k: {} for k in SAMPLERS},
    "annealed_langevin": dict(n_steps_each=5),
    "heun_churn": dict(S_churn=40.0, S_min=0.05, S_max=50.0, S_noise=1.003),
}


@pytest.mark.parametrize(
    "process",
    ["vp"] + [pytest.param(p, marks=pytest.mark.slow) for p in ("ve", "subvp", "edm")],
)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_finite_for_every_n(config, process, mixture_sources):
    src = mixture_sources[process]
    f = SAMPLERS[config.replace("_churn", "")]
    for n in (1, 2, 3, 10, 50) if process == "vp" else (1, 2, 50):
        x, info = f(src, jax.random.key(n), (4, 2), grid=edm_grid(n), **CONFIGS[config])
        assert x.shape == (4, 2)
        assert np.all(np.isfinite(np.asarray(x))), (config, process, n)
        assert info["steps"] == n
