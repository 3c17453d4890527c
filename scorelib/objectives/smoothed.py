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

Class labels. A class-conditional network must regress onto its class's smoothed score:
the teacher is then a :class:`~scorelib.scores.PerClassScore` of one ``SmoothedScore`` per
class (of that class's training examples) with the pooled one as its null
(:func:`smoothed_score_matching` with ``labels``), bound to the batch's labels (the
network's, bound by the train step); an example whose label was dropped regresses onto the
pooled teacher. Each class's teacher is evaluated on the whole batch and each example keeps
its own class's answer (``K + 1`` teacher evaluations a step). A conditional network with
an unconditional teacher is refused (it would learn the pooled score under every label).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from flax import struct

from scorelib._checks import check_choice, check_int, check_real, require
from scorelib.objectives.base import (
    REDUCTIONS,
    Objective,
    example_draws,
    reduce_per_example,
    source_labels,
)
from scorelib.objectives.weights import edm_weight
from scorelib.processes.base import broadcast_to_data
from scorelib.processes.noise_levels import log_normal_sigma
from scorelib.scores import EmpiricalScore, NeighbourScore, PerClassScore
from scorelib.scores.smoothed import SmoothedScore

Array = Any


class SmoothedScoreMatching(Objective, struct.PyTreeNode):
    """Regression onto the smoothed closed-form denoiser (module docstring).

    Fields:
      teacher: the :class:`SmoothedScore` of the training set, on the network's process; or,
        for a class-conditional network, a :class:`~scorelib.scores.PerClassScore` of one
        ``SmoothedScore`` per class with the pooled one as its ``null`` (module docstring).
      P_mean, P_std, sigma_data, reduce: as :class:`scorelib.objectives.EDMLoss` (static).
    """

    teacher: Any
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
        per_class = isinstance(teacher, PerClassScore) and all(
            isinstance(s, SmoothedScore) for s in (*teacher.sources, teacher.null)
        )
        require(
            isinstance(teacher, SmoothedScore) or per_class,
            "objective.teacher",
            "a SmoothedScore, or a PerClassScore of SmoothedScores with a SmoothedScore null",
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

    @property
    def num_classes(self) -> int:
        """The teacher's classes (0: an unconditional teacher)."""
        return self.teacher.num_classes if isinstance(self.teacher, PerClassScore) else 0

    def example_losses(self, source, x0, key):
        """``lambda(sigma) reduce((source.denoiser(x_t, t) - D_sigma(x_t, t))^2)`` per example.

        Args:
          source: a score source on the teacher's process; its ``denoiser`` is trained.
          x0: ``[batch, *data_shape]`` training examples (data units).
          key: the step's PRNG key.

        With labels bound to ``source`` (a conditional network) each example regresses onto
        its class's teacher (module docstring).

        Returns:
          ``(losses [batch], {"sigma": [batch]})``, ``sigma`` the VE-frame noise levels.

        Raises:
          ValueError: naming ``data.labels`` for a source with labels and an unconditional
            teacher, or ``model.num_classes`` for one whose classes are not the teacher's.
        """
        sigma, t, xt = self._draws(x0, key)
        classes = source_labels(source, x0.shape[0])
        teacher = self.teacher
        if classes is None and isinstance(teacher, PerClassScore):
            teacher = teacher.null  # an unconditional network: the pooled teacher only
        elif classes is not None:
            require(
                isinstance(teacher, PerClassScore),
                "data.labels",
                "false with an unconditional smoothed-score teacher (build the objective "
                "with the training labels: smoothed_score_matching(..., labels=...))",
                True,
            )
            require(
                source.num_classes == teacher.num_classes,
                "model.num_classes",
                f"the teacher's number of classes ({teacher.num_classes})",
                source.num_classes,
            )
            teacher = teacher.with_labels(classes)
        teacher = teacher.for_examples(jax.random.fold_in(key, 1), x0.shape[0])
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
    labels=None,
) -> SmoothedScoreMatching:
    """:class:`SmoothedScoreMatching` onto the smoothed closed-form score of ``train`` (what
    ``objective=smoothed`` builds); with ``labels``, onto each class's (module docstring).

    Args:
      process: the network's process (the teacher's too).
      train: ``[N, *data_shape]`` the training set (data units).
      sigma_s: the smoothing scale (``>= 0``); M: smoothing draws (``>= 1``); redraw: see
        :mod:`scorelib.scores.smoothed`.
      estimator: ``nn`` (the k-nearest + l-uniform estimator, cheap labels) or ``exact``.
      k, l: ``estimator=nn`` only (default 15 each; ``1 <= k <= N``, ``l >= 0``).
      chunk: training points per streamed block of the exact softmax and the top-k search.
      P_mean, P_std, sigma_data, reduce: as :class:`scorelib.objectives.EDMLoss`.
      labels: ``None``, or ``[N]`` integer class labels of ``train`` in ``[0, K)``
        (``data.labels``): a teacher per class (of its examples, class weights its share of
        ``train``) with the pooled teacher as its null. With ``estimator=nn``, ``k`` must not
        exceed the smallest class.

    Raises:
      ValueError: naming ``objective.<field>`` or ``data.labels`` (not ``[N]`` labels, or a
        class in ``[0, K)`` without examples), before anything is compiled.
    """
    check_real(sigma_s, "objective.sigma_s", low=0.0)
    check_int(M, "objective.M", low=1)
    require(isinstance(redraw, bool), "objective.redraw", "a bool", redraw)
    estimator = check_choice(estimator, "objective.estimator", ("exact", "nn"))
    chunk = check_int(chunk, "objective.chunk", low=1)
    if estimator == "exact":
        for name, value in (("k", k), ("l", l)):
            require(
                value is None, f"objective.{name}", "null with objective.estimator=exact", value
            )

    def smoothed(points, what):
        table = EmpiricalScore.create(process, points, chunk=chunk)
        if estimator == "exact":
            est = table
        else:
            n = table.n
            kk = check_int(15 if k is None else k, "objective.k", low=1, high=n)
            ll = check_int(15 if l is None else l, "objective.l", low=0)
            require(
                ll == 0 or kk < n,
                "objective.l",
                f"0 when objective.k = N{what} (no other points)",
                ll,
            )
            est = NeighbourScore.create(table, k=kk, l=ll)
        return SmoothedScore.create(est, sigma_s=sigma_s, M=M, redraw=redraw)

    teacher = smoothed(train, "")
    if labels is not None:
        y = np.asarray(labels)
        n = np.shape(train)[0]
        require(
            y.shape == (n,) and np.issubdtype(y.dtype, np.integer) and y.min() >= 0,
            "data.labels",
            f"integer class labels [{n}] (>= 0) of the training examples",
            f"dtype {y.dtype} and shape {y.shape}",
        )
        counts = np.bincount(y)
        require(
            bool(np.all(counts > 0)),
            "data.labels",
            f"classes 0 .. {counts.size - 1} each with examples",
            f"no example of class {int(np.argmin(counts))}",
        )
        x = np.asarray(train)
        classes = [smoothed(x[y == c], f" of class {c}") for c in range(counts.size)]
        teacher = PerClassScore.create(classes, prior=counts, null=teacher)
    return SmoothedScoreMatching.create(
        teacher, P_mean=P_mean, P_std=P_std, sigma_data=sigma_data, reduce=reduce
    )
