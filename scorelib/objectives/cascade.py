"""Cas-DM's loss (An et al., "Bring metric functions into diffusion models", IJCAI 2024,
arXiv:2401.02414): the first module's denoising loss, the second module's, and a metric
function on the second module's clean-image estimate.

Per example, with EDM's noise draw and weight (Karras et al. 2022, eq. 8; ``lambda(sigma) =
(sigma^2 + sigma_data^2) / (sigma sigma_data)^2``)::

    L = lambda(sigma) |D1 - x0|^2 + lambda(sigma) |D2 - x0|^2 + metric_weight d(D2, x0)

``D1, D2`` are the two modules' estimates (:class:`scorelib.nets.cascade.Cascade`; ``|.|^2``
reduced over the data axes by ``reduce``). Module 2 reads ``D1`` through a stop-gradient, so
module 1's gradient is that of the EDM loss alone ("unaffected by the metric function", the
paper's first module), and at ``metric_weight = 0`` both minimisers are Tweedie's
``E[x0 | x_t]``: the two outputs agree (``D2 = D1`` is module 2's optimum). A metric other
than the squared error moves ``D2`` off the posterior mean, towards images the metric's
network prefers; that is the paper's aim, and why the sampler blends the two
(``model.blend``). The metric term is not weighted by ``lambda``: the paper adds LPIPS to the
loss as it is (the weighting over noise levels is not in the abstract; ours is none).

The metric is any ``d(x, y) -> [batch]`` differentiable in ``x`` (e.g.
:func:`scorelib.metrics.perceptual.digits_classifier_distance`, :func:`~scorelib.metrics.
perceptual.lpips_vgg16`), or ``None`` with ``metric_weight = 0`` (the cascade without the
metric: the paper's baseline is the same network without it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from flax import nnx, struct

from scorelib._checks import check_choice, check_real, require
from scorelib.nets.cascade import Cascade
from scorelib.nets.precond import edm_precond
from scorelib.objectives.base import REDUCTIONS, Objective, reduce_per_example
from scorelib.objectives.dsm import EDMLoss, edm_loss_like
from scorelib.objectives.weights import edm_weight
from scorelib.processes.base import broadcast_to_data

Array = Any


def cascade_denoisers(source, x: Array, t: Array) -> tuple[Array, Array]:
    """The two estimates ``(D1, D2)`` of ``E[x0 | x_t = x]`` of a cascade (data units).

    Args:
      source: a :class:`scorelib.scores.NetworkScore` whose network is a
        :class:`~scorelib.nets.cascade.Cascade` (its ``sigma_data`` the source's), or any
        object with ``cascade_denoisers(x, t) -> (D1, D2)`` (an exact pair in the tests).
      x: ``[batch, *data_shape]`` noisy points in process coordinates.
      t: ``[batch]`` or scalar process times.

    Returns:
      ``(D1, D2)``, each ``[batch, *data_shape]``.

    Raises:
      ValueError: naming ``model`` for a source that is not a cascade, ``model.sigma_data``
        when the cascade's differs from the source's (``data.sigma_data``).
    """
    own = getattr(source, "cascade_denoisers", None)
    if own is not None:
        return own(x, t)
    graphdef = getattr(source, "graphdef", None)
    net = None if graphdef is None else nnx.merge(graphdef, source.params)
    require(
        isinstance(net, Cascade),
        "model",
        "a scorelib.nets.Cascade (model=cascade_digits) for objective=cascade",
        type(net).__name__ if net is not None else type(source).__name__,
    )
    require(
        abs(net.sigma_data - source.sigma_data) <= 1e-9 * source.sigma_data,
        "model.sigma_data",
        f"the preconditioning's sigma_data, {source.sigma_data} (data.sigma_data)",
        net.sigma_data,
    )
    p = source.process
    alpha = broadcast_to_data(p.alpha(t), x)
    sigma = jnp.broadcast_to(jnp.asarray(p.ve_sigma(t)), (x.shape[0],))
    c = edm_precond(sigma, source.sigma_data)
    x_in = broadcast_to_data(c.c_in, x) * (x / alpha)
    return net.denoisers(x_in, c.c_noise, rngs=source._rngs())


@dataclasses.dataclass(frozen=True)
class SourcePair:
    """Two score sources read as a cascade's modules: ``(D1, D2) = (first.denoiser(x, t),
    second.denoiser(x, t))`` (:func:`cascade_denoisers`). With an exact source on both sides
    (:class:`scorelib.scores.GaussianScore`) it is the pair a metric-free cascade converges to
    (Tweedie), the oracle of :class:`CascadeLoss` and :func:`scorelib.metrics.cascade_errors`;
    with a network on one side it reads that network against the exact denoiser.

    Fields:
      first, second: score sources of the same process (``first.process``).
    """

    first: Any
    second: Any

    @property
    def process(self):
        """The first source's process."""
        return self.first.process

    def cascade_denoisers(self, x: Array, t: Array) -> tuple[Array, Array]:
        """``(first.denoiser(x, t), second.denoiser(x, t))``."""
        return self.first.denoiser(x, t), self.second.denoiser(x, t)


