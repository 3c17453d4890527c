"""Samplers: time grids, one sampler driver, and the samplers registered with it.

**Signature.** Every sampler is called as ``sample(source, key, shape, *, grid, x_T=None,
first_index=0, float64=False, **opts) -> (x, info)``: ``source`` a ``ScoreSource`` (its
``.process`` is the process), ``key`` one PRNG key, ``shape = (batch, *data_shape)``,
``grid`` a strictly decreasing ``[N + 1]`` array of VE noise levels ``ve_sigma``
(``grids``; one grid serves every process), ``x_T`` an optional start state in process
coordinates at ``grid[0]``, ``first_index`` the global index of ``x[0]``. ``x`` has
``shape``, in process coordinates at ``grid[-1]`` (the data frame when it is 0);
``info = {"nfe": int, "steps": N}``. Example ``b`` draws all its noise from
``fold_in(key, first_index + b)`` (``driver`` documents the scheme), so a sample depends
on its key and global index only.

**Contract** (what entry points rely on). ``get_sampler(name)`` returns a ``Sampler``:

* ``.name``: the registry name;
* ``.options``: option name -> default (``unroll``, the scan's unroll factor, included);
* ``.default_grid``: the grid (a name of ``GRIDS``) it runs on unless told otherwise;
* ``.is_stochastic(**opts)``: whether the output depends on step noise with these
  options (``heun``: when ``S_churn > 0``; ``euler_maruyama``, ``pc``,
  ``annealed_langevin``: always; ``dpmpp_2m``, ``pf_ode_euler``: never);
* calling it with an option it does not take raises ``ValueError("sampler.<opt> is not
  used by sampler <name> (its options: ...)")``; every value is checked before compile.

Grids: ``make_grid(name, steps, process, **opts)`` refuses an option the grid does not use
(``sampler.rho is not used by grid log_snr``). ``GRID_FUNCTIONS`` maps each name to its
constructor, whose keyword parameters are the grid's options (``GRIDS``: name -> options and
their defaults, read from the signatures); adding a grid is one function and one line
there. ``draw_samples`` draws any number of samples in batches (batch-size independent);
``teleport`` starts any sampler from ``grid[k]`` in closed form;
``langevin_corrector`` runs the Langevin corrector alone. ``cfdm_sample`` is the sigma-CFDM
sampler (Euler in rectified-flow time from an exact training-mixture draw; not a
``StepRule``: see ``cfdm.py``). ``ddrm`` (DDRM, Kawar et al. 2022) samples an inverse
problem's posterior from a ``scorelib.scores.MeasuredScore`` whose operator has an SVD; it is
not in ``SAMPLERS`` (it needs a measurement; every registered sampler draws posteriors from
the measurement-conditioned sources of ``scorelib.scores.measured``). Every registered
sampler runs on a random source (``SmoothedScore``, ``ReverseDiffusionScore``) or a
conditional one (class labels) as it is: the driver binds its draws and conditions to each
block's examples
(``source.for_examples``). ``langevin_mcmc`` is plain ULA/MALA on a target's log-density
(``mcmc.py``), the baseline of reverse-diffusion Monte Carlo. ``langevin_from_data`` is
Koehler and Vuong's early-stopped Langevin on a vanilla score (one time of any source),
started at training examples (``data_langevin.py``; ``langevin_from_noise`` beside it).

**Adding a sampler**: a ``driver.StepRule`` subclass (options, stochastic property,
option checks, default grid, NFE count, ``init``/``step``/``final``; see ``ode.py`` and
``sde.py``) and one line in ``SAMPLERS`` below.
"""

from scorelib.samplers.cfdm import cfdm_sample
from scorelib.samplers.data_langevin import langevin_from_data, langevin_from_noise
from scorelib.samplers.ddrm import ddrm
from scorelib.samplers.draw import draw_samples
from scorelib.samplers.driver import Sampler, StepRule
from scorelib.samplers.grids import (
    GRID_FUNCTIONS,
    GRIDS,
    edm_grid,
    log_snr_grid,
    make_grid,
    uniform_t_grid,
)
from scorelib.samplers.langevin import corrector_step_size, langevin_corrector
from scorelib.samplers.mcmc import langevin_mcmc, steps_for_budget
from scorelib.samplers.ode import dpmpp_2m, heun
from scorelib.samplers.sde import annealed_langevin, euler_maruyama, pc, pf_ode_euler
from scorelib.samplers.teleport import teleport

SAMPLERS: dict[str, Sampler] = {
    s.name: s for s in (euler_maruyama, pc, annealed_langevin, pf_ode_euler, heun, dpmpp_2m)
}


def get_sampler(name: str) -> Sampler:
    """The sampler registered as ``name`` (see the module docstring for its contract).

    Raises:
      ValueError: naming ``sampler.name`` and listing the registered names.
    """
    if not isinstance(name, str) or name not in SAMPLERS:
        raise ValueError(f"sampler.name must be one of {sorted(SAMPLERS)}; got {name!r}")
    return SAMPLERS[name]


__all__ = [
    "SAMPLERS",
    "GRIDS",
    "GRID_FUNCTIONS",
    "Sampler",
    "StepRule",
    "get_sampler",
    "make_grid",
    "edm_grid",
    "uniform_t_grid",
    "log_snr_grid",
    "heun",
    "dpmpp_2m",
    "euler_maruyama",
    "pc",
    "pf_ode_euler",
    "annealed_langevin",
    "langevin_corrector",
    "langevin_mcmc",
    "langevin_from_data",
    "langevin_from_noise",
    "steps_for_budget",
    "corrector_step_size",
    "draw_samples",
    "cfdm_sample",
    "ddrm",
    "teleport",
]
