"""Every sampler at N in {1, 2, 3, 10, 50} returns finite values (terminal and degenerate
steps), on a 2-D mixture with a nearly flat component, from the EDM grid (final sigma
exactly 0, sigma from 80 to 0.002): on VP at every N, on the other processes at the
degenerate and the long grids (N in {1, 2, 50}).

Each (sampler, process, N) is a program of its own (N is the scan length); the runs of one
test are traced into one ``jax.jit`` over the sources and keys, so XLA compiles one module
per test instead of one per run (less than half the compile time: the per-compile overhead
is paid once and the runs share their start draws). Each run is the registered sampler's
own call, validation included; inside the outer jit its grid is a compile-time constant.
"""

import jax
import numpy as np
import pytest

from scorelib.samplers import SAMPLERS, edm_grid

CONFIGS = {
    **{k: {} for k in SAMPLERS},
    "annealed_langevin": dict(n_steps_each=5),
    "heun_churn": dict(S_churn=40.0, S_min=0.05, S_max=50.0, S_noise=1.003),
}


def check_finite(sources, cases):
    """Run every ``(config, process, n)`` of ``cases`` inside one compiled program and check
    the shape, finiteness and reported step count of each result."""
    steps = {}

    def run_all(sources, keys):
        out = []
        for config, process, n in cases:
            f = SAMPLERS[config.replace("_churn", "")]
            x, info = f(sources[process], keys[n], (4, 2), grid=edm_grid(n), **CONFIGS[config])
            steps[config, process, n] = info["steps"]
            out.append(x)
        return out

    keys = {n: jax.random.key(n) for _, _, n in cases}
    xs = jax.jit(run_all)(sources, keys)
    assert len(xs) == len(cases)
    for case, x in zip(cases, xs, strict=True):
        assert x.shape == (4, 2), case
        assert np.all(np.isfinite(np.asarray(x))), case
        assert steps[case] == case[2], (case, steps[case])


@pytest.mark.slow  # over 5 s on 2 idle cores: `make test` only
def test_finite_for_every_n_on_vp(mixture_sources):
    """Every sampler configuration on VP at N in {1, 2, 3, 10, 50}."""
    check_finite(mixture_sources, [(c, "vp", n) for c in CONFIGS for n in (1, 2, 3, 10, 50)])


@pytest.mark.slow
def test_finite_at_degenerate_and_long_grids_on_the_other_processes(mixture_sources):
    """Every sampler configuration on VE, sub-VP and EDM at N in {1, 2, 50}."""
    cases = [(c, p, n) for c in CONFIGS for p in ("ve", "subvp", "edm") for n in (1, 2, 50)]
    check_finite(mixture_sources, cases)
