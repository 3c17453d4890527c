"""The reverse-diffusion Monte Carlo score (rdMC): the score of ``p_t`` of an unnormalised
density ``p ∝ exp(-f)``, estimated by short Langevin chains on a posterior.

Huang, Dong, Hao, Ma and Zhang, "Reverse diffusion Monte Carlo", ICLR 2024 (arXiv
2307.02037). The data ``x_0 ~ p`` are noised by the Ornstein-Uhlenbeck process
``dx = -x dt + sqrt(2) dB``, ``x_t = e^{-t} x_0 + sqrt(1 - e^{-2t}) eps``; its reverse needs
``grad log p_t``, which is a posterior mean (Tweedie):

    grad log p_t(x) = E_{q_t(x_0 | x)}[(alpha x_0 - x) / sigma^2],
    q_t(x_0 | x) ∝ exp(-f(x_0) - |x - alpha x_0|^2 / (2 sigma^2)),

with ``alpha = e^{-t}``, ``sigma^2 = 1 - e^{-2t}``. rdMC estimates the mean with ``n`` samples
of ``q_t`` from short ULA or MALA chains (``scores/mcmc.py``); the quadratic term makes
``q_t`` log-concave at small ``t`` even where ``f`` is not. The second estimator ("TSI",
the target score identity; De Bortoli et al., "Target score matching", arXiv 2402.08667,
Prop. 1) averages the clean score instead:

    grad log p_t(x) = E_{q_t(x_0 | x)}[grad log p(x_0)] / alpha.

Nothing here is particular to the OU process: with ``y = x / alpha`` and
``v = (sigma / alpha)^2`` (the VE-frame noise level squared, ``process.ve_sigma``),
``q_t(x_0 | x) ∝ p(x_0) N(x_0; y, v I)`` for any process, so the source runs on any
``Process``. The paper's OU process is the VP process with a constant ``beta``
(:func:`scorelib.processes.ornstein_uhlenbeck`: ``beta = 2 T`` runs OU time ``T t``).

Inner chains (options of :meth:`ReverseDiffusionScore.create`): ``n_samples`` chains of
``n_steps`` steps, step ``h = step_size v / (1 + curvature v)``: ``step_size`` over the
curvature of ``-log q_t``, ``1 / v`` from the quadratic term plus ``curvature``, a bound the
user gives on the curvature of ``f`` (data units^-2), so that one ``step_size < 2`` is stable
at every ``t`` (``h -> step_size v`` at small noise, ``step_size / curvature`` at large).
Start (``init``): ``"scaled"``, every chain at ``y = e^t x`` (the maximiser of the quadratic
term), or ``"importance"``, ``n_proposals`` draws of ``N(y, v I)`` (the Gaussian factor of
``q_t``) weighted by ``p`` and resampled (self-normalised importance sampling; a warm start
that sees every mode within a few ``sqrt(v)`` of ``y``). Which start the paper uses is not
verified here (``docs/rdmc.md``). With ``estimator="snis"`` there are no chains: the
posterior mean is the self-normalised importance-weighted mean of all ``n_proposals``
proposals, ``sum_i w_i z_i / sum_i w_i`` with ``w_i = p(z_i)`` (the baseline that shows what
the chains add to the importance start).

A score source that is random. The source holds one key per example of the batch it will be
called on (:meth:`ReverseDiffusionScore.for_examples`, by :func:`scorelib.keys.example_keys`,
as :class:`~scorelib.scores.smoothed.SmoothedScore` does); every sampler's driver
binds them to each sampler call's examples (``fold_in(key, first_index + b)``, the keys of the
sampler's own draws). A query at time ``t`` draws from
``k_bt = fold_in(fold_in(k_b, 2^32 - 1), bits(t_b))`` (``bits``: the float32 bit pattern;
index ``2^32 - 1`` is one the driver never uses, its draws take ``0 .. N``): the importance
proposals from ``fold_in(k_bt, 0)``, chain ``c`` from ``fold_in(k_bt, 1 + c)`` (its resampling
index from ``fold_in(., 0)``, its steps from ``fold_in(., 1)``). So the estimate is a
deterministic function of ``(x, t)`` and the example's key: fresh draws at every time of a
trajectory, the same draws for two queries at one time (PC's corrector steps, Heun's two
evaluations at ``t_{i+1}``: common random numbers), and a sample depends on its key and global
index only, never on its batch.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from scorelib._checks import check_choice, check_int, check_real, require
from scorelib.keys import example_keys
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.base import ScoreSource, check_query, flatten
from scorelib.scores.mcmc import (
    chain_evaluations,
    check_log_density,
    check_method,
    langevin_chains,
)
from scorelib.scores.smoothed import time_bits

Array = Any

INITS = ("scaled", "importance")
ESTIMATORS = ("dsi", "tsi", "snis")
STREAM = 2**32 - 1  # the fold-in index of the source's draws below an example key


def inner_step(step_size: Array, curvature: Array, v: Array) -> Array:
    """The inner chains' step ``h = step_size v / (1 + curvature v)`` (data units squared).

    ``v = ve_sigma(t)^2`` (``v = inf`` gives ``step_size / curvature``, the step of plain
    Langevin on ``p``: ``samplers/mcmc.py``). Works on scalars and arrays alike.
    """
    if np.ndim(v) == 0 and np.isinf(v):
        return step_size / curvature
    return step_size * v / (1.0 + curvature * v)


class ReverseDiffusionScore(ScoreSource):
    """rdMC's score of ``p_t`` for a target with a log-density (module docstring).

    Build with :meth:`create`, then bind keys with :meth:`for_examples` (samplers:
    every sampler's driver does it for each block of examples).

    Fields:
      target: the target (static; ``dim``, ``log_prob``, ``score``).
      keys: ``[batch]`` per-example keys, or ``None`` until :meth:`for_examples`.
      step_size, curvature: the inner step rule (leaves: a sweep compiles once).
      n_samples, n_steps, method, init, n_proposals, estimator: static options.
    """

    target: Any = struct.field(pytree_node=False, default=None)
    keys: Array = None
    step_size: Array = 0.5
    curvature: Array = 1.0
    n_samples: int = struct.field(pytree_node=False, default=8)
    n_steps: int = struct.field(pytree_node=False, default=10)
    method: str = struct.field(pytree_node=False, default="mala")
    init: str = struct.field(pytree_node=False, default="scaled")
    n_proposals: int = struct.field(pytree_node=False, default=0)
    estimator: str = struct.field(pytree_node=False, default="dsi")

    @classmethod
    def create(
        cls,
        target,
        *,
        process: Process,
        n_samples: int = 8,
        n_steps: int = 10,
        step_size: float = 0.5,
        curvature: float = 1.0,
        method: str = "mala",
        init: str = "scaled",
        n_proposals: int | None = None,
        estimator: str = "dsi",
    ) -> ReverseDiffusionScore:
        """Check the options and build the source (no keys yet).

        Args:
          target: a target with a log-density (``scorelib.data.targets``:
            ``GaussianMixtureTarget``, ``ManyWellTarget``, ``EnergyTarget``).
          process: the noise process (the paper's: ``ornstein_uhlenbeck(T)``).
          n_samples: inner chains per query (``>= 1``).
          n_steps: steps per chain (``>= 0``; ``>= 1`` with ``init="scaled"``).
          step_size: ``step_size`` of the step rule, in ``(0, 2)`` (dimensionless).
          curvature: ``> 0``, a bound on the curvature of ``f`` (data units^-2), e.g.
            ``1 / std^2`` of the narrowest mixture component.
          method: ``"ula"`` or ``"mala"``.
          init: ``"scaled"`` or ``"importance"``.
          n_proposals: importance proposals per query (``>= 1``; default 64), with
            ``init="importance"`` only.
          estimator: ``"dsi"`` (posterior mean, the paper's), ``"tsi"`` (mean clean score)
            or ``"snis"`` (the importance-weighted mean of the proposals, no chains: needs
            ``init="importance"``, ``n_steps=0`` and ``n_samples=1``).

        Raises:
          ValueError: naming ``data.target`` for a target without a log-density, ``process``,
            or ``score.<option>`` with its allowed values.
        """
        check_log_density(target, "data.target")
        require(isinstance(process, Process), "process", "a scorelib Process", process)
        n_samples = check_int(n_samples, "score.n_samples", low=1)
        init = check_choice(init, "score.init", INITS)
        n_steps = check_int(n_steps, "score.n_steps", low=1 if init == "scaled" else 0)
        step_size = check_real(
            step_size, "score.step_size", low=0.0, high=2.0, low_open=True, high_open=True
        )
        curvature = check_real(curvature, "score.curvature", low=0.0, low_open=True)
        method = check_method(method, "score.method")
        estimator = check_choice(estimator, "score.estimator", ESTIMATORS)
        if estimator == "snis":
            require(
                init == "importance", "score.init", "importance with score.estimator=snis", init
            )
            require(
                n_steps == 0, "score.n_steps", "0 with score.estimator=snis (no chains)", n_steps
            )
            require(
                n_samples == 1,
                "score.n_samples",
                "1 with score.estimator=snis (no chains)",
                n_samples,
            )
        if init == "importance":
            n_proposals = check_int(
                64 if n_proposals is None else n_proposals, "score.n_proposals", low=1
            )
        else:
            require(
                n_proposals is None, "score.n_proposals", "null with score.init=scaled", n_proposals
            )
            n_proposals = 0
        return cls(
            process=process,
            target=target,
            step_size=step_size,
            curvature=curvature,
            n_samples=n_samples,
            n_steps=n_steps,
            method=method,
            init=init,
            n_proposals=n_proposals,
            estimator=estimator,
        )

    @property
    def data_shape(self) -> tuple:
        """``(target.dim,)``."""
        return (int(self.target.dim),)

    def for_examples(self, key: jax.Array, batch: int, first_index: Array = 0):
        """A copy that draws for examples ``first_index .. first_index + batch - 1`` of ``key``.

        Raises:
          ValueError: if ``batch < 1``.
        """
        return self.replace(keys=example_keys(key, batch, first_index))

    def evaluations_per_query(self) -> dict:
        """Target evaluations of one query (one example at one time): ``{"grad", "density"}``.

        ``n_samples`` chains (:func:`scorelib.scores.mcmc.chain_evaluations`; the TSI
        estimator needs the gradient at the last state) plus ``n_proposals`` log-densities
        for the importance start.
        """
        per = chain_evaluations(self.method, self.n_steps, self.estimator == "tsi")
        return {
            "grad": self.n_samples * per["grad"],
            "density": self.n_samples * per["density"] + self.n_proposals,
        }

    def target_evaluations(self, nfe: int) -> dict:
        """Target evaluations per sample of a sampler run with ``nfe`` score calls (its
        ``info["nfe"]``): :meth:`evaluations_per_query` times ``nfe``."""
        nfe = check_int(nfe, "nfe", low=0)
        return {k: nfe * v for k, v in self.evaluations_per_query().items()}

    # ------------------------------------------------------------------ the estimate
    def _check_query(self, x: Array, t: Array) -> tuple[int, int]:
        check_query(self, x, t)
        b, d = flatten(x).shape
        require(
            self.keys is not None and self.keys.shape[0] == b,
            "ReverseDiffusionScore.keys",
            f"one key per example of the batch ({b}); call for_examples(key, {b}, first_index)",
            None if self.keys is None else f"{self.keys.shape[0]} keys",
        )
        if not isinstance(t, jax.core.Tracer):  # a concrete time: check it before compute
            with jax.ensure_compile_time_eval():
                v = np.asarray(self.process.ve_sigma(jnp.asarray(t, jnp.float32)))
            require(
                bool(np.all(np.isfinite(v) & (v > 0))),
                "t",
                "a time with a noise level ve_sigma(t) > 0 (q_t needs sigma(t) > 0)",
                np.asarray(t).tolist(),
            )
        return b, d

    def posterior_samples(self, x: Array, t: Array) -> dict:
        """The inner chains' final states: approximate draws of ``q_t(x_0 | x)``.

        Args:
          x: ``[batch, dim]`` in process coordinates.
          t: a scalar or ``[batch]`` time with ``ve_sigma(t) > 0``.

        Returns:
          ``{"x0": [batch, n_samples, dim], "grad": [batch, n_samples, dim] (the clean
          score at them, TSI only, else None), "accept": [batch, n_samples]}`` (MALA's
          fraction of accepted proposals per chain; 1 for ULA).

        Raises:
          ValueError: for a source without keys for this batch, a ``t`` that is neither a
            scalar nor ``[batch]``, ``x`` of another dim, or (concrete ``t``) a noise level
            ``<= 0``.
        """
        b, d = self._check_query(x, t)
        n = self.n_samples
        xf = flatten(x)
        dtype = xf.dtype
        a = broadcast_to_data(self.process.alpha(t), xf)
        v = jnp.broadcast_to(self.process.ve_sigma(t) ** 2, (b,)).astype(dtype)  # [b]
        y = xf / a  # [b, d]: the mean of q_t's Gaussian factor
        qk = self._query_keys(t, b)  # [b]
        ck = jax.vmap(lambda k: jax.vmap(lambda c: jax.random.fold_in(k, 1 + c))(jnp.arange(n)))(
            qk
        )  # [b, n]
        y_rep = jnp.repeat(y, n, axis=0)  # [b n, d]
        v_rep = jnp.repeat(v, n)  # [b n]
        if self.init == "scaled":
            x_init = y_rep
        else:
            z, logw = self._proposals(qk, y, v)

            def pick(keys_b, logw_b, z_b):
                idx = jax.vmap(lambda k: jax.random.categorical(jax.random.fold_in(k, 0), logw_b))(
                    keys_b
                )
                return z_b[idx]

            x_init = jax.vmap(pick)(ck, logw, z).reshape(b * n, d)

        def log_q(u):
            return self.target.log_prob(u) - 0.5 * jnp.sum((y_rep - u) ** 2, -1) / v_rep

        def grad_q(u):
            return self.target.score(u) + (y_rep - u) / v_rep[:, None]

        h = inner_step(self.step_size, self.curvature, v_rep)
        chain_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(ck.reshape(-1), 1)
        out = langevin_chains(
            log_q if self.method == "mala" else None,
            grad_q,
            x_init.astype(dtype),
            h,
            chain_keys,
            self.n_steps,
            method=self.method,
            final_grad=self.estimator == "tsi",
        )
        grad = None
        if out["grad"] is not None:  # grad log q = score + (y - x0) / v: take the quadratic off
            g = out["grad"] - (y_rep - out["x"]) / v_rep[:, None]
            grad = g.reshape(b, n, d)
        return {
            "x0": out["x"].reshape(b, n, d),
            "grad": grad,
            "accept": out["accept"].reshape(b, n),
        }

    def _query_keys(self, t: Array, b: int) -> Array:
        """``k_bt`` of each example (module docstring), ``[b]``."""
        qk = jax.vmap(jax.random.fold_in, in_axes=(0, None))(self.keys, STREAM)
        return jax.vmap(jax.random.fold_in)(qk, time_bits(t, b))

    def _proposals(self, qk: Array, y: Array, v: Array) -> tuple[Array, Array]:
        """``n_proposals`` draws ``z ~ N(y, v I)`` per example (from ``fold_in(k_bt, 0)``)
        and their log-weights ``log p(z)`` (``-inf`` where NaN): ``[b, m, d]``, ``[b, m]``."""
        b, d = y.shape
        m = self.n_proposals
        eps = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, 0), (m, d), y.dtype))(qk)
        z = y[:, None, :] + jnp.sqrt(v)[:, None, None] * eps
        logw = self.target.log_prob(z.reshape(b * m, d)).reshape(b, m)
        return z, jnp.where(jnp.isnan(logw), -jnp.inf, logw)

    def importance_mean(self, x: Array, t: Array) -> Array:
        """The self-normalised importance estimate of ``E[x_0 | x_t = x]``: ``sum_i w_i z_i /
        sum_i w_i`` over the ``n_proposals`` proposals ``z_i ~ N(x / alpha, v I)``, ``w_i =
        p(z_i)`` (Owen, "Monte Carlo theory, methods and examples", 2013, eq. 9.8); ``[batch,
        dim]``, data units. The ``estimator="snis"`` denoiser.

        Raises:
          ValueError: as :meth:`posterior_samples`; ``score.init`` without importance
            proposals.
        """
        b, _ = self._check_query(x, t)
        require(self.init == "importance", "score.init", "importance for its proposals", self.init)
        xf = flatten(x)
        y = xf / broadcast_to_data(self.process.alpha(t), xf)
        v = jnp.broadcast_to(self.process.ve_sigma(t) ** 2, (b,)).astype(xf.dtype)
        z, logw = self._proposals(self._query_keys(t, b), y, v)
        w = jax.nn.softmax(logw, axis=-1)
        return jnp.einsum("bm,bmd->bd", w, z)

    def denoiser(self, x, t):
        """``E[x_0 | x_t = x]`` estimated by the inner chains (DSI: their mean; TSI: Tweedie
        of the TSI score) or by the weighted proposals (SNIS, :meth:`importance_mean`); shape
        of ``x``, data units.

        Raises:
          ValueError: as :meth:`posterior_samples`.
        """
        if self.estimator == "snis":
            return jnp.reshape(self.importance_mean(x, t), x.shape)
        if self.estimator == "tsi":
            return super().denoiser(x, t)
        return jnp.reshape(jnp.mean(self.posterior_samples(x, t)["x0"], axis=1), x.shape)

    def score(self, x, t):
        """``grad log p_t(x)`` estimated by the inner chains (DSI: Tweedie of the posterior
        mean, ``E[(alpha x_0 - x) / sigma^2]``; TSI: ``E[grad log p(x_0)] / alpha``); shape
        of ``x``, units of 1/data (SNIS: Tweedie of :meth:`importance_mean`).

        Raises:
          ValueError: as :meth:`posterior_samples`.
        """
        if self.estimator != "tsi":
            return super().score(x, t)
        mean = jnp.mean(self.posterior_samples(x, t)["grad"], axis=1)
        a = broadcast_to_data(self.process.alpha(t), flatten(x))
        return jnp.reshape(mean / a, x.shape)
