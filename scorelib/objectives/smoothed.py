"""Smoothed closed-form score matching: regress a network onto the smoothed closed-form
score of the training set.

The sigma-CFDM score (Scarvelis, Saez de Ocariz Borde and Solomon, "Closed-form diffusion
models", arXiv 2310.12395; ``scorelib/scores/smoothed.py``) is a computed label, not a noisy
one: at a noisy point ``x_t`` the target is the smoothed denoiser
``D_sigma(x_t, t) = (1/M) sum_m D(x_t + sigma_s eps_m, t)`` of the training set (exact or by
the nearest-neighbour estimator), so a small network can stand in for the training-set
search at sampling time. The loss is EDM's (Karras et al. 2022, eq. 8) with the smoothed
denoiser in place of the clean example::

    lambda(sigma) reduce((D_theta(x_t, t) - D_sigma(x_t, t))^2),
    ln sigma ~ N(P_mean, P_std^2),  x_t = alpha(t) (x0 + sigma n),
    lambda = (sigma^2 + sigma_data^2) / (sigma sigma_data)^2.

The step's key is split into two streams, ``fold_in(key, 0)`` and ``fold_in(key, 1)``:
example ``b`` draws ``(z, n)`` from ``fold_in(fold_in(key, 0), b)`` (``example_draws``) and
its smoothing draws (and the NN estimator's uniform points) from
``fold_in(fold_in(key, 1), b)`` (``SmoothedScore.for_examples``); no key of one stream is
an ancestor of a key of the other, and a loss does not depend on its batch.

Unlike the other objectives (static pytrees of hyperparameters) this one holds the training
set, so it is a pytree with the teacher's arrays as leaves.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from flax import struct

from scorelib._checks import check_choice, check_int, check_real, require
from scorelib.objectives.base import REDUCTIONS, Objective, example_draws, reduce_per_example
from scorelib.objectives.weights import edm_weight
from scorelib.processes.base import broadcast_to_data
from scorelib.processes.noise_levels import log_normal_sigma
from scorelib.scores import EmpiricalScore, NeighbourScore
from scorelib.scores.smoothed import SmoothedScore

Array = Any


class SmoothedScoreMatching(Objective, struct.PyTreeNode):
    """Regression onto the smoothed closed-form denoiser (module docstring).

    Fields:
      teacher: the :class:`SmoothedScore` of the training set, on the network's process.
      P_mean, P_std, sigma_data, reduce: as :class:`scorelib.objectives.EDMLoss` (static).
    """

    teacher: SmoothedScore
    P_mean: float = struct.field(pytree_node=False, default=-1.2)
    P_std: float = struct.field(pytree_node=False, default=1.2)
    sigma_data: float = struct.field(pytree_node=False, default=0.5)
    reduce: str = struct.field(pytree_node=False, default="mean")

    @classmethod
    def create(
        cls, teacher: SmoothedScore, *, P_mean=-1.2, P_std=1.2, sigma_data=0.5, reduce="mean"
    ) -> SmoothedScoreMatching:
        """Validate and build.

        Raises:
          ValueError: naming ``objective.teacher``, ``objective.P_mean``, ``objective.P_std``,
            ``objective.sigma_data`` or ``objective.reduce``.
        """
        require(
            isinstance(teacher, SmoothedScore),
            "objective.teacher",
            "a SmoothedScore",
            type(teacher).__name__,
        )
        inf = math.inf
        P_mean = check_real(P_mean, "objective.P_mean", low=-inf, high=inf)
        P_std = check_real(P_std, "objective.P_std", low=0.0, low_open=True)
        sigma_data = check_real(sigma_data, "objective.sigma_data", low=0.0, low_open=True)
        check_choice(reduce, "objective.reduce", REDUCTIONS)
        return cls(
            teacher=teacher, P_mean=P_mean, P_std=P_std, sigma_data=sigma_data, reduce=reduce
        )

    @property
    def process(self):
        """The teacher's (and the network's) process."""
        return self.teacher.process

    def example_losses(self, source, x0, key):
        """``lambda(sigma) reduce((source.denoiser(x_t, t) - D_sigma(x_t, t))^2)`` per example.

        Args:
          source: a score source on the teacher's process; its ``denoiser`` is trained.
          x0: ``[batch, *data_shape]`` training examples (data units).
          key: the step's PRNG key.

        Returns:
          ``(losses [batch], {"sigma": [batch]})``, ``sigma`` the VE-frame noise levels.
        """
        sigma, t, xt = self._draws(x0, key)
        teacher = self.teacher.for_examples(jax.random.fold_in(key, 1), x0.shape[0])
        label = jax.lax.stop_gradient(teacher.denoiser(xt, t))
        err = reduce_per_example((source.denoiser(xt, t) - label) ** 2, self.reduce)
        return edm_weight(ve_sigma=sigma, sigma_data=self.sigma_data) * err, {"sigma": sigma}

    def _draws(self, x0, key):
        """``(sigma [batch], t [batch], x_t)`` of :meth:`example_losses` (stream
        ``fold_in(key, 0)``)."""
        p = self.teacher.process
        z, n = example_draws(jax.random.fold_in(key, 0), x0, "normal")
        sigma = log_normal_sigma(z, P_mean=self.P_mean, P_std=self.P_std)
        t = p.t_of_ve_sigma(sigma)
        return sigma, t, broadcast_to_data(p.alpha(t), x0) * (x0 + broadcast_to_data(sigma, x0) * n)

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses` (:meth:`Objective.example_points`)."""
        _, t, xt = self._draws(x0, key)
        return xt, t


