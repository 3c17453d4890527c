"""Score-SDE samplers in process time: Euler-Maruyama, predictor-corrector,
probability-flow ODE Euler; and NCSN's annealed Langevin dynamics.

The first three step in process time ``t_i = process.t_of_ve_sigma(grid[i])`` with
the forward SDE coefficients ``(f, g) = process.sde(x, t)`` (Song et al., ICLR
2021, eqs. 6 and 13)::

    reverse SDE:       dx = [f(x, t) - g(t)^2 s(x, t)] dt + g(t) dw_bar
    probability flow:  dx = [f(x, t) - g(t)^2 s(x, t) / 2] dt

A step to ``ve_sigma = 0`` (a grid ending in 0) is the Tweedie denoising step
``x <- source.denoiser(x, t_{N-1})``, score_sde's noise-removal step, counted as
one NFE. Results are in process coordinates at the last grid point (the data
frame when it is 0).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from scorelib.samplers import _common as C


def _norms(v):
    """Per-example Euclidean norms, ``[batch]``."""
    return jnp.sqrt(jnp.sum(jnp.reshape(v, (v.shape[0], -1)) ** 2, axis=-1))


@functools.partial(
    jax.jit,
    static_argnames=("shape", "final_zero", "unroll", "probability_flow", "n_corrector", "snr"),
)
def _sde_core(source, key, grid, x_T, first_index, *, shape, final_zero, unroll,
              probability_flow, n_corrector, snr):
    process = source.process
    dtype = grid.dtype
    n = grid.shape[0] - 1
    keys = C.example_keys(key, first_index, shape[0])
    x = C.initial_state(process, keys, grid[0], x_T, shape, dtype)
    n_pos = n if final_zero else n + 1
    ts = process.t_of_ve_sigma(grid[:n_pos])
    alphas = process.alpha(ts)
    # alpha at the step's target; alpha = 1 at ve_sigma = 0 for every process (t -> t(0)).
    alpha_next = jnp.concatenate([alphas[1:], jnp.ones((1,), dtype)])[:n]
    # Langevin corrector's alpha_i: score_sde uses 1 (VE) and 1 - beta_i (VP), i.e. the
    # squared ratio of consecutive alpha(t); derived here from the process.
    ratio = (alphas[:n] / alpha_next) ** 2

    def corrector(x, i, t, a_i):
        # Song et al. 2021, Algorithm 4 / score_sde LangevinCorrector, with per-example norms
        # so that a sample does not depend on its batch.
        ks = C.step_keys(keys, i)
        tiny = jnp.finfo(dtype).tiny
        sqrt_d = math.sqrt(math.prod(shape[1:]))  # E||z||^2 = d
        for j in range(n_corrector):
            s = source.score(x, t)
            z = C.normal(ks, j + 1, shape[1:], dtype)
            eps = 2 * a_i * (snr * sqrt_d / jnp.maximum(_norms(s), tiny)) ** 2
            eps = C.per_example(eps, x)
            x = x + eps * s + jnp.sqrt(2 * eps) * z
        return x

    def step(x, xs):
        i, t, t_next, a_i = xs
        x = corrector(x, i, t, a_i)
        f, g = process.sde(x, t)
        s = source.score(x, t)
        dt = t_next - t  # < 0
        if probability_flow:
            return x + (f - 0.5 * g**2 * s) * dt, None
        z = C.normal(C.step_keys(keys, i), 0, shape[1:], dtype)
        return x + (f - g**2 * s) * dt + g * jnp.sqrt(-dt) * z, None

    m = C.n_scanned(n, final_zero)
    xs = (jnp.arange(m), ts[:m], ts[1 : m + 1], ratio[:m])
    x, _ = jax.lax.scan(step, x, xs, unroll=unroll)
    if not final_zero:
        return x
    x = corrector(x, n - 1, ts[n - 1], ratio[n - 1])
    return source.denoiser(x, ts[n - 1])  # Tweedie noise removal: E[x_0 | x_{t_{N-1}}]


def _run_sde(source, key, shape, grid, x_T, first_index, float64, unroll, *,
             probability_flow, n_corrector, snr):
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    unroll = C.check_int(unroll, "unroll", low=1)
    n, final_zero = g.shape[0] - 1, bool(g[-1] == 0)
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        x = _sde_core(
            source, key, jnp.asarray(g, dtype), x_T, first_index, shape=shape,
            final_zero=final_zero, unroll=unroll, probability_flow=probability_flow,
            n_corrector=n_corrector, snr=snr,
        )
    return x, {"nfe": n * (1 + n_corrector), "steps": n}


def euler_maruyama(source, key, shape, *, grid, x_T=None, first_index: int = 0,
                   float64: bool = False, unroll: int = 1):
    """Euler-Maruyama on the reverse-time SDE (Song et al. 2021, eq. 6; App. E predictor).

    ``x_{i+1} = x_i + [f(x_i, t_i) - g(t_i)^2 s(x_i, t_i)] (t_{i+1} - t_i)
    + g(t_i) sqrt(t_i - t_{i+1}) z_i``, ``t_i = process.t_of_ve_sigma(grid[i])``;
    a step to ``ve_sigma = 0`` is the Tweedie denoising step.

    Args:
      source: a ``ScoreSource`` (its ``process`` gives ``sde`` and the time map).
      key: a PRNG key; example ``b`` uses ``fold_in(key, first_index + b)``.
      shape: ``(batch, *data_shape)``.
      grid: ``[N + 1]`` VE noise levels, strictly decreasing, last ``>= 0``.
      x_T: optional ``shape`` start state in process coordinates at ``grid[0]``.
      first_index: global index of this batch's first example (>= 0).
      float64: float64 state and grid (scoped ``jax.enable_x64``).
      unroll: ``lax.scan`` unroll factor (>= 1).

    Returns:
      ``(x, {"nfe": N, "steps": N})``; ``x`` of ``shape`` in process coordinates at ``grid[-1]``.

    Raises:
      ValueError: for any invalid argument, before anything is compiled.
    """
    return _run_sde(source, key, shape, grid, x_T, first_index, float64, unroll,
                    probability_flow=False, n_corrector=0, snr=0.0)


def pf_ode_euler(source, key, shape, *, grid, x_T=None, first_index: int = 0,
                 float64: bool = False, unroll: int = 1):
    """Euler on the probability-flow ODE in process time (Song et al. 2021, eq. 13).

    ``x_{i+1} = x_i + [f(x_i, t_i) - g(t_i)^2 s(x_i, t_i) / 2] (t_{i+1} - t_i)``; a step
    to ``ve_sigma = 0`` is the Tweedie denoising step. Deterministic given ``x_T``.

    Args, Returns, Raises: as :func:`euler_maruyama` (``nfe = N``).
    """
    return _run_sde(source, key, shape, grid, x_T, first_index, float64, unroll,
                    probability_flow=True, n_corrector=0, snr=0.0)


def pc(source, key, shape, *, grid, x_T=None, first_index: int = 0, float64: bool = False,
       snr: float = 0.16, n_corrector: int = 1, unroll: int = 1):
    """Predictor-corrector sampling (Song et al. 2021, Algorithms 2-3; App. G).

    At each grid time ``t_i`` (before the step): ``n_corrector`` Langevin steps
    ``x <- x + eps s(x, t_i) + sqrt(2 eps) z`` with per-example step
    ``eps = 2 a_i (snr sqrt(d) / ||s||)^2`` and ``a_i = (alpha(t_i) / alpha(t_{i+1}))^2``
    (1 for VE and EDM; score_sde's ``1 - beta_i`` for VP), then one Euler-Maruyama
    predictor step. A step to ``ve_sigma = 0`` is the corrector followed by the
    Tweedie denoising step.

    Two deliberate differences from the reference: (1) score_sde averages ``||s||``
    and ``||z||`` over the batch; we take ``||s||`` per example so that a sample does
    not depend on its batch. (2) The paper's per-sample ``||z||`` (Algorithm 4) makes
    the step correlated with its own noise, which inflates the injected variance by
    ``(d + 2) / d`` (+67% at d = 3; measured as a 2.7x variance error on a 3-D
    Gaussian); we use ``sqrt(d) = E[||z||^2]^(1/2)``, what the batch mean tends to.
    In low dimension ``1 / ||s||^2`` is still heavy-tailed: the snr rule is designed
    for high-dimensional data.

    Args:
      snr: the corrector's signal-to-noise ratio (> 0); score_sde uses 0.16 (VE CIFAR-10).
      n_corrector: Langevin steps per grid time (>= 0; 0 is Euler-Maruyama).
      Others as :func:`euler_maruyama`.

    Returns:
      ``(x, {"nfe": N (1 + n_corrector), "steps": N})``.

    Raises:
      ValueError: for any invalid argument, before anything is compiled.
    """
    snr = C.check_real(snr, "snr", low=0.0, low_open=True)
    n_corrector = C.check_int(n_corrector, "n_corrector", low=0)
    return _run_sde(source, key, shape, grid, x_T, first_index, float64, unroll,
                    probability_flow=False, n_corrector=n_corrector, snr=snr)


# ------------------------------------------------------------------------ annealed Langevin
@functools.partial(
    jax.jit, static_argnames=("shape", "final_zero", "unroll", "n_steps_each", "eps")
)
def _annealed_langevin_core(source, key, grid, x_T, first_index, *, shape, final_zero, unroll,
                            n_steps_each, eps):
    process = source.process
    dtype = grid.dtype
    n = grid.shape[0] - 1
    n_pos = n if final_zero else n + 1
    levels = grid[:n_pos]
    ts = process.t_of_ve_sigma(levels)
    alphas = process.alpha(ts)
    keys = C.example_keys(key, first_index, shape[0])
    x = C.initial_state(process, keys, grid[0], x_T, shape, dtype) / alphas[0]
    sig_last = levels[n_pos - 1]

    def level(x, xs):
        i, sig, t, a = xs
        eta = eps * (sig / sig_last) ** 2  # Algorithm 1, line 3 (as step_size in the code)
        ks = C.step_keys(keys, i)

        def langevin(x, j):
            s = a * source.score(a * x, t)  # score of the VE-frame density x / alpha
            z = C.normal(ks, j, shape[1:], dtype)
            return x + eta * s + jnp.sqrt(2 * eta) * z, None  # Algorithm 1, line 6

        x, _ = jax.lax.scan(langevin, x, jnp.arange(n_steps_each), unroll=unroll)
        return x, None

    x, _ = jax.lax.scan(level, x, (jnp.arange(n_pos), levels, ts, alphas))
    if final_zero:
        return source.denoiser(alphas[n_pos - 1] * x, ts[n_pos - 1])
    return alphas[n_pos - 1] * x


def annealed_langevin(source, key, shape, *, grid, x_T=None, first_index: int = 0,
                      float64: bool = False, n_steps_each: int = 100, eps: float | None = None,
                      unroll: int = 1):
    """Annealed Langevin dynamics (NCSN; Song & Ermon 2019, Algorithm 1).

    For each positive grid level ``sigma_i`` (in order), ``n_steps_each`` steps
    ``x <- x + eta_i s(x; sigma_i) + sqrt(2 eta_i) z`` in the VE frame ``x / alpha``,
    with ``eta_i = eps (sigma_i / sigma_L)^2`` and ``sigma_L`` the last positive level.
    This is the reference code's form (ermongroup/ncsn ``anneal_Langevin_dynamics``:
    ``step_size = step_lr * (sigma / sigmas[-1])**2``, ``step_lr = 2e-5``); the paper's
    Algorithm 1 writes the same update with ``alpha_i = 2 eta_i``.
    If the grid ends in 0, a final Tweedie denoising step at ``sigma_L`` follows
    (the "denoise" option of later NCSN versions); otherwise the Langevin state is
    returned (in process coordinates at ``sigma_L``).

    Args:
      n_steps_each: Langevin steps per level (>= 1); Song & Ermon use 100.
      eps: the base step ``epsilon`` (> 0). Default ``0.2 sigma_L^2``, which is Song &
        Ermon's ``2e-5`` at their ``sigma_L = 0.01`` and keeps ``eta_i / sigma_i^2 = 0.2``
        (stable) for any ``sigma_L``; a fixed ``2e-5`` would diverge for ``sigma_L < 0.003``.
      Others as :func:`euler_maruyama`.

    Returns:
      ``(x, info)`` with ``info["nfe"] = L n_steps_each + (1 if grid[-1] == 0 else 0)``,
      ``L`` the number of positive grid levels (``N`` if the grid ends in 0, else ``N + 1``).

    Raises:
      ValueError: for any invalid argument, before anything is compiled.
    """
    shape, g = C.check_common(source, shape, grid, x_T, first_index, float64)
    C.check_key(key)
    n_steps_each = C.check_int(n_steps_each, "n_steps_each", low=1)
    unroll = C.check_int(unroll, "unroll", low=1)
    n, final_zero = g.shape[0] - 1, bool(g[-1] == 0)
    n_pos = n if final_zero else n + 1
    sig_last = float(g[n_pos - 1])
    eps = 0.2 * sig_last**2 if eps is None else C.check_real(eps, "eps", low=0.0, low_open=True)
    with C.x64_scope(float64):
        dtype = jnp.float64 if float64 else jnp.float32
        x = _annealed_langevin_core(
            source, key, jnp.asarray(g, dtype), x_T, first_index, shape=shape,
            final_zero=final_zero, unroll=unroll, n_steps_each=n_steps_each, eps=eps,
        )
    return x, {"nfe": n_pos * n_steps_each + (1 if final_zero else 0), "steps": n}
