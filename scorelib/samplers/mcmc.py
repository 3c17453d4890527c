"""Plain Langevin Monte Carlo on a target's log-density: ULA and MALA chains from noise.

The baseline of reverse-diffusion Monte Carlo (Huang et al., ICLR 2024): one chain per
sample, started from ``N(0, init_scale^2 I)`` (the OU prior with ``init_scale = 1``), run
for ``n_steps`` steps of the kernels of ``scorelib/scores/mcmc.py`` with the step
``h = step_size / curvature`` (the rdMC inner step at infinite noise,
:func:`scorelib.scores.rdmc.inner_step`), and its final state returned. Not a ``StepRule``:
there is no grid and no score source, only a target.

Keys: example ``b`` owns ``k_b = fold_in(key, first_index + b)`` (``scorelib.keys``); its
start is ``normal(fold_in(k_b, 0))`` (the draw the sampler driver starts from, so rdMC and
Langevin start from the same noise), its chain key ``fold_in(k_b, 1)``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scorelib._checks import check_int, check_real
from scorelib.keys import example_keys
from scorelib.samplers.driver import check_key
from scorelib.scores.mcmc import chain_evaluations, check_log_density, check_method
from scorelib.scores.mcmc import langevin_chains as _chains
from scorelib.scores.rdmc import inner_step

Array = Any


def steps_for_budget(method: str, grad_evals: int) -> int:
    """The most steps of one chain whose gradient evaluations do not exceed ``grad_evals``
    (ULA: ``grad_evals``; MALA: ``grad_evals - 1``, its start costs one).

    Raises:
      ValueError: naming ``method`` or ``grad_evals`` (``>= 1``; ``>= 2`` for MALA).
    """
    method = check_method(method, "method")
    grad_evals = check_int(grad_evals, "grad_evals", low=2 if method == "mala" else 1)
    return grad_evals - (1 if method == "mala" else 0)


@functools.partial(jax.jit, static_argnames=("target", "n", "n_steps", "method"))
def _run(target, key, first_index, h, init_scale, *, n, n_steps, method):
    keys = example_keys(key, n, first_index)
    d = target.dim
    x = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 0), (d,), jnp.float32))(keys)
    chain_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 1)
    out = _chains(
        target.log_prob if method == "mala" else None,
        target.score,
        init_scale * x,
        h,
        chain_keys,
        n_steps,
        method=method,
    )
    return out["x"], out["accept"]


def langevin_mcmc(
    target,
    key,
    n: int,
    *,
    n_steps: int,
    step_size: float,
    curvature: float = 1.0,
    method: str = "mala",
    init_scale: float = 1.0,
    first_index: int = 0,
) -> tuple[np.ndarray, dict]:
    """``n`` samples of ``target``: the final states of ``n`` independent Langevin chains.

    Args:
      target: a target with a log-density (``dim``, ``log_prob``, ``score``).
      key: one PRNG key (module docstring, "Keys").
      n: the number of chains (= samples, ``>= 1``).
      n_steps: steps per chain (``>= 0``); :func:`steps_for_budget` for a gradient budget.
      step_size, curvature: the step ``h = step_size / curvature`` (``step_size`` in
        ``(0, 2)``, ``curvature > 0`` in data units^-2, as rdMC's options).
      method: ``"ula"`` or ``"mala"``.
      init_scale: standard deviation of the start ``N(0, init_scale^2 I)`` (``> 0``).
      first_index: global index of the first chain (``>= 0``).

    Returns:
      ``(x, info)``: ``x`` ``[n, dim]`` float32 numpy; ``info = {"grad_evals",
      "density_evals"}`` per sample (:func:`scorelib.scores.mcmc.chain_evaluations`) and
      ``"acceptance"``, the mean fraction of accepted proposals (1 for ULA).

    Raises:
      ValueError: naming ``data.target`` (no log-density), ``key`` or the argument at
        fault, before anything is compiled.
    """
    check_log_density(target, "data.target")
    check_key(key)
    n = check_int(n, "n", low=1)
    n_steps = check_int(n_steps, "n_steps", low=0)
    step_size = check_real(step_size, "step_size", low=0.0, high=2.0, low_open=True, high_open=True)
    curvature = check_real(curvature, "curvature", low=0.0, low_open=True)
    method = check_method(method, "method")
    init_scale = check_real(init_scale, "init_scale", low=0.0, low_open=True)
    first_index = check_int(first_index, "first_index", low=0)
    h = inner_step(step_size, curvature, np.inf)
    x, acc = _run(
        target,
        key,
        first_index,
        jnp.float32(h),
        jnp.float32(init_scale),
        n=n,
        n_steps=n_steps,
        method=method,
    )
    ev = chain_evaluations(method, n_steps, False)
    info = {
        "grad_evals": ev["grad"],
        "density_evals": ev["density"],
        "acceptance": float(jnp.mean(acc)),
    }
    return np.asarray(x), info