def smoothed_score_matching(
    process,
    train,
    *,
    sigma_s: float,
    M: int,
    estimator: str = "nn",
    k: int | None = None,
    l: int | None = None,  # noqa: E741
    chunk: int = 4096,
    redraw: bool = False,
    P_mean: float = -1.2,
    P_std: float = 1.2,
    sigma_data: float = 0.5,
    reduce: str = "mean",
) -> SmoothedScoreMatching:
    """:class:`SmoothedScoreMatching` onto the smoothed closed-form score of ``train`` (what
    ``objective=smoothed`` builds).

    Args:
      process: the network's process (the teacher's too).
      train: ``[N, *data_shape]`` the training set (data units).
      sigma_s: the smoothing scale (``>= 0``); M: smoothing draws (``>= 1``); redraw: see
        :mod:`scorelib.scores.smoothed`.
      estimator: ``nn`` (the k-nearest + l-uniform estimator, cheap labels) or ``exact``.
      k, l: ``estimator=nn`` only (default 15 each; ``1 <= k <= N``, ``l >= 0``).
      chunk: training points per streamed block of the exact softmax and the top-k search.
      P_mean, P_std, sigma_data, reduce: as :class:`scorelib.objectives.EDMLoss`.

    Raises:
      ValueError: naming ``objective.<field>``, before anything is compiled.
    """
    check_real(sigma_s, "objective.sigma_s", low=0.0)
    check_int(M, "objective.M", low=1)
    require(isinstance(redraw, bool), "objective.redraw", "a bool", redraw)
    estimator = check_choice(estimator, "objective.estimator", ("exact", "nn"))
    table = EmpiricalScore.create(process, train, chunk=check_int(chunk, "objective.chunk", low=1))
    if estimator == "exact":
        for name, value in (("k", k), ("l", l)):
            require(
                value is None, f"objective.{name}", "null with objective.estimator=exact", value
            )
        est = table
    else:
        n = table.n
        k = check_int(15 if k is None else k, "objective.k", low=1, high=n)
        l = check_int(15 if l is None else l, "objective.l", low=0)  # noqa: E741
        require(l == 0 or k < n, "objective.l", "0 when objective.k = N (no other points)", l)
        est = NeighbourScore.create(table, k=k, l=l)
    teacher = SmoothedScore.create(est, sigma_s=sigma_s, M=M, redraw=redraw)
    return SmoothedScoreMatching.create(
        teacher, P_mean=P_mean, P_std=P_std, sigma_data=sigma_data, reduce=reduce
    )