class CascadeLoss(Objective, struct.PyTreeNode):
    """The Cas-DM loss (module docstring).

    Fields:
      process: the noise process (static).
      metric: ``d(x, y) -> [batch]`` on clean-image estimates and data (a pytree such as
        :class:`scorelib.metrics.perceptual.PerceptualDistance`), or ``None``.
      metric_weight: its weight (>= 0; 0 exactly when ``metric`` is ``None``).
      P_mean, P_std, sigma_data, reduce: the EDM loss's (:class:`~scorelib.objectives.EDMLoss`;
        Karras et al. Table 1: -1.2, 1.2, 0.5).

    Raises:
      ValueError: naming ``objective.<field>``: a negative ``metric_weight``, a weight
        without a metric or a metric with weight 0, and the EDM loss's checks.
    """

    process: Any = struct.field(pytree_node=False, default=None)
    metric: Any = None
    metric_weight: float = struct.field(pytree_node=False, default=1.0)
    P_mean: float = struct.field(pytree_node=False, default=-1.2)
    P_std: float = struct.field(pytree_node=False, default=1.2)
    sigma_data: float = struct.field(pytree_node=False, default=0.5)
    reduce: str = struct.field(pytree_node=False, default="mean")

    def __post_init__(self):
        w = check_real(self.metric_weight, "objective.metric_weight", low=0.0)
        if self.metric is None:
            require(w == 0.0, "objective.metric_weight", "0 with objective.metric=none", w)
        else:
            require(
                w > 0.0,
                "objective.metric_weight",
                "> 0 with a metric (for the cascade without one, objective.metric=none "
                "objective.metric_weight=0)",
                w,
            )
        check_choice(self.reduce, "objective.reduce", REDUCTIONS)
        self._edm()  # the EDM loss's checks

    def _edm(self) -> EDMLoss:
        return edm_loss_like(self)

    def example_losses(self, source, x0, key):
        """Each example's loss and its three parts.

        Args:
          source: a cascade (:func:`cascade_denoisers`).
          x0: ``[batch, *data_shape]`` clean data (data units; images in ``[-1, 1]`` for an
            image metric).
          key: the step's PRNG key (the draws of :class:`~scorelib.objectives.EDMLoss`).

        Returns:
          ``(losses [batch], aux)``: ``aux`` holds ``sigma`` and the parts ``first``,
          ``second`` (the weighted squared errors) and ``metric`` (unweighted).
        """
        sigma, t, xt = self._edm()._draws(x0, key)
        d1, d2 = cascade_denoisers(source, xt, t)
        lam = edm_weight(ve_sigma=sigma, sigma_data=self.sigma_data)
        first = lam * reduce_per_example((d1 - x0) ** 2, self.reduce)
        second = lam * reduce_per_example((d2 - x0) ** 2, self.reduce)
        aux = {"sigma": sigma, "first": first, "second": second}
        losses = first + second
        if self.metric is not None:
            m = self.metric(d2, x0)
            aux["metric"] = m
            losses = losses + self.metric_weight * m
        return losses, aux

    def example_points(self, x0, key):
        """``(x_t, t)`` of :meth:`example_losses`."""
        return self._edm().example_points(x0, key)
