"""Samplers: time grids and jit-compiled samplers with one signature.

Every sampler is ``sample(source, key, shape, *, grid, x_T=None, first_index=0,
float64=False, **opts) -> (x, info)``: ``source`` is a ``ScoreSource`` (its
``.process`` is the process), ``shape = (batch, *data_shape)``, ``grid`` a
strictly decreasing ``[N + 1]`` array of VE noise levels (``grids``), ``info``
holds ``nfe`` (a Python int fixed by the grid and options) and ``steps``.
"""

from scorelib.samplers.grids import edm_grid, log_snr_grid, uniform_t_grid
from scorelib.samplers.ode import dpmpp_2m, heun
from scorelib.samplers.sde import annealed_langevin, euler_maruyama, pc, pf_ode_euler
from scorelib.samplers.teleport import teleport

SAMPLERS = {
    "euler_maruyama": euler_maruyama,
    "pc": pc,
    "annealed_langevin": annealed_langevin,
    "pf_ode_euler": pf_ode_euler,
    "heun": heun,
    "dpmpp_2m": dpmpp_2m,
}


def get_sampler(name: str):
    """The sampler registered as ``name``.

    Raises:
      ValueError: naming ``sampler.name`` and listing the registered names.
    """
    try:
        return SAMPLERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"sampler.name must be one of {sorted(SAMPLERS)}; got {name!r}"
        ) from None


__all__ = [
    "SAMPLERS",
    "get_sampler",
    "edm_grid",
    "uniform_t_grid",
    "log_snr_grid",
    "heun",
    "dpmpp_2m",
    "euler_maruyama",
    "pc",
    "pf_ode_euler",
    "annealed_langevin",
    "teleport",
]
