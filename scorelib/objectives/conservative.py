"""Quasi-conservative score models: any objective plus a penalty on the asymmetry of the
score's Jacobian.

Chao, Sun, Cheng and Lee, "On investigating the conservative property of score-based
generative models" (ICML 2022, arXiv 2209.12753), Sec. 4: a score network is not
constrained to be a gradient field; its total loss adds ``lambda`` times the expected
squared Frobenius norm of the asymmetric part of its Jacobian ``J = d s_theta / d x``::

    L_total = L(theta) + lambda E[ w(t) |J - J^T|_F^2 ],   |J - J^T|_F^2 = 2 (|J|_F^2 - tr(J^2))

Here the penalty is evaluated at the very points and times the wrapped objective trains at
(``objective.example_points``), one Hutchinson estimate per example
(:func:`scorelib.scores.jacobian.jacobian_asymmetry`: per probe one JVP and one VJP, averaged
over ``probes``), weighted by ``w(t)`` of ``scorelib/objectives/weights.py``: ``sigma(t)^2``
(``'sigma2'``, the weight of Chao et al.'s code, ``reg = (traceJJt - traceJJ) * std ** 2``),
``g(t)^2`` (``'likelihood'``) or 1 (``'none'``). Their code's ``traceJJt - traceJJ`` is half of
``|J - J^T|_F^2``, so their ``balancing_fac`` is ``2 * weight`` here.

Keys: the step's key is split into two streams, ``fold_in(key, 0)`` for the wrapped
objective (so its losses are those of the objective alone called with that key) and
``fold_in(key, 1)`` for the probes, example ``b``'s from ``fold_in(fold_in(key, 1), b)``.
JAX differentiates through the JVP and VJP directly (the paper's "two-step backpropagation"
is a PyTorch memory device with the same gradient).

Class labels: the Jacobian of example ``b`` is that of its own conditional score
``s(x, t | c_b)``: with a conditional source (labels bound by the train step) each example's
probes run on the source bound to its own label
(:func:`scorelib.objectives.base.example_source`), since
:func:`~scorelib.scores.jacobian.jacobian_asymmetry` calls the source one example at a time.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from scorelib._checks import check_choice, check_int, check_real
from scorelib.objectives.base import Objective, example_source, source_labels
from scorelib.objectives.weights import DSM_WEIGHTINGS, dsm_weight
from scorelib.scores.jacobian import FORMS, PROBE_NOISES, example_probes, jacobian_asymmetry

Array = Any


class QuasiConservative(Objective, struct.PyTreeNode):
    """``objective`` plus ``weight * w(t) * |J - J^T|_F^2`` per example (module docstring).

    Build it with :meth:`create` (or :func:`quasi_conservative`), which validates.

    Fields:
      objective: the wrapped objective (any :class:`Objective` with ``example_points``).
      weight: ``lambda >= 0``; 0 measures the penalty (logged) without training on it (its
        gradient is then stopped).
      probes: Hutchinson probes per example (>= 1).
      noise: ``'rademacher'`` or ``'gaussian'`` probes.
      weighting: ``w(t)``: ``'sigma2'`` (``sigma(t)^2``, Chao et al.'s code), ``'likelihood'``
        (``g(t)^2``) or ``'none'``.
      form: the estimator, ``'skew'`` (``|(J - J^T) v|^2``, default) or ``'paper'`` (``2(|v^T
        J|^2 - (v^T J)(J v))``); both unbiased (:mod:`scorelib.scores.jacobian`).

    ``example_losses`` returns the wrapped objective's aux plus ``[batch]`` arrays
    ``objective_loss`` (the wrapped losses), ``asymmetry`` (the estimate of ``|J - J^T|_F^2``,
    units 1 / data^4) and ``qc_penalty`` (``w(t)`` times it, what ``weight`` multiplies); the
    step's metrics are their batch means.
    """

    objective: Any
    weight: float = struct.field(pytree_node=False, default=1.0)
    probes: int = struct.field(pytree_node=False, default=1)
    noise: str = struct.field(pytree_node=False, default="rademacher")
    weighting: str = struct.field(pytree_node=False, default="sigma2")
    form: str = struct.field(pytree_node=False, default="skew")

    @classmethod
    def create(
        cls,
        objective,
        *,
        weight: float = 1.0,
        probes: int = 1,
        noise: str = "rademacher",
        weighting: str = "sigma2",
        form: str = "skew",
    ) -> QuasiConservative:
        """Validate and build.

        Raises:
          ValueError: naming ``penalty=qc`` (an objective that does not give its training
            points, e.g. SURE), ``penalty.weight`` (not a finite number >= 0),
            ``penalty.probes`` (not an integer >= 1), ``penalty.noise``, ``penalty.weighting``
            or ``penalty.form``.
        """
        if not (
            isinstance(objective, Objective)
            and type(objective).example_points is not Objective.example_points
        ):
            raise ValueError(
                "penalty=qc needs an objective whose training points it can penalise at "
                f"(edm, dsm, mixed, ...); got {type(objective).__name__} (remove penalty=qc "
                "or choose another objective)"
            )
        weight = check_real(weight, "penalty.weight", low=0.0)
        probes = check_int(probes, "penalty.probes", low=1)
        check_choice(noise, "penalty.noise", PROBE_NOISES)
        check_choice(weighting, "penalty.weighting", DSM_WEIGHTINGS)
        check_choice(form, "penalty.form", FORMS)
        return cls(
            objective=objective,
            weight=weight,
            probes=probes,
            noise=noise,
            weighting=weighting,
            form=form,
        )

    @property
    def process(self):
        """The wrapped objective's process."""
        return self.objective.process

    def example_points(self, x0, key):
        """The wrapped objective's points for this key (its stream ``fold_in(key, 0)``)."""
        return self.objective.example_points(x0, jax.random.fold_in(key, 0))

    def penalty(self, source, x0, key) -> tuple[Array, Array]:
        """``(qc_penalty, asymmetry)``: ``[batch]`` each (module docstring).

        Args:
          source: the score source being trained.
          x0: ``[batch, *data_shape]`` clean data.
          key: the step's PRNG key.
        """
        xt, t = self.example_points(x0, key)
        d = math.prod(x0.shape[1:])
        eps = example_probes(jax.random.fold_in(key, 1), x0.shape[0], self.probes, d, self.noise)
        labels = source_labels(source, x0.shape[0])
        if labels is None:
            asym, _ = jacobian_asymmetry(source, xt, t, eps=eps, form=self.form)
        else:  # each example's Jacobian with its own label (a batch of one per example)
            t = jnp.broadcast_to(jnp.asarray(t), (x0.shape[0],))

            def one(xb, tb, eb, lb):
                src = example_source(source, lb)
                return jacobian_asymmetry(src, xb[None], tb[None], eps=eb[None], form=self.form)

            asym = jax.vmap(one)(xt, t, eps, labels)[0][:, 0]
        return dsm_weight(self.weighting, process=self.process, t=t) * asym, asym

    def example_losses(self, source, x0, key):
        """``objective losses + weight * w(t) |J - J^T|_F^2`` per example.

        Args:
          source: a score source (e.g. a ``NetworkScore`` with the parameters being trained).
          x0: ``[batch, *data_shape]`` clean data (data units).
          key: the step's PRNG key.

        Returns:
          ``(losses [batch], aux)``: the wrapped objective's aux plus ``objective_loss``,
          ``asymmetry`` and ``qc_penalty`` (each ``[batch]``).
        """
        losses, aux = self.objective.example_losses(source, x0, jax.random.fold_in(key, 0))
        penalty, asym = self.penalty(source, x0, key)
        if self.weight == 0.0:
            penalty, asym = jax.lax.stop_gradient((penalty, asym))
        total = losses + self.weight * penalty
        return total, {**aux, "objective_loss": losses, "asymmetry": asym, "qc_penalty": penalty}


#: :meth:`QuasiConservative.create` as a function (what a ``penalty=qc`` config builds).
quasi_conservative = QuasiConservative.create
