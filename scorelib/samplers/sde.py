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

Each sampler is a :class:`scorelib.samplers.driver.StepRule`; the driver owns
validation, keys, the scan and the NFE count. The Langevin steps of PC and annealed
Langevin are :func:`scorelib.samplers.langevin.langevin_steps`.
"""

from __future__ import annotations

import jax.numpy as jnp

from scorelib._checks import check_int, check_real
from scorelib.samplers.driver import Sampler, StepRule
from scorelib.samplers.langevin import corrector_step_size, langevin_steps


class EulerMaruyama(StepRule):
    """Euler-Maruyama on the reverse-time SDE (Song et al. 2021, eq. 6; App. E predictor).

    ``euler_maruyama(source, key, shape, *, grid, x_T=None, first_index=0, float64=False,
    unroll=1) -> (x, info)``

    ``x_{i+1} = x_i + [f(x_i, t_i) - g(t_i)^2 s(x_i, t_i)] (t_{i+1} - t_i)
    + g(t_i) sqrt(t_i - t_{i+1}) z_i``, ``t_i = process.t_of_ve_sigma(grid[i])``;
    a step to ``ve_sigma = 0`` is the Tweedie denoising step. Stochastic.

    Args:
      source: a ``ScoreSource`` (its ``process`` gives ``sde`` and the time map).
      key: a PRNG key; example ``b`` uses ``fold_in(key, first_index + b)``.
      shape: ``(batch, *data_shape)``.
      grid: ``[N + 1]`` VE noise levels (data units), strictly decreasing, last ``>= 0``.
      x_T: optional ``shape`` start state in process coordinates at ``grid[0]``.
      first_index: global index of this batch's first example (>= 0).
      float64: float64 state and grid (scoped ``jax.enable_x64``).
      unroll: ``lax.scan`` unroll factor (>= 1).

    Returns:
      ``(x, {"nfe": N, "steps": N})``; ``x`` of ``shape`` in process coordinates at
      ``grid[-1]``.

    Raises:
      ValueError: for any invalid argument or unused option, before anything is compiled.
    """

    name = "euler_maruyama"
    default_grid = "uniform_t"  # score_sde: linspace(T, eps, N)
    stochastic = True
    probability_flow = False

    def nfe(self, n, final_zero, opts):
        return n

    def tables(self, ctx):
        process, g, n = ctx.process, ctx.grid, ctx.n
        n_pos = n if ctx.final_zero else n + 1
        ts = process.t_of_ve_sigma(g[:n_pos])
        alphas = process.alpha(ts)
        # alpha at the step's target; alpha = 1 at ve_sigma = 0 for every process (t -> t(0)).
        alpha_next = jnp.concatenate([alphas[1:], jnp.ones((1,), ctx.dtype)])[:n]
        # Langevin corrector's a_i: score_sde uses 1 (VE) and 1 - beta_i (VP), i.e. the
        # squared ratio of consecutive alpha(t); derived here from the process.
        return {"t": ts, "a": (alphas[:n] / alpha_next) ** 2}

    def init(self, ctx, x):
        return x

    def scan_inputs(self, ctx):
        m = ctx.n - 1 if ctx.final_zero else ctx.n  # the step to 0 is the Tweedie step (final)
        t, a = ctx.tables["t"], ctx.tables["a"]
        return jnp.arange(m), t[:m], t[1 : m + 1], a[:m]

    def correct(self, ctx, x, i, t, a):
        """The corrector at grid time ``t = t_i`` before step ``i``: none for the plain
        predictors (:class:`PredictorCorrector` overrides it)."""
        return x

    def step(self, ctx, x, xs):
        i, t, t_next, a = xs
        x = self.correct(ctx, x, i, t, a)
        f, g = ctx.process.sde(x, t)
        s = ctx.source.score(x, t)
        dt = t_next - t  # < 0
        if self.probability_flow:
            return x + (f - 0.5 * g**2 * s) * dt
        z = ctx.noise(i, 0)
        return x + (f - g**2 * s) * dt + g * jnp.sqrt(-dt) * z

    def final(self, ctx, x):
        if not ctx.final_zero:
            return x
        t = ctx.tables["t"][ctx.n - 1]
        x = self.correct(ctx, x, ctx.n - 1, t, ctx.tables["a"][ctx.n - 1])
        # Tweedie noise removal: E[x_0 | x_{t_{N-1}}].
        return ctx.source.denoiser(x, t)


class ProbabilityFlowEuler(EulerMaruyama):
    """Euler on the probability-flow ODE in process time (Song et al. 2021, eq. 13).

    ``pf_ode_euler(source, key, shape, *, grid, x_T=None, first_index=0, float64=False,
    unroll=1) -> (x, info)``

    ``x_{i+1} = x_i + [f(x_i, t_i) - g(t_i)^2 s(x_i, t_i) / 2] (t_{i+1} - t_i)``; a step
    to ``ve_sigma = 0`` is the Tweedie denoising step. Deterministic given ``x_T``.

    Args, Returns, Raises: as :func:`scorelib.samplers.euler_maruyama` (``nfe = N``).
    """

    name = "pf_ode_euler"
    default_grid = "uniform_t"
    stochastic = False
    probability_flow = True


class PredictorCorrector(EulerMaruyama):
    """Predictor-corrector sampling (Song et al. 2021, Algorithms 2-5; App. G).

    ``pc(source, key, shape, *, grid, x_T=None, first_index=0, float64=False, snr=0.16,
    n_corrector=1, unroll=1) -> (x, info)``

    At each grid time ``t_i`` (before the step): ``n_corrector`` Langevin steps
    ``x <- x + eps_i s(x, t_i) + sqrt(2 eps_i) z`` with the step
    ``eps_i = 2 a_i (snr sigma(t_i))^2`` (:func:`scorelib.samplers.langevin.corrector_step_size`;
    ``sigma(t)`` the process's noise std, ``a_i = (alpha(t_i) / alpha(t_{i+1}))^2``: 1 for
    VE and EDM, score_sde's ``1 - beta_i`` for VP), then one Euler-Maruyama predictor
    step. A step to ``ve_sigma = 0`` is the corrector followed by the Tweedie denoising
    step. Stochastic.

    The step depends on the grid (``t_i`` and, through ``a_i``, the spacing to ``t_{i+1}``:
    on a coarse VP grid ``a_i`` is well below 1, as score_sde's ``1 - beta_i`` is at small
    N) and never on the state, where the paper's ``2 a_i (snr ||z|| / ||s||)^2`` depends
    on each chain's own score norm; the two agree where ``p_t`` is noise-dominated
    (``||s|| ~ sqrt(d) / sigma(t)``), and only the fixed step leaves ``p_t`` invariant (up
    to ULA's ``O(eps)`` bias), is finite where ``s = 0``, and keeps each sample independent
    of its batch (see :func:`scorelib.samplers.langevin.corrector_step_size`).

    Args:
      snr: the corrector's signal-to-noise ratio (> 0); score_sde uses 0.16 (VE CIFAR-10).
      n_corrector: Langevin steps per grid time (>= 0; 0 is Euler-Maruyama); a
        ``lax.scan``, so large counts compile as fast as small ones.
      Others as :func:`scorelib.samplers.euler_maruyama`.

    Returns:
      ``(x, {"nfe": N (1 + n_corrector), "steps": N})``.

    Raises:
      ValueError: for any invalid argument or unused option, before anything is compiled.
    """

    name = "pc"
    default_grid = "uniform_t"
    options = {"snr": 0.16, "n_corrector": 1}

    def check(self, opts, grid):
        got = {
            "snr": check_real(opts["snr"], "sampler.snr", low=0.0, low_open=True),
            "n_corrector": check_int(opts["n_corrector"], "sampler.n_corrector", low=0),
        }
        if got["n_corrector"] == 0 and got["snr"] != self.options["snr"]:
            raise ValueError(
                "sampler.snr is not used by sampler pc when sampler.n_corrector = 0 (no "
                f"corrector steps); got {got['snr']!r}"
            )
        return got

    def correct(self, ctx, x, i, t, a):
        # Song et al. 2021, Algorithms 4-5 with the step of corrector_step_size; its noise
        # j = 0, 1, ... uses fold_in index j + 1 of step i (index 0 is the predictor's).
        n_corr = ctx.opts["n_corrector"]
        if n_corr == 0:
            return x
        eps = corrector_step_size(ctx.process, t, snr=ctx.opts["snr"], alpha_ratio=a)
        return langevin_steps(
            lambda y: ctx.source.score(y, t), x, eps, ctx.step_keys(i), n_corr, first_noise=1
        )

    def nfe(self, n, final_zero, opts):
        return n * (1 + opts["n_corrector"])


class AnnealedLangevin(StepRule):
    """Annealed Langevin dynamics (NCSN; Song & Ermon 2019, Algorithm 1).

    ``annealed_langevin(source, key, shape, *, grid, x_T=None, first_index=0,
    float64=False, n_steps_each=100, eps=None, unroll=1) -> (x, info)``

    For each positive grid level ``sigma_i`` (in order), ``n_steps_each`` steps
    ``x <- x + eta_i s(x; sigma_i) + sqrt(2 eta_i) z`` in the VE frame ``x / alpha``,
    with ``eta_i = eps (sigma_i / sigma_L)^2`` and ``sigma_L`` the last positive level.
    This is the reference code's form (ermongroup/ncsn ``anneal_Langevin_dynamics``:
    ``step_size = step_lr * (sigma / sigmas[-1])**2``, ``step_lr = 2e-5``); the paper's
    Algorithm 1 writes the same update with ``alpha_i = 2 eta_i``.
    If the grid ends in 0, a final Tweedie denoising step at ``sigma_L`` follows
    (the "denoise" option of later NCSN versions); otherwise the Langevin state is
    returned (in process coordinates at ``sigma_L``). Stochastic. Scan index ``i`` of the
    key scheme is the level; step ``j`` of level ``i`` draws
    ``normal(fold_in(fold_in(k_b, i + 1), j))``.

    Args:
      n_steps_each: Langevin steps per level (>= 1); Song & Ermon use 100.
      eps: the base step ``epsilon`` (> 0). Default ``0.2 sigma_L^2``, which is Song &
        Ermon's ``2e-5`` at their ``sigma_L = 0.01`` and keeps ``eta_i / sigma_i^2 = 0.2``
        (stable) for any ``sigma_L``; a fixed ``2e-5`` would diverge for ``sigma_L < 0.003``.
      unroll: ``lax.scan`` unroll factor of the Langevin steps within a level (>= 1).
      Others as :func:`scorelib.samplers.euler_maruyama`.

    Returns:
      ``(x, info)`` with ``info["nfe"] = L n_steps_each + (1 if grid[-1] == 0 else 0)``,
      ``L`` the number of positive grid levels (``N`` if the grid ends in 0, else ``N + 1``).

    Raises:
      ValueError: for any invalid argument or unused option, before anything is compiled.
    """

    name = "annealed_langevin"
    default_grid = "log_snr"  # NCSN: geometric noise levels
    options = {"n_steps_each": 100, "eps": None}
    stochastic = True
    unroll_scan = False  # ``unroll`` applies to the steps within a level

    @staticmethod
    def _levels(n, final_zero):
        return n if final_zero else n + 1

    def check(self, opts, grid):
        n_each = check_int(opts["n_steps_each"], "sampler.n_steps_each", low=1)
        eps = opts["eps"]
        if eps is not None:
            eps = check_real(eps, "sampler.eps", low=0.0, low_open=True)
        elif grid is not None:
            sig_last = float(grid[self._levels(grid.shape[0] - 1, grid[-1] == 0) - 1])
            eps = 0.2 * sig_last**2
        return {"n_steps_each": n_each, "eps": eps}

    def nfe(self, n, final_zero, opts):
        return self._levels(n, final_zero) * opts["n_steps_each"] + (1 if final_zero else 0)

    def tables(self, ctx):
        ts = ctx.process.t_of_ve_sigma(ctx.grid[: self._levels(ctx.n, ctx.final_zero)])
        return {"t": ts, "alpha": ctx.process.alpha(ts)}

    def init(self, ctx, x):
        return x / ctx.tables["alpha"][0]

    def scan_inputs(self, ctx):
        levels = self._levels(ctx.n, ctx.final_zero)
        return jnp.arange(levels), ctx.grid[:levels], ctx.tables["t"], ctx.tables["alpha"]

    def step(self, ctx, x, xs):
        i, sig, t, a = xs
        sig_last = ctx.grid[self._levels(ctx.n, ctx.final_zero) - 1]
        eta = ctx.opts["eps"] * (sig / sig_last) ** 2  # Algorithm 1, line 3 (code's step_size)
        # Algorithm 1, line 6, with the score of the VE-frame density x / alpha.
        return langevin_steps(
            lambda y: a * ctx.source.score(a * y, t),
            x,
            eta,
            ctx.step_keys(i),
            ctx.opts["n_steps_each"],
            unroll=ctx.unroll,
        )

    def final(self, ctx, x):
        last = self._levels(ctx.n, ctx.final_zero) - 1
        a, t = ctx.tables["alpha"][last], ctx.tables["t"][last]
        if ctx.final_zero:
            return ctx.source.denoiser(a * x, t)
        return a * x


euler_maruyama = Sampler(EulerMaruyama())
pf_ode_euler = Sampler(ProbabilityFlowEuler())
pc = Sampler(PredictorCorrector())
annealed_langevin = Sampler(AnnealedLangevin())
