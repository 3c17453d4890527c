"""A trained network behind EDM preconditioning, as a score source for any process.

For a process with ``alpha != 1`` the network works in the VE frame
``x / alpha(t)`` at noise level ``ve_sigma(t) = sigma(t) / alpha(t)`` (Karras et
al. 2022, Sec. 4 and eq. 4); since ``E[x_0 | x_t] = E[x_0 | x_t / alpha]`` the
denoiser output needs no rescaling, and the score is the VE frame's divided by
``alpha(t)`` (``p_t(x) = p_ve(x / alpha) / alpha^d``).

With ``sigma_fisher`` set the network sits behind
:func:`scorelib.nets.precond.fisher_precond` instead (for regression labels that are exact
at low noise, e.g. the DSM/TSM mixtures), and its score is computed in score form.

A class-conditional network (its ``num_classes > 0``, ``scorelib.nets``) is called as
``F(x, c_noise, labels)``; :class:`NetworkScore` is then a
:class:`~scorelib.scores.conditional.ConditionalScore` whose null label (the network's zero
label embedding) is its unconditional score. An unconditional network is called as
``F(x, c_noise)``, exactly as before labels existed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from scorelib._checks import check_array, check_real, check_time, require
from scorelib.nets.precond import edm_precond, fisher_precond
from scorelib.processes.base import broadcast_to_data
from scorelib.scores.base import check_query, denoiser_from_score
from scorelib.scores.conditional import ConditionalScore

Array = Any


def network_data_shape(graphdef, params) -> tuple[tuple | None, str]:
    """``(data_shape, note)`` of a split network: its ``data_shape`` attribute (``MLP``,
    ``UNet``; ``None`` for a network without one) and, for error messages, where it comes
    from. Reads a static attribute (no compute)."""
    net = nnx.merge(graphdef, params)
    data_shape = getattr(net, "data_shape", None)
    if not data_shape:
        return None, ""
    return tuple(data_shape), f" (the data_shape of the {type(net).__name__})"


def network_num_classes(graphdef, params) -> int:
    """The network's ``num_classes`` attribute (0, unconditional, for a network without
    one). Reads a static attribute (no compute)."""
    return int(getattr(nnx.merge(graphdef, params), "num_classes", 0) or 0)


def check_network_input(graphdef, params, x, field: str) -> int:
    """Require a real ``x: [batch, *data_shape]`` for the network; return ``batch``.

    Raises:
      ValueError: naming ``field``, its shape and the network's ``data_shape``.
    """
    data_shape, note = network_data_shape(graphdef, params)
    pattern = ("batch", *data_shape) if data_shape else ("batch", "*data_shape")
    return check_array(x, field, pattern, note=note)["batch"]


def preconditioned_denoiser(
    graphdef, params, x_ve: Array, sigma: Array, sigma_data: float, *, rngs=None, labels=None
) -> Array:
    """``D(x; sigma) = c_skip x + c_out F(c_in x; c_noise)`` in the VE frame.

    Args:
      graphdef, params: the network split by ``nnx.split(model, nnx.Param)``; the
        network is called as ``F(x, c_noise, rngs=rngs)``.
      x_ve: ``[batch, *data_shape]`` noisy input in the VE frame.
      sigma: scalar or ``[batch]`` VE noise level (> 0), data units.
      sigma_data: data standard deviation used by the preconditioning.
      rngs: ``nnx.Rngs`` for dropout during training, else ``None`` (deterministic).
      labels: ``[batch]`` int class labels for a class-conditional network (its
        ``num_classes`` the null label), or ``None`` (the network is called without).

    Returns:
      ``[batch, *data_shape]`` denoised estimate of ``x_0``.

    Raises:
      ValueError: naming ``x_ve`` (not real, or not ``[batch, *data_shape]`` with the
        network's ``data_shape``) or ``sigma`` (neither a scalar nor ``[batch]``).
    """
    check_time(sigma, "sigma", check_network_input(graphdef, params, x_ve, "x_ve"))
    c = edm_precond(sigma, sigma_data)
    f = _network_output(graphdef, params, x_ve, c, rngs, labels)
    return broadcast_to_data(c.c_skip, x_ve) * x_ve + broadcast_to_data(c.c_out, x_ve) * f


def fisher_preconditioned_score(
    graphdef,
    params,
    x_ve: Array,
    sigma: Array,
    sigma_data: float,
    sigma_fisher: float,
    *,
    rngs=None,
    labels=None,
) -> Array:
    """``s(x; sigma) = c_skip_score x + c_out_score F(c_in x; c_noise)`` in the VE frame, with
    the coefficients of :func:`scorelib.nets.precond.fisher_precond` (units 1 / data).

    Args, shapes and errors as :func:`preconditioned_denoiser`; ``sigma_fisher`` the data's
    Fisher length scale (data units, > 0).
    """
    check_time(sigma, "sigma", check_network_input(graphdef, params, x_ve, "x_ve"))
    c = fisher_precond(sigma, sigma_data, sigma_fisher)
    f = _network_output(graphdef, params, x_ve, c, rngs, labels)
    return (
        broadcast_to_data(c.c_skip_score, x_ve) * x_ve + broadcast_to_data(c.c_out_score, x_ve) * f
    )


def _network_output(graphdef, params, x_ve, c, rngs, labels=None):
    """``F(c_in x; c_noise[, labels])`` for the coefficients ``c`` (``[batch, *data_shape]``).

    One noise level for the whole batch (a scalar ``sigma``: what the samplers pass) and no
    dropout: the network runs under ``jax.vmap`` over the examples (``x: [1, *data_shape]``
    inside) with the same ``c_noise: [1]`` for all of them (not mapped), so that its noise
    embedding (Fourier features and the layers that read them alone) is computed once per
    call instead of once per example; its layers on ``x`` are the same batched matmuls and
    convolutions. The network must treat each example on its own (as every sampler
    assumes); a random draw inside it would be shared by the batch, hence not with ``rngs``.
    Labels, when given, are mapped with the examples (``[1]`` inside).
    """
    net = nnx.merge(graphdef, params)
    x_in = broadcast_to_data(c.c_in, x_ve) * x_ve
    if jnp.ndim(c.c_noise) == 0 and rngs is None:
        cn = c.c_noise[None]
        if labels is None:
            return jax.vmap(lambda x: net(x[None], cn)[0])(x_in)
        return jax.vmap(lambda x, y: net(x[None], cn, y[None])[0])(x_in, labels)
    c_noise = jnp.broadcast_to(c.c_noise, (x_ve.shape[0],))
    if labels is None:
        return net(x_in, c_noise, rngs=rngs)
    return net(x_in, c_noise, labels, rngs=rngs)


class NetworkScore(ConditionalScore):
    """Score source of an EDM-preconditioned network ``F`` (parameters are leaves).

    For a class-conditional network (``num_classes > 0``) it is a
    :class:`~scorelib.scores.conditional.ConditionalScore`: ``denoiser_given(x, t, labels)``,
    labels bound per example by ``conditioned`` / ``for_examples`` (samplers) or
    ``with_labels`` (training); without labels, the null label (the unconditional score).

    Fields:
      process: the noise process (static).
      graphdef, params: the network split by ``nnx.split(model, nnx.Param)``; ``params``
        are the pytree leaves (differentiated during training).
      sigma_data: data standard deviation of the preconditioning (static, data units).
      dropout_key: a PRNG key enables dropout (training); ``None`` is deterministic.
      sigma_fisher: ``None`` (default): EDM's preconditioning; the score follows from
        :meth:`denoiser` by Tweedie's formula (:func:`scorelib.scores.score_from_denoiser`),
        as before this field existed. A Fisher length scale (static, data units, > 0):
        :func:`scorelib.nets.precond.fisher_precond`; :meth:`score` is computed in score
        form (:func:`fisher_preconditioned_score`) and :meth:`denoiser` from it by Tweedie.

    Raises:
      ValueError: for a ``sigma_fisher`` that is neither ``None`` nor a positive number.
    """

    graphdef: Any = struct.field(pytree_node=False, default=None)
    params: Any = None
    sigma_data: float = struct.field(pytree_node=False, default=0.5)
    dropout_key: Any = None  # a PRNG key enables dropout (training); None is deterministic
    sigma_fisher: float | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        if self.sigma_fisher is not None:
            check_real(self.sigma_fisher, "sigma_fisher", low=0.0, low_open=True)

    def expected_data_shape(self) -> tuple[tuple | None, Any]:
        """The network's ``data_shape`` (:func:`network_data_shape`)."""
        return network_data_shape(self.graphdef, self.params)

    def _rngs(self):
        return None if self.dropout_key is None else nnx.Rngs(dropout=self.dropout_key)

    @property
    def num_classes(self) -> int:
        """The network's ``num_classes`` (0: unconditional; :func:`network_num_classes`)."""
        return network_num_classes(self.graphdef, self.params)

    def _call_labels(self, batch: int):
        """The labels the network is called with: ``None`` for an unconditional network
        (which takes none), else the bound labels or the null label."""
        if self.num_classes == 0:
            require(
                self.labels is None and self.condition is None,
                "labels",
                "None for an unconditional network (model.num_classes = 0)",
                "labels bound to the source",
            )
            return None
        return self.bound_labels(batch)

    def score(self, x, t):
        """``grad_x log p_t(x)`` (units 1 / data) by the preconditioned network, with the
        labels bound to the call (:meth:`score_given`)."""
        return self.score_given(x, t, self._call_labels(check_query(self, x, t)))

    def denoiser(self, x, t):
        """``D(x, t) = E[x_0 | x_t = x]`` by the preconditioned network, with the labels
        bound to the call (:meth:`denoiser_given`)."""
        return self.denoiser_given(x, t, self._call_labels(check_query(self, x, t)))

    def score_given(self, x, t, labels):
        """``grad_x log p_t(x | labels)`` (units 1 / data) by the preconditioned network.

        EDM (``sigma_fisher=None``): Tweedie from :meth:`denoiser_given`. Fisher-scaled:
        ``s = (1 / alpha) s_ve(x / alpha; ve_sigma(t))`` with ``s_ve`` from
        :func:`fisher_preconditioned_score`. Arguments, shapes and errors as
        :meth:`denoiser_given`.
        """
        if self.sigma_fisher is None:
            return super().score_given(x, t, labels)
        check_query(self, x, t)
        alpha = broadcast_to_data(self.process.alpha(t), x)
        s_ve = fisher_preconditioned_score(
            self.graphdef,
            self.params,
            x / alpha,
            self.process.ve_sigma(t),
            self.sigma_data,
            self.sigma_fisher,
            rngs=self._rngs(),
            labels=labels,
        )
        return s_ve / alpha

    def denoiser_given(self, x, t, labels):
        """``D(x, t | labels) = E[x_0 | x_t = x, c]`` (data units) by the preconditioned
        network.

        Karras et al. 2022, eq. 7 and Table 1, applied in the VE frame: ``D = c_skip(s)
        (x / alpha) + c_out(s) F(c_in(s) x / alpha; c_noise(s))`` with ``s = ve_sigma(t)``
        (:func:`preconditioned_denoiser`). Fisher-scaled (``sigma_fisher`` set): Tweedie
        from :meth:`score`, ``D = (x + sigma(t)^2 s) / alpha(t)``.

        Args:
          x: ``[batch, *data_shape]`` noisy input in process coordinates.
          t: scalar or ``[batch]`` process time.
          labels: ``[batch]`` int labels in ``[0, num_classes]`` (``num_classes``: null) for
            a class-conditional network; ``None`` for an unconditional one.

        Returns:
          ``[batch, *data_shape]``.

        Raises:
          ValueError: if ``t`` is neither a scalar nor ``[batch]``; labels given to an
            unconditional network.
        """
        check_query(self, x, t)
        if self.sigma_fisher is not None:
            return denoiser_from_score(self.process, x, t, self.score_given(x, t, labels))
        alpha = broadcast_to_data(self.process.alpha(t), x)
        sigma = self.process.ve_sigma(t)
        return preconditioned_denoiser(
            self.graphdef,
            self.params,
            x / alpha,
            sigma,
            self.sigma_data,
            rngs=self._rngs(),
            labels=labels,
        )
