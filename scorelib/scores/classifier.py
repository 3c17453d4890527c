"""A trained noise-conditional classifier ``log p_t(c | x_t)`` for classifier guidance.

:class:`NoisyClassifier` wraps a network ``F(x, c_noise) -> logits`` (e.g.
:class:`scorelib.nets.classifier.ClassifierMLP`) the way :class:`scorelib.scores.NetworkScore`
wraps a denoiser: it works in the VE frame, at ``x / alpha(t)`` and noise level
``sigma = ve_sigma(t) = sigma(t) / alpha(t)``, with EDM's input coefficients (Karras et al.
2022, Table 1)::

    logits(x, t) = F(c_in(sigma) x / alpha(t); c_noise(sigma)),
    c_in = 1 / sqrt(sigma^2 + sigma_data^2),  c_noise = ln(sigma) / 4

so one classifier serves every process and its inputs have about unit variance at every
noise level (score_sde's noise-conditional classifier reads the VE std and ``x`` undivided
by ``alpha``, which is right for VE only: ``notes/conditioning-anchors.md``). Since
``p_t(c | x) = p_ve(c | x / alpha)``, nothing else changes between processes; the input
gradient of :meth:`NoisyClassifier.class_log_prob` is in process coordinates (units
1 / data), the term that ``scorelib.scores.guidance.ClassifierGuidance`` adds to a score.

Class probabilities are a log-softmax of the logits (never ``log(softmax + eps)``, which the
official DLSM code uses and which caps ``log p`` at ``log 1e-8`` and flattens its gradient
there). The classifier is trained by ``scorelib.objectives.classifier`` (cross-entropy on
noised inputs, or DLSM) with ``scorelib.training.classifier``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from scorelib._checks import check_time
from scorelib.nets.precond import edm_precond
from scorelib.processes.base import Process, broadcast_to_data
from scorelib.scores.network import check_network_input

Array = Any


class NoisyClassifier(struct.PyTreeNode):
    """A noise-conditional classifier network behind EDM's input preconditioning.

    A pytree: ``params`` are its leaves (trained, or passed through ``jax.jit``); the
    process, the network's graph and ``sigma_data`` are static.

    Fields:
      process: the noise process (static).
      graphdef, params: the network split by ``nnx.split(model, nnx.Param)``; the network
        is called as ``F(x, c_noise) -> [batch, num_classes]`` and has a ``num_classes``
        attribute (``ClassifierMLP``).
      sigma_data: the data standard deviation of ``c_in`` (static, data units, > 0).
    """

    process: Process = struct.field(pytree_node=False)
    graphdef: Any = struct.field(pytree_node=False, default=None)
    params: Any = None
    sigma_data: float = struct.field(pytree_node=False, default=0.5)

    @classmethod
    def create(cls, process: Process, model: nnx.Module, sigma_data: float = 0.5):
        """A classifier of the network ``model`` (split into graph and parameters)."""
        graphdef, params = nnx.split(model, nnx.Param)
        return cls(process=process, graphdef=graphdef, params=params, sigma_data=sigma_data)

    def with_process(self, process: Process) -> NoisyClassifier:
        """The same classifier under another process. Its logits read only ``x / alpha(t)``
        and ``ve_sigma(t)``, and the classifier objectives draw VE levels and VE-frame inputs
        whose law is the same under every process, so a classifier trained under one process
        (``experiments.train_classifier``'s ``process=edm``) is the classifier of any other
        (e.g. to guide a VP score run)."""
        return self.replace(process=process)

    @property
    def num_classes(self) -> int:
        """``K``: the network's ``num_classes`` (a static attribute, no compute)."""
        return int(nnx.merge(self.graphdef, self.params).num_classes)

    def logits(self, x: Array, t: Array) -> Array:
        """``F(c_in(sigma) x / alpha(t); c_noise(sigma))``: ``[batch, num_classes]``.

        Args:
          x: ``[batch, *data_shape]`` noisy input ``x_t`` in process coordinates.
          t: scalar or ``[batch]`` process time (``ve_sigma(t) > 0``).

        Raises:
          ValueError: naming ``x`` (not real ``[batch, *data_shape]`` with the network's
            ``data_shape``) or ``t`` (neither a scalar nor ``[batch]``).
        """
        batch = check_network_input(self.graphdef, self.params, x, "x")
        check_time(t, "t", batch)
        alpha = broadcast_to_data(self.process.alpha(t), x)
        c = edm_precond(self.process.ve_sigma(t), self.sigma_data)
        net = nnx.merge(self.graphdef, self.params)
        x_in = broadcast_to_data(c.c_in, x) * x / alpha
        return net(x_in, jnp.broadcast_to(c.c_noise, (batch,)))

    def log_probs(self, x: Array, t: Array) -> Array:
        """``log p_t(k | x)`` of every class: ``[batch, num_classes]`` (nats; a
        log-softmax of :meth:`logits`, ``logsumexp`` over classes 0). Arguments as
        :meth:`logits`."""
        return jax.nn.log_softmax(self.logits(x, t), axis=-1)

    def class_log_prob(self, x: Array, t: Array, labels: Array) -> Array:
        """``log p_t(c | x)`` of each example's label: ``[batch]`` (nats).

        Args:
          x, t: as :meth:`logits`.
          labels: ``[batch]`` int classes in ``[0, num_classes)``.
        """
        lp = self.log_probs(x, t)
        return jnp.take_along_axis(lp, jnp.asarray(labels, jnp.int32)[:, None], axis=1)[:, 0]
