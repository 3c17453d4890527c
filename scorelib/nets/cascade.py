"""Cas-DM's cascaded network (An et al., "Bring metric functions into diffusion models",
IJCAI 2024, arXiv:2401.02414, Fig. 1c): two modules, the second fed the first's estimate.

The paper's first module predicts the noise as a DDPM does and is untouched by the metric
loss; the second, cascaded module predicts the clean image, on which the metric (LPIPS) is
applied; sampling blends the two with a time-dependent weight. The abstract leaves the
wiring open; ours, in the library's EDM preconditioning (Karras et al. 2022, Table 1), is::

    D1 = c_skip x + c_out F1(c_in x; c_noise)              # module 1: the EDM denoiser
    D2 = sg(D1) + sigma_data F2(sg(D1) / sigma_data; c_noise)  # module 2: a clean image
    D  = (1 - r(sigma)) D1 + r(sigma) D2                   # what the samplers use

- Module 1 is the library's denoiser exactly: EDM's ``F1`` predicts the noise ``eps`` at
  ``sigma << sigma_data`` (DDPM's parameterisation) and ``x_0`` at high noise. Its loss
  (:class:`scorelib.objectives.CascadeLoss`) is the EDM loss on ``D1`` alone, and module 2
  reads it through a stop-gradient ``sg``, so no other loss reaches its parameters.
- Module 2 refines the first module's clean-image estimate: it sees ``sg(D1)`` and the
  noise level (not ``x_t``), and adds a correction; its zero-initialised output layer makes
  ``D2 = D1`` at the start. That it reads ``D1`` rather than ``x_t`` is our choice.
- ``r(sigma)``, the blend (:data:`BLENDS`): ``'first'`` (r = 0, module 1 alone, what the
  same network without the metric samples), ``'second'`` (r = 1) or ``'snr'`` (r = c_skip =
  sigma_data^2 / (sigma^2 + sigma_data^2): module 2 where the image is nearly determined,
  module 1 at high noise, where a metric-trained estimate is not the posterior mean the
  sampler's ODE needs). The paper's weight is time-dependent; its formula is not in the
  abstract, ``'snr'`` is ours.

The cascade returns the EDM network output ``F`` of the blended denoiser, so it sits behind
:class:`scorelib.scores.NetworkScore` as any network (``D = c_skip x + c_out F``; every
sampler, ``experiments.sample`` and the evaluation use it unchanged). It needs the
preconditioning's ``sigma_data`` to recover ``sigma = exp(4 c_noise)`` and ``c_out``;
:meth:`Cascade.denoisers` gives the two modules' outputs for the loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from scorelib._checks import check_choice, check_real
from scorelib.nets.local import LocalMLP
from scorelib.nets.precond import edm_precond

#: The blends ``r(sigma)`` of the two modules' clean-image estimates (module docstring).
BLENDS = ("first", "second", "snr")


def blend_weight(blend: str, sigma, sigma_data: float):
    """``r(sigma)`` of the blend (module docstring), the shape of ``sigma`` (dimensionless).

    Raises:
      ValueError: naming ``model.blend`` for an unknown blend.
    """
    check_choice(blend, "model.blend", BLENDS)
    sigma = jnp.asarray(sigma)
    if blend == "first":
        return jnp.zeros_like(sigma)
    if blend == "second":
        return jnp.ones_like(sigma)
    return edm_precond(sigma, sigma_data).c_skip


class Cascade(nnx.Module):
    """Two :class:`~scorelib.nets.LocalMLP` in cascade (module docstring), called as
    ``F(x, c_noise)``.

    Args:
      data_shape: the data's shape, e.g. ``(H, W, C)``.
      sigma_data: the EDM preconditioning's data std (data units, > 0): the value the
        :class:`~scorelib.scores.NetworkScore` around it uses (``data.sigma_data``).
      blend: ``r(sigma)`` of :data:`BLENDS` (a static attribute; change it on a trained
        network with :func:`with_blend`).
      **fields: the :class:`~scorelib.nets.LocalMLP` fields of both modules (e.g.
        ``sigma_local``, ``width``; a plain MLP of the whole image is ``sigma_local``
        below the smallest noise level trained).

    Raises:
      ValueError: naming ``model.<field>`` (``sigma_data`` not positive, an unknown
        ``blend``, the networks' own checks); ``num_classes`` is refused (a
        class-conditional cascade is not built).
    """

    def __init__(
        self,
        data_shape,
        sigma_data: float = 0.5,
        blend: str = "snr",
        *,
        rngs: nnx.Rngs,
        **fields,
    ):
        self.sigma_data = check_real(
            sigma_data, "model.sigma_data", low=0.0, low_open=True, high_open=True
        )
        self.blend = check_choice(blend, "model.blend", BLENDS)
        if fields.get("num_classes"):
            raise ValueError("model.num_classes: a class-conditional cascade is not built; use 0")
        fields.pop("num_classes", None)
        self.first = LocalMLP(data_shape, **fields, rngs=rngs)
        self.second = LocalMLP(data_shape, **fields, rngs=rngs)
        self.data_shape = tuple(data_shape)
        self.num_classes = 0

    def _coefficients(self, x_in, c_noise):
        """``(x, c_skip, c_out)`` broadcast to the data: the input before ``c_in``."""
        sigma = jnp.exp(4.0 * c_noise)
        c = edm_precond(sigma, self.sigma_data)
        shape = (-1,) + (1,) * (x_in.ndim - 1)
        x = x_in / c.c_in.reshape(shape)
        return x, c.c_skip.reshape(shape), c.c_out.reshape(shape), sigma

    def denoisers(self, x_in, c_noise, *, rngs: nnx.Rngs | None = None):
        """The two modules' clean-image estimates ``(D1, D2)`` (data units).

        Args:
          x_in: ``[batch, *data_shape]`` the preconditioned input ``c_in(sigma) x`` (VE frame).
          c_noise: ``[batch]`` ``ln(sigma) / 4``.
          rngs: dropout when training, else ``None``.

        Returns:
          ``(D1, D2)``, each ``[batch, *data_shape]``; ``D2`` depends on module 1's
          parameters only through a stop-gradient.
        """
        x, c_skip, c_out, _ = self._coefficients(x_in, c_noise)
        d1 = c_skip * x + c_out * self.first(x_in, c_noise, rngs=rngs)
        base = jax.lax.stop_gradient(d1)
        d2 = base + self.sigma_data * self.second(base / self.sigma_data, c_noise, rngs=rngs)
        return d1, d2

    def __call__(self, x_in, c_noise, labels=None, *, rngs: nnx.Rngs | None = None):
        """``F`` with ``c_skip x + c_out F = (1 - r) D1 + r D2``: ``F1 + r sigma_data F2 /
        c_out`` (written without the cancellation of ``(D - c_skip x) / c_out``).

        Args and shapes as :meth:`denoisers`; ``labels`` must be ``None``.
        """
        if labels is not None:
            raise ValueError("labels: the cascade is unconditional (model.num_classes = 0)")
        x, c_skip, c_out, sigma = self._coefficients(x_in, c_noise)
        f1 = self.first(x_in, c_noise, rngs=rngs)
        if self.blend == "first":
            return f1
        d1 = jax.lax.stop_gradient(c_skip * x + c_out * f1)
        f2 = self.second(d1 / self.sigma_data, c_noise, rngs=rngs)
        r = blend_weight(self.blend, sigma, self.sigma_data).reshape(c_out.shape)
        return f1 + r * self.sigma_data * f2 / c_out


def with_blend(graphdef, params, blend: str):
    """The graph definition of the cascade ``(graphdef, params)`` with another blend (the
    parameters are unchanged: pass them with it to :class:`~scorelib.scores.NetworkScore`).

    Raises:
      ValueError: for a network that is not a :class:`Cascade`, or an unknown blend (naming
        ``model.blend``).
    """
    net = nnx.merge(graphdef, params)
    if not isinstance(net, Cascade):
        raise ValueError(f"model: with_blend needs a Cascade network; got {type(net).__name__}")
    net.blend = check_choice(blend, "model.blend", BLENDS)
    return nnx.split(net, nnx.Param)[0]
